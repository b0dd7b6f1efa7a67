package realomni

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/ProtonMail/gopenpgp/v3/crypto"
)

// certValidity is how long the generated CA and server certificate are valid.
const certValidity = 5 * 365 * 24 * time.Hour

// tlsFiles are the paths of Omni's TLS material in its directory.
type tlsFiles struct {
	CA, Cert, Key string
}

// ensureTLS writes a CA and a server certificate for ip and localhost (signed by it) unless the directory
// already holds a server certificate valid for ip, and returns the CA certificate in PEM.
func ensureTLS(files tlsFiles, ip string, rnd io.Reader, now time.Time) ([]byte, error) {
	if caPEM, err := os.ReadFile(files.CA); err == nil && certCovers(files.Cert, ip, now) {
		return caPEM, nil
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}

	caTmpl := &x509.Certificate{
		SerialNumber:          serial(rnd),
		Subject:               pkix.Name{CommonName: "outpost realomni CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}

	caDER, err := x509.CreateCertificate(rnd, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}

	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, fmt.Errorf("generate server key: %w", err)
	}

	tmpl := &x509.Certificate{
		SerialNumber: serial(rnd),
		Subject:      pkix.Name{CommonName: ip},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		DNSNames:     []string{"localhost"},
	}

	der, err := x509.CreateCertificate(rnd, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create server certificate: %w", err)
	}

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal server key: %w", err)
	}

	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	certPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), caPEM...)

	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{files.Key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{files.Cert, certPEM, 0o644},
		{files.CA, caPEM, 0o644},
	} {
		if err := writeFileAtomic(f.path, f.data, f.mode); err != nil {
			return nil, err
		}
	}

	return caPEM, nil
}

// certCovers reports whether the PEM certificate at path is valid for ip at now.
func certCovers(path, ip string, now time.Time) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}

	block, _ := pem.Decode(b)
	if block == nil {
		return false
	}

	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}

	return cert.VerifyHostname(ip) == nil && now.After(cert.NotBefore) && now.Before(cert.NotAfter)
}

func serial(rnd io.Reader) *big.Int {
	b := make([]byte, 16)
	if _, err := io.ReadFull(rnd, b); err != nil {
		return big.NewInt(time.Now().UnixNano())
	}

	return new(big.Int).SetBytes(b)
}

// ensurePGP writes an unlocked PGP key pair (armored) for Omni's etcd encryption; an existing private key is
// kept (Omni's etcd key store is sealed with it). gopenpgp draws its randomness from crypto/rand.
func ensurePGP(privPath, pubPath string) error {
	var key *crypto.Key

	armored, err := os.ReadFile(privPath)

	switch {
	case err == nil:
		if _, err := os.Stat(pubPath); err == nil {
			return nil
		}

		if key, err = crypto.NewKeyFromArmored(string(armored)); err != nil {
			return fmt.Errorf("read etcd PGP key %s: %w", privPath, err)
		}
	case errors.Is(err, os.ErrNotExist):
		if key, err = crypto.PGP().KeyGeneration().AddUserId("omni-etcd", "etcd@example.com").New().GenerateKey(); err != nil {
			return fmt.Errorf("generate etcd PGP key: %w", err)
		}

		priv, err := key.Armor()
		if err != nil {
			return fmt.Errorf("armor etcd PGP key: %w", err)
		}

		if err := writeFileAtomic(privPath, []byte(priv), 0o600); err != nil {
			return err
		}
	default:
		return fmt.Errorf("read etcd PGP key: %w", err)
	}

	pub, err := key.GetArmoredPublicKey()
	if err != nil {
		return fmt.Errorf("armor etcd PGP public key: %w", err)
	}

	return writeFileAtomic(pubPath, []byte(pub), 0o644)
}

// writeFileAtomic writes data to a temporary file beside path and renames it into place.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}

	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}

	return nil
}
