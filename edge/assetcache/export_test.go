package assetcache

import (
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// ErrorCount returns how many errors with this reason the store counted.
func (s *Store) ErrorCount(reason string) float64 {
	return testutil.ToFloat64(s.metrics.errors.WithLabelValues(reason))
}

// CachedBlob is a cached asset as the eviction choice sees it.
type CachedBlob struct {
	Size     int64
	LastUsed time.Time
}

// LRUVictims runs the eviction choice over blobs by digest, with busy the digests it must not choose.
func LRUVictims(blobs map[string]CachedBlob, busy []string, reserved, size, maxBytes int64) ([]string, error) {
	entries := make(map[string]*blobEntry, len(blobs))
	for d, b := range blobs {
		entries[d] = &blobEntry{Size: b.Size, LastUsed: b.LastUsed}
	}

	set := map[string]bool{}
	for _, d := range busy {
		set[d] = true
	}

	return lruVictims(entries, set, reserved, size, maxBytes)
}

// TalosName is the logical name of a Talos install boot asset for a version, image factory schematic and
// architecture, as the controller names them.
func TalosName(version, schematic, arch, kind string) string {
	return "talos/" + version + "/" + schematic + "/" + arch + "/" + kind
}
