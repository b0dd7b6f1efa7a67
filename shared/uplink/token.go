package uplink

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// tokenPrefix marks version 1 join tokens.
const tokenPrefix = "outpost1"

// SecretLen is the length of a join token's secret in bytes.
const SecretLen = 32

// ErrMalformedToken means a string is not a join token at all.
var ErrMalformedToken = errors.New("malformed join token")

// JoinToken is what an operator hands to a new edge: which site it is, a secret that proves it,
// and the SHA-256 of the controller's CA certificate, so the edge can pin the controller on its
// first connection without any CA distribution.
//
// Its text form is "outpost1.<site>.<secret>.<ca-sha256>", the last two base64url without padding.
type JoinToken struct {
	SiteID        string
	Secret        []byte
	CAFingerprint [sha256.Size]byte
}

// String returns the text form of the token.
func (t JoinToken) String() string {
	enc := base64.RawURLEncoding

	return strings.Join([]string{tokenPrefix, t.SiteID, enc.EncodeToString(t.Secret), enc.EncodeToString(t.CAFingerprint[:])}, ".")
}

// ParseJoinToken parses the text form of a join token. Its errors never contain the secret.
func ParseJoinToken(s string) (JoinToken, error) {
	s = strings.TrimSpace(s)

	parts := strings.Split(s, ".")
	if len(parts) != 4 || parts[0] != tokenPrefix {
		return JoinToken{}, fmt.Errorf("%w: expected %s.<site>.<secret>.<fingerprint>", ErrMalformedToken, tokenPrefix)
	}

	if err := ValidateSiteID(parts[1]); err != nil {
		return JoinToken{}, fmt.Errorf("%w: %w", ErrMalformedToken, err)
	}

	enc := base64.RawURLEncoding

	secret, err := enc.DecodeString(parts[2])
	if err != nil || len(secret) != SecretLen {
		return JoinToken{}, fmt.Errorf("%w: the secret is not %d base64url bytes", ErrMalformedToken, SecretLen)
	}

	fp, err := enc.DecodeString(parts[3])
	if err != nil || len(fp) != sha256.Size {
		return JoinToken{}, fmt.Errorf("%w: the CA fingerprint is not a base64url SHA-256", ErrMalformedToken)
	}

	tok := JoinToken{SiteID: parts[1], Secret: secret}
	copy(tok.CAFingerprint[:], fp)

	return tok, nil
}

// SecretHash returns the SHA-256 of the token's secret: what the controller stores.
func (t JoinToken) SecretHash() []byte {
	sum := sha256.Sum256(t.Secret)

	return sum[:]
}
