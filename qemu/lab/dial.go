package lab

import (
	"context"
	"net"
)

// DialerIn returns a dialer whose sockets live in the named namespace, so the lab process (in the root
// namespace) reaches services inside the lab without any route from the root namespace.
func DialerIn(ns string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var conn net.Conn

		err := InNetns(ns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)

			return err
		})

		return conn, err
	}
}
