package assets

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outpost-metal/outpost/shared/atomicfile"

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

// NeededSet tells the store which digests the current boot plans need; those are never evicted. The
// assets a Fetcher was asked to hold are kept too, without one (Hold).
type NeededSet interface {
	NeededDigests() []string
}

// NoneNeeded is a NeededSet for when there are no boot plans (tools such as `edge assets import`).
type NoneNeeded struct{}

// NeededDigests returns nothing.
func (NoneNeeded) NeededDigests() []string { return nil }

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
type Store struct {
	cfg     Config
	log     *zap.Logger
	needed  NeededSet
	now     func() time.Time
	metrics *metrics

	mu       sync.Mutex
	man      manifest
	manStamp fileStamp
	inflight map[string]*flight

	// held are the digests a fetcher over this store was asked to hold (never evicted); heldMu is taken
	// alone or inside mu, never the other way round.
	heldMu sync.Mutex
	held   map[string]bool
}

// Hold keeps a digest from eviction for the life of the store: the fetcher calls it for every asset the
// controller asks the site to hold, so the cache needs no reference back to the fetcher.
func (s *Store) Hold(digest string) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()

	if s.held == nil {
		s.held = map[string]bool{}
	}

	s.held[digest] = true
}

type flight struct {
	done chan struct{}
	err  error
	size int64 // bytes reserved under the cap while writing
}

// manifest is the on-disk index (manifest.json).
type manifest struct {
	Version int                   `json:"version"`
	Names   map[string]string     `json:"names"` // logical name -> digest
	Blobs   map[string]*blobEntry `json:"blobs"` // digest -> entry
}

type blobEntry struct {
	Size     int64     `json:"size"`
	LastUsed time.Time `json:"last_used"`
	// Stamp is the file's size and modification time when its content was last verified.
	Stamp fileStamp `json:"stamp"`
}

type fileStamp struct {
	Size    int64 `json:"size"`
	ModTime int64 `json:"mtime_ns"`
}

func stampOf(fi fs.FileInfo) fileStamp {
	return fileStamp{Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
}

const manifestVersion = 1

// New opens (creating if needed) the cache in cfg.Dir. Partial downloads are never visible; recent ones are
// kept and resumed by the next download of the same asset, stale ones removed (cleanTmp).
func New(cfg Config, log *zap.Logger, needed NeededSet, now func() time.Time) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	if needed == nil {
		needed = NoneNeeded{}
	}

	if now == nil {
		now = time.Now
	}

	s := &Store{
		cfg:      cfg,
		log:      log.With(zap.String("component", "assets")),
		needed:   needed,
		now:      now,
		metrics:  newMetrics(),
		inflight: map[string]*flight{},
	}

	for _, d := range []string{cfg.Dir, s.blobDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create asset directory: %w", err)
		}
	}

	if err := s.withLock(func() error {
		if err := s.cleanTmp(); err != nil {
			return err
		}

		return s.reconcile()
	}); err != nil {
		return nil, err
	}

	return s, nil
}

func (s *Store) blobDir() string               { return filepath.Join(s.cfg.Dir, "blobs", "sha256") }
func (s *Store) tmpDir() string                { return filepath.Join(s.cfg.Dir, "tmp") }
func (s *Store) manifestPath() string          { return filepath.Join(s.cfg.Dir, "manifest.json") }
func (s *Store) blobPath(digest string) string { return filepath.Join(s.blobDir(), digest) }

// cleanTmp removes what earlier runs left in the temporary directory, except partial downloads that may be
// resumed: those younger than partialMaxAge and not in use by another process. Import staging directories and
// private temporary files are removed once they are an hour old (a running import in another process keeps
// its own).
func (s *Store) cleanTmp() error {
	items, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return fmt.Errorf("read asset temp directory: %w", err)
	}

	now := time.Now()

	for _, it := range items {
		path := filepath.Join(s.tmpDir(), it.Name())

		info, err := it.Info()
		if err != nil {
			continue // gone meanwhile
		}

		age := now.Sub(info.ModTime())

		if digest, ok := strings.CutSuffix(it.Name(), partialSuffix); ok && ValidateDigest(digest) == nil && it.Type().IsRegular() {
			if age < partialMaxAge || inUse(path) {
				continue
			}
		} else if age < time.Hour {
			continue
		}

		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("remove stale partial download: %w", err)
		}
	}

	return nil
}

// partialMaxAge is how long a partial download is kept for resuming.
const partialMaxAge = 24 * time.Hour

// inUse tells whether another process holds the file's download lock.
func inUse(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close() //nolint:errcheck

	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
}

// reconcile loads the manifest and makes it agree with the blob directory: entries whose file is gone or has
// the wrong size are dropped, files nobody references are removed. Called under the file lock.
func (s *Store) reconcile() error {
	s.mu.Lock()
	defer s.mu.Unlock()

	if err := s.loadLocked(); err != nil {
		return err
	}

	changed := false

	for digest, b := range s.man.Blobs {
		fi, err := os.Stat(s.blobPath(digest))
		if err != nil || fi.Size() != b.Size {
			s.log.Warn("dropping asset whose file is missing or has the wrong size", zap.String("sha256", digest))
			s.metrics.errors.WithLabelValues("corrupt").Inc()
			s.dropLocked(digest)

			changed = true
		}
	}

	files, err := os.ReadDir(s.blobDir())
	if err != nil {
		return fmt.Errorf("read asset blob directory: %w", err)
	}

	for _, f := range files {
		if _, ok := s.man.Blobs[f.Name()]; !ok {
			_ = os.Remove(filepath.Join(s.blobDir(), f.Name()))
		}
	}

	if changed {
		return s.saveLocked()
	}

	return nil
}

// loadLocked reads manifest.json (an absent file is an empty cache). Called with s.mu held.
func (s *Store) loadLocked() error {
	s.man = manifest{Version: manifestVersion, Names: map[string]string{}, Blobs: map[string]*blobEntry{}}

	f, err := os.Open(s.manifestPath())
	if errors.Is(err, fs.ErrNotExist) {
		s.manStamp = fileStamp{}

		return nil
	}

	if err != nil {
		return fmt.Errorf("open asset manifest: %w", err)
	}
	defer f.Close() //nolint:errcheck

	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat asset manifest: %w", err)
	}

	var m manifest

	if err := json.NewDecoder(io.LimitReader(f, 64<<20)).Decode(&m); err != nil {
		return fmt.Errorf("decode asset manifest: %w", err)
	}

	if m.Version != manifestVersion {
		return fmt.Errorf("asset manifest version %d, want %d", m.Version, manifestVersion)
	}

	if m.Names == nil {
		m.Names = map[string]string{}
	}

	if m.Blobs == nil {
		m.Blobs = map[string]*blobEntry{}
	}

	// keep in-memory recency (not persisted on every read) when reloading
	for d, b := range m.Blobs {
		if old, ok := s.man.Blobs[d]; ok && old.LastUsed.After(b.LastUsed) {
			b.LastUsed = old.LastUsed
		}
	}

	s.man = m
	s.manStamp = stampOf(fi)

	return nil
}

// refreshLocked reloads the manifest when another process has rewritten it. Called with s.mu held.
func (s *Store) refreshLocked() {
	fi, err := os.Stat(s.manifestPath())
	if err != nil || stampOf(fi) == s.manStamp {
		return
	}

	old := s.man

	if err := s.loadLocked(); err != nil {
		s.log.Error("reload asset manifest, keeping the previous one", zap.Error(err))
		s.man = old

		return
	}

	for d, b := range old.Blobs {
		if nb, ok := s.man.Blobs[d]; ok && b.LastUsed.After(nb.LastUsed) {
			nb.LastUsed = b.LastUsed
		}
	}
}

// saveLocked writes the manifest atomically (temp file, fsync, rename, fsync directory). Called with s.mu held.
func (s *Store) saveLocked() error {
	data, err := json.MarshalIndent(s.man, "", "  ")
	if err != nil {
		return fmt.Errorf("encode asset manifest: %w", err)
	}

	if err := atomicfile.Write(s.manifestPath(), data, 0o644); err != nil {
		return fmt.Errorf("save asset manifest: %w", err)
	}

	if fi, err := os.Stat(s.manifestPath()); err == nil {
		s.manStamp = stampOf(fi)
	}

	s.metrics.bytesUsed.Set(float64(s.usedLocked()))

	return nil
}

// withLock runs fn holding the cross-process lock on the cache directory.
func (s *Store) withLock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.cfg.Dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open asset lock: %w", err)
	}
	defer f.Close() //nolint:errcheck

	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock asset directory: %w", err)
	}

	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck

	return fn()
}

func (s *Store) dropLocked(digest string) {
	delete(s.man.Blobs, digest)

	for n, d := range s.man.Names {
		if d == digest {
			delete(s.man.Names, n)
		}
	}
}

func (s *Store) usedLocked() int64 {
	var total int64

	for _, b := range s.man.Blobs {
		total += b.Size
	}

	return total
}

func (s *Store) neededSet() map[string]bool {
	set := map[string]bool{}

	for _, d := range s.needed.NeededDigests() {
		set[d] = true
	}

	s.heldMu.Lock()
	for d := range s.held {
		set[d] = true
	}
	s.heldMu.Unlock()

	return set
}

// resolveLocked maps a digest or logical name to a digest. Called with s.mu held.
func (s *Store) resolveLocked(key string) (string, *blobEntry, bool) {
	digest := key

	if ValidateDigest(key) != nil {
		d, ok := s.man.Names[key]
		if !ok {
			return "", nil, false
		}

		digest = d
	}

	b, ok := s.man.Blobs[digest]

	return digest, b, ok
}

// Has reports whether the asset with this digest is cached (by the manifest; content is checked by Check).
func (s *Store) Has(digest string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.refreshLocked()

	_, ok := s.man.Blobs[digest]

	return ok
}

// Lookup returns the entry for a digest or logical name.
func (s *Store) Lookup(key string) (Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.refreshLocked()

	digest, b, ok := s.resolveLocked(key)
	if !ok {
		return Entry{}, fmt.Errorf("look up %s: %w", key, ErrNotFound)
	}

	return s.entryLocked(digest, b, s.neededSet()), nil
}

func (s *Store) entryLocked(digest string, b *blobEntry, needed map[string]bool) Entry {
	var names []string

	for n, d := range s.man.Names {
		if d == digest {
			names = append(names, n)
		}
	}

	sort.Strings(names)

	return Entry{SHA256: digest, Size: b.Size, Names: names, LastUsed: b.LastUsed, Needed: needed[digest]}
}

// List returns all cached assets, most recently used first, and the bytes they take.
func (s *Store) List() ([]Entry, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.refreshLocked()

	needed := s.neededSet()
	out := make([]Entry, 0, len(s.man.Blobs))

	for d, b := range s.man.Blobs {
		out = append(out, s.entryLocked(d, b, needed))
	}

	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastUsed.Equal(out[j].LastUsed) {
			return out[i].LastUsed.After(out[j].LastUsed)
		}

		return out[i].SHA256 < out[j].SHA256
	})

	return out, s.usedLocked()
}

// Cap returns the configured size cap in bytes.
func (s *Store) Cap() int64 { return s.cfg.MaxBytes }

// Open opens a cached asset by digest or logical name for reading and marks it used. A file whose size no
// longer matches the manifest is dropped and reported as ErrCorrupt.
func (s *Store) Open(key string) (*os.File, Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.refreshLocked()

	digest, b, ok := s.resolveLocked(key)
	if !ok {
		return nil, Entry{}, fmt.Errorf("open asset %s: %w", key, ErrNotFound)
	}

	f, err := os.Open(s.blobPath(digest))
	if err != nil {
		s.dropCorruptLocked(digest, "open failed")

		return nil, Entry{}, fmt.Errorf("open asset %s: %w: %w", key, ErrCorrupt, err)
	}

	fi, err := f.Stat()
	if err != nil || fi.Size() != b.Size {
		f.Close() //nolint:errcheck
		s.dropCorruptLocked(digest, "size changed")

		return nil, Entry{}, fmt.Errorf("open asset %s: %w", key, ErrCorrupt)
	}

	b.LastUsed = s.now()

	return f, s.entryLocked(digest, b, s.neededSet()), nil
}

// dropCorruptLocked removes a corrupt blob from the manifest and disk. Called with s.mu held; takes the file
// lock for the manifest write.
func (s *Store) dropCorruptLocked(digest, why string) {
	s.log.Warn("dropping corrupt asset", zap.String("sha256", digest), zap.String("reason", why))
	s.metrics.errors.WithLabelValues("corrupt").Inc()

	err := s.withLock(func() error {
		s.refreshLocked()
		s.dropLocked(digest)
		_ = os.Remove(s.blobPath(digest))

		return s.saveLocked()
	})
	if err != nil {
		s.log.Error("save manifest after dropping corrupt asset", zap.Error(err))
	}
}

// Check re-hashes a cached asset when its file changed since it was last verified (or always when force is
// set) and drops it when the content no longer matches: the caller then fetches it again.
func (s *Store) Check(digest string, force bool) error {
	s.mu.Lock()
	s.refreshLocked()
	b, ok := s.man.Blobs[digest]
	var stamp fileStamp
	if ok {
		stamp = b.Stamp
	}
	s.mu.Unlock()

	if !ok {
		return fmt.Errorf("check asset %s: %w", digest, ErrNotFound)
	}

	fi, err := os.Stat(s.blobPath(digest))
	if err == nil && !force && stampOf(fi) == stamp {
		return nil
	}

	if err == nil {
		var sum string

		sum, err = hashFile(s.blobPath(digest))
		if err == nil && sum == digest {
			s.mu.Lock()
			if b, ok := s.man.Blobs[digest]; ok {
				b.Stamp = stampOf(fi)
			}
			s.mu.Unlock()

			return nil
		}
	}

	s.mu.Lock()
	s.dropCorruptLocked(digest, "content does not match digest")
	s.mu.Unlock()

	return fmt.Errorf("check asset %s: %w", digest, ErrCorrupt)
}

// Scrub re-hashes every cached asset and drops the corrupt ones; it returns the digests dropped.
func (s *Store) Scrub(ctx context.Context) ([]string, error) {
	entries, _ := s.List()

	var dropped []string

	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return dropped, err
		}

		if err := s.Check(e.SHA256, true); errors.Is(err, ErrCorrupt) {
			dropped = append(dropped, e.SHA256)
		}
	}

	return dropped, nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close() //nolint:errcheck

	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}

	return hex.EncodeToString(h.Sum(nil)), nil
}

// Evict removes cached assets by digest. Assets a current boot plan needs are refused with ErrNeeded.
func (s *Store) Evict(digests ...string) (evicted []string, refused map[string]error, err error) {
	refused = map[string]error{}

	s.mu.Lock()
	defer s.mu.Unlock()

	err = s.withLock(func() error {
		s.refreshLocked()

		needed := s.neededSet()

		for _, d := range digests {
			switch _, ok := s.man.Blobs[d]; {
			case ValidateDigest(d) != nil:
				refused[d] = ValidateDigest(d)
			case !ok:
				refused[d] = ErrNotFound
			case needed[d]:
				refused[d] = ErrNeeded
			case s.inflight[d] != nil:
				refused[d] = errors.New("asset is being written")
			default:
				s.dropLocked(d)
				_ = os.Remove(s.blobPath(d))
				evicted = append(evicted, d)
			}
		}

		if len(evicted) == 0 {
			return nil
		}

		return s.saveLocked()
	})

	return evicted, refused, err
}

// makeRoomLocked evicts least-recently-used assets nobody needs until size more bytes fit under the cap.
// Called with s.mu and the file lock held.
func (s *Store) makeRoomLocked(size int64, keep string) error {
	if size > s.cfg.MaxBytes {
		return fmt.Errorf("%w: asset of %d bytes exceeds the cap of %d", ErrNoSpace, size, s.cfg.MaxBytes)
	}

	used := s.usedLocked() + s.reservedLocked()
	if used+size <= s.cfg.MaxBytes {
		return nil
	}

	needed := s.neededSet()

	type cand struct {
		digest string
		b      *blobEntry
	}

	var cands []cand

	for d, b := range s.man.Blobs {
		if needed[d] || d == keep || s.inflight[d] != nil {
			continue
		}

		cands = append(cands, cand{d, b})
	}

	slices.SortFunc(cands, func(a, b cand) int { return a.b.LastUsed.Compare(b.b.LastUsed) })

	var victims []string

	for _, c := range cands {
		if used+size <= s.cfg.MaxBytes {
			break
		}

		victims = append(victims, c.digest)
		used -= c.b.Size
	}

	if used+size > s.cfg.MaxBytes {
		s.metrics.errors.WithLabelValues("no_space").Inc()

		return fmt.Errorf("%w: %d bytes needed, %d of %d used by assets current boot plans need or being written",
			ErrNoSpace, size, used, s.cfg.MaxBytes)
	}

	for _, d := range victims {
		s.log.Info("evicting least recently used asset", zap.String("sha256", d), zap.Int64("size", s.man.Blobs[d].Size))
		s.metrics.evictions.Inc()
		s.dropLocked(d)
		_ = os.Remove(s.blobPath(d))
	}

	return s.saveLocked()
}

// reservedLocked is the space promised to downloads in progress.
func (s *Store) reservedLocked() int64 {
	var total int64

	for _, f := range s.inflight {
		total += f.size
	}

	return total
}

// hashingFile writes to a file and a hash at once.
type hashingFile struct {
	f *os.File
	h hash.Hash
	n int64
}

func (w *hashingFile) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)

	if err != nil {
		return n, fmt.Errorf("%w: %w", errWrite, err)
	}

	return n, nil
}
