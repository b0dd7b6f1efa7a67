// Package registry is the edge's read-only OCI registry: the pull half of the OCI distribution API (v1.1,
// what containerd, skopeo and go-containerregistry use) served under /v2/ from the edge's content-addressed
// cache (edge/assetcache), so machines of an air-gapped site pull the Talos installer from their edge through
// a registry mirror.
//
// The controller pulls an image once and relays its content like any boot asset, under the logical names of
// shared/ocinames: a manifest by tag as oci/<repo>/manifests/<tag>, every blob and child manifest as
// oci/<repo>/blobs/<hex>. The registry serves only what is held under those names: a digest is served for a
// repository only when the repository's blob name points at it, or, for a manifest, when one of the
// repository's tags does (containerd resolves a tag, then fetches the manifest by digest), so the machines'
// kernels and other repositories' content are not reachable by digest.
//
// Writes (PUT, POST, PATCH, DELETE) are refused with 405 UNSUPPORTED. A manifest is answered with its own
// media type; a client whose Accept header does not admit it gets 404 MANIFEST_UNKNOWN (no conversion
// between Docker and OCI formats). containerd's mirror query (?ns=<upstream host>) is ignored: a repository
// is named without its host.
package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

// Store is the cache the registry serves from (edge/assetcache.Store).
type Store interface {
	// Open opens a cached asset by logical name and returns its digest; assetcache.ErrNotFound or
	// assetcache.ErrCorrupt when it has none.
	Open(key string) (*os.File, string, error)
	// Lookup describes a cached asset by digest, with its logical names.
	Lookup(key string) (assetcache.Entry, error)
	// List returns every cached asset with its logical names.
	List() ([]assetcache.Entry, int64)
}

// Bounds of the tag listing: it walks the whole cache index, so few run at once, and a page holds at most
// maxTagsPage tags (the spec's n and last page through more).
const (
	maxTagListings = 2
	maxTagsPage    = 1000
)

// Handler serves the registry under Prefix. Mount it at /v2/ for every method, so writes get the spec's
// error rather than the mux's.
type Handler struct {
	store   Store
	log     *zap.Logger
	metrics metrics
	// listings bounds the tag listings running at once.
	listings chan struct{}
}

// New returns the registry over a store.
func New(store Store, log *zap.Logger) *Handler {
	if store == nil {
		panic("registry: nil store")
	}

	return &Handler{
		store:    store,
		log:      log.With(zap.String("component", "registry")),
		metrics:  newMetrics(),
		listings: make(chan struct{}, maxTagListings),
	}
}

// ServeHTTP answers one request of the pull API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")

	t, err := parsePath(r.URL.EscapedPath())
	label := routeLabel(t.route)

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.count(label, outcomeUnsupported)
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, codeUnsupported, "this registry is read-only")

		return
	}

	if err != nil {
		h.refuseBadPath(w, r, t, err)

		return
	}

	switch t.route {
	case routeBase:
		h.count(label, outcomeServed)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("{}\n")) //nolint:errcheck // the client went away
	case routeManifest:
		h.serveManifest(w, r, t)
	case routeBlob:
		h.serveBlob(w, r, t)
	case routeTags:
		h.serveTags(w, r, t)
	}
}

// refuseBadPath answers a path parsePath refused.
func (h *Handler) refuseBadPath(w http.ResponseWriter, r *http.Request, t target, err error) {
	h.log.Debug("refusing registry request", zap.String("path", r.URL.EscapedPath()), zap.Error(err))

	switch {
	case errors.Is(err, errUnknownPath):
		h.count(labelOther, outcomeUnsupported)
		writeError(w, http.StatusNotFound, codeUnsupported, "not an endpoint of this registry")
	case errors.Is(err, ocinames.ErrBadDigest):
		h.count(routeLabel(t.route), outcomeInvalid)
		writeError(w, http.StatusBadRequest, codeDigestInvalid, "only sha256:<64 lower-case hex> digests are supported")
	case errors.Is(err, errBadTag):
		h.count(labelManifest, outcomeInvalid)
		writeError(w, http.StatusBadRequest, codeManifestUnknown, "invalid tag")
	default: // errBadPath, ocinames.ErrBadRepository
		h.count(labelOther, outcomeInvalid)
		writeError(w, http.StatusBadRequest, codeNameInvalid, "invalid repository name or path")
	}
}

// open opens what a logical name of repo holds. byDigest is the hex the name's digest must have, "" for a
// tag. It answers the request itself when there is nothing to serve.
func (h *Handler) open(w http.ResponseWriter, label, name, byDigest, unknownCode string) (*os.File, string, bool) {
	f, digest, err := h.store.Open(name)

	switch {
	case err == nil:
	case errors.Is(err, assetcache.ErrNotFound):
		h.count(label, outcomeUnknown)
		writeError(w, http.StatusNotFound, unknownCode, "not held by this edge")

		return nil, "", false
	case errors.Is(err, assetcache.ErrCorrupt):
		h.log.Warn("cached OCI content is corrupt, dropped", zap.String("asset", name), zap.Error(err))
		h.count(label, outcomeCorrupt)
		writeError(w, http.StatusNotFound, unknownCode, "not held by this edge")

		return nil, "", false
	default:
		h.log.Error("open cached OCI content", zap.String("asset", name), zap.Error(err))
		h.count(label, outcomeError)
		writeError(w, http.StatusInternalServerError, codeUnknown, "cache failure")

		return nil, "", false
	}

	if byDigest != "" && digest != byDigest {
		f.Close() //nolint:errcheck
		h.log.Warn("cached OCI name points at another digest, not served", zap.String("asset", name), zap.String("sha256", digest))
		h.count(label, outcomeCorrupt)
		writeError(w, http.StatusNotFound, unknownCode, "not held by this edge")

		return nil, "", false
	}

	return f, digest, true
}

// serveManifest answers GET and HEAD of a manifest or index, by tag or digest, with its stored bytes.
func (h *Handler) serveManifest(w http.ResponseWriter, r *http.Request, t target) {
	name := ocinames.ManifestName(t.repo, t.tag)
	if t.hex != "" {
		name = ocinames.BlobName(t.repo, t.hex)

		if tagged, ok := h.taggedManifest(t.repo, t.hex); ok {
			name = tagged
		}
	}

	f, digest, ok := h.open(w, labelManifest, name, t.hex, codeManifestUnknown)
	if !ok {
		return
	}

	data, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	f.Close() //nolint:errcheck

	switch {
	case err != nil:
		h.log.Error("read cached manifest", zap.String("asset", name), zap.Error(err))
		h.count(labelManifest, outcomeError)
		writeError(w, http.StatusInternalServerError, codeUnknown, "cache failure")

		return
	case len(data) > MaxManifestBytes:
		h.count(labelManifest, outcomeRefused)
		writeError(w, http.StatusNotFound, codeManifestUnknown, fmt.Sprintf("larger than %d bytes: not a manifest served here", MaxManifestBytes))

		return
	}

	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
		h.log.Warn("cached manifest does not match its digest, not served", zap.String("asset", name), zap.String("sha256", digest))
		h.count(labelManifest, outcomeCorrupt)
		writeError(w, http.StatusNotFound, codeManifestUnknown, "not held by this edge")

		return
	}

	mediaType, err := mediaTypeOf(data)
	if err != nil {
		h.log.Debug("refusing manifest request", zap.String("asset", name), zap.Error(err))
		h.count(labelManifest, outcomeRefused)
		writeError(w, http.StatusNotFound, codeManifestUnknown, "not an image manifest or index")

		return
	}

	if !accepts(r.Header.Values("Accept"), mediaType) {
		h.count(labelManifest, outcomeRefused)
		writeError(w, http.StatusNotFound, codeManifestUnknown, "held only as "+mediaType+", which the request does not accept")

		return
	}

	h.count(labelManifest, outcomeServed)
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", "sha256:"+digest)
	w.Header().Set("ETag", `"sha256:`+digest+`"`)

	if t.hex != "" {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	}

	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

// taggedManifest returns the name of a tag of repo pointing at the digest hex, when the repository's blob name
// does not hold it: a manifest the controller relayed by tag only is still served by its digest.
func (h *Handler) taggedManifest(repo, hex string) (string, bool) {
	blob := ocinames.BlobName(repo, hex)

	e, err := h.store.Lookup(hex)
	if err != nil || slices.Contains(e.Names, blob) {
		return "", false
	}

	for _, name := range e.Names {
		if _, ok := ocinames.TagOf(repo, name); ok {
			return name, true
		}
	}

	return "", false
}

// serveBlob answers GET and HEAD of a blob with the cached file (Range and conditional requests, sendfile).
func (h *Handler) serveBlob(w http.ResponseWriter, r *http.Request, t target) {
	f, digest, ok := h.open(w, labelBlob, ocinames.BlobName(t.repo, t.hex), t.hex, codeBlobUnknown)
	if !ok {
		return
	}
	defer f.Close() //nolint:errcheck

	h.count(labelBlob, outcomeServed)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", "sha256:"+digest)
	w.Header().Set("ETag", `"sha256:`+digest+`"`)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	http.ServeContent(w, r, "", time.Time{}, f)
}

// serveTags answers the tag listing of a repository (spec: "Listing Tags", with n and last).
func (h *Handler) serveTags(w http.ResponseWriter, r *http.Request, t target) {
	n := maxTagsPage

	q := r.URL.Query()
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			h.count(labelTags, outcomeInvalid)
			writeError(w, http.StatusBadRequest, codeUnsupported, "n must be a non-negative integer")

			return
		}

		n = min(v, maxTagsPage)
	}

	last := q.Get("last")

	select {
	case h.listings <- struct{}{}:
	default:
		h.count(labelTags, outcomeBusy)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, codeTooManyRequests, "too many tag listings at once")

		return
	}

	tags := h.tags(t.repo)
	<-h.listings

	if len(tags) == 0 {
		h.count(labelTags, outcomeUnknown)
		writeError(w, http.StatusNotFound, codeNameUnknown, "no tags held for this repository")

		return
	}

	if last != "" {
		i, found := slices.BinarySearch(tags, last)
		if found {
			i++
		}

		tags = tags[i:]
	}

	if len(tags) > n {
		tags = tags[:n]

		if n > 0 {
			next := url.Values{"n": {strconv.Itoa(n)}, "last": {tags[n-1]}}
			w.Header().Set("Link", fmt.Sprintf(`<%s%s/tags/list?%s>; rel="next"`, Prefix, t.repo, next.Encode()))
		}
	}

	body, err := json.Marshal(struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{Name: t.repo, Tags: append([]string{}, tags...)})
	if err != nil {
		h.count(labelTags, outcomeError)
		writeError(w, http.StatusInternalServerError, codeUnknown, "encode tags")

		return
	}

	h.count(labelTags, outcomeServed)
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(body, '\n')) //nolint:errcheck // the client went away
}

// tags returns the tags held for repo, sorted.
func (h *Handler) tags(repo string) []string {
	entries, _ := h.store.List()

	var tags []string

	for _, e := range entries {
		for _, name := range e.Names {
			if tag, ok := ocinames.TagOf(repo, name); ok {
				tags = append(tags, tag)
			}
		}
	}

	slices.Sort(tags)

	return slices.Compact(tags)
}

func (h *Handler) count(route, outcome string) {
	h.metrics.requests.WithLabelValues(route, outcome).Inc()
}

func routeLabel(r route) string {
	switch r {
	case routeBase:
		return labelBase
	case routeManifest:
		return labelManifest
	case routeBlob:
		return labelBlob
	case routeTags:
		return labelTags
	default:
		return labelOther
	}
}
