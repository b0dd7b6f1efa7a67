package assetcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
)

// Check re-hashes a cached asset when its file changed since it was last verified (or always when force is
// set) and drops it when the content no longer matches: the caller then fetches it again.
func (s *Store) Check(digest string, force bool) error {
	s.mu.Lock()
	s.idx.refresh()
	b, ok := s.idx.man.Blobs[digest]
	var stamp fileStamp
	if ok {
		stamp = b.Stamp
	}
	s.mu.Unlock()

	if !ok {
		return fmt.Errorf("check asset %s: %w", digest, ErrNotFound)
	}

	// read without mu, which would hold up every other call for as long as the hashing takes
	path := s.idx.blobPath(digest)

	fi, err := os.Stat(path)
	if err == nil && !force && stampOf(fi) == stamp {
		return nil
	}

	if err == nil {
		var sum string

		sum, err = hashFile(path)
		if err == nil && sum == digest {
			s.mu.Lock()
			if b, ok := s.idx.man.Blobs[digest]; ok {
				b.Stamp = stampOf(fi)
			}
			s.mu.Unlock()

			return nil
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	// Hashed without mu: the asset may have been evicted meanwhile (not corrupt, just gone), or evicted and
	// cached again (a new, verified file under the same path).
	s.idx.refresh()

	if _, ok := s.idx.man.Blobs[digest]; !ok {
		return fmt.Errorf("check asset %s: %w", digest, ErrNotFound)
	}

	if now, statErr := os.Stat(path); err == nil && statErr == nil && stampOf(now) != stampOf(fi) {
		return nil
	}

	s.dropCorrupt(digest, "content does not match digest")

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

// dropCorrupt removes a corrupt blob from the manifest and disk. Called with s.mu held; takes the file lock
// for the manifest write.
func (s *Store) dropCorrupt(digest, why string) {
	s.log.Warn("dropping corrupt asset", zap.String("sha256", digest), zap.String("reason", why))
	s.metrics.errors.WithLabelValues("corrupt").Inc()

	err := s.idx.update(func() error {
		s.idx.remove(digest)

		return s.idx.save()
	})
	if err != nil {
		s.log.Error("save manifest after dropping corrupt asset", zap.Error(err))
	}
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
