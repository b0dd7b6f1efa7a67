// Package app is the edge's composition root: it builds every component from the configuration,
// wires them together and runs them under one errgroup.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/uplink"
)

// Run runs the edge until ctx is done.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	uc := cfg.Uplink
	uc.StateDir = cfg.StateDir

	link, err := uplink.New(uc, uplink.Options{Logger: log})
	if err != nil {
		return err
	}

	httpLn, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }) //nolint:errcheck

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return link.Run(ctx) })
	eg.Go(func() error { return serveHTTP(ctx, httpLn, mux) })

	return eg.Wait()
}

func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
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
