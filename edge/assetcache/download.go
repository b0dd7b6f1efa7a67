package assetcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
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

		if fl == nil { // registered: ours to download
			break
		}

		// someone else is downloading it: wait and look again
		select {
		case <-fl.done:
			if fl.err != nil {
				return fl.err
			}
		case <-ctx.Done():
			return fmt.Errorf("put asset %s: %w", ref.Name, ctx.Err())
		}
	}

	err := s.download(ctx, ref, src)
	s.finish(ref, err)

	return err
}

// flight is a download in progress; those waiting for it block on done and then read err.
type flight struct {
	done chan struct{}
	err  error
	size int64 // bytes reserved under the cap while writing
}

// flights are the downloads in progress by digest, guarded by the Store's mu.
type flights map[string]*flight

// reserved is the space promised to downloads in progress.
func (f flights) reserved() int64 {
	var total int64

	for _, fl := range f {
		total += fl.size
	}

	return total
}

// begin either records the name of an asset already cached (done), returns a download in flight to wait
// for, or reserves room and registers a new download for the caller to run (and finish).
func (s *Store) begin(ref Ref) (bool, *flight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if fl := s.inflight[ref.SHA256]; fl != nil {
		return false, fl, nil
	}

	var done bool

	err := s.idx.update(func() error {
		if b, ok := s.idx.man.Blobs[ref.SHA256]; ok && b.Size == ref.Size {
			done = true

			if s.idx.man.Names[ref.Name] == ref.SHA256 {
				return nil
			}

			s.idx.man.Names[ref.Name] = ref.SHA256

			return s.idx.save()
		}

		return s.makeRoom(ref.Size)
	})
	if err != nil {
		return false, nil, fmt.Errorf("put asset %s: %w", ref.Name, err)
	}

	if !done {
		s.inflight[ref.SHA256] = &flight{done: make(chan struct{}), size: ref.Size}
	}

	return done, nil, nil
}

// finish unregisters the download begin registered and wakes those waiting for it with its outcome.
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

// download runs one transfer of ref from src and installs the verified file.
func (s *Store) download(ctx context.Context, ref Ref, src Source) error {
	t := &transfer{
		ref:      ref,
		src:      src,
		attempts: s.cfg.Attempts,
		backoff:  s.cfg.RetryBackoff,
		log:      s.log.With(zap.String("asset", ref.Name), zap.String("sha256", ref.SHA256), zap.String("source", src.Name())),
		metrics:  s.metrics,
	}

	if err := t.open(s.idx.partialPath(ref.SHA256), s.idx.tmpDir()); err != nil {
		return fmt.Errorf("put asset %s: %w", ref.Name, err)
	}
	defer t.close()

	if err := t.run(ctx); err != nil {
		return err
	}

	// Renamed in while still open and locked; closed afterwards.
	return s.install(ref, t.file.Name(), func() { t.committed = true })
}

// install renames a verified file into the blob directory and records it in the manifest; committed is called
// once the file is renamed.
func (s *Store) install(ref Ref, path string, committed func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.idx.update(func() error {
		if err := os.Chmod(path, 0o444); err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		if err := os.Rename(path, s.idx.blobPath(ref.SHA256)); err != nil {
			return fmt.Errorf("put asset %s: rename into cache: %w", ref.Name, err)
		}

		committed()

		fi, err := os.Stat(s.idx.blobPath(ref.SHA256))
		if err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		s.idx.man.Blobs[ref.SHA256] = &blobEntry{Size: ref.Size, LastUsed: s.now(), Stamp: stampOf(fi)}
		s.idx.man.Names[ref.Name] = ref.SHA256

		if err := atomicfile.SyncDir(s.idx.blobDir()); err != nil {
			return fmt.Errorf("put asset %s: sync: %w", ref.Name, err)
		}

		if err := s.idx.save(); err != nil {
			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}

		s.log.Info("asset cached", zap.String("asset", ref.Name), zap.String("sha256", ref.SHA256), zap.Int64("size", ref.Size))

		return nil
	})
}

// transfer is one download of an asset from a source into a temporary file, resumed from a partial download
// when there is one and retried while the source makes progress, then verified. Store.install moves the file
// into the cache; close removes it unless it was moved in or is worth resuming later.
type transfer struct {
	ref      Ref
	src      Source
	attempts int           // tries without progress before giving up (Config.Attempts)
	backoff  time.Duration // pause before a retry (Config.RetryBackoff)
	log      *zap.Logger
	metrics  *metrics

	file   *os.File
	w      *hashingFile // writes to file; w.n is the bytes written so far
	shared bool         // file is the asset's shared partial download, not a private temporary file

	// A download that is cut short (the edge stops, the source stays away) keeps its shared partial file for
	// the next attempt, also after a restart (keep); one that went wrong for good starts afresh next time.
	keep      bool
	committed bool // renamed into the cache
}

// open opens the asset's partial download at partial, resuming it when one is there: its bytes are hashed
// again and writing continues at its end. The file is locked while open; when another process holds it, this
// download uses a private temporary file in tmpDir instead, which is never kept.
func (t *transfer) open(partial, tmpDir string) error {
	var (
		f   *os.File
		err error
	)

	for range 3 {
		if f, err = lockedFile(partial); err != nil || f != nil {
			break
		}
	}

	if err != nil {
		return err
	}

	if f == nil {
		if f, err = os.CreateTemp(tmpDir, t.ref.SHA256+".*.private"); err != nil {
			return fmt.Errorf("create temporary file: %w", err)
		}

		t.file, t.w = f, &hashingFile{f: f, h: sha256.New()}

		return nil
	}

	w := &hashingFile{f: f, h: sha256.New()}

	n, err := io.Copy(w.h, f)
	if err == nil && n > t.ref.Size {
		err = f.Truncate(0) // not this asset's bytes: start again
		n = 0
		w.h.Reset()
	}

	if err == nil {
		_, err = f.Seek(n, io.SeekStart)
	}

	if err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("read partial download: %w", err)
	}

	w.n = n
	t.file, t.w, t.shared = f, w, true

	return nil
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

// close removes the file unless it was committed or is a shared partial download to keep, then closes it. The
// file is removed before it is closed, while its lock is still held; closing releases the lock.
func (t *transfer) close() {
	if !t.committed && (!t.keep || !t.shared) {
		os.Remove(t.file.Name()) //nolint:errcheck
	}

	t.file.Close() //nolint:errcheck
}

// run copies the rest of the asset from the source, retrying while it makes progress, and verifies the file.
func (t *transfer) run(ctx context.Context) error {
	ref, src := t.ref, t.src

	if t.w.n > 0 {
		t.log.Info("resuming a partial download", zap.Int64("offset", t.w.n))
	}

	if t.w.n == ref.Size {
		// Complete already (the edge stopped between the last byte and the rename): the digest decides.
		return t.verify()
	}

	failures := 0

	for {
		before := t.w.n

		err := t.copyFrom(ctx)
		if err == nil {
			break
		}

		if ctx.Err() != nil {
			t.keep = true

			return fmt.Errorf("put asset %s: %w", ref.Name, ctx.Err())
		}

		if !retryable(err) {
			t.metrics.countStopped(err)

			return fmt.Errorf("put asset %s from %s: %w", ref.Name, src.Name(), err)
		}

		if t.w.n > before {
			failures = 0
			t.log.Info("asset download broke off, resuming", zap.Int64("offset", t.w.n), zap.Error(err))

			continue
		}

		failures++
		if failures >= t.attempts {
			t.metrics.errors.WithLabelValues("source").Inc()

			t.keep = true

			return fmt.Errorf("put asset %s from %s after %d attempts: %w", ref.Name, src.Name(), failures, err)
		}

		t.log.Info("asset download failed, retrying", zap.Int("attempt", failures), zap.Error(err))

		if err := sleep(ctx, t.backoff); err != nil {
			t.keep = true

			return fmt.Errorf("put asset %s: %w", ref.Name, err)
		}
	}

	return t.verify()
}

// copyFrom reads from the source at the current offset until the end or an error.
func (t *transfer) copyFrom(ctx context.Context) error {
	ref, w := t.ref, t.w

	rc, err := t.src.Open(ctx, ref, w.n)
	if err != nil {
		return err
	}
	defer rc.Close() //nolint:errcheck

	// read one byte more than expected so that an oversized source is noticed
	n, err := io.Copy(w, io.LimitReader(rc, ref.Size-w.n+1))
	t.metrics.bytesFetched.WithLabelValues(t.src.Name()).Add(float64(n))

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

// verify checks what was written against ref's size and digest and syncs the file, ready to be installed.
func (t *transfer) verify() error {
	ref := t.ref

	if t.w.n != ref.Size {
		t.metrics.errors.WithLabelValues("size_mismatch").Inc()

		return fmt.Errorf("put asset %s: %w: got %d bytes, want %d", ref.Name, ErrSizeMismatch, t.w.n, ref.Size)
	}

	if sum := hex.EncodeToString(t.w.h.Sum(nil)); sum != ref.SHA256 {
		t.metrics.errors.WithLabelValues("digest_mismatch").Inc()

		return fmt.Errorf("put asset %s from %s: %w: got sha256 %s", ref.Name, t.src.Name(), ErrDigestMismatch, sum)
	}

	if err := t.file.Sync(); err != nil {
		t.metrics.countError(err)

		return fmt.Errorf("put asset %s: sync: %w", ref.Name, err)
	}

	return nil
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
