package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/shared/metal"
)

// BootBookFile is the file in the edge's state directory that keeps each machine's boot evidence (the address
// the edge last served its boot script to) across edge restarts: an agent that booted through the edge
// reconnects to the restarted edge, as it would to the one that served it. Without it, every agent running at
// the site was refused (no boot evidence) until its machine rebooted, and a machine the controller wants to
// install looked like one installing.
const BootBookFile = "boot-evidence.json"

// maxBootBookFile bounds the file read back (maxBooks addresses are well under it).
const maxBootBookFile = 16 << 20

// LoadBootBook returns a book holding the evidence kept in dir (none when the file is missing), which Run
// keeps there. A file that cannot be read as evidence is set aside (renamed *.bad) with a warning: the book
// starts empty, and machines bind again on their next boot.
func LoadBootBook(dir string, now func() time.Time, log *zap.Logger) (*BootBook, error) {
	b := NewBootBook(now)
	b.path = filepath.Join(dir, BootBookFile)

	f, err := os.Open(b.path)
	if errors.Is(err, os.ErrNotExist) {
		return b, nil
	}

	if err != nil {
		return nil, fmt.Errorf("boot evidence: %w", err)
	}

	data, err := io.ReadAll(io.LimitReader(f, maxBootBookFile+1))
	f.Close() //nolint:errcheck // read only

	if err != nil {
		return nil, fmt.Errorf("boot evidence: read %s: %w", b.path, err)
	}

	seen, err := decodeEvidence(data)
	if err != nil {
		log.Warn("boot evidence not readable: set aside, machines bind again on their next boot", zap.String("file", b.path), zap.Error(err))

		if rerr := os.Rename(b.path, b.path+".bad"); rerr != nil {
			return nil, fmt.Errorf("boot evidence: set aside %s: %w", b.path, rerr)
		}

		return b, nil
	}

	b.seen = seen

	return b, nil
}

// decodeEvidence reads the file's JSON object of machine ID to address; entries that are not one are dropped.
func decodeEvidence(data []byte) (map[metal.ID]netip.Addr, error) {
	if len(data) > maxBootBookFile {
		return nil, fmt.Errorf("over %d bytes", maxBootBookFile)
	}

	var raw map[string]string
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}

	if len(raw) > maxBooks {
		return nil, fmt.Errorf("%d machines, at most %d", len(raw), maxBooks)
	}

	seen := make(map[metal.ID]netip.Addr, len(raw))

	for raw, a := range raw {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			continue
		}

		id, err := metal.ParsePeerID(raw)
		if err != nil {
			continue
		}

		seen[id] = addr
	}

	return seen, nil
}

// Run writes the evidence to the book's file each second it changed, and once more when ctx ends. A book not
// loaded from a directory keeps nothing.
func (b *BootBook) Run(ctx context.Context) error {
	if b.path == "" {
		<-ctx.Done()

		return nil
	}

	tick := time.NewTicker(time.Second)
	defer tick.Stop()

	for {
		select {
		case <-ctx.Done():
			return b.save()
		case <-tick.C:
			if err := b.save(); err != nil {
				return err
			}
		}
	}
}

// save writes the evidence when it changed since the last save (a new file renamed over the old one).
func (b *BootBook) save() error {
	b.mu.Lock()
	if !b.dirty {
		b.mu.Unlock()

		return nil
	}

	raw := make(map[string]string, len(b.seen))
	for id, a := range b.seen {
		raw[id.String()] = a.String()
	}

	b.dirty = false
	b.mu.Unlock()

	data, err := json.Marshal(raw)
	if err != nil {
		return err
	}

	tmp := b.path + ".tmp"
	if err = os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("boot evidence: %w", err)
	}

	if err = os.Rename(tmp, b.path); err != nil {
		return fmt.Errorf("boot evidence: %w", err)
	}

	return nil
}
