package realomni

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/siderolabs/image-factory/pkg/schematic"
	"go.uber.org/zap"
)

// ukiSuffix ends the name of a schematic's signed UKI, metal-<arch>-secureboot-uki.efi, as the real factory
// names it.
const ukiSuffix = "-secureboot-uki.efi"

// errNoUKIBuilder says the factory was given no SecureBootUKI builder.
var errNoUKIBuilder = errors.New("no secure boot uki builder")

// ukiBuild is one UKI built, or being built until done is closed.
type ukiBuild struct {
	done chan struct{}
	data []byte
	err  error
}

// SetSecureBootUKI sets the builder of the signed UKIs served from now on (nil serves none) and forgets the
// UKIs built so far.
func (f *Factory) SetSecureBootUKI(build UKIBuilder) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.ukiBuilder = build
	f.ukis = map[string]*ukiBuild{}
}

// uki serves a known schematic's signed UKI for a listed Talos version and an architecture the factory has
// images for, with ranges and conditional requests (http.ServeContent); 404 without a builder, 500 when the
// builder fails.
func (f *Factory) uki(w http.ResponseWriter, r *http.Request, arch string) {
	id, version := r.PathValue("schematic"), canonicalVersion(r.PathValue("version"))

	f.mu.Lock()
	build := f.ukiBuilder
	_, known := f.schematics[id]
	_, hasArch := f.images[arch]
	f.mu.Unlock()

	switch {
	case build == nil:
		f.notFound(w, r)

		return
	case !known:
		http.Error(w, "schematic not found", http.StatusNotFound)

		return
	case !slices.Contains(f.talos, version):
		http.Error(w, "unknown talos version", http.StatusNotFound)

		return
	case !hasArch:
		http.Error(w, "no image for architecture "+arch, http.StatusNotFound)

		return
	}

	data, err := f.secureBootUKI(r, id, version, arch)

	switch {
	case errors.Is(err, errNoUKIBuilder):
		f.notFound(w, r)

		return
	case r.Context().Err() != nil:
		return // the client went away while the UKI was being built
	case err != nil:
		f.log.Error("build secure boot uki", zap.String("schematic_id", id), zap.String("version", version),
			zap.String("arch", arch), zap.Error(err))
		http.Error(w, "secure boot uki unavailable", http.StatusInternalServerError)

		return
	}

	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, r.PathValue("file"), time.Time{}, bytes.NewReader(data))
}

// secureBootUKI returns the UKI of schematic id for version and arch, built once: concurrent first requests
// wait for one build; a failed build is forgotten, so the next request builds again.
func (f *Factory) secureBootUKI(r *http.Request, id, version, arch string) (data []byte, err error) {
	key := id + "/" + version + "/" + arch

	f.mu.Lock()

	if b, ok := f.ukis[key]; ok {
		f.mu.Unlock()

		select {
		case <-b.done:
			return b.data, b.err
		case <-r.Context().Done():
			return nil, fmt.Errorf("wait for secure boot uki: %w", r.Context().Err())
		}
	}

	build, yaml := f.ukiBuilder, f.schematics[id]
	b := &ukiBuild{done: make(chan struct{})}
	f.ukis[key] = b
	f.mu.Unlock()

	defer func() {
		if p := recover(); p != nil {
			b.data, b.err = nil, fmt.Errorf("secure boot uki builder panicked: %v", p)
		}

		data, err = b.data, b.err

		if b.err != nil {
			f.mu.Lock()
			if f.ukis[key] == b {
				delete(f.ukis, key)
			}
			f.mu.Unlock()
		}

		close(b.done)
	}()

	b.data, b.err = buildUKI(build, yaml, version, arch)

	return b.data, b.err
}

// buildUKI calls build with the schematic stored as yaml.
func buildUKI(build UKIBuilder, yaml []byte, version, arch string) ([]byte, error) {
	if build == nil {
		return nil, errNoUKIBuilder
	}

	sc, err := schematic.Unmarshal(yaml)
	if err != nil {
		return nil, fmt.Errorf("parse stored schematic: %w", err)
	}

	data, err := build(sc, version, arch)
	if err != nil {
		return nil, fmt.Errorf("build secure boot uki %s %s: %w", version, arch, err)
	}

	return data, nil
}
