package intents_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/shared/api/intents"
)

func TestCheckID(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		id   string
		ok   bool
	}{
		{name: "hex", id: "3f2e1a0b7c11deadbeef", ok: true},
		{name: "dotted", id: "wipe.5a3e0f1e-8c1b_1", ok: true},
		{name: "empty"},
		{name: "too long", id: strings.Repeat("a", intents.MaxIDLen+1)},
		{name: "longest", id: strings.Repeat("a", intents.MaxIDLen), ok: true},
		{name: "slash", id: "a/b"},
		{name: "space", id: "a b"},
		{name: "non-ascii", id: "wipé"},
		{name: "newline", id: "a\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			err := intents.CheckID(tc.id)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, intents.ErrInvalidID)
			}
		})
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()

	ctx := intents.NewOutgoingContext(metadata.AppendToOutgoingContext(context.Background(), "machine-id", "m1"), "first")
	ctx = intents.NewOutgoingContext(ctx, "second")
	require.Equal(t, "second", intents.FromOutgoingContext(ctx))

	md, _ := metadata.FromOutgoingContext(ctx)
	require.Equal(t, []string{"m1"}, md.Get("machine-id"), "other metadata kept")

	id, err := intents.FromMetadata(md)
	require.NoError(t, err)
	require.Equal(t, "second", id)

	id, err = intents.FromMetadata(metadata.MD{})
	require.NoError(t, err)
	require.Empty(t, id)

	_, err = intents.FromMetadata(metadata.Pairs(intents.MetadataKey, "a", intents.MetadataKey, "b"))
	require.ErrorIs(t, err, intents.ErrInvalidID)

	_, err = intents.FromMetadata(metadata.Pairs(intents.MetadataKey, "a/b"))
	require.ErrorIs(t, err, intents.ErrInvalidID)
}

func FuzzCheckID(f *testing.F) {
	for _, s := range []string{"", "abc", "a/b", strings.Repeat("x", 70), "wipe.1-2_3"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, id string) {
		if intents.CheckID(id) != nil {
			return
		}

		if len(id) == 0 || len(id) > intents.MaxIDLen || strings.ContainsAny(id, "/ \n\x00") {
			t.Fatalf("accepted %q", id)
		}
	})
}
