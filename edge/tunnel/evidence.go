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

// BootWindow is how long after the edge answered a MAC's DHCP or PXE request a boot script request naming
// that MAC still counts as the boot the edge served it: iPXE asks for boot.ipxe seconds after its DHCP.
const BootWindow = 10 * time.Minute

// maxBooks bounds the machines a BootBook remembers: a site has at most a few thousand; a flood of made-up
// UUIDs resets the book.
const maxBooks = 65536

// BootBook is the evidence of each machine's boot that a tunnel is bound to (an AddressBook and an Evidence):
// the address the edge last served the machine's boot script to (boot.ipxe with its UUID and MAC), and the
// MACs that asked for its boot script lately (two of them: a cloned UUID, or a forger).
//
// Only a boot the edge served counts, never whoever fetched a URL: a request naming no MAC is no evidence,
// a config fetch (/config?u=) is none (it carries no MAC and is answered to any host), and where the edge
// answers a MAC's DHCP or PXE requests (DHCPAnswered) a boot script request naming that MAC counts only within
// BootWindow of the last answer: a request replayed from another host, with no boot behind it, does not.
type BootBook struct {
	now func() time.Time

	mu   sync.Mutex
	seen map[metal.ID]netip.Addr
	macs map[metal.ID]map[string]time.Time // uuid -> mac -> last asked
	dhcp map[string]time.Time              // mac -> when the edge last answered its DHCP or PXE request

	// path is the file seen is kept in (LoadBootBook; "" for none); dirty says seen changed since it was saved.
	path  string
	dirty bool
}

// NewBootBook returns an empty book; now is the clock (nil: time.Now).
func NewBootBook(now func() time.Time) *BootBook {
	if now == nil {
		now = time.Now
	}

	return &BootBook{now: now, seen: map[metal.ID]netip.Addr{}, macs: map[metal.ID]map[string]time.Time{}, dhcp: map[string]time.Time{}}
}

// DHCPAnswered records that the edge answered a DHCP or PXE request from mac (a machine starting to boot).
func (b *BootBook) DHCPAnswered(mac net.HardwareAddr) {
	if len(mac) == 0 {
		return
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if len(b.dhcp) > maxBooks {
		b.dhcp = map[string]time.Time{}
	}

	b.dhcp[mac.String()] = b.now()
}

// Note records that the edge served the machine's boot script, asked for with mac, to addr: the evidence
// its tunnel is bound to, unless the edge answers mac's DHCP and did not within BootWindow before (see
// BootBook). A request with no MAC (nil) is no evidence and changes nothing.
func (b *BootBook) Note(uuid metal.ID, addr netip.Addr, mac net.HardwareAddr) {
	if uuid == "" || !addr.IsValid() || len(mac) == 0 {
		return
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if len(b.seen) > maxBooks || len(b.macs) > maxBooks {
		b.seen, b.macs = map[metal.ID]netip.Addr{}, map[metal.ID]map[string]time.Time{}
		b.dirty = true
	}

	now := b.now()

	if answered, ok := b.dhcp[mac.String()]; (!ok || now.Sub(answered) <= BootWindow) && b.seen[uuid] != addr {
		b.seen[uuid] = addr
		b.dirty = true
	}

	m := b.macs[uuid]
	if m == nil {
		m = map[string]time.Time{}
		b.macs[uuid] = m
	}

	for k, at := range m {
		if now.Sub(at) > ContestWindow || len(m) > 8 {
			delete(m, k)
		}
	}

	m[mac.String()] = now
}

// SeenAddr implements AddressBook.
func (b *BootBook) SeenAddr(machineID metal.ID) (netip.Addr, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()

	a, ok := b.seen[machineID]

	return a, ok
}

// BootAddr implements Evidence.
func (b *BootBook) BootAddr(machineID metal.ID) (netip.Addr, bool) { return b.SeenAddr(machineID) }

// Contested implements Evidence: two MACs asked for the machine's boot script within ContestWindow.
func (b *BootBook) Contested(machineID metal.ID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()

	n, now := 0, b.now()

	for _, at := range b.macs[machineID] {
		if now.Sub(at) <= ContestWindow {
			n++
		}
	}

	return n > 1
}
