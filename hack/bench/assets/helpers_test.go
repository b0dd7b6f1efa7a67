package assetsbench_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeRandomFile writes size random bytes to dir/<sha256> and returns the digest.
func writeRandomFile(tb testing.TB, dir string, size int64) string {
	tb.Helper()

	tmp := filepath.Join(dir, "tmp")
	f, err := os.Create(tmp)
	require.NoError(tb, err)

	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, h), rand.Reader, size)
	require.NoError(tb, err)
	require.NoError(tb, f.Close())

	digest := hex.EncodeToString(h.Sum(nil))
	require.NoError(tb, os.Rename(tmp, filepath.Join(dir, digest)))

	return digest
}

// cutListener wraps a listener so a test can cut every connection it accepted once the server has written
// cutAfter bytes on one of them (once).
type cutListener struct {
	net.Listener

	cutAfter int64
	cuts     atomic.Int32

	mu    sync.Mutex
	conns []net.Conn
}

func (l *cutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}

	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()

	return &cutConn{Conn: c, l: l}, nil
}

func (l *cutListener) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()

	for _, c := range l.conns {
		c.Close() //nolint:errcheck
	}

	l.conns = nil
}

type cutConn struct {
	net.Conn

	l       *cutListener
	written atomic.Int64
}

func (c *cutConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)

	if c.written.Add(int64(n)) > c.l.cutAfter && c.l.cuts.CompareAndSwap(0, 1) {
		c.l.cutAll()
	}

	return n, err
}

// selfSigned returns a TLS server config with a fresh certificate for 127.0.0.1 and a client config trusting it.
func selfSigned(tb testing.TB) (*tls.Config, *tls.Config) {
	tb.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)

	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "bench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)

	cert, err := x509.ParseCertificate(der)
	require.NoError(tb, err)

	pool := x509.NewCertPool()
	pool.AddCert(cert)

	srv := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	cli := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1"}

	return srv, cli
}
