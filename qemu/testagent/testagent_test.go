package testagent_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/qemu/testagent"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const machineID = "8a1f4c2e-5b6d-4e7f-9a0b-1c2d3e4f5a6b"

// selfSigned returns a server certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edge"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)

	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)

	pool := x509.NewCertPool()
	pool.AddCert(cert)

	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestAgentOverTLSTunnel(t *testing.T) {
	t.Parallel()

	log := zaptest.NewLogger(t)
	edge := tunnel.New(tunnel.Options{Logger: log, Binding: tunnel.BindOff})

	cert, pool := selfSigned(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	edgeDone := make(chan error, 1)

	go func() {
		edgeDone <- edge.ServeTLS(ctx, ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}()

	dir := t.TempDir()
	disks := []string{filepath.Join(dir, "vda"), filepath.Join(dir, "vdb")}

	for _, d := range disks {
		require.NoError(t, os.WriteFile(d, bytes.Repeat([]byte{0xAB}, 3<<20), 0o600))
	}

	ipmi := &testagent.IPMI{Address: "10.5.0.3", Port: 623}

	agent, err := testagent.New(testagent.Config{
		Endpoint:  "https://" + ln.Addr().String(),
		TLS:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MachineID: machineID,
		Disks:     disks,
		IPMI:      ipmi,
		Logger:    log,
	})
	require.NoError(t, err)

	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)

	go func() { agentDone <- agent.Run(agentCtx) }()

	require.Eventually(t, func() bool { return edge.Connected(machineID) }, 10*time.Second, 10*time.Millisecond)

	client := agentpb.NewAgentServiceClient(edge.Channel(machineID))
	callCtx := metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, machineID)

	_, err = client.Hello(callCtx, &agentpb.HelloRequest{})
	require.NoError(t, err)

	pm, err := client.GetPowerManagement(callCtx, &agentpb.GetPowerManagementRequest{Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: "outpost"}})
	require.NoError(t, err)
	require.False(t, pm.GetIpmi().GetUserExists())
	require.Equal(t, "10.5.0.3", pm.GetIpmi().GetAddress())

	_, err = client.SetPowerManagement(callCtx, &agentpb.SetPowerManagementRequest{Ipmi: &agentpb.SetPowerManagementRequest_IPMI{Username: "outpost", Password: "s3cret-s3cret-16"}})
	require.NoError(t, err)

	pw, ok := ipmi.Password("outpost")
	require.True(t, ok)
	require.Equal(t, "s3cret-s3cret-16", pw)

	// Fast wipe clears both ends; zeroes clears everything.
	_, err = client.WipeDisks(callCtx, &agentpb.WipeDisksRequest{})
	require.NoError(t, err)

	data, err := os.ReadFile(disks[0])
	require.NoError(t, err)
	require.Equal(t, make([]byte, 1<<20), data[:1<<20])
	require.Equal(t, byte(0xAB), data[(3<<20)/2])

	_, err = client.WipeDisks(callCtx, &agentpb.WipeDisksRequest{Zeroes: true})
	require.NoError(t, err)

	for _, d := range disks {
		data, err := os.ReadFile(d)
		require.NoError(t, err)
		require.Equal(t, make([]byte, 3<<20), data, "%s is all zeroes", d)
	}

	stopAgent()
	require.NoError(t, <-agentDone)
	require.Eventually(t, func() bool { return !edge.Connected(machineID) }, 5*time.Second, 10*time.Millisecond)

	cancel()
	require.NoError(t, <-edgeDone)
}

func TestAgentRefusesUntrustedEdge(t *testing.T) {
	t.Parallel()

	log := zaptest.NewLogger(t)
	edge := tunnel.New(tunnel.Options{Logger: log, Binding: tunnel.BindOff})
	cert, _ := selfSigned(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())

	edgeDone := make(chan error, 1)

	go func() {
		edgeDone <- edge.ServeTLS(ctx, ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}()

	agent, err := testagent.New(testagent.Config{
		Endpoint:  "https://" + ln.Addr().String(),
		TLS:       &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12},
		MachineID: machineID,
		Logger:    log,
	})
	require.NoError(t, err)

	require.Error(t, agent.RunOnce(ctx))
	require.False(t, edge.Connected(machineID))

	cancel()
	require.NoError(t, <-edgeDone)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()

	_, err := testagent.New(testagent.Config{})
	require.Error(t, err)

	_, err = testagent.New(testagent.Config{Endpoint: "127.0.0.1:1", MachineID: machineID})
	require.ErrorContains(t, err, "logger")
}
