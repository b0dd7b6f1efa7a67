// Package seal encrypts the secrets the controller writes to Omni (BMC passwords) with a key only the
// controllers of the provider hold: it is derived from the provider's service-account key, which every
// controller of the provider is given and which an Omni account with the Reader role, able to read the
// provider's namespace, does not have. A moved or standby controller given the same key opens what another
// sealed; a controller given a new key cannot, and says so (the lifecycle then provisions the credentials
// again where it can).
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
)

// Prefix starts every sealed value (its format version included), so sealed and clear values are told apart.
const Prefix = "outpost-sealed:v1:"

// ErrOpen means a sealed value cannot be opened: sealed with another key, or damaged.
var ErrOpen = errors.New("sealed value cannot be opened with this controller's key")

// Box seals and opens values with one key.
type Box struct {
	aead cipher.AEAD
	rand io.Reader
}

// KeyFromServiceAccount derives the 32-byte sealing key for purpose from a service-account key (base64, as
// `omnictl infraprovider create` prints it): HKDF-SHA256 over the key exactly as given (it holds the account's
// private key), salted with the account's name. The same key gives the same sealing key in every controller
// and every version.
func KeyFromServiceAccount(serviceAccountKey, purpose string) ([]byte, error) {
	serviceAccountKey = strings.TrimSpace(serviceAccountKey)

	sa, err := serviceaccount.Decode(serviceAccountKey)
	if err != nil {
		return nil, fmt.Errorf("decode service-account key: %w", err)
	}

	key, err := hkdf.Key(sha256.New, []byte(serviceAccountKey), []byte("outpost/"+sa.Name), "outpost seal "+purpose, 32)
	if err != nil {
		return nil, fmt.Errorf("derive sealing key: %w", err)
	}

	return key, nil
}

// New returns a Box for a 32-byte key; rand supplies the nonces.
func New(key []byte, rand io.Reader) (*Box, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("sealing key of %d bytes: want 32", len(key))
	}

	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("sealing cipher: %w", err)
	}

	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("sealing cipher: %w", err)
	}

	return &Box{aead: aead, rand: rand}, nil
}

// Sealed reports whether v is a sealed value.
func Sealed(v string) bool { return strings.HasPrefix(v, Prefix) }

// Seal encrypts v (AES-256-GCM, a fresh nonce each time); the empty string stays empty.
func (b *Box) Seal(v string) (string, error) {
	if v == "" {
		return "", nil
	}

	nonce := make([]byte, b.aead.NonceSize())
	if _, err := io.ReadFull(b.rand, nonce); err != nil {
		return "", fmt.Errorf("seal: nonce: %w", err)
	}

	out := b.aead.Seal(nonce, nonce, []byte(v), []byte(Prefix))

	return Prefix + base64.RawStdEncoding.EncodeToString(out), nil
}

// Open decrypts a sealed value; a value that is not sealed is returned as it is (written before sealing
// existed), so callers can reseal it.
func (b *Box) Open(v string) (string, error) {
	enc, ok := strings.CutPrefix(v, Prefix)
	if !ok {
		return v, nil
	}

	raw, err := base64.RawStdEncoding.DecodeString(enc)
	if err != nil || len(raw) < b.aead.NonceSize()+b.aead.Overhead() {
		return "", fmt.Errorf("%w: malformed", ErrOpen)
	}

	ns := b.aead.NonceSize()

	plain, err := b.aead.Open(nil, raw[:ns], raw[ns:], []byte(Prefix))
	if err != nil {
		return "", ErrOpen
	}

	return string(plain), nil
}
