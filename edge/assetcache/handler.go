package assetcache

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"

	"go.uber.org/zap"
)

// Prefix is the path the edge serves its assets under: /assets/<sha256> or /assets/<logical name>.
const Prefix = "/assets/"

// Handler is the one owner of /assets/ on the edge. A name the cache holds (by digest or logical name) is
// served from the cache; any other name from the files directory, plain files an operator placed there
// (<state>/files: agent images for an air-gapped site, a lab's kernels). Names follow ValidateName in both
// places, so the boot scripts, the cache and the directory agree on what a name is.
//
// It answers GET and HEAD with Range and conditional requests via http.ServeContent on the open file, so whole
// and ranged bodies go out with sendfile. A cached asset's ETag is "sha256:<hex>" (strong, and it may be
// cached for good); a plain file's is its size and modification time.
type Handler struct {
	store *Store
	files *os.Root
	log   *zap.Logger
}

// NewHandler returns the /assets/ handler over a store and a files directory (created when missing). Close
// releases the directory.
func NewHandler(store *Store, filesDir string) (*Handler, error) {
	if err := os.MkdirAll(filesDir, 0o755); err != nil {
		return nil, fmt.Errorf("create files directory: %w", err)
	}

	files, err := os.OpenRoot(filesDir)
	if err != nil {
		return nil, fmt.Errorf("open files directory: %w", err)
	}

	return &Handler{store: store, files: files, log: store.log}, nil
}

// Close releases the files directory.
func (h *Handler) Close() error { return h.files.Close() }

// Has reports whether the edge serves /assets/<name> now: the cache holds it or the files directory has a
// regular file by that name.
func (h *Handler) Has(name string) bool {
	if ValidateDigest(name) != nil && ValidateName(name) != nil {
		return false
	}

	if h.store.Has(name) {
		return true
	}

	st, err := h.files.Stat(name)

	return err == nil && st.Mode().IsRegular()
}

// ServeHTTP serves one asset.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)

		return
	}

	key, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.NotFound(w, r)

		return
	}

	if ValidateDigest(key) != nil {
		if err := ValidateName(key); err != nil {
			h.store.metrics.errors.WithLabelValues("bad_name").Inc()
			h.log.Debug("refusing asset request", zap.String("path", r.URL.Path), zap.Error(err))
			http.Error(w, "invalid asset name", http.StatusBadRequest)

			return
		}
	}

	f, digest, err := h.store.Open(key)

	switch {
	case err == nil:
		w.Header().Set("ETag", `"sha256:`+digest+`"`)
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt):
		if f, err = h.openFile(key); err != nil {
			http.NotFound(w, r)

			return
		}
	default:
		h.log.Error("open asset", zap.String("asset", key), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}
	defer f.Close() //nolint:errcheck

	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}

	if digest == "" { // a plain file of the files directory
		w.Header().Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.Size(), fi.ModTime().UnixNano()))
	}

	h.store.metrics.bytesServed.Inc()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// Open opens an asset by name as /assets/<name> would serve it: the cache's, else the files directory's.
func (h *Handler) Open(name string) (*os.File, error) {
	if ValidateDigest(name) != nil {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
	}

	f, _, err := h.store.Open(name)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
		return h.openFile(name)
	}

	return f, err
}

// openFile opens a regular file of the files directory (the root keeps the name inside it).
func (h *Handler) openFile(name string) (*os.File, error) {
	f, err := h.files.Open(name)
	if err != nil {
		return nil, err
	}

	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close() //nolint:errcheck

		return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}

	return f, nil
}
