package testagent_test

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// httpServer runs an http.Server with timeouts on a caller's listener.
type httpServer struct {
	srv  *http.Server
	done chan struct{}
	once sync.Once
}

func (h *httpServer) start(ln net.Listener, handler http.Handler) {
	h.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	h.done = make(chan struct{})

	go func() {
		defer close(h.done)

		_ = h.srv.Serve(ln) //nolint:errcheck // ErrServerClosed on stop
	}()
}

func (h *httpServer) stop() {
	h.once.Do(func() {
		h.srv.Close() //nolint:errcheck
		<-h.done
	})
}
