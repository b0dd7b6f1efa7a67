package intents

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"
)

// MetadataKey is the gRPC metadata key that carries an intent ID on a call the edge forwards to a machine's
// agent (the agent's API has no field for it; the edge reads it and passes it on).
const MetadataKey = "outpost-intent-id"

// MaxIDLen bounds an intent ID.
const MaxIDLen = 64

// ErrInvalidID is returned for an intent ID that is empty, too long or has characters outside [A-Za-z0-9._-].
var ErrInvalidID = errors.New("invalid intent id")

// CheckID checks an intent ID from a peer or a stored record.
func CheckID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("%w: %d bytes, want 1-%d", ErrInvalidID, len(id), MaxIDLen)
	}

	for i := range len(id) {
		if c := id[i]; !idByte(c) {
			return fmt.Errorf("%w: byte %#x at %d", ErrInvalidID, c, i)
		}
	}

	return nil
}

func idByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// NewOutgoingContext returns ctx with the intent ID in its outgoing metadata (replacing any there).
func NewOutgoingContext(ctx context.Context, id string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(MetadataKey, id)

	return metadata.NewOutgoingContext(ctx, md)
}

// FromOutgoingContext returns the intent ID NewOutgoingContext put in ctx ("" for none).
func FromOutgoingContext(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)

	return only(md.Get(MetadataKey))
}

// FromMetadata returns the intent ID in a call's incoming metadata: "" for none, an error for more than one
// value or an invalid one.
func FromMetadata(md metadata.MD) (string, error) {
	vals := md.Get(MetadataKey)

	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		if err := CheckID(vals[0]); err != nil {
			return "", err
		}

		return vals[0], nil
	default:
		return "", fmt.Errorf("%w: %d values of %s", ErrInvalidID, len(vals), MetadataKey)
	}
}

func only(vals []string) string {
	if len(vals) == 1 {
		return vals[0]
	}

	return ""
}
