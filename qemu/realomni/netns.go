package realomni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on an OS thread switched into the named network namespace (empty: fn runs as is), so the
// sockets fn opens live there. When switching back fails the thread stays locked and the runtime discards it.
func inNetns(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}

	errc := make(chan error, 1)

	go func() {
		runtime.LockOSThread()

		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("open own network namespace: %w", err)

			return
		}
		defer orig.Close() //nolint:errcheck

		target, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- fmt.Errorf("open network namespace %s: %w", ns, err)

			return
		}
		defer target.Close() //nolint:errcheck

		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", ns, err)

			return
		}

		ferr := fn()

		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave network namespace %s: %w", ns, err))

			return
		}

		runtime.UnlockOSThread()

		errc <- ferr
	}()

	return <-errc
}

// listenIn opens a TCP listener on addr inside the named network namespace (empty: the current one).
func listenIn(ctx context.Context, ns, addr string) (net.Listener, error) {
	var ln net.Listener

	err := inNetns(ns, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", addr)

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}

	return ln, nil
}

// dialIn dials addr over TCP from inside the named network namespace (empty: the current one).
func dialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	var conn net.Conn

	err := inNetns(ns, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)

		return err
	})

	return conn, err
}
