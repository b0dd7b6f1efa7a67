package httpd

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// AssetFetch is one whole boot asset sent to a machine, or the sending stopped early: what tells a kernel
// download that failed from one that never started.
type AssetFetch struct {
	// Name is the asset's name under /assets/.
	Name   string
	Remote netip.Addr
	// Sent of Size bytes went out; Err says why the sending stopped early (nil when all of it went).
	Sent, Size int64
	Err        error
}

// AssetObserver is told about every whole asset a GET under /assets/ sent, or stopped sending (range requests,
// HEAD and answers other than 200 are not reported). An Observer that is one too is told.
type AssetObserver interface {
	AssetFetch(AssetFetch)
}

// errStoppedEarly is an asset's sending that ended short with no write error seen (the handler gave up).
var errStoppedEarly = errors.New("the response ended early")

// guardAssets wraps the /assets/ handler: a response that can send nothing for stall is ended (the connection
// and the file go back; whole as it is bounded by total), and o (when not nil) is told what each whole-asset
// GET sent.
func guardAssets(o AssetObserver, stall, total time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: stall, end: time.Now().Add(total)}
		h.ServeHTTP(cw, r)

		if o == nil || r.Method != http.MethodGet || r.Header.Get("Range") != "" {
			return
		}

		size, err := strconv.ParseInt(w.Header().Get("Content-Length"), 10, 64)
		if (cw.code != 0 && cw.code != http.StatusOK) || err != nil || size < 0 {
			return
		}

		f := AssetFetch{Name: strings.TrimPrefix(r.URL.Path, "/assets/"), Sent: cw.sent, Size: size, Err: cw.err}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			f.Remote = ap.Addr().Unmap()
		}

		if f.Err == nil && f.Sent < f.Size {
			f.Err = errStoppedEarly
			if cause := r.Context().Err(); cause != nil {
				f.Err = fmt.Errorf("%w: %w", errStoppedEarly, cause)
			}
		}

		o.AssetFetch(f)
	})
}

// countingWriter counts the body bytes written, keeps the first write error and gives each write stall at most.
type countingWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	end   time.Time
	code  int
	sent  int64
	err   error
}

func (c *countingWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}

	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.stall > 0 {
		// Each write may take stall (a chunk, 32 KiB from ServeContent), never past the whole response's end.
		deadline := time.Now().Add(c.stall)
		if deadline.After(c.end) {
			deadline = c.end
		}

		_ = c.rc.SetWriteDeadline(deadline) //nolint:errcheck // not every writer has a connection (tests)
	}

	n, err := c.ResponseWriter.Write(p)
	c.sent += int64(n)

	if err != nil && c.err == nil {
		c.err = err
	}

	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
