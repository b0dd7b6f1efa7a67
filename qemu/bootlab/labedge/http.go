package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// listenHTTP serves the edge's HTTP routes behind the lab's logging wrapper on :80.
type listenHTTP struct {
	handler http.Handler
}

func (l *listenHTTP) run(ctx context.Context) error {
	ln, err := net.Listen("tcp", ":80")
	if err != nil {
		return fmt.Errorf("listen http: %w", err)
	}

	srv := &http.Server{Handler: l.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}

	go func() {
		<-ctx.Done()
		srv.Close() //nolint:errcheck
	}()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}

	return nil
}
