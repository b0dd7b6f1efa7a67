package httpd

import (
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the HTTP server's counters.
type metrics struct {
	requests *prometheus.CounterVec
	rejected *prometheus.CounterVec
	served   *prometheus.CounterVec
}

func newMetrics() metrics {
	return metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_http_requests_total", Help: "HTTP requests, by handler and status code.",
		}, []string{"handler", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_http_rejected_total", Help: "HTTP requests refused for bad input, by reason.",
		}, []string{"reason"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_ipxe_boot_served_total", Help: "boot.ipxe answers, by boot mode.",
		}, []string{"mode"}),
	}
}

func (m metrics) register(reg prometheus.Registerer, more ...prometheus.Collector) error {
	for _, c := range append([]prometheus.Collector{m.requests, m.rejected, m.served}, more...) {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register http metrics: %w", err)
		}
	}

	return nil
}

// count counts the requests h answers by status code under the handler's name.
func (m metrics) count(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)

		if rec.code == 0 {
			rec.code = http.StatusOK
		}

		m.requests.WithLabelValues(name, strconv.Itoa(rec.code)).Inc()
	})
}

// statusRecorder notes the status code of a response for count.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}

	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}

	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// ReadFrom keeps the underlying writer's sendfile path for asset bodies.
func (r *statusRecorder) ReadFrom(src io.Reader) (int64, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}

	if rf, ok := r.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}

	return io.Copy(struct{ io.Writer }{r.ResponseWriter}, src)
}
