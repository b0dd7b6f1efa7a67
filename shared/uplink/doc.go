// Package uplink holds the transport mechanics both ends of the uplink share:
// the hello frame that opens a connection, the join token, the TLS names and pinning,
// and the yamux session that carries gRPC in both directions.
//
// The edge always dials. After TLS 1.3 it sends a Hello frame; the controller answers with a
// HelloReply frame and, when it accepts, both sides run a yamux session over the TLS connection.
// Each side serves gRPC on the streams the other side opens and dials the other side by opening streams.
package uplink
