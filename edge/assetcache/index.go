package assetcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/outpost-metal/outpost/shared/atomicfile"

	"go.uber.org/zap"
)

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

// index is the cache directory on disk: its layout, the manifest and the cross-process file lock. The manifest
// (man, stamp) is guarded by the Store's mu: every method here is called with mu held, except the layout
// helpers and withLock, which only read dir. Changes to the manifest are made under the file lock too (update),
// so that another process sharing the directory sees each one whole; a process reloads the manifest when its
// stamp shows that another one has rewritten it (refresh).
type index struct {
	dir     string
	log     *zap.Logger
	metrics *metrics

	man   manifest
	stamp fileStamp // manifest.json as last read or written by this process
}

// openIndex creates the cache directory layout in dir, removes what earlier runs left behind (cleanTmp) and
// loads the manifest. Nobody else sees the index until it returns, so it takes no mu.
func openIndex(dir string, log *zap.Logger, m *metrics) (*index, error) {
	x := &index{dir: dir, log: log, metrics: m}

	for _, d := range []string{dir, x.blobDir(), x.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create asset directory: %w", err)
		}
	}

	if err := x.withLock(func() error {
		if err := x.cleanTmp(); err != nil {
			return err
		}

		return x.reconcile()
	}); err != nil {
		return nil, err
	}

	return x, nil
}

func (x *index) blobDir() string               { return filepath.Join(x.dir, "blobs", "sha256") }
func (x *index) tmpDir() string                { return filepath.Join(x.dir, "tmp") }
func (x *index) manifestPath() string          { return filepath.Join(x.dir, "manifest.json") }
func (x *index) blobPath(digest string) string { return filepath.Join(x.blobDir(), digest) }

// partialSuffix names a download in progress: <tmp>/<sha256>.partial, so a later attempt (also after a
// restart) finds it and resumes where it stopped.
const partialSuffix = ".partial"

func (x *index) partialPath(digest string) string {
	return filepath.Join(x.tmpDir(), digest+partialSuffix)
}

// withLock runs fn holding the cross-process lock on the cache directory.
func (x *index) withLock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(x.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
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

// update runs fn under the file lock on a manifest that is up to date with what other processes wrote.
func (x *index) update(fn func() error) error {
	return x.withLock(func() error {
		x.refresh()

		return fn()
	})
}

// cleanTmp removes what earlier runs left in the temporary directory, except partial downloads that may be
// resumed: those younger than partialMaxAge and not in use by another process. Import staging directories and
// private temporary files are removed once they are an hour old (a running import in another process keeps
// its own).
func (x *index) cleanTmp() error {
	items, err := os.ReadDir(x.tmpDir())
	if err != nil {
		return fmt.Errorf("read asset temp directory: %w", err)
	}

	now := time.Now()

	for _, it := range items {
		path := filepath.Join(x.tmpDir(), it.Name())

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
func (x *index) reconcile() error {
	if err := x.load(); err != nil {
		return err
	}

	changed := false

	for digest, b := range x.man.Blobs {
		fi, err := os.Stat(x.blobPath(digest))
		if err != nil || fi.Size() != b.Size {
			x.log.Warn("dropping asset whose file is missing or has the wrong size", zap.String("sha256", digest))
			x.metrics.errors.WithLabelValues("corrupt").Inc()
			x.drop(digest)

			changed = true
		}
	}

	files, err := os.ReadDir(x.blobDir())
	if err != nil {
		return fmt.Errorf("read asset blob directory: %w", err)
	}

	for _, f := range files {
		if _, ok := x.man.Blobs[f.Name()]; !ok {
			_ = os.Remove(filepath.Join(x.blobDir(), f.Name()))
		}
	}

	if changed {
		return x.save()
	}

	return nil
}

// load reads manifest.json (an absent file is an empty cache).
func (x *index) load() error {
	x.man = manifest{Version: manifestVersion, Names: map[string]string{}, Blobs: map[string]*blobEntry{}}

	f, err := os.Open(x.manifestPath())
	if errors.Is(err, fs.ErrNotExist) {
		x.stamp = fileStamp{}

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

	x.man = m
	x.stamp = stampOf(fi)

	return nil
}

// refresh reloads the manifest when another process has rewritten it.
func (x *index) refresh() {
	fi, err := os.Stat(x.manifestPath())
	if err != nil || stampOf(fi) == x.stamp {
		return
	}

	old := x.man

	if err := x.load(); err != nil {
		x.log.Error("reload asset manifest, keeping the previous one", zap.Error(err))
		x.man = old

		return
	}

	for d, b := range old.Blobs {
		if nb, ok := x.man.Blobs[d]; ok && b.LastUsed.After(nb.LastUsed) {
			nb.LastUsed = b.LastUsed
		}
	}
}

// save writes the manifest atomically (temp file, fsync, rename, fsync directory).
func (x *index) save() error {
	data, err := json.MarshalIndent(x.man, "", "  ")
	if err != nil {
		return fmt.Errorf("encode asset manifest: %w", err)
	}

	if err := atomicfile.Write(x.manifestPath(), data, 0o644); err != nil {
		return fmt.Errorf("save asset manifest: %w", err)
	}

	if fi, err := os.Stat(x.manifestPath()); err == nil {
		x.stamp = stampOf(fi)
	}

	x.metrics.bytesUsed.Set(float64(x.used()))

	return nil
}

// resolve maps a digest or logical name to a digest and its entry.
func (x *index) resolve(key string) (string, *blobEntry, bool) {
	digest := key

	if ValidateDigest(key) != nil {
		d, ok := x.man.Names[key]
		if !ok {
			return "", nil, false
		}

		digest = d
	}

	b, ok := x.man.Blobs[digest]

	return digest, b, ok
}

// entry describes a cached blob with its logical names; kept are the digests never evicted (space.kept).
func (x *index) entry(digest string, b *blobEntry, kept map[string]bool) Entry {
	var names []string

	for n, d := range x.man.Names {
		if d == digest {
			names = append(names, n)
		}
	}

	sort.Strings(names)

	return Entry{SHA256: digest, Size: b.Size, Names: names, LastUsed: b.LastUsed, Needed: kept[digest]}
}

// drop forgets a blob and the names pointing at it (the caller saves the manifest).
func (x *index) drop(digest string) {
	delete(x.man.Blobs, digest)

	for n, d := range x.man.Names {
		if d == digest {
			delete(x.man.Names, n)
		}
	}
}

// remove drops a blob and deletes its file (the caller saves the manifest).
func (x *index) remove(digest string) {
	x.drop(digest)
	_ = os.Remove(x.blobPath(digest))
}

// used is the bytes the cached blobs take.
func (x *index) used() int64 {
	var total int64

	for _, b := range x.man.Blobs {
		total += b.Size
	}

	return total
}
