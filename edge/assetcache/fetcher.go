package assetcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Policy is the site's asset policy (passthrough, cache or offline), set by the controller.
type Policy string

// The policies.
const (
	// PolicyPassthrough: machines fetch install assets from the image factory themselves; nothing is cached.
	PolicyPassthrough Policy = "passthrough"
	// PolicyCache: fetch from the factory (or relay), verify, serve locally; machines wait until it is held.
	PolicyCache Policy = "cache"
	// PolicyOffline: serve only what is cached; fill by relay or import, never from the factory.
	PolicyOffline Policy = "offline"
)

// Validate checks the policy name.
func (p Policy) Validate() error {
	switch p {
	case PolicyPassthrough, PolicyCache, PolicyOffline:
		return nil
	default:
		return fmt.Errorf("unknown asset policy %q (want passthrough, cache or offline)", string(p))
	}
}

// State is what the fetcher knows about one asset.
type State string

// The states.
const (
	StatePresent  State = "present"
	StateFetching State = "fetching"
	StateMissing  State = "missing"
	StateFailed   State = "failed"
)

// Status reports one asset.
type Status struct {
	Ref   Ref
	State State
	Err   string
}

// FetcherConfig configures a Fetcher.
type FetcherConfig struct {
	// Policy is the policy until the controller sets one.
	Policy Policy
	// Workers is how many downloads run at once.
	Workers int
	// Timeout bounds one asset's download from one source.
	Timeout time.Duration
	// ScrubInterval is how often every cached asset is re-hashed (bit rot is not visible in file stamps);
	// 0 disables scrubbing.
	ScrubInterval time.Duration
}

// DefaultFetcher returns the default fetcher configuration.
func DefaultFetcher() FetcherConfig {
	return FetcherConfig{Policy: PolicyCache, Workers: 2, Timeout: 30 * time.Minute, ScrubInterval: 24 * time.Hour}
}

// Validate checks the configuration.
func (c FetcherConfig) Validate() error {
	if err := c.Policy.Validate(); err != nil {
		return err
	}

	if c.Workers <= 0 {
		return fmt.Errorf("assets: fetcher workers must be positive, got %d", c.Workers)
	}

	if c.Timeout <= 0 {
		return fmt.Errorf("assets: fetcher timeout must be positive, got %s", c.Timeout)
	}

	if c.ScrubInterval < 0 {
		return fmt.Errorf("assets: negative scrub interval %s", c.ScrubInterval)
	}

	return nil
}

// Fetcher keeps the cache filled according to the site policy: it downloads what the controller asks for in
// the background (from the factory under cache, by relay from the controller under cache and offline) and
// reports the asset state to the controller.
type Fetcher struct {
	cfg   FetcherConfig
	store *Store
	http  Source
	log   *zap.Logger

	mu     sync.Mutex
	policy Policy
	relay  *relayEntry
	states map[string]*Status // by digest
	// names is every name asked for, by digest: two names may share one content (an image's top manifest is
	// both a blob and its tag), and each is linked once the content is here.
	names   map[string]map[string]Ref
	pending []Ref
	wake    chan struct{}
	changed chan struct{}
}

// NewFetcher returns a fetcher over a store; httpSrc fetches from asset URLs (nil: never).
func NewFetcher(cfg FetcherConfig, store *Store, httpSrc Source, log *zap.Logger) (*Fetcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	return &Fetcher{
		cfg:     cfg,
		store:   store,
		http:    httpSrc,
		log:     log.With(zap.String("component", "asset-fetcher")),
		policy:  cfg.Policy,
		states:  map[string]*Status{},
		names:   map[string]map[string]Ref{},
		wake:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
	}, nil
}

// Policy returns the current policy.
func (f *Fetcher) Policy() Policy {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.policy
}

// relayEntry is the relay of one uplink session; done closes when the session's relay is replaced or cleared.
type relayEntry struct {
	src  Source
	done chan struct{}
}

// SetRelay sets (or, with nil, clears) the relay source; the uplink session calls it. Downloads in progress
// through the previous relay are cut and resume through the new one.
func (f *Fetcher) SetRelay(src Source) {
	f.mu.Lock()
	if f.relay != nil {
		close(f.relay.done)
	}

	f.relay = nil
	if src != nil {
		f.relay = &relayEntry{src: src, done: make(chan struct{})}
	}

	retry := f.policy != PolicyPassthrough && src != nil
	f.mu.Unlock()

	if retry {
		f.requeueMissing()
	}
}

// requeueMissing queues again what is missing or failed (a relay has become available).
func (f *Fetcher) requeueMissing() {
	f.mu.Lock()
	defer f.mu.Unlock()

	for _, st := range f.states {
		if st.State == StateMissing || st.State == StateFailed {
			st.State = StateFetching
			st.Err = ""
			f.pending = append(f.pending, st.Ref)
		}
	}

	f.signal()
}

func (f *Fetcher) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}

	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// Ensure sets the policy and makes the fetcher hold the given assets: present ones are checked (a file that
// changed on disk is re-hashed and, when corrupt, dropped and fetched again), missing ones are queued for
// download when the policy allows. It returns the state of each at once.
func (f *Fetcher) Ensure(policy Policy, refs []Ref) ([]Status, error) {
	if err := policy.Validate(); err != nil {
		return nil, err
	}

	for _, r := range refs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("ensure assets: %w", err)
		}
	}

	present := make([]bool, len(refs))

	for i, r := range refs {
		if f.store.Has(r.SHA256) && f.store.Check(r.SHA256, false) == nil && f.store.Link(r) == nil {
			present[i] = true
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	f.policy = policy
	out := make([]Status, 0, len(refs))

	for i, r := range refs {
		st := f.states[r.SHA256]
		if st == nil {
			st = &Status{Ref: r}
			f.states[r.SHA256] = st
			f.store.Hold(r.SHA256)
		}

		st.Ref = r

		if f.names[r.SHA256] == nil {
			f.names[r.SHA256] = map[string]Ref{}
		}

		f.names[r.SHA256][r.Name] = r

		switch {
		case present[i]:
			st.State, st.Err = StatePresent, ""
		case st.State == StateFetching:
		case policy == PolicyPassthrough,
			policy == PolicyOffline && f.relay == nil,
			policy == PolicyCache && f.relay == nil && (f.http == nil || len(r.URLs) == 0):
			st.State = StateMissing
		default:
			st.State, st.Err = StateFetching, ""
			f.pending = append(f.pending, r)
		}

		out = append(out, *st)
	}

	f.signal()

	return out, nil
}

// Statuses returns what the fetcher knows about the assets it was asked for.
func (f *Fetcher) Statuses() []Status {
	f.mu.Lock()
	defer f.mu.Unlock()

	out := make([]Status, 0, len(f.states))
	for _, st := range f.states {
		out = append(out, *st)
	}

	sort.Slice(out, func(i, j int) bool { return out[i].Ref.Name < out[j].Ref.Name })

	return out
}

// Coming reports whether /assets/<name> is on its way: asked for by the controller and being fetched now (a
// boot that needs it can wait for it, where one that needs an asset nobody is fetching cannot).
func (f *Fetcher) Coming(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	for digest, names := range f.names {
		if _, ok := names[name]; ok && f.states[digest] != nil && f.states[digest].State == StateFetching {
			return true
		}
	}

	return false
}

// Changed is signalled (coalesced) whenever an asset's state changes.
func (f *Fetcher) Changed() <-chan struct{} { return f.changed }

// Run downloads queued assets until ctx ends.
func (f *Fetcher) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)

	if f.cfg.ScrubInterval > 0 {
		g.Go(func() error {
			t := time.NewTicker(f.cfg.ScrubInterval)
			defer t.Stop()

			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}

				dropped, err := f.store.Scrub(ctx)
				if err != nil && ctx.Err() == nil {
					f.log.Warn("scrub asset cache", zap.Error(err))
				}

				if len(dropped) > 0 {
					f.log.Warn("scrub dropped corrupt assets", zap.Strings("sha256", dropped))
					f.requeueDropped(dropped)
				}
			}
		})
	}

	for range f.cfg.Workers {
		g.Go(func() error {
			for {
				ref, ok := f.next()
				if !ok {
					select {
					case <-ctx.Done():
						return nil
					case <-f.wake:
						continue
					}
				}

				f.fetch(ctx, ref)
			}
		})
	}

	return g.Wait()
}

// requeueDropped fetches again the assets a scrub dropped that the controller had asked for.
func (f *Fetcher) requeueDropped(digests []string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	for _, d := range digests {
		if st := f.states[d]; st != nil {
			st.State = StateFetching
			f.pending = append(f.pending, st.Ref)
		}
	}

	f.signal()
}

func (f *Fetcher) next() (Ref, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if len(f.pending) == 0 {
		return Ref{}, false
	}

	r := f.pending[0]
	f.pending = f.pending[1:]

	if len(f.pending) > 0 {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}

	return r, true
}

func (f *Fetcher) sources(ref Ref) []Source {
	f.mu.Lock()
	defer f.mu.Unlock()

	var srcs []Source

	if f.policy == PolicyCache && f.http != nil && len(ref.URLs) > 0 {
		srcs = append(srcs, f.http)
	}

	if f.policy != PolicyPassthrough && f.relay != nil {
		srcs = append(srcs, sessionRelay{f: f})
	}

	return srcs
}

func (f *Fetcher) fetch(ctx context.Context, ref Ref) {
	var errs []error

	for _, src := range f.sources(ref) {
		fctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
		err := f.store.Put(fctx, ref, src)

		cancel()

		if err == nil {
			f.linkNames(ref)
			f.setState(ref, StatePresent, "")

			return
		}

		if ctx.Err() != nil {
			return
		}

		f.log.Warn("asset fetch failed", zap.String("asset", ref.Name), zap.String("source", src.Name()), zap.Error(err))
		errs = append(errs, err)
	}

	if len(errs) == 0 {
		if f.store.Has(ref.SHA256) {
			f.linkNames(ref)
			f.setState(ref, StatePresent, "")
		} else {
			f.setState(ref, StateMissing, "")
		}

		return
	}

	f.setState(ref, StateFailed, errors.Join(errs...).Error())
}

// linkNames records every other name asked for under ref's digest, now that its content is here.
func (f *Fetcher) linkNames(ref Ref) {
	f.mu.Lock()

	var others []Ref

	for name, r := range f.names[ref.SHA256] {
		if name != ref.Name {
			others = append(others, r)
		}
	}

	f.mu.Unlock()

	for _, r := range others {
		if err := f.store.Link(r); err != nil {
			f.log.Warn("link asset name", zap.String("asset", r.Name), zap.Error(err))
		}
	}
}

func (f *Fetcher) setState(ref Ref, state State, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	st := f.states[ref.SHA256]
	if st == nil {
		st = &Status{Ref: ref}
		f.states[ref.SHA256] = st
		f.store.Hold(ref.SHA256)
	}

	st.State, st.Err = state, msg

	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// sessionRelay relays through whichever uplink session is current: a stream on a session that ends is cut,
// and the next attempt waits for the next session (bounded by the download's context).
type sessionRelay struct{ f *Fetcher }

func (sessionRelay) Name() string { return "relay" }

func (r sessionRelay) Open(ctx context.Context, ref Ref, offset int64) (io.ReadCloser, error) {
	var entry *relayEntry

	for {
		r.f.mu.Lock()
		entry = r.f.relay
		r.f.mu.Unlock()

		if entry != nil {
			break
		}

		select { // no session: poll until one comes back
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}

	sctx, cancel := context.WithCancel(ctx)

	go func() {
		select {
		case <-entry.done:
			cancel()
		case <-sctx.Done():
		}
	}()

	rc, err := entry.src.Open(sctx, ref, offset)
	if err != nil {
		cancel()

		return nil, err
	}

	return &cancelOnClose{ReadCloser: rc, cancel: cancel}, nil
}

type cancelOnClose struct {
	io.ReadCloser

	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()

	return err
}

// OnSession runs for the life of an uplink session: it relays through the controller and reports the asset
// state on connect and on every change. Wire it into the uplink's OnSession hooks.
func (f *Fetcher) OnSession(ctx context.Context, conn grpc.ClientConnInterface) error {
	client := assetsapi.NewAssetRelayClient(conn)

	f.SetRelay(RelaySource{Client: client})
	defer f.SetRelay(nil)

	for {
		if _, err := client.Report(ctx, f.Report()); err != nil {
			if ctx.Err() != nil {
				return nil
			}

			f.log.Warn("report asset state", zap.Error(err))
		}

		select {
		case <-ctx.Done():
			return nil
		case <-f.changed:
		}
	}
}

// Report builds the report sent to the controller: every cached asset plus what was asked for but is missing.
func (f *Fetcher) Report() *assetsapi.AssetReport {
	entries, used := f.store.List()
	rep := &assetsapi.AssetReport{BytesUsed: used, BytesCap: f.store.Cap(), Policy: PolicyToProto(f.Policy())}
	seen := map[string]bool{}

	for _, e := range entries {
		seen[e.SHA256] = true
		rep.Assets = append(rep.Assets, entryToProto(e))
	}

	for _, st := range f.Statuses() {
		if !seen[st.Ref.SHA256] {
			rep.Assets = append(rep.Assets, statusToProto(st))
		}
	}

	return rep
}
