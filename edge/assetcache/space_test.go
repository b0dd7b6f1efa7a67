package assetcache_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/assetcache"
)

func TestLRUVictims(t *testing.T) {
	t.Parallel()

	at := func(sec int64) time.Time { return time.Unix(1_700_000_000+sec, 0) }

	// 100 bytes each, "a" the least recently used
	abc := map[string]assetcache.CachedBlob{
		"a": {Size: 100, LastUsed: at(1)},
		"b": {Size: 100, LastUsed: at(2)},
		"c": {Size: 100, LastUsed: at(3)},
	}

	tests := []struct {
		name     string
		blobs    map[string]assetcache.CachedBlob
		busy     []string
		reserved int64
		size     int64
		max      int64
		want     []string
		wantErr  error
	}{
		{name: "empty cache", size: 100, max: 100},
		{name: "fits", blobs: abc, size: 100, max: 400},
		{name: "fits with everything busy", blobs: abc, busy: []string{"a", "b", "c"}, size: 100, max: 400},
		{name: "least recently used goes", blobs: abc, size: 100, max: 300, want: []string{"a"}},
		{name: "as many as it takes, oldest first", blobs: abc, size: 150, max: 300, want: []string{"a", "b"}},
		{name: "busy ones are passed over", blobs: abc, busy: []string{"a"}, size: 100, max: 300, want: []string{"b"}},
		{name: "reserved bytes count", blobs: abc, reserved: 100, size: 100, max: 400, want: []string{"a"}},
		{
			name: "equally recent by digest",
			blobs: map[string]assetcache.CachedBlob{
				"d": {Size: 100, LastUsed: at(1)},
				"c": {Size: 100, LastUsed: at(1)},
				"e": {Size: 100, LastUsed: at(2)},
			},
			size: 100, max: 300, want: []string{"c"},
		},
		{name: "everything busy", blobs: abc, busy: []string{"a", "b", "c"}, size: 100, max: 300, wantErr: assetcache.ErrNoSpace},
		{name: "not enough evictable", blobs: abc, busy: []string{"b", "c"}, size: 150, max: 300, wantErr: assetcache.ErrNoSpace},
		{name: "reserved bytes cannot be evicted", blobs: abc, reserved: 250, size: 100, max: 300, wantErr: assetcache.ErrNoSpace},
		{name: "larger than the cap", size: 101, max: 100, wantErr: assetcache.ErrNoSpace},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := assetcache.LRUVictims(tt.blobs, tt.busy, tt.reserved, tt.size, tt.max)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Empty(t, got)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
