package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// forwardStatusPage forwards a port on the host's loopback (listen when free, else any port) to the
// controller's status page inside the core namespace, for as long as ctx lasts, and returns the page's
// address on the host.
func forwardStatusPage(ctx context.Context, coreNS, listen string) (string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
	if err != nil {
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	}

	if err != nil {
		return "", fmt.Errorf("status page forward: %w", err)
	}

	dial := lab.DialerIn(coreNS)
	target := fmt.Sprintf("127.0.0.1:%d", lab.ControllerHTTPPort)

	go forward(ctx, ln, func(ctx context.Context) (net.Conn, error) { return dial(ctx, target) })

	return "http://" + ln.Addr().String() + "/status/", nil
}

// forward accepts on ln until ctx ends (then closes it) and copies each connection to one dial opens.
func forward(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error)) {
	context.AfterFunc(ctx, func() { ln.Close() }) //nolint:errcheck

	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}

		go func() {
			defer c.Close() //nolint:errcheck

			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			up, err := dial(dctx)

			cancel()

			if err != nil {
				return
			}
			defer up.Close() //nolint:errcheck

			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() }) //nolint:errcheck
			defer stop()

			go func() {
				io.Copy(up, c) //nolint:errcheck
				up.Close()     //nolint:errcheck
			}()

			io.Copy(c, up) //nolint:errcheck
		}()
	}
}
