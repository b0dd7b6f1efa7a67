package linklab_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// benchService answers EmptyCall and streams StreamingOutputCall payloads of the requested sizes.
type benchService struct {
	testgrpc.UnimplementedTestServiceServer

	chunk []byte
}

func (benchService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (s benchService) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	for range req.GetResponseParameters() {
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: s.chunk}}); err != nil {
			return err
		}
	}

	return nil
}

const (
	chunkSize   = 64 << 10
	streamBytes = 64 << 20
)

// uplinkClient returns a TestService client that reaches an edge through a real uplink on loopback.
func uplinkClient(b *testing.B) testgrpc.TestServiceClient {
	b.Helper()

	svc := benchService{chunk: make([]byte, chunkSize)}
	ctrl := linklab.StartController(b, linklab.ControllerOptions{Logger: zap.NewNop()})
	linklab.StartEdge(b, ctrl.Addr, ctrl.CreateSite(b, "bench", sites.TokenOptions{}), linklab.EdgeOptions{Options: edgeuplink.Options{
		Logger:   zap.NewNop(),
		Register: []func(grpc.ServiceRegistrar){func(s grpc.ServiceRegistrar) { testgrpc.RegisterTestServiceServer(s, svc) }},
	}})

	return testgrpc.NewTestServiceClient(ctrl.WaitConnected(b, "bench"))
}

// tlsPair returns server and client TLS configurations from a throwaway CA, as the uplink uses.
func tlsPair(b *testing.B) (*tls.Config, *tls.Config) {
	b.Helper()

	ca, _, _, err := sites.NewCA(time.Now())
	require.NoError(b, err)

	cert, err := ca.ServerCertificate(time.Now())
	require.NoError(b, err)

	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())

	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}},
		&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: uplink.ControllerServerName}
}

// plainClient returns a TestService client over plain gRPC with TLS on loopback: the peer to beat.
func plainClient(b *testing.B) testgrpc.TestServiceClient {
	b.Helper()

	serverTLS, clientTLS := tlsPair(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)

	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	testgrpc.RegisterTestServiceServer(srv, benchService{chunk: make([]byte, chunkSize)})

	go srv.Serve(ln) //nolint:errcheck

	b.Cleanup(srv.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() }) //nolint:errcheck

	return testgrpc.NewTestServiceClient(conn)
}

// BenchmarkUnaryRoundTrip compares a unary call controller -> edge over the uplink with plain gRPC over TLS.
// It reports p50 and p99 latency besides ns/op.
func BenchmarkUnaryRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name   string
		client func(*testing.B) testgrpc.TestServiceClient
	}{
		{"uplink", uplinkClient},
		{"grpc-tls", plainClient},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := tc.client(b)
			ctx := context.Background()

			_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
			require.NoError(b, err)

			lat := make([]time.Duration, 0, b.N)

			b.ResetTimer()

			for range b.N {
				start := time.Now()

				if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
					b.Fatal(err)
				}

				lat = append(lat, time.Since(start))
			}

			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkBulkStream compares streaming 64 MiB edge -> controller over the uplink (gRPC in yamux in TLS)
// with gRPC over TLS and with the raw TLS connection the uplink rides on.
func BenchmarkBulkStream(b *testing.B) {
	req := &testgrpc.StreamingOutputCallRequest{ResponseParameters: make([]*testgrpc.ResponseParameters, streamBytes/chunkSize)}

	for _, tc := range []struct {
		name   string
		client func(*testing.B) testgrpc.TestServiceClient
	}{
		{"uplink", uplinkClient},
		{"grpc-tls", plainClient},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := tc.client(b)

			b.SetBytes(streamBytes)
			b.ResetTimer()

			for range b.N {
				stream, err := client.StreamingOutputCall(context.Background(), req)
				require.NoError(b, err)

				for {
					_, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						break
					}

					require.NoError(b, err)
				}
			}
		})
	}

	b.Run("raw-tls", func(b *testing.B) {
		serverTLS, clientTLS := tlsPair(b)
		ln, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
		require.NoError(b, err)
		b.Cleanup(func() { ln.Close() }) //nolint:errcheck

		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}

				go func() {
					defer conn.Close() //nolint:errcheck

					chunk := make([]byte, chunkSize)
					for range streamBytes / chunkSize {
						if _, err := conn.Write(chunk); err != nil {
							return
						}
					}
				}()
			}
		}()

		b.SetBytes(streamBytes)
		b.ResetTimer()

		for range b.N {
			conn, err := tls.Dial("tcp", ln.Addr().String(), clientTLS)
			require.NoError(b, err)

			n, err := io.Copy(io.Discard, conn)
			require.NoError(b, err)
			require.EqualValues(b, streamBytes, n)
			conn.Close() //nolint:errcheck
		}
	})
}
