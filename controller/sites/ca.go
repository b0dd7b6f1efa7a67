package sites

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/outpost-metal/outpost/shared/atomicfile"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// CA is the controller's enrollment certificate authority. It signs the controller's server certificate
// and one client certificate per enrolled edge, whose common name is the site ID.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	// issued counts the client certificates signed since the CA was loaded.
	issued atomic.Uint64
}

const (
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
	caValidity = 20 * 365 * 24 * time.Hour
)

// LoadOrCreateCA loads the CA from dir, creating it (key mode 0600) on first use.
func LoadOrCreateCA(dir string, now time.Time) (*CA, error) {
	ca, err := loadCA(dir)
	if err == nil {
		return ca, nil
	}

	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA directory: %w", err)
	}

	ca, certPEM, keyPEM, err := NewCA(now)
	if err != nil {
		return nil, err
	}

	// The key is written first and the certificate last: a crash in between leaves no certificate,
	// so the next start creates a fresh pair instead of loading half of one.
	if err := atomicfile.Write(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
		return nil, err
	}

	if err := atomicfile.Write(filepath.Join(dir, caCertFile), certPEM, 0o644); err != nil {
		return nil, err
	}

	return ca, nil
}

// NewCA creates a new CA in memory and returns it with its PEM certificate and key.
func NewCA(now time.Time) (*CA, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generate CA key: %w", err)
	}

	serial, err := newSerial()
	if err != nil {
		return nil, nil, nil, err
	}

	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Outpost enrollment CA", Organization: []string{"outpost"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}

	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse CA certificate: %w", err)
	}

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("marshal CA key: %w", err)
	}

	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})

	return &CA{cert: cert, key: key}, certPEM, keyPEM, nil
}

func loadCA(dir string) (*CA, error) {
	ca, _, _, err := readCAFiles(dir)

	return ca, err
}

// Issued returns how many client certificates the CA has signed since it was loaded or created.
func (ca *CA) Issued() uint64 { return ca.issued.Load() }

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Fingerprint returns the SHA-256 of the CA certificate, as pinned by join tokens.
func (ca *CA) Fingerprint() [sha256.Size]byte { return uplink.CAFingerprint(ca.cert.Raw) }

// ServerCertificate issues the controller's TLS server certificate for uplink.ControllerServerName
// plus any extra names.
func (ca *CA) ServerCertificate(now time.Time, extraNames ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate server key: %w", err)
	}

	serial, err := newSerial()
	if err != nil {
		return tls.Certificate{}, err
	}

	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: uplink.ControllerServerName},
		DNSNames:     append([]string{uplink.ControllerServerName}, extraNames...),
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(2 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("sign server certificate: %w", err)
	}

	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse server certificate: %w", err)
	}

	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// SignClient signs a client certificate for siteID from a DER certificate request.
// The request's subject is ignored: the identity is always the site ID.
func (ca *CA) SignClient(csrDER []byte, siteID string, now time.Time, validity time.Duration) (*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}

	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}

	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
	case interface{ Size() int }: // RSA
		if k.Size() < 256 {
			return nil, errors.New("certificate request: RSA keys must have at least 2048 bits")
		}
	default:
		if csr.PublicKeyAlgorithm != x509.Ed25519 {
			return nil, fmt.Errorf("certificate request: unsupported key type %v", csr.PublicKeyAlgorithm)
		}
	}

	serial, err := newSerial()
	if err != nil {
		return nil, err
	}

	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: siteID, Organization: []string{"outpost-site"}},
		// Backdated for clock skew, but by little enough that the edge's renewal at two thirds of
		// the lifetime stays in the future even for short-lived certificates.
		NotBefore:   now.Add(-min(5*time.Minute, validity/10)),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign client certificate: %w", err)
	}

	ca.issued.Add(1)

	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse client certificate: %w", err)
	}

	return cert, nil
}

// VerifyClient checks a client certificate chain against the CA and returns the leaf.
func (ca *CA) VerifyClient(chain []*x509.Certificate, now time.Time) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("no client certificate")
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)

	if _, err := chain[0].Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}

	return chain[0], nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}

	return serial, nil
}
