package tunnel

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/outpost-metal/outpost/shared/metal"
)

// ContestWindow is how long two MACs asking for one machine's boot script keep it contested.
const ContestWindow = 30 * time.Minute

// maxBooks bounds the machines a BootBook remembers: a site has at most a few thousand; a flood of made-up
// UUIDs resets the book.
const maxBooks = 65536

// BootBook is the evidence of each machine's boot that a tunnel is bound to (an AddressBook and an Evidence):
// the address that last fetched its boot script or config, and the MACs that asked for its boot script lately
// (two of them: a cloned UUID, or a forger).
type BootBook struct {
	now func() time.Time

	mu   sync.Mutex
	seen map[string]netip.Addr
	macs map[string]map[string]time.Time // uuid -> mac -> last asked
}

// NewBootBook returns an empty book; now is the clock (nil: time.Now).
func NewBootBook(now func() time.Time) *BootBook {
	if now == nil {
		now = time.Now
	}

	return &BootBook{now: now, seen: map[string]netip.Addr{}, macs: map[string]map[string]time.Time{}}
}

// Note records that the machine's boot script (mac set) or config (mac nil) was fetched from addr.
func (b *BootBook) Note(uuid string, addr netip.Addr, mac net.HardwareAddr) {
	if uuid == "" || !addr.IsValid() {
		return
	}

	uuid = metal.NormalizeID(uuid)

	b.mu.Lock()
	defer b.mu.Unlock()

	if len(b.seen) > maxBooks {
		b.seen, b.macs = map[string]netip.Addr{}, map[string]map[string]time.Time{}
	}

	b.seen[uuid] = addr

	if len(mac) == 0 {
		return
	}

	m := b.macs[uuid]
	if m == nil {
		m = map[string]time.Time{}
		b.macs[uuid] = m
	}

	now := b.now()
	for k, at := range m {
		if now.Sub(at) > ContestWindow || len(m) > 8 {
			delete(m, k)
		}
	}

	m[mac.String()] = now
}

// SeenAddr implements AddressBook.
func (b *BootBook) SeenAddr(machineID string) (netip.Addr, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()

	a, ok := b.seen[metal.NormalizeID(machineID)]

	return a, ok
}

// BootAddr implements Evidence.
func (b *BootBook) BootAddr(machineID string) (netip.Addr, bool) { return b.SeenAddr(machineID) }

// Contested implements Evidence: two MACs asked for the machine's boot script within ContestWindow.
func (b *BootBook) Contested(machineID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()

	n, now := 0, b.now()

	for _, at := range b.macs[metal.NormalizeID(machineID)] {
		if now.Sub(at) <= ContestWindow {
			n++
		}
	}

	return n > 1
}
