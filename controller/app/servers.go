package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/impl/store"
	"github.com/cosi-project/runtime/pkg/state/impl/store/bolt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/resources"
)

// openState returns COSI state whose controller namespace is persisted in a bolt file; other
// namespaces (connection state) live in memory.
func openState(path string) (state.State, func() error, error) {
	backing, err := bolt.NewBackingStore(func() (*bbolt.DB, error) {
		return bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	}, store.ProtobufMarshaler{})
	if err != nil {
		return nil, nil, fmt.Errorf("open state %s: %w", path, err)
	}

	st := state.WrapCore(namespaced.NewState(func(ns resource.Namespace) state.CoreState {
		if ns == resources.Namespace {
			return inmem.NewStateWithOptions(inmem.WithBackingStore(backing.WithNamespace(ns)))(ns)
		}

		return inmem.NewState(ns)
	}))

	return st, backing.Close, nil
}

// listenUnix listens on a unix socket only its owner can use, replacing a stale socket file.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale admin socket: %w", err)
	}

	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}

	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close() //nolint:errcheck

		return nil, fmt.Errorf("admin socket permissions: %w", err)
	}

	return ln, nil
}

// serveGRPC serves the admin API on ln until ctx is done, then stops gracefully.
func serveGRPC(ctx context.Context, srv *grpc.Server, ln net.Listener) error {
	stop := context.AfterFunc(ctx, srv.GracefulStop)
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("admin API: %w", err)
	}

	return nil
}

// newHTTPMux returns the controller's HTTP handlers: /metrics from reg and /healthz.
func newHTTPMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }) //nolint:errcheck

	return mux
}

// serveHTTP serves h on ln until ctx is done, then shuts down, giving requests in flight a few seconds.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}

	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		srv.Shutdown(sctx) //nolint:errcheck
	})
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}

	return nil
}
