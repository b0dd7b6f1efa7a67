package assetcache

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Errors callers branch on.
var (
	// ErrNotFound: no cached asset under that name or digest.
	ErrNotFound = errors.New("asset not cached")
	// ErrDigestMismatch: downloaded or imported content does not hash to the expected digest.
	ErrDigestMismatch = errors.New("asset digest mismatch")
	// ErrSizeMismatch: content is longer or shorter than the expected size.
	ErrSizeMismatch = errors.New("asset size mismatch")
	// ErrNoSpace: the asset does not fit under the size cap even after evicting everything evictable.
	ErrNoSpace = errors.New("asset cache full")
	// ErrNeeded: the asset is needed by a current boot plan and cannot be evicted.
	ErrNeeded = errors.New("asset needed by a current boot plan")
	// ErrCorrupt: a cached file no longer matches its manifest entry; it has been dropped.
	ErrCorrupt = errors.New("cached asset corrupt")
)

// IsDiskFull reports whether err comes from the file system running out of space.
func IsDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Config configures a Store.
type Config struct {
	// Dir is the cache directory, normally <state dir>/assets.
	Dir string
	// MaxBytes caps the total size of cached assets.
	MaxBytes int64
	// Attempts is how many times a download is tried from one source without progress before giving up.
	Attempts int
	// RetryBackoff is the pause before retrying a download that made no progress.
	RetryBackoff time.Duration
	// Controller is the SHA-256 (hex) of the CA of the controller the edge is enrolled with ("": not
	// enrolled yet); an import of a bundle another controller made is refused.
	Controller string
}

// Default returns the default store configuration for a state directory.
func Default() Config {
	return Config{
		Dir:          "/var/lib/outpost-edge/assets",
		MaxBytes:     20 << 30,
		Attempts:     5,
		RetryBackoff: 2 * time.Second,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("assets: dir is empty")
	case c.MaxBytes <= 0:
		return fmt.Errorf("assets: max bytes must be positive, got %d", c.MaxBytes)
	case c.Attempts <= 0:
		return fmt.Errorf("assets: attempts must be positive, got %d", c.Attempts)
	case c.RetryBackoff < 0:
		return fmt.Errorf("assets: negative retry backoff %s", c.RetryBackoff)
	}

	return nil
}

// Entry describes one cached asset.
type Entry struct {
	SHA256   string
	Size     int64
	Names    []string
	LastUsed time.Time
	Needed   bool
}

// Store is the content-addressed asset cache. It is safe for concurrent use, and several processes (the edge
// and `edge assets import`) may share one directory: changes are made under a file lock and each process
// reloads the manifest when another one has rewritten it.
//
// Its parts: the index (index.go) is the directory and its manifest, the space policy (space.go) says what may
// be evicted, downloads (download.go) fill the cache, Check and Scrub (verify.go) find corrupt files, Import
// (import.go) adds bundles.
//
// Lock order: mu, then the file lock (index.withLock), then space.heldMu; never the other way round.
type Store struct {
	cfg     Config
	log     *zap.Logger
	now     func() time.Time
	metrics *metrics
	space   *space

	// mu guards idx's manifest and inflight.
	mu       sync.Mutex
	idx      *index
	inflight flights
}

// New opens (creating if needed) the cache in cfg.Dir. Partial downloads are never visible; recent ones are
// kept and resumed by the next download of the same asset, stale ones removed (cleanTmp).
func New(cfg Config, log *zap.Logger, now func() time.Time) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	if now == nil {
		now = time.Now
	}

	log = log.With(zap.String("component", "assets"))
	m := newMetrics()

	idx, err := openIndex(cfg.Dir, log, m)
	if err != nil {
		return nil, err
	}

	return &Store{
		cfg:      cfg,
		log:      log,
		now:      now,
		metrics:  m,
		space:    newSpace(cfg.MaxBytes),
		idx:      idx,
		inflight: flights{},
	}, nil
}

// Has reports whether an asset is cached, by digest or logical name (by the manifest; content is checked by
// Check).
func (s *Store) Has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.idx.refresh()

	_, _, ok := s.idx.resolve(key)

	return ok
}

// Lookup returns the entry for a digest or logical name.
func (s *Store) Lookup(key string) (Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.idx.refresh()

	digest, b, ok := s.idx.resolve(key)
	if !ok {
		return Entry{}, fmt.Errorf("look up %s: %w", key, ErrNotFound)
	}

	return s.idx.entry(digest, b, s.space.kept()), nil
}

// List returns all cached assets, most recently used first, and the bytes they take.
func (s *Store) List() ([]Entry, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.idx.refresh()

	kept := s.space.kept()
	out := make([]Entry, 0, len(s.idx.man.Blobs))

	for d, b := range s.idx.man.Blobs {
		out = append(out, s.idx.entry(d, b, kept))
	}

	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastUsed.Equal(out[j].LastUsed) {
			return out[i].LastUsed.After(out[j].LastUsed)
		}

		return out[i].SHA256 < out[j].SHA256
	})

	return out, s.idx.used()
}

// Cap returns the configured size cap in bytes.
func (s *Store) Cap() int64 { return s.space.max }

// Open opens a cached asset by digest or logical name for reading, marks it used and returns its digest. A
// file whose size no longer matches the manifest is dropped and reported as ErrCorrupt. It serves every asset
// request, so it describes nothing more (Lookup does).
func (s *Store) Open(key string) (*os.File, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.idx.refresh()

	digest, b, ok := s.idx.resolve(key)
	if !ok {
		return nil, "", fmt.Errorf("open asset %s: %w", key, ErrNotFound)
	}

	f, err := os.Open(s.idx.blobPath(digest))
	if err != nil {
		s.dropCorrupt(digest, "open failed")

		return nil, "", fmt.Errorf("open asset %s: %w: %w", key, ErrCorrupt, err)
	}

	fi, err := f.Stat()
	if err != nil || fi.Size() != b.Size {
		f.Close() //nolint:errcheck
		s.dropCorrupt(digest, "size changed")

		return nil, "", fmt.Errorf("open asset %s: %w", key, ErrCorrupt)
	}

	b.LastUsed = s.now()

	return f, digest, nil
}

// Link records ref's name for an asset already cached under ref's digest (ErrNotFound otherwise).
func (s *Store) Link(ref Ref) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("link asset: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	return s.idx.update(func() error {
		b, ok := s.idx.man.Blobs[ref.SHA256]
		if !ok || b.Size != ref.Size {
			return fmt.Errorf("link asset %s: %w", ref.Name, ErrNotFound)
		}

		if s.idx.man.Names[ref.Name] == ref.SHA256 {
			return nil
		}

		s.idx.man.Names[ref.Name] = ref.SHA256

		return s.idx.save()
	})
}
