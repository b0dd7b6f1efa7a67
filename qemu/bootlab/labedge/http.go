package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/outpost-metal/outpost/edge/limits"
)

// listenHTTP serves the edge's HTTP routes behind the lab's logging wrapper on :80, within the boot server's
// connection limits as the edge serves them.
type listenHTTP struct {
	handler http.Handler
	limit   func(net.Listener) net.Listener
}

func (l *listenHTTP) run(ctx context.Context) error {
	ln, err := net.Listen("tcp", ":80")
	if err != nil {
		return fmt.Errorf("listen http: %w", err)
	}

	ln = l.limit(ln)

	srv := &http.Server{Handler: l.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ConnState: limits.ConnState}

	go func() {
		<-ctx.Done()
		srv.Close() //nolint:errcheck
	}()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}

	return nil
}
