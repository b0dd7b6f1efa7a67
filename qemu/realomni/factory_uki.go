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

// SetSecureBootUKI sets the builder of the signed UKIs served from now on (nil serves none) and forgets the
// UKIs built so far.
func (f *Factory) SetSecureBootUKI(build UKIBuilder) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.ukiBuilder = build
	f.ukis = map[string][]byte{}
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
// share one build (singleflight); a failed build is not kept, so the next request builds again.
func (f *Factory) secureBootUKI(r *http.Request, id, version, arch string) ([]byte, error) {
	key := id + "/" + version + "/" + arch

	f.mu.Lock()
	data, ok := f.ukis[key]
	build, yaml, built := f.ukiBuilder, f.schematics[id], f.ukis // a later SetSecureBootUKI drops what this builds
	f.mu.Unlock()

	if ok {
		return data, nil
	}

	ch := f.ukiFlight.DoChan(key, func() (any, error) {
		data, err := buildUKI(build, yaml, version, arch)
		if err == nil {
			f.mu.Lock()
			built[key] = data
			f.mu.Unlock()
		}

		return data, err
	})

	select {
	case res := <-ch:
		data, _ := res.Val.([]byte) // the flight's function returns []byte

		return data, res.Err
	case <-r.Context().Done():
		return nil, fmt.Errorf("wait for secure boot uki: %w", r.Context().Err())
	}
}

// buildUKI calls build with the schematic stored as yaml; a panic in build is its error.
func buildUKI(build UKIBuilder, yaml []byte, version, arch string) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			data, err = nil, fmt.Errorf("secure boot uki builder panicked: %v", p)
		}
	}()

	if build == nil {
		return nil, errNoUKIBuilder
	}

	sc, err := schematic.Unmarshal(yaml)
	if err != nil {
		return nil, fmt.Errorf("parse stored schematic: %w", err)
	}

	data, err = build(sc, version, arch)
	if err != nil {
		return nil, fmt.Errorf("build secure boot uki %s %s: %w", version, arch, err)
	}

	return data, nil
}
