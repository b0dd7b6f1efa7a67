package uplink

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outpost-metal/outpost/shared/atomicfile"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// Files of the edge's identity in its state directory. All are mode 0600.
const (
	keyFile  = "uplink.key"
	certFile = "uplink.crt"
	caFile   = "uplink-ca.crt"
)

// ErrNoIdentity means the edge has not enrolled yet.
var ErrNoIdentity = errors.New("edge not enrolled (no certificate in the state directory)")

// Identity is what an enrolled edge proves itself with: its key and certificate, and the controller's CA.
type Identity struct {
	SiteID string
	Cert   tls.Certificate
	CA     *x509.Certificate
}

// LoadIdentity reads the identity from dir; ErrNoIdentity when the edge has not enrolled.
func LoadIdentity(dir string) (*Identity, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, certFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoIdentity
	}

	if err != nil {
		return nil, fmt.Errorf("read edge certificate: %w", err)
	}

	keyPEM, err := os.ReadFile(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, fmt.Errorf("read edge key: %w", err)
	}

	caPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, fmt.Errorf("read controller CA: %w", err)
	}

	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load edge key pair from %s: %w", dir, err)
	}

	block, _ := pem.Decode(caPEM)
	if block == nil {
		return nil, fmt.Errorf("controller CA in %s is not PEM", dir)
	}

	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse controller CA: %w", err)
	}

	return &Identity{SiteID: cert.Leaf.Subject.CommonName, Cert: cert, CA: ca}, nil
}

// saveIdentity writes key, certificate and CA atomically, certificate last: the certificate's presence
// means the identity is complete.
func saveIdentity(dir string, keyPEM, certDER, caDER []byte) (*Identity, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}

	files := []struct {
		name string
		data []byte
	}{
		{keyFile, keyPEM},
		{caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})},
		{certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})},
	}

	for _, f := range files {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return nil, fmt.Errorf("save edge identity: %w", err)
		}
	}

	return LoadIdentity(dir)
}

// newKeyAndCSR generates a key and a DER certificate request for the site.
func newKeyAndCSR(siteID string) (keyPEM, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate edge key: %w", err)
	}

	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: siteID},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate request: %w", err)
	}

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal edge key: %w", err)
	}

	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), csrDER, nil
}

// ControllerFingerprint returns the SHA-256 (hex) of the CA of the controller the edge in dir is enrolled
// with, or "" when it is not enrolled yet.
func ControllerFingerprint(dir string) (string, error) {
	id, err := LoadIdentity(dir)
	if errors.Is(err, ErrNoIdentity) {
		return "", nil
	}

	if err != nil {
		return "", err
	}

	sum := uplink.CAFingerprint(id.CA.Raw)

	return hex.EncodeToString(sum[:]), nil
}
