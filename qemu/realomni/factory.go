package realomni

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/siderolabs/image-factory/pkg/schematic"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
)

// maxSchematic bounds a schematic upload.
const maxSchematic = 1 << 20

// maxRequestLog bounds the request log (the oldest entries go first).
const maxRequestLog = 4096

// Factory is a fake Sidero image factory and OCI registry answering what a real Omni asks of them offline
// (the factory's Talos versions, schematics, extensions and overlays, github.com/siderolabs/image-factory/pkg/client;
// the kubelet and installer tag lists, OCI distribution spec GET /v2/<name>/tags/list) and what a provider
// downloads from them: each known schematic's kernel and initramfs (GET|HEAD
// /image/<schematic>/<version>/kernel-<arch> and initramfs-<arch>.xz, with ranges), its signed unified kernel
// image for Secure Boot (metal-<arch>-secureboot-uki.efi, built on first request by FactoryConfig.SecureBootUKI)
// and its installer images, small generated multi-platform indexes served read-only by a real in-memory
// registry (go-containerregistry pkg/registry) as installer/<schematic>:<version> and
// installer-secureboot/<schematic>:<version>, on the same host as the real factory serves them. It counts what it is asked (Requests, RequestLog) and misbehaves on request (SetFault).
type Factory struct {
	talos []string
	kube  []string
	archs []string
	log   *zap.Logger
	reg   http.Handler

	mu         sync.Mutex
	schematics map[string][]byte // ID -> normalized YAML
	unanswered []string
	images     map[string]ImageFiles
	faults     map[RequestKind]Fault
	counts     map[string]map[RequestKind]Counter // listener address -> kind -> counter
	reqlog     []Request
	ukiBuilder UKIBuilder
	ukis       map[string][]byte // "<schematic>/<version>/<arch>" -> the UKI built
	ukiFlight  singleflight.Group

	// pushMu serializes the lazy pushes of installer images; installers maps "<repository>:<tag>" to its
	// index digest once pushed.
	pushMu     sync.Mutex
	installers map[string]string
}

// ImageFiles are the boot files the factory serves for one architecture, whatever the schematic and version.
type ImageFiles struct {
	// Kernel is served as /image/<schematic>/<version>/kernel-<arch>.
	Kernel string
	// Initramfs is served as /image/<schematic>/<version>/initramfs-<arch>.xz.
	Initramfs string
}

// UKIBuilder builds the signed unified kernel image of a schematic (as it was created, its
// customization.extraKernelArgs the UKI's command line) for a Talos version (with its v) and architecture.
type UKIBuilder func(sc *schematic.Schematic, version, arch string) ([]byte, error)

// FactoryConfig is what the fake factory lists and serves.
type FactoryConfig struct {
	// TalosVersions are the factory's Talos versions ("1.11.5" or "v1.11.5"; served with the v).
	TalosVersions []string
	// KubernetesVersions are the kubelet tags.
	KubernetesVersions []string
	// Images are the kernel and initramfs served per architecture (amd64, arm64); SetImages changes them later.
	Images map[string]ImageFiles
	// InstallerArchs are the platforms in each installer image index (default amd64 and arm64).
	InstallerArchs []string
	// SecureBootUKI builds what the factory serves as /image/<schematic>/<version>/metal-<arch>-secureboot-uki.efi
	// for the architectures it has Images for, called at most once per schematic, version and architecture
	// (a failure is not kept: the next request calls it again). Nil serves no UKI (404). SetSecureBootUKI
	// changes it later.
	SecureBootUKI UKIBuilder
	// Logger logs the factory's requests at debug level and its failures (default none).
	Logger *zap.Logger
}

// RequestKind says what a request to the factory was for.
type RequestKind string

// The kinds of request the factory counts.
const (
	KindImageKernel      RequestKind = "image_kernel"
	KindImageInitramfs   RequestKind = "image_initramfs"
	KindImageUKI         RequestKind = "image_uki"
	KindRegistryManifest RequestKind = "registry_manifest"
	KindRegistryBlob     RequestKind = "registry_blob"
	KindRegistryTags     RequestKind = "registry_tags"
	KindSchematics       RequestKind = "schematics"
	// KindOther is everything else (versions, extensions, the registry's API check, unanswered paths).
	KindOther RequestKind = "other"
)

// Counter counts the requests of one kind and the response body bytes sent for them.
type Counter struct {
	Requests int64
	Bytes    int64
}

// Request is one request in the factory's log.
type Request struct {
	Method string
	Path   string
	Kind   RequestKind
	// Local is the address of the listener the request came in on (Serve may serve several).
	Local string
	// Remote is the client's IP address.
	Remote string
	Status int
	// Bytes is the length of the response body sent (cut short by a fault or a client that went away).
	Bytes int64
}

// FaultMode is how the factory misbehaves for a kind of request.
type FaultMode int

// Fault modes.
const (
	// FaultNone answers normally.
	FaultNone FaultMode = iota
	// FaultNotFound answers 404.
	FaultNotFound
	// FaultServerError answers 500.
	FaultServerError
	// FaultGarbage answers with the right headers and length, every body byte inverted.
	FaultGarbage
	// FaultSlow trickles the right body (Fault.Chunk bytes every Fault.Interval) and cuts the connection once
	// it has trickled for Fault.For.
	FaultSlow
)

// Fault is a misbehaviour for one kind of request (SetFault).
type Fault struct {
	Mode FaultMode
	// Chunk and Interval pace FaultSlow (defaults 4 KiB every 100 ms).
	Chunk    int
	Interval time.Duration
	// For bounds FaultSlow: the response is aborted once it has trickled this long (default 10 s).
	For time.Duration
}

// NewFactory returns a fake factory listing cfg's versions and serving cfg's images.
func NewFactory(cfg FactoryConfig) *Factory {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}

	v := func(in []string) []string {
		out := make([]string, 0, len(in))
		for _, s := range in {
			out = append(out, canonicalVersion(s))
		}

		return out
	}

	archs := slices.Clone(cfg.InstallerArchs)
	if len(archs) == 0 {
		archs = []string{"amd64", "arm64"}
	}

	images := map[string]ImageFiles{}
	for arch, files := range cfg.Images {
		images[arch] = files
	}

	log = log.With(zap.String("component", "fake_image_factory"))

	return &Factory{
		talos: v(cfg.TalosVersions), kube: v(cfg.KubernetesVersions), archs: archs, log: log,
		reg:        newRegistry(log),
		schematics: map[string][]byte{}, images: images, faults: map[RequestKind]Fault{},
		counts:     map[string]map[RequestKind]Counter{},
		ukiBuilder: cfg.SecureBootUKI, ukis: map[string][]byte{},
		installers: map[string]string{},
	}
}

// canonicalVersion is a Talos version with its v, as the factory names it.
func canonicalVersion(s string) string { return "v" + strings.TrimPrefix(s, "v") }

// Serve serves the factory on ln until ctx ends (then it returns nil). It may serve several listeners at once
// (one factory, one state).
func (f *Factory) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           f.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
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
	mux.HandleFunc("GET /image/{schematic}/{version}/{file}", f.image)
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
	mux.HandleFunc("/v2/", f.registry)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { f.notFound(w, r) })

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.log.Debug("request", zap.String("method", r.Method), zap.String("path", r.URL.Path))

		kind := classify(r)
		cw := &countingWriter{ResponseWriter: w}

		// Recorded even when a fault aborts the response (panic(http.ErrAbortHandler) unwinds through here).
		defer f.record(r, kind, cw)

		var out http.ResponseWriter = cw

		switch fault := f.fault(kind); fault.Mode {
		case FaultNotFound:
			http.Error(cw, "not found (fault)", http.StatusNotFound)

			return
		case FaultServerError:
			http.Error(cw, "internal error (fault)", http.StatusInternalServerError)

			return
		case FaultGarbage:
			out = &garbageWriter{countingWriter: cw}
		case FaultSlow:
			out = newTrickleWriter(cw, fault, r.Context().Done())
		case FaultNone:
		}

		mux.ServeHTTP(out, r)
	})
}

// classify says what a request is for, from its method and path.
func classify(r *http.Request) RequestKind {
	p := r.URL.Path

	switch {
	case p == "/schematics" || strings.HasPrefix(p, "/schematics/"):
		return KindSchematics
	case strings.HasPrefix(p, "/image/"):
		switch file := p[strings.LastIndex(p, "/")+1:]; {
		case strings.HasPrefix(file, "kernel-"):
			return KindImageKernel
		case strings.HasPrefix(file, "initramfs-"):
			return KindImageInitramfs
		case strings.HasPrefix(file, "metal-") && strings.HasSuffix(file, ukiSuffix):
			return KindImageUKI
		}
	case strings.HasPrefix(p, "/v2/"):
		elems := strings.Split(strings.Trim(p, "/"), "/")
		if len(elems) >= 4 {
			switch elems[len(elems)-2] {
			case "manifests":
				return KindRegistryManifest
			case "blobs":
				return KindRegistryBlob
			case "tags":
				return KindRegistryTags
			}
		}
	}

	return KindOther
}

func (f *Factory) record(r *http.Request, kind RequestKind, cw *countingWriter) {
	status := cw.status
	if status == 0 {
		status = http.StatusOK
	}

	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		remote = r.RemoteAddr
	}

	local := ""
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		local = a.String()
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	if f.counts[local] == nil {
		f.counts[local] = map[RequestKind]Counter{}
	}

	c := f.counts[local][kind]
	c.Requests++
	c.Bytes += cw.bytes
	f.counts[local][kind] = c

	if len(f.reqlog) >= maxRequestLog {
		f.reqlog = slices.Delete(f.reqlog, 0, len(f.reqlog)-maxRequestLog+1)
	}

	f.reqlog = append(f.reqlog, Request{
		Method: r.Method, Path: r.URL.Path, Kind: kind, Local: local, Remote: remote, Status: status, Bytes: cw.bytes,
	})
}

// Requests returns how many requests of each kind the factory got so far and the body bytes it sent for them.
func (f *Factory) Requests() map[RequestKind]Counter {
	f.mu.Lock()
	defer f.mu.Unlock()

	out := map[RequestKind]Counter{}

	for _, byKind := range f.counts {
		for k, c := range byKind {
			sum := out[k]
			sum.Requests += c.Requests
			sum.Bytes += c.Bytes
			out[k] = sum
		}
	}

	return out
}

// RequestsOn is Requests for the requests that came in on one listener (its address, "IP:port"): what the
// clients given that address asked, when the factory serves several (one for Omni, one for a provider).
func (f *Factory) RequestsOn(local string) map[RequestKind]Counter {
	f.mu.Lock()
	defer f.mu.Unlock()

	out := make(map[RequestKind]Counter, len(f.counts[local]))
	for k, c := range f.counts[local] {
		out[k] = c
	}

	return out
}

// RequestLog returns the requests answered so far, oldest first (the latest few thousand).
func (f *Factory) RequestLog() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()

	return slices.Clone(f.reqlog)
}

// SetFault makes the factory misbehave for every request of kind from now on (Fault{} answers normally again).
func (f *Factory) SetFault(kind RequestKind, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if fault.Mode == FaultNone {
		delete(f.faults, kind)

		return
	}

	f.faults[kind] = fault
}

func (f *Factory) fault(kind RequestKind) Fault {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.faults[kind]
}

// SetImages sets the kernel and initramfs served for arch from now on.
func (f *Factory) SetImages(arch string, files ImageFiles) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.images[arch] = files
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

func (f *Factory) knows(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	_, ok := f.schematics[id]

	return ok
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

// image serves a known schematic's kernel (kernel-<arch>) or initramfs (initramfs-<arch>.xz) for a listed
// Talos version, with ranges and conditional requests (http.ServeContent); the same files for every schematic.
// Its signed UKI (metal-<arch>-secureboot-uki.efi) is served by uki.
func (f *Factory) image(w http.ResponseWriter, r *http.Request) {
	file := r.PathValue("file")

	if mid, ok := strings.CutPrefix(file, "metal-"); ok {
		if arch, ok := strings.CutSuffix(mid, ukiSuffix); ok {
			f.uki(w, r, arch)

			return
		}
	}

	kernelArch, isKernel := strings.CutPrefix(file, "kernel-")
	initrdArch, isInitrd := strings.CutPrefix(file, "initramfs-")
	initrdArch, isXZ := strings.CutSuffix(initrdArch, ".xz")

	var arch string

	switch {
	case isKernel:
		arch = kernelArch
	case isInitrd && isXZ:
		arch = initrdArch
	default:
		f.notFound(w, r)

		return
	}

	id, version := r.PathValue("schematic"), canonicalVersion(r.PathValue("version"))

	f.mu.Lock()
	_, known := f.schematics[id]
	files, hasArch := f.images[arch]
	f.mu.Unlock()

	path := files.Kernel
	if isInitrd {
		path = files.Initramfs
	}

	switch {
	case !known:
		http.Error(w, "schematic not found", http.StatusNotFound)

		return
	case !slices.Contains(f.talos, version):
		http.Error(w, "unknown talos version", http.StatusNotFound)

		return
	case !hasArch || path == "":
		http.Error(w, "no image for architecture "+arch, http.StatusNotFound)

		return
	}

	fh, err := os.Open(path)
	if err != nil {
		f.log.Error("open image", zap.String("path", path), zap.Error(err))
		http.Error(w, "image unavailable", http.StatusInternalServerError)

		return
	}
	defer fh.Close() //nolint:errcheck

	st, err := fh.Stat()
	if err != nil {
		http.Error(w, "image unavailable", http.StatusInternalServerError)

		return
	}

	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, file, st.ModTime(), fh)
}

// countingWriter notes the status and counts the body bytes of a response.
type countingWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}

	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}

	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)

	return n, err
}

func (w *countingWriter) Flush() {
	if fl, ok := w.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// garbageWriter sends every body byte inverted: the right length, the wrong content.
type garbageWriter struct {
	*countingWriter
}

func (w *garbageWriter) Write(b []byte) (int, error) {
	inv := make([]byte, len(b))
	for i, c := range b {
		inv[i] = ^c
	}

	return w.countingWriter.Write(inv)
}

// trickleWriter sends the body a chunk per interval and aborts the response once it has trickled too long.
type trickleWriter struct {
	*countingWriter
	chunk    int
	interval time.Duration
	deadline time.Time
	done     <-chan struct{}
}

func newTrickleWriter(w *countingWriter, f Fault, done <-chan struct{}) *trickleWriter {
	t := &trickleWriter{countingWriter: w, chunk: f.Chunk, interval: f.Interval, done: done}
	if t.chunk <= 0 {
		t.chunk = 4 << 10
	}

	if t.interval <= 0 {
		t.interval = 100 * time.Millisecond
	}

	bound := f.For
	if bound <= 0 {
		bound = 10 * time.Second
	}

	t.deadline = time.Now().Add(bound)

	return t
}

func (w *trickleWriter) Write(b []byte) (int, error) {
	written := 0

	for len(b) > 0 {
		if !time.Now().Before(w.deadline) {
			panic(http.ErrAbortHandler) // the client sees the body cut short
		}

		n, err := w.countingWriter.Write(b[:min(w.chunk, len(b))])
		written += n

		if err != nil {
			return written, err
		}

		w.Flush()

		b = b[n:]

		timer := time.NewTimer(w.interval)
		select {
		case <-w.done:
			timer.Stop()

			return written, errors.New("client went away")
		case <-timer.C:
		}
	}

	return written, nil
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

// registry answers the OCI distribution API read-only: the kubelet and installer tag lists Omni asks for
// (siderolabs/kubelet, siderolabs/installer), and each known schematic's installer images
// (installer/<schematic> and installer-secureboot/<schematic>, tags the listed Talos versions) from the
// in-memory registry, pushed there on first request.
func (f *Factory) registry(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "read-only registry", http.StatusMethodNotAllowed)

		return
	}

	rest := strings.TrimPrefix(r.URL.Path, "/v2/")

	if name, ok := strings.CutSuffix(rest, "/tags/list"); ok {
		switch {
		case strings.HasSuffix(name, "/kubelet"):
			f.tagList(w, name, f.kube)

			return
		case strings.HasSuffix(name, "/installer"):
			f.tagList(w, name, f.talos)

			return
		}
	}

	elems := strings.Split(rest, "/")
	if len(elems) < 4 || (elems[0] != installerRepo && elems[0] != secureBootInstallerRepo) {
		f.notFound(w, r)

		return
	}

	id := elems[1]
	if !f.knows(id) {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "no such schematic")

		return
	}

	var tags []string

	switch elems[2] {
	case "manifests":
		if tag := elems[3]; slices.Contains(f.talos, tag) {
			tags = []string{tag}
		}
	case "tags":
		tags = f.talos
	}

	for _, tag := range tags {
		if _, err := f.ensureInstaller(elems[0], id, tag); err != nil {
			f.log.Error("push installer image", zap.String("repository", elems[0]), zap.String("schematic_id", id),
				zap.String("tag", tag), zap.Error(err))
			registryError(w, http.StatusInternalServerError, "UNKNOWN", "installer image unavailable")

			return
		}
	}

	f.reg.ServeHTTP(w, r)
}

func (f *Factory) tagList(w http.ResponseWriter, name string, tags []string) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	writeJSON(w, http.StatusOK, struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{name, tags})
}

// registryError answers as the OCI distribution spec's error body says.
func registryError(w http.ResponseWriter, status int, code, message string) {
	type item struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}

	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	writeJSON(w, status, struct {
		Errors []item `json:"errors"`
	}{[]item{{code, message}}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck
}

// installerRepo is the repository prefix of installer images: installer/<schematic>, as the real factory names
// them on its own host.
const installerRepo = "installer"

// secureBootInstallerRepo is the repository prefix of Secure Boot installer images:
// installer-secureboot/<schematic>, as the real factory names them.
const secureBootInstallerRepo = "installer-secureboot"

// installerPayload is the size of the random file in each installer image's layer, so that pulling and
// relaying it moves a measurable number of bytes.
const installerPayload = 256 << 10

// pushHost names the in-memory registry in the references pushed to it in-process; nothing is dialled.
const pushHost = "127.0.0.1"

// InstallerRepository is the repository of a schematic's installer image on the factory's host
// (installer/<schematic>); its tags are the Talos versions with their v.
func InstallerRepository(schematicID string) string { return installerRepo + "/" + schematicID }

// SecureBootInstallerRepository is the repository of a schematic's Secure Boot installer image on the factory's
// host (installer-secureboot/<schematic>); its tags are the Talos versions with their v.
func SecureBootInstallerRepository(schematicID string) string {
	return secureBootInstallerRepo + "/" + schematicID
}

// InstallerDigest returns the digest ("sha256:...") of the installer image index the factory serves as
// installer/<schematic>:<version> (version with or without its v), pushing it first when needed. The
// schematic must have been created and the version listed.
func (f *Factory) InstallerDigest(schematicID, version string) (string, error) {
	return f.installerDigest(installerRepo, schematicID, version)
}

// SecureBootInstallerDigest is InstallerDigest for the Secure Boot installer image,
// installer-secureboot/<schematic>:<version>: another image, with another digest.
func (f *Factory) SecureBootInstallerDigest(schematicID, version string) (string, error) {
	return f.installerDigest(secureBootInstallerRepo, schematicID, version)
}

func (f *Factory) installerDigest(repo, schematicID, version string) (string, error) {
	tag := canonicalVersion(version)

	if !f.knows(schematicID) {
		return "", fmt.Errorf("%s image for schematic %q: schematic unknown", repo, schematicID)
	}

	if !slices.Contains(f.talos, tag) {
		return "", fmt.Errorf("%s image for talos %s: version not listed", repo, tag)
	}

	return f.ensureInstaller(repo, schematicID, tag)
}

// ensureInstaller pushes <repo>/<id>:<tag> (repo installer or installer-secureboot) to the in-memory registry
// once and returns its index digest.
func (f *Factory) ensureInstaller(repo, id, tag string) (string, error) {
	f.pushMu.Lock()
	defer f.pushMu.Unlock()

	key := repo + "/" + id + ":" + tag
	if d, ok := f.installers[key]; ok {
		return d, nil
	}

	idx, err := installerIndex(repo, id, tag, f.archs)
	if err != nil {
		return "", err
	}

	ref, err := name.NewTag(pushHost+"/"+key, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("installer reference: %w", err)
	}

	if err := remote.WriteIndex(ref, idx, remote.WithTransport(handlerTransport{f.reg})); err != nil {
		return "", fmt.Errorf("push installer %s: %w", key, err)
	}

	digest, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("installer %s digest: %w", key, err)
	}

	f.installers[key] = digest.String()
	f.log.Debug("installer image pushed", zap.String("repository", repo), zap.String("schematic_id", id), zap.String("tag", tag),
		zap.String("digest", digest.String()))

	return digest.String(), nil
}

// installerIndex is an OCI image index with one small image per architecture, its content derived from the
// repository, schematic, tag and architecture only (the same inputs give the same digests).
func installerIndex(repo, id, tag string, archs []string) (v1.ImageIndex, error) {
	adds := make([]mutate.IndexAddendum, 0, len(archs))

	for _, arch := range archs {
		img, err := installerImage(repo, id, tag, arch)
		if err != nil {
			return nil, err
		}

		adds = append(adds, mutate.IndexAddendum{
			Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}

	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...), nil
}

func installerImage(repo, id, tag, arch string) (v1.Image, error) {
	layerTar, err := installerTar(repo, id, tag, arch)
	if err != nil {
		return nil, err
	}

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("installer layer: %w", err)
	}

	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)

	base, err = mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: arch, OS: "linux", RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: []string{"/usr/bin/installer"},
			Labels:     map[string]string{"dev.outpost.fake-image-factory.schematic": id},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("installer config: %w", err)
	}

	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer, History: v1.History{CreatedBy: "fake image factory: " + repo + " " + tag + " " + arch},
	})
	if err != nil {
		return nil, fmt.Errorf("installer image: %w", err)
	}

	return img, nil
}

// installerTar is the installer layer: a script naming what it stands for and a pseudo-random payload seeded
// by the repository, schematic, tag and architecture (the plain installer's seed leaves the repository out, as
// it did before Secure Boot installers).
func installerTar(repo, id, tag, arch string) ([]byte, error) {
	what, in := "installer", id+"\x00"+tag+"\x00"+arch
	if repo != installerRepo {
		what, in = "Secure Boot installer", repo+"\x00"+in
	}

	seed := sha256.Sum256([]byte(in))
	payload := make([]byte, installerPayload)
	rand.NewChaCha8(seed).Read(payload) //nolint:errcheck // never fails

	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"usr/bin/installer", 0o755, []byte(fmt.Sprintf("#!/bin/sh\n# fake Talos %s %s for schematic %s (%s)\n", what, tag, id, arch))},
		{"usr/share/installer/payload", 0o644, payload},
	}

	var buf bytes.Buffer

	tw := tar.NewWriter(&buf)

	for _, file := range files {
		if err := tw.WriteHeader(&tar.Header{
			Name: file.name, Mode: file.mode, Size: int64(len(file.data)), Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		}); err != nil {
			return nil, fmt.Errorf("installer layer: %w", err)
		}

		if _, err := tw.Write(file.data); err != nil {
			return nil, fmt.Errorf("installer layer: %w", err)
		}
	}

	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("installer layer: %w", err)
	}

	return buf.Bytes(), nil
}

// newRegistry is go-containerregistry's in-memory registry, logging at debug level.
func newRegistry(log *zap.Logger) http.Handler {
	std, err := zap.NewStdLogAt(log.With(zap.String("part", "registry")), zap.DebugLevel)
	if err != nil {
		std = stdlog.New(io.Discard, "", 0)
	}

	return ggcrregistry.New(ggcrregistry.Logger(std))
}

// handlerTransport carries requests to an in-process handler (the pushes into the in-memory registry).
type handlerTransport struct {
	h http.Handler
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// A server's handler always gets a body; a client's request may have none.
	in := req.Clone(req.Context())
	if in.Body == nil {
		in.Body = http.NoBody
	}

	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, in)
	in.Body.Close() //nolint:errcheck

	resp := rec.Result()
	resp.Request = req

	return resp, nil
}
