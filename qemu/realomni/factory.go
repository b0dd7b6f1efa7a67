package realomni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/image-factory/pkg/schematic"
	"go.uber.org/zap"
)

// maxSchematic bounds a schematic upload.
const maxSchematic = 1 << 20

// Factory is a fake Sidero image factory and OCI registry (tag lists only) answering what a real Omni asks
// of them offline: the factory's Talos versions, schematics, extensions and overlays
// (github.com/siderolabs/image-factory/pkg/client) and the kubelet and installer tags
// (OCI distribution spec, GET /v2/<name>/tags/list). It serves no images.
type Factory struct {
	talos []string
	kube  []string
	log   *zap.Logger

	mu         sync.Mutex
	schematics map[string][]byte // ID -> normalized YAML
	unanswered []string
}

// FactoryConfig is what the fake factory lists.
type FactoryConfig struct {
	// TalosVersions are the factory's Talos versions ("1.11.5" or "v1.11.5"; served with the v).
	TalosVersions []string
	// KubernetesVersions are the kubelet tags.
	KubernetesVersions []string
	Logger             *zap.Logger
}

// NewFactory returns a fake factory listing cfg's versions.
func NewFactory(cfg FactoryConfig) *Factory {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}

	v := func(in []string) []string {
		out := make([]string, 0, len(in))
		for _, s := range in {
			out = append(out, "v"+strings.TrimPrefix(s, "v"))
		}

		return out
	}

	return &Factory{
		talos: v(cfg.TalosVersions), kube: v(cfg.KubernetesVersions),
		log: log.With(zap.String("component", "fake_image_factory")), schematics: map[string][]byte{},
	}
}

// Serve serves the factory on ln until ctx ends (then it returns nil).
func (f *Factory) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           f.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
	}

	errc := make(chan error, 1)

	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve fake image factory: %w", err)
	case <-ctx.Done():
	}

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}

	if err != nil {
		return fmt.Errorf("stop fake image factory: %w", err)
	}

	return nil
}

// Handler is the factory's and registry's HTTP handler.
func (f *Factory) Handler() http.Handler {
	mux := http.NewServeMux()

	mux.HandleFunc("GET /versions", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("broken") == "true" {
			writeJSON(w, http.StatusOK, []string{})

			return
		}

		writeJSON(w, http.StatusOK, f.talos)
	})
	mux.HandleFunc("POST /schematics", f.createSchematic)
	mux.HandleFunc("GET /schematics/{id}", f.getSchematic)
	mux.HandleFunc("GET /version/{version}/extensions/official", f.extensions)
	mux.HandleFunc("GET /version/{version}/overlays/official", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []struct{}{})
	})
	mux.HandleFunc("GET /talosctl/{version}", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []string{})
	})
	mux.HandleFunc("GET /v2/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("GET /v2/", f.tags)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { f.notFound(w, r) })

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.log.Debug("request", zap.String("method", r.Method), zap.String("path", r.URL.Path))
		mux.ServeHTTP(w, r)
	})
}

// Unanswered lists the requests ("GET /path") the factory had no answer for, each once.
func (f *Factory) Unanswered() []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	return slices.Clone(f.unanswered)
}

// Schematics lists the IDs of the schematics uploaded so far, sorted.
func (f *Factory) Schematics() []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	ids := make([]string, 0, len(f.schematics))
	for id := range f.schematics {
		ids = append(ids, id)
	}

	slices.Sort(ids)

	return ids
}

func (f *Factory) notFound(w http.ResponseWriter, r *http.Request) {
	req := r.Method + " " + r.URL.Path

	f.mu.Lock()
	first := !slices.Contains(f.unanswered, req)

	if first {
		f.unanswered = append(f.unanswered, req)
	}
	f.mu.Unlock()

	if first {
		f.log.Warn("unanswered request", zap.String("request", req))
	}

	http.Error(w, "not found", http.StatusNotFound)
}

// createSchematic stores the schematic under its ID, the SHA-256 of its normalized YAML, as the real
// factory does (image-factory pkg/schematic), and answers {"id", "schematic"}.
func (f *Factory) createSchematic(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSchematic))
	if err != nil {
		http.Error(w, "read schematic: "+err.Error(), http.StatusBadRequest)

		return
	}

	s, err := schematic.Unmarshal(body)
	if err != nil {
		http.Error(w, "invalid schematic: "+err.Error(), http.StatusBadRequest)

		return
	}

	id, err := s.ID()
	if err != nil {
		http.Error(w, "schematic ID: "+err.Error(), http.StatusBadRequest)

		return
	}

	normalized, err := s.Marshal()
	if err != nil {
		http.Error(w, "marshal schematic: "+err.Error(), http.StatusInternalServerError)

		return
	}

	f.mu.Lock()
	f.schematics[id] = normalized
	f.mu.Unlock()

	f.log.Debug("schematic created", zap.String("schematic_id", id))

	writeJSON(w, http.StatusCreated, struct {
		ID        string `json:"id"`
		Schematic string `json:"schematic"`
	}{id, string(normalized)})
}

func (f *Factory) getSchematic(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	data, ok := f.schematics[r.PathValue("id")]
	f.mu.Unlock()

	if !ok {
		http.Error(w, "schematic not found", http.StatusNotFound)

		return
	}

	w.Header().Set("Content-Type", "application/yaml")
	w.Write(data) //nolint:errcheck
}

// extensions lists a few official extensions for a known Talos version, their images named on this host.
func (f *Factory) extensions(w http.ResponseWriter, r *http.Request) {
	version := "v" + strings.TrimPrefix(r.PathValue("version"), "v")
	if !slices.Contains(f.talos, version) {
		http.Error(w, "unknown version", http.StatusNotFound)

		return
	}

	type info struct {
		Name        string `json:"name"`
		Ref         string `json:"ref"`
		Digest      string `json:"digest"`
		Author      string `json:"author"`
		Description string `json:"description"`
	}

	list := []info{}

	for _, name := range []string{"siderolabs/iscsi-tools", "siderolabs/metal-agent", "siderolabs/qemu-guest-agent"} {
		ref := r.Host + "/" + name + ":" + version
		sum := sha256.Sum256([]byte(ref))
		list = append(list, info{
			Name: name, Ref: ref, Digest: "sha256:" + hex.EncodeToString(sum[:]), Author: "Sidero Labs",
			Description: name + " (fake image factory)",
		})
	}

	writeJSON(w, http.StatusOK, list)
}

// tags answers GET /v2/<name>/tags/list for the kubelet and installer repositories.
func (f *Factory) tags(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v2/"), "/tags/list")
	if !ok {
		f.notFound(w, r)

		return
	}

	var tags []string

	switch {
	case strings.HasSuffix(name, "/kubelet"):
		tags = f.kube
	case strings.HasSuffix(name, "/installer"):
		tags = f.talos
	default:
		f.notFound(w, r)

		return
	}

	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	writeJSON(w, http.StatusOK, struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{name, tags})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck
}
