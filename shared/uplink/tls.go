package uplink

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// ControllerServerName is the DNS name in the controller's server certificate and the TLS server name
// every edge verifies. The enrollment CA is private to one controller and pinned by the edge,
// so this fixed name is as strong as a real host name and lets the controller move addresses freely.
const ControllerServerName = "controller.outpost.internal"

// CAFingerprint is the SHA-256 of a CA certificate's DER encoding, as carried in join tokens.
func CAFingerprint(der []byte) [sha256.Size]byte {
	return sha256.Sum256(der)
}

// EnrollTLSConfig returns the client TLS configuration for enrolment: no client certificate yet,
// and the controller is trusted only if its chain ends in the CA whose fingerprint the join token pins.
func EnrollTLSConfig(fingerprint [sha256.Size]byte) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: ControllerServerName,
		// The chain is verified below against the pinned CA instead of the system roots.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, fingerprint)
		},
	}
}

// ErrPinMismatch means the controller's CA is not the one the join token names.
var ErrPinMismatch = errors.New("the controller's CA does not match the join token's fingerprint (wrong controller, or a token from another controller)")

func verifyPinned(chain []*x509.Certificate, fingerprint [sha256.Size]byte) error {
	if len(chain) == 0 {
		return errors.New("controller sent no certificate")
	}

	var ca *x509.Certificate

	for _, c := range chain[1:] {
		fp := CAFingerprint(c.Raw)
		if bytes.Equal(fp[:], fingerprint[:]) {
			ca = c
		}
	}

	if ca == nil {
		return ErrPinMismatch
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca)

	if _, err := chain[0].Verify(x509.VerifyOptions{
		DNSName:   ControllerServerName,
		Roots:     roots,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("verify controller certificate against the pinned CA: %w", err)
	}

	return nil
}

// SessionTLSConfig returns the client TLS configuration for an enrolled edge: its own certificate,
// and the controller's CA as the only root.
func SessionTLSConfig(cert tls.Certificate, ca *x509.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		ServerName:   ControllerServerName,
		RootCAs:      roots,
		Certificates: []tls.Certificate{cert},
	}
}
