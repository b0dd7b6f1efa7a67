package assets

import (
	"errors"
	"net/http"
	"strings"

	"go.uber.org/zap"
)

// Handler serves cached assets under /assets/: /assets/<sha256> or /assets/<logical name>. It answers GET and
// HEAD with Range, ETag ("sha256:<hex>", strong) and conditional requests via http.ServeContent on the open
// file, so whole-file and range bodies go out with sendfile.
type Handler struct {
	store  *Store
	prefix string
	log    *zap.Logger
}

// NewHandler returns the /assets/ handler for a store; prefix is the path it is mounted on ("/assets/").
func NewHandler(store *Store, prefix string) *Handler {
	return &Handler{store: store, prefix: prefix, log: store.log}
}

// ServeHTTP serves one asset.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)

		return
	}

	key, ok := strings.CutPrefix(r.URL.Path, h.prefix)
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

	f, e, err := h.store.Open(key)
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
			http.NotFound(w, r)

			return
		}

		h.log.Error("open asset", zap.String("asset", key), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}
	defer f.Close() //nolint:errcheck

	h.store.metrics.bytesServed.Inc()

	w.Header().Set("ETag", `"sha256:`+e.SHA256+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")

	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}

	http.ServeContent(w, r, "", fi.ModTime(), f)
}
