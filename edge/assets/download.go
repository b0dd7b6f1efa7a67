package assets

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/outpost-metal/outpost/shared/atomicfile"

	"go.uber.org/zap"
)

// Source is somewhere an asset can be read from: the image factory over HTTP, the controller's relay, a
// directory. Open must return the content from offset to the end (so broken downloads resume).
type Source interface {
	// Name identifies the source in logs and metrics ("http", "relay", "import").
	Name() string
	// Open returns the asset's content starting at offset.
	Open(ctx context.Context, ref Ref, offset int64) (io.ReadCloser, error)
}

// Put downloads an asset from src into the cache: it is written to a hidden temporary file, resumed from the
// last byte written when the source breaks off, verified against ref's size and digest, then renamed in and
// recorded under ref's name. Concurrent calls for the same digest share one download. A partial, oversized or
// mismatching download never becomes visible.
func (s *Store) Put(ctx context.Context, ref Ref, src Source) error {
	if err := ref.Validate(); err != nil {
		s.metrics.errors.WithLabelValues("bad_ref").Inc()

		return fmt.Errorf("put asset: %w", err)
	}

	for {
		done, fl, err := s.begin(ref)
		if err != nil || done {
			return err
		}

		if fl != nil { // someone else is downloading it: wait and look again
			select {
			case <-fl.done:
				if fl.err != nil {
					return fl.err
				}
			case <-ctx.Done():
				return fmt.Errorf("put asset %s: %w", ref.Name, ctx.Err())
			}

			continue
		}

		err = s.download(ctx, ref, src)
		s.finish(ref, err)

		return err
	}
}

// begin either records the name of an asset already cached (done), returns a download in flight to wait
// for, or reserves room and registers a new download for the caller to run.
func (s *Store) begin(ref Ref) (bool, *flight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if fl := s.inflight[ref.SHA256]; fl != nil {
		return false, fl, nil
	}

	var done bool

	err := s.withLock(func() error {
		s.refreshLocked()

		if b, ok := s.man.Blobs[ref.SHA256]; ok && b.Size == ref.Size {
			done = true

			if s.man.Names[ref.Name] == ref.SHA256 {
				return nil
			}

			s.man.Names[ref.Name] = ref.SHA256

			return s.saveLocked()
		}

		return s.makeRoomLocked(ref.Size, "")
	})
	if err != nil {
		return false, nil, fmt.Errorf("put asset %s: %w", ref.Name, err)
	}

	if !done {
		s.inflight[ref.SHA256] = &flight{done: make(chan struct{}), size: ref.Size}
	}

	return done, nil, nil
}

// Link records ref's name for an asset already cached under ref's digest (ErrNotFound otherwise).
func (s *Store) Link(ref Ref) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("link asset: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	return s.withLock(func() error {
		s.refreshLocked()

		b, ok := s.man.Blobs[ref.SHA256]
		if !ok || b.Size != ref.Size {
			return fmt.Errorf("link asset %s: %w", ref.Name, ErrNotFound)
		}

		if s.man.Names[ref.Name] == ref.SHA256 {
			return nil
		}

		s.man.Names[ref.Name] = ref.SHA256

		return s.saveLocked()
	})
}

func (s *Store) finish(ref Ref, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	fl := s.inflight[ref.SHA256]
	delete(s.inflight, ref.SHA256)

	if fl != nil {
		fl.err = err
		close(fl.done)
	}
}

func (s *Store) download(ctx context.Context, ref Ref, src Source) error {
	log := s.log.With(zap.String("asset", ref.Name), zap.String("sha256", ref.SHA256), zap.String("source", src.Name()))

	tmp, w, shared, err := s.openPartial(ref)
	if err != nil {
		return fmt.Errorf("put asset %s: %w", ref.Name, err)
	}

	if w.n > 0 {
		log.Info("resuming a partial download", zap.Int64("offset", w.n))
	}

	// A download that is cut short (the edge stops, the source stays away) keeps its shared partial file for
	// the next attempt, also after a restart; one that went wrong for good starts afresh next time. The file
	// is removed before it is closed, while its lock is still held.
	committed, keep := false, false

	defer func() {
		if !committed && (!keep || !shared) {
			os.Remove(tmp.Name()) //nolint:errcheck
		}

		tmp.Close() //nolint:errcheck // closing also releases the file's lock
	}()

	if w.n == ref.Size {
		// Complete already (the edge stopped between the last byte and the rename): the digest decides.
		return s.commit(ref, tmp, w, src.Name(), func() { committed = true })
	}

	failures := 0

	for {
		before := w.n

		err := s.copyFrom(ctx, ref, src, w)
		if err == nil {
			break
		}

		if ctx.Err() != nil {
			keep = true

			return fmt.Errorf("put asset %s: %w", ref.Name, ctx.Err())
		}

		if !retryable(err) {
			s.countError(err)

			return fmt.Errorf("put asset %s from %s: %w", ref.Name, src.Name(), err)
		}

		if w.n > before {
			failures = 0
			log.Info("asset download broke off, resuming", zap.Int64("offset", w.n), zap.Error(err))

			continue
		}

		failures++
		if failures >= s.cfg.Attempts {
			s.metrics.errors.WithLabelValues("source").Inc()

			keep = true

			return fmt.Errorf("put asset %s from %s after %d attempts: %w", ref.Name, src.Name(), failures, err)
		}

		log.Info("asset download failed, retrying", zap.Int("attempt", failures), zap.Error(err))

		if err := sleep(ctx, s.cfg.RetryBackoff); err != nil {
			keep = true

			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}
	}

	return s.commit(ref, tmp, w, src.Name(), func() { committed = true })
}

// partialSuffix names a download in progress: <tmp>/<sha256>.partial, so a later attempt (also after a
// restart) finds it and resumes where it stopped.
const partialSuffix = ".partial"

// openPartial opens ref's partial download, resuming it when one is there: its bytes are hashed again and
// writing continues at its end. The file is locked while open (shared reports that); when another process
// holds it, this download uses a private temporary file instead, which is never kept.
func (s *Store) openPartial(ref Ref) (f *os.File, w *hashingFile, shared bool, err error) {
	path := filepath.Join(s.tmpDir(), ref.SHA256+partialSuffix)

	for range 3 {
		if f, err = lockedFile(path); err != nil || f != nil {
			break
		}
	}

	if err != nil {
		return nil, nil, false, err
	}

	if f == nil {
		if f, err = os.CreateTemp(s.tmpDir(), ref.SHA256+".*.private"); err != nil {
			return nil, nil, false, fmt.Errorf("create temporary file: %w", err)
		}

		return f, &hashingFile{f: f, h: sha256.New()}, false, nil
	}

	w = &hashingFile{f: f, h: sha256.New()}

	n, err := io.Copy(w.h, f)
	if err == nil && n > ref.Size {
		err = f.Truncate(0) // not this asset's bytes: start again
		n = 0
		w.h.Reset()
	}

	if err == nil {
		_, err = f.Seek(n, io.SeekStart)
	}

	if err != nil {
		f.Close() //nolint:errcheck

		return nil, nil, false, fmt.Errorf("read partial download: %w", err)
	}

	w.n = n

	return f, w, true, nil
}

// lockedFile opens (creating) path and locks it; nil without an error when another process holds the lock or
// the file was replaced while the lock was taken (the caller tries again or works elsewhere).
func lockedFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open partial download: %w", err)
	}

	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close() //nolint:errcheck

		return nil, nil // busy: the caller falls back
	}

	// The holder before us may have renamed or removed the file after we opened it.
	held, err1 := f.Stat()
	now, err2 := os.Stat(path)

	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		f.Close() //nolint:errcheck

		return nil, nil
	}

	return f, nil
}

// copyFrom reads from the source at the current offset until the end or an error.
func (s *Store) copyFrom(ctx context.Context, ref Ref, src Source, w *hashingFile) error {
	rc, err := src.Open(ctx, ref, w.n)
	if err != nil {
		return err
	}
	defer rc.Close() //nolint:errcheck

	// read one byte more than expected so that an oversized source is noticed
	n, err := io.Copy(w, io.LimitReader(rc, ref.Size-w.n+1))
	s.metrics.bytesFetched.WithLabelValues(src.Name()).Add(float64(n))

	if err != nil {
		if IsDiskFull(err) || errors.Is(err, errWrite) {
			return &permanentError{err}
		}

		return err
	}

	if w.n > ref.Size {
		return &permanentError{fmt.Errorf("%w: source sent more than %d bytes", ErrSizeMismatch, ref.Size)}
	}

	if w.n < ref.Size {
		return fmt.Errorf("%w: source ended at %d of %d bytes", io.ErrUnexpectedEOF, w.n, ref.Size)
	}

	return nil
}

// commit verifies the temporary file and renames it into the cache (the caller closes it afterwards).
func (s *Store) commit(ref Ref, tmp *os.File, w *hashingFile, source string, committed func()) error {
	if w.n != ref.Size {
		s.metrics.errors.WithLabelValues("size_mismatch").Inc()

		return fmt.Errorf("put asset %s: %w: got %d bytes, want %d", ref.Name, ErrSizeMismatch, w.n, ref.Size)
	}

	if sum := hex.EncodeToString(w.h.Sum(nil)); sum != ref.SHA256 {
		s.metrics.errors.WithLabelValues("digest_mismatch").Inc()

		return fmt.Errorf("put asset %s from %s: %w: got sha256 %s", ref.Name, source, ErrDigestMismatch, sum)
	}

	if err := tmp.Sync(); err != nil {
		s.countError(err)

		return fmt.Errorf("put asset %s: sync: %w", ref.Name, err)
	}

	// Renamed in while still open and locked; the caller closes it.
	return s.install(ref, tmp.Name(), committed)
}

// install renames a verified file into the blob directory and records it in the manifest.
func (s *Store) install(ref Ref, path string, committed func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.withLock(func() error {
		s.refreshLocked()

		if err := os.Chmod(path, 0o444); err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		if err := os.Rename(path, s.blobPath(ref.SHA256)); err != nil {
			return fmt.Errorf("put asset %s: rename into cache: %w", ref.Name, err)
		}

		committed()

		fi, err := os.Stat(s.blobPath(ref.SHA256))
		if err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		s.man.Blobs[ref.SHA256] = &blobEntry{Size: ref.Size, LastUsed: s.now(), Stamp: stampOf(fi)}
		s.man.Names[ref.Name] = ref.SHA256

		if err := atomicfile.SyncDir(s.blobDir()); err != nil {
			return fmt.Errorf("put asset %s: sync: %w", ref.Name, err)
		}

		if err := s.saveLocked(); err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		s.log.Info("asset cached", zap.String("asset", ref.Name), zap.String("sha256", ref.SHA256), zap.Int64("size", ref.Size))

		return nil
	})
}

func (s *Store) countError(err error) {
	switch {
	case IsDiskFull(err):
		s.metrics.errors.WithLabelValues("disk_full").Inc()
	case errors.Is(err, ErrSizeMismatch):
		s.metrics.errors.WithLabelValues("size_mismatch").Inc()
	default:
		s.metrics.errors.WithLabelValues("write").Inc()
	}
}

// errWrite marks local write failures (never worth retrying against the source).
var errWrite = errors.New("write asset")

// permanentError stops retries.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// PermanentError wraps an error a Source returns when retrying cannot help (for example the asset is unknown
// to the relay).
func PermanentError(err error) error { return &permanentError{err} }

func retryable(err error) bool {
	var p *permanentError

	return !errors.As(err, &p)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tempPath returns a path for staging files in the cache's temporary directory.
func (s *Store) stagingDir() (string, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "import-*")
	if err != nil {
		return "", fmt.Errorf("create staging directory: %w", err)
	}

	return filepath.Clean(dir), nil
}
