package dhcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/shared/atomicfile"
)

// Lease is one client's address: bound (acknowledged, persisted) or offered (pending, in memory only).
type Lease struct {
	MAC     [6]byte
	IP      netip.Addr
	Expires time.Time
	// Offered is an OFFER not yet REQUESTed: it expires after LeaseLimits.OfferTTL.
	Offered bool
}

func (l *Lease) live(now time.Time) bool { return now.Before(l.Expires) }

// LeaseLimits bound what clients can make the lease state hold.
type LeaseLimits struct {
	// OfferTTL is how long an unrequested offer holds its address.
	OfferTTL time.Duration
	// MaxOffers bounds the pending offers (the oldest is withdrawn for a new one): a DISCOVER flood with
	// random MACs holds at most this many addresses, for at most OfferTTL.
	MaxOffers int
	// DeclineHold is how long a declined (or probed in-use) address is not offered.
	DeclineHold time.Duration
	// MaxBad bounds the addresses held back at once: a DECLINE storm cannot take the pool.
	MaxBad int
}

// DefaultLeaseLimits are the production limits.
func DefaultLeaseLimits() LeaseLimits {
	return LeaseLimits{OfferTTL: 30 * time.Second, MaxOffers: 64, DeclineHold: 10 * time.Minute, MaxBad: 64}
}

// forPool bounds the limits by the pool: offers and held-back addresses never take more than a quarter of it
// each, so a flood leaves half the pool to everyone else.
func (l LeaseLimits) forPool(p *Pool) LeaseLimits {
	quarter := max(1, p.Size()/4)
	l.MaxOffers, l.MaxBad = min(l.MaxOffers, quarter), min(l.MaxBad, quarter)

	return l
}

// LeaseState is the full-mode server's leases, pending offers and held-back addresses. It is not safe for
// concurrent use (LeaseStore serializes it).
type LeaseState struct {
	byMAC  map[[6]byte]*Lease
	byIP   map[netip.Addr]*Lease
	offers map[[6]byte]*Lease
	bad    map[netip.Addr]time.Time
}

// NewLeaseState returns an empty state.
func NewLeaseState() *LeaseState {
	return &LeaseState{byMAC: map[[6]byte]*Lease{}, byIP: map[netip.Addr]*Lease{}, offers: map[[6]byte]*Lease{}, bad: map[netip.Addr]time.Time{}}
}

// Counts returns the bound leases live at now, the pending offers and the addresses held back.
func (st *LeaseState) Counts(now time.Time) (bound, offered, bad int) {
	for _, l := range st.byMAC {
		switch {
		case l.Offered && l.live(now):
			offered++
		case !l.Offered && l.live(now):
			bound++
		}
	}

	for _, until := range st.bad {
		if now.Before(until) {
			bad++
		}
	}

	return bound, offered, bad
}

func (st *LeaseState) isBad(ip netip.Addr, now time.Time) bool {
	until, ok := st.bad[ip]

	return ok && now.Before(until)
}

// usable reports whether ip may be given to mac now.
func (st *LeaseState) usable(p *Pool, ip netip.Addr, mac [6]byte, now time.Time) bool {
	if !p.Subnet.Contains(ip) || p.never(ip) || st.isBad(ip, now) {
		return false
	}

	if holder, ok := p.reservedBy[ip]; ok {
		if holder != mac {
			return false
		}
	} else if !p.inPool(ip) {
		return false
	}

	l := st.byIP[ip]

	return l == nil || l.MAC == mac || !l.live(now)
}

// free picks an address for mac: first one nobody ever held, else the one whose lease ended longest ago.
func (st *LeaseState) free(p *Pool, mac [6]byte, now time.Time) (netip.Addr, bool) {
	for ip := p.Start; ip.IsValid() && !p.End.Less(ip); ip = ip.Next() {
		if st.byIP[ip] == nil && st.usable(p, ip, mac, now) {
			return ip, true
		}
	}

	var oldest *Lease

	for ip, l := range st.byIP {
		if st.usable(p, ip, mac, now) && (oldest == nil || l.Expires.Before(oldest.Expires)) {
			oldest = l
		}
	}

	if oldest == nil {
		return netip.Addr{}, false
	}

	return oldest.IP, true
}

func (st *LeaseState) remove(l *Lease) {
	if l == nil {
		return
	}

	if st.byMAC[l.MAC] == l {
		delete(st.byMAC, l.MAC)
	}

	if st.byIP[l.IP] == l {
		delete(st.byIP, l.IP)
	}

	if st.offers[l.MAC] == l {
		delete(st.offers, l.MAC)
	}
}

func (st *LeaseState) put(l *Lease) {
	st.remove(st.byMAC[l.MAC])
	st.remove(st.byIP[l.IP])
	st.byMAC[l.MAC], st.byIP[l.IP] = l, l

	if l.Offered {
		st.offers[l.MAC] = l
	}
}

// Apply carries out a decision of DecideLease at now. It reports whether what is persisted changed, and a
// reason when the decision could not be carried out (a DECLINE beyond the held-back bound).
func (st *LeaseState) Apply(p *Pool, lim LeaseLimits, d LeaseDecision, now time.Time) (dirty bool, refused DropReason) {
	lim = lim.forPool(p)
	st.expireOffers(now)

	switch d.Action {
	case ActOffer:
		if l := st.byMAC[d.MAC]; l != nil && l.IP == d.IP && (l.live(now) && !l.Offered) {
			return false, "" // its own live lease: the offer changes nothing
		}

		wasBound := st.byMAC[d.MAC] != nil && !st.byMAC[d.MAC].Offered
		st.put(&Lease{MAC: d.MAC, IP: d.IP, Expires: now.Add(lim.OfferTTL), Offered: true})
		st.evictOffers(lim.MaxOffers, d.MAC)

		return wasBound, ""
	case ActAck:
		st.put(&Lease{MAC: d.MAC, IP: d.IP, Expires: now.Add(p.LeaseTime)})

		return true, ""
	case ActDecline:
		st.remove(st.byMAC[d.MAC])

		return true, st.holdBack(d.IP, lim, now)
	case ActRelease:
		if l := st.byMAC[d.MAC]; l != nil && l.IP == d.IP {
			l.Expires = now // kept, expired: the client gets the same address back while nobody needs it
		}

		return true, ""
	case ActForget:
		if l := st.offers[d.MAC]; l != nil {
			st.remove(l)
		}
	}

	return false, ""
}

// Conflict withdraws an offer of ip whose probe found another host using it, and holds ip back.
func (st *LeaseState) Conflict(p *Pool, lim LeaseLimits, mac [6]byte, ip netip.Addr, now time.Time) DropReason {
	if l := st.byMAC[mac]; l != nil && l.IP == ip {
		st.remove(l)
	}

	return st.holdBack(ip, lim.forPool(p), now)
}

func (st *LeaseState) holdBack(ip netip.Addr, lim LeaseLimits, now time.Time) DropReason {
	if len(st.bad) >= lim.MaxBad {
		for a, until := range st.bad {
			if !now.Before(until) {
				delete(st.bad, a)
			}
		}
	}

	if len(st.bad) >= lim.MaxBad {
		return DropDeclineLimit
	}

	st.bad[ip] = now.Add(lim.DeclineHold)

	return ""
}

func (st *LeaseState) expireOffers(now time.Time) {
	for _, l := range st.offers {
		if !l.live(now) {
			st.remove(l)
		}
	}
}

// evictOffers withdraws the oldest pending offers (never keep's) beyond limit.
func (st *LeaseState) evictOffers(limit int, keep [6]byte) {
	for len(st.offers) > limit {
		var oldest *Lease

		for mac, l := range st.offers {
			if mac != keep && (oldest == nil || l.Expires.Before(oldest.Expires)) {
				oldest = l
			}
		}

		if oldest == nil {
			return
		}

		st.remove(oldest)
	}
}

// LeaseFileName is the lease file in the state directory.
const LeaseFileName = "dhcp-leases.json"

// maxStoredLeases bounds the leases read back from disk.
const maxStoredLeases = 1 << 17

type leaseFile struct {
	Leases []storedLease `json:"leases"`
	Bad    []storedBad   `json:"held_back,omitempty"`
}

type storedLease struct {
	MAC     string    `json:"mac"`
	IP      string    `json:"ip"`
	Expires time.Time `json:"expires"`
}

type storedBad struct {
	IP    string    `json:"ip"`
	Until time.Time `json:"until"`
}

// LeaseStore is the lease state persisted in the edge's state directory: every change to bound leases or
// held-back addresses is written atomically before the reply that depends on it is sent, so leases survive an
// edge restart and a WAN cut (the site's settings come from the persisted boot table).
//
// Writes are committed in groups: while one write is under way, the changes made meanwhile wait and go out
// together in the next one, so a rack powering on at once costs a few writes, not one per exchange.
type LeaseStore struct {
	path string

	mu sync.Mutex
	st *LeaseState
	// changed counts the changes made to st; written is the count the file holds; failed is the count of the
	// last write that failed, with its error. writing is set while a write is under way (mu released); saved
	// is broadcast when it ends.
	changed, written, failed uint64
	failErr                  error
	writing                  bool
	saved                    *sync.Cond
	// writes counts the writes made (tests: changes are grouped).
	writes uint64
}

// OpenLeases loads the leases from dir (none when the file is absent). A file that does not decode is moved
// aside and the state starts empty.
func OpenLeases(dir string, log *zap.Logger) (*LeaseStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}

	s := &LeaseStore{path: filepath.Join(dir, LeaseFileName), st: NewLeaseState()}
	s.saved = sync.NewCond(&s.mu)

	data, err := os.ReadFile(s.path)

	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("read dhcp leases: %w", err)
	}

	if err := s.decode(data); err != nil {
		aside := s.path + ".corrupt"
		if rerr := os.Rename(s.path, aside); rerr != nil {
			return nil, fmt.Errorf("move corrupt dhcp leases aside: %w", rerr)
		}

		log.Warn("dhcp leases did not decode; moved aside, starting empty", zap.String("moved_to", aside), zap.Error(err))
		s.st = NewLeaseState()
	}

	return s, nil
}

func (s *LeaseStore) decode(data []byte) error {
	var f leaseFile
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}

	if len(f.Leases) > maxStoredLeases || len(f.Bad) > maxStoredLeases {
		return fmt.Errorf("%d leases and %d held-back addresses, at most %d", len(f.Leases), len(f.Bad), maxStoredLeases)
	}

	for _, l := range f.Leases {
		hw, err := net.ParseMAC(l.MAC)
		ip, ierr := netip.ParseAddr(l.IP)

		if err != nil || len(hw) != 6 || ierr != nil || !ip.Is4() {
			return fmt.Errorf("lease %q %q does not parse", l.MAC, l.IP)
		}

		s.st.put(&Lease{MAC: [6]byte(hw), IP: ip, Expires: l.Expires})
	}

	for _, b := range f.Bad {
		ip, err := netip.ParseAddr(b.IP)
		if err != nil || !ip.Is4() {
			return fmt.Errorf("held-back address %q does not parse", b.IP)
		}

		s.st.bad[ip] = b.Until
	}

	return nil
}

// Do runs fn on the state under the store's lock and, when fn reports it dirty, returns once a write holding the
// change is on disk; an error is the persisting's (the state in memory has changed anyway).
func (s *LeaseStore) Do(fn func(st *LeaseState) bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	if !fn(s.st) {
		return nil
	}

	s.changed++
	want := s.changed

	for s.written < want {
		if s.failed >= want {
			return s.failErr
		}

		if s.writing {
			s.saved.Wait()

			continue
		}

		// This caller writes everything changed so far, its own change and those made while the last write ran.
		s.writing = true
		gen := s.changed
		data, err := s.encodeLocked()

		if err == nil {
			s.mu.Unlock()
			err = atomicfile.Write(s.path, data, 0o600)
			s.mu.Lock()

			if err != nil {
				err = fmt.Errorf("persist dhcp leases: %w", err)
			}
		}

		s.writing = false

		if err == nil {
			s.written = max(s.written, gen)
			s.writes++
		} else {
			s.failed, s.failErr = gen, err
		}

		s.saved.Broadcast()
	}

	return nil
}

// encodeLocked is the lease file of the state now.
func (s *LeaseStore) encodeLocked() ([]byte, error) {
	f := leaseFile{Leases: []storedLease{}}

	for _, l := range s.st.byMAC {
		if !l.Offered {
			f.Leases = append(f.Leases, storedLease{MAC: net.HardwareAddr(l.MAC[:]).String(), IP: l.IP.String(), Expires: l.Expires.UTC()})
		}
	}

	for ip, until := range s.st.bad {
		f.Bad = append(f.Bad, storedBad{IP: ip.String(), Until: until.UTC()})
	}

	data, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode dhcp leases: %w", err)
	}

	return data, nil
}
