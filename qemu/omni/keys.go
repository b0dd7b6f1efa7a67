package omni

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/siderolabs/omni/client/pkg/access"
	"github.com/siderolabs/omni/client/pkg/jointoken"
)

// AdminIdentity is the identity of the admin service account (what Omni's UI and omnictl act as).
const AdminIdentity = "admin" + access.ServiceAccountNameSuffix

// ProviderIdentity is the identity of the service account of infra provider id.
func ProviderIdentity(id string) string {
	return id + access.InfraProviderServiceAccountNameSuffix
}

// keyring holds the stand-in's service-account keys (base64, as omnictl prints them) and the join token secret.
type keyring struct {
	ProviderID string `json:"provider_id"`
	Provider   string `json:"provider"`
	Admin      string `json:"admin"`
	JoinToken  string `json:"join_token"`
}

const keyLifetime = 365 * 24 * time.Hour

func loadOrCreateKeys(dir, providerID string) (*keyring, error) {
	path := filepath.Join(dir, "keys.json")

	if dir != "" {
		b, err := os.ReadFile(path)

		switch {
		case err == nil:
			var k keyring
			if err = json.Unmarshal(b, &k); err != nil {
				return nil, fmt.Errorf("parse %s: %w", path, err)
			}

			if k.ProviderID == providerID {
				return &k, nil
			}
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("read keys: %w", err)
		}
	}

	k := &keyring{ProviderID: providerID}

	var err error

	if k.Provider, err = newServiceAccount(ProviderIdentity(providerID)); err != nil {
		return nil, err
	}

	if k.Admin, err = newServiceAccount(AdminIdentity); err != nil {
		return nil, err
	}

	if k.JoinToken, err = jointoken.Generate(); err != nil {
		return nil, fmt.Errorf("generate join token: %w", err)
	}

	if dir != "" {
		b, err := json.Marshal(k)
		if err != nil {
			return nil, fmt.Errorf("encode keys: %w", err)
		}

		if err = os.WriteFile(path, b, 0o600); err != nil {
			return nil, fmt.Errorf("write keys: %w", err)
		}
	}

	return k, nil
}

func newServiceAccount(identity string) (string, error) {
	key, err := pgp.GenerateKey(identity, "service account", identity, keyLifetime)
	if err != nil {
		return "", fmt.Errorf("generate key for %s: %w", identity, err)
	}

	enc, err := serviceaccount.Encode(identity, key)
	if err != nil {
		return "", fmt.Errorf("encode key for %s: %w", identity, err)
	}

	return enc, nil
}

// publicKeys returns the public halves of the service-account keys by identity: the server keeps nothing else
// to verify requests with, as Omni keeps only the registered public keys.
func (k *keyring) publicKeys() (map[string]*pgp.Key, error) {
	out := map[string]*pgp.Key{}

	for _, enc := range []string{k.Provider, k.Admin} {
		sa, err := serviceaccount.Decode(enc)
		if err != nil {
			return nil, fmt.Errorf("decode service account: %w", err)
		}

		armored, err := sa.Key.ArmorPublic()
		if err != nil {
			return nil, fmt.Errorf("armor public key of %s: %w", sa.Name, err)
		}

		// parse the armored public key with the library's own decoder (it takes the service-account JSON form)
		js, err := json.Marshal(serviceaccount.JSON{Name: sa.Name, PGPKey: armored})
		if err != nil {
			return nil, fmt.Errorf("encode public key of %s: %w", sa.Name, err)
		}

		pub, err := serviceaccount.Decode(base64.StdEncoding.EncodeToString(js))
		if err != nil {
			return nil, fmt.Errorf("parse public key of %s: %w", sa.Name, err)
		}

		if pub.Key.IsPrivate() {
			return nil, fmt.Errorf("public key of %s still holds the private key", sa.Name)
		}

		out[sa.Name] = pub.Key
	}

	return out, nil
}

// newID returns a random request or wipe ID (UUID v4 text form, as Omni generates them).
func newID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("read random bytes: %v", err)) // crypto/rand does not fail on supported platforms
	}

	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80

	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
