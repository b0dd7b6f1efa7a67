package assetcache

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// space is the cache's size policy: the cap, and what is kept however long ago it was used, namely what a
// fetcher over the store was asked to hold for the site's boot plans (Hold).
type space struct {
	max int64

	// heldMu guards held. It is taken alone (hold) or inside the Store's mu and file lock (kept), never the
	// other way round.
	heldMu sync.Mutex
	held   map[string]bool
}

func newSpace(maxBytes int64) *space {
	return &space{max: maxBytes, held: map[string]bool{}}
}

func (p *space) hold(digest string) {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()

	p.held[digest] = true
}

// kept returns the digests never evicted: those held (what the controller asked the site to hold for its boot
// plans). The map is the caller's.
func (p *space) kept() map[string]bool {
	set := map[string]bool{}

	p.heldMu.Lock()
	for d := range p.held {
		set[d] = true
	}
	p.heldMu.Unlock()

	return set
}

// lruVictims chooses the blobs to evict so that size more bytes fit under maxBytes next to the blobs and the
// reserved bytes of downloads in progress: the least recently used first (by digest when equally recent),
// never one in busy. It chooses nothing when the bytes fit already, and fails with ErrNoSpace when they do
// not fit even with every blob outside busy gone.
func lruVictims(blobs map[string]*blobEntry, busy map[string]bool, reserved, size, maxBytes int64) ([]string, error) {
	used := reserved
	for _, b := range blobs {
		used += b.Size
	}

	if used+size <= maxBytes {
		return nil, nil
	}

	var cands []string

	for d := range blobs {
		if !busy[d] {
			cands = append(cands, d)
		}
	}

	slices.SortFunc(cands, func(a, b string) int {
		if c := blobs[a].LastUsed.Compare(blobs[b].LastUsed); c != 0 {
			return c
		}

		return strings.Compare(a, b)
	})

	var victims []string

	for _, d := range cands {
		if used+size <= maxBytes {
			break
		}

		victims = append(victims, d)
		used -= blobs[d].Size
	}

	if used+size > maxBytes {
		return nil, fmt.Errorf("%w: %d bytes needed, %d of %d used by assets current boot plans need or being written",
			ErrNoSpace, size, used, maxBytes)
	}

	return victims, nil
}

// makeRoom evicts least recently used assets nobody needs until size more bytes fit under the cap. Called with
// s.mu and the file lock held.
func (s *Store) makeRoom(size int64) error {
	if size > s.space.max {
		return fmt.Errorf("%w: asset of %d bytes exceeds the cap of %d", ErrNoSpace, size, s.space.max)
	}

	reserved := s.inflight.reserved()
	if s.idx.used()+reserved+size <= s.space.max {
		return nil // fits: no need to ask what the boot plans need
	}

	busy := s.space.kept()
	for d := range s.inflight {
		busy[d] = true
	}

	victims, err := lruVictims(s.idx.man.Blobs, busy, reserved, size, s.space.max)
	if err != nil {
		s.metrics.errors.WithLabelValues("no_space").Inc()

		return err
	}

	for _, d := range victims {
		s.log.Info("evicting least recently used asset", zap.String("sha256", d), zap.Int64("size", s.idx.man.Blobs[d].Size))
		s.metrics.evictions.Inc()
		s.idx.remove(d)
	}

	return s.idx.save()
}

// Hold keeps a digest from eviction for the life of the store: the fetcher calls it for every asset the
// controller asks the site to hold, so the cache needs no reference back to the fetcher.
func (s *Store) Hold(digest string) {
	s.space.hold(digest)
}

// Evict removes cached assets by digest. Assets a current boot plan needs are refused with ErrNeeded.
func (s *Store) Evict(digests ...string) (evicted []string, refused map[string]error, err error) {
	refused = map[string]error{}

	s.mu.Lock()
	defer s.mu.Unlock()

	err = s.idx.update(func() error {
		kept := s.space.kept()

		for _, d := range digests {
			switch _, ok := s.idx.man.Blobs[d]; {
			case ValidateDigest(d) != nil:
				refused[d] = ValidateDigest(d)
			case !ok:
				refused[d] = ErrNotFound
			case kept[d]:
				refused[d] = ErrNeeded
			case s.inflight[d] != nil:
				refused[d] = errors.New("asset is being written")
			default:
				s.idx.remove(d)
				evicted = append(evicted, d)
			}
		}

		if len(evicted) == 0 {
			return nil
		}

		return s.idx.save()
	})

	return evicted, refused, err
}
