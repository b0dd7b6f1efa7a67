// Package assets is the controller's side of boot assets: the per-site asset policy and state bookkeeping
// (what each edge has cached, what current plans need but the site lacks, bytes relayed) and the relay that
// streams asset files the controller holds to edges that cannot fetch them themselves.
package assets

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/envflag"
)

// ParsePolicy parses a policy name as operators type it: passthrough, cache or offline.
func ParsePolicy(s string) (assetsapi.Policy, error) {
	switch strings.ToLower(s) {
	case "passthrough":
		return assetsapi.Policy_POLICY_PASSTHROUGH, nil
	case "cache":
		return assetsapi.Policy_POLICY_CACHE, nil
	case "offline":
		return assetsapi.Policy_POLICY_OFFLINE, nil
	default:
		return assetsapi.Policy_POLICY_UNSPECIFIED, fmt.Errorf("unknown asset policy %q (want passthrough, cache or offline)", s)
	}
}

// PolicyName is the operator-facing name of a policy.
func PolicyName(p assetsapi.Policy) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "POLICY_"))
}

// ValidPolicy reports whether p is one of the policies: passthrough, cache or offline.
func ValidPolicy(p assetsapi.Policy) bool {
	switch p {
	case assetsapi.Policy_POLICY_PASSTHROUGH, assetsapi.Policy_POLICY_CACHE, assetsapi.Policy_POLICY_OFFLINE:
		return true
	default:
		return false
	}
}

// PolicyFlag is p as a flag value (pflag.Value): it takes passthrough, cache or offline, so that a
// configuration holds the policy parsed.
func PolicyFlag(p *assetsapi.Policy) pflag.Value {
	return envflag.Parsed(p, "policy", ParsePolicy, PolicyName)
}

// SiteAssets is one site's asset state as `controller site` shows it.
type SiteAssets struct {
	SiteID string
	Policy assetsapi.Policy
	// Cached lists what the edge last reported as cached.
	Cached []*assetsapi.AssetStatus
	// Missing lists what current boot plans need but the edge has not reported as cached.
	Missing []*assetsapi.AssetRef
	// Failed maps digests to the edge's last fetch error.
	Failed       map[string]string
	BytesUsed    int64
	BytesCap     int64
	BytesRelayed int64
	Relays       int64
	ReportedAt   time.Time
	// PushError is the last failure to send the policy and needed assets to the edge ("" when it worked).
	PushError string
}

// Catalog keeps the per-site asset policy and state. It is safe for concurrent use.
type Catalog struct {
	now           func() time.Time
	defaultPolicy assetsapi.Policy

	metrics *Metrics

	mu    sync.Mutex
	sites map[string]*siteState
}

type siteState struct {
	policy       assetsapi.Policy
	needed       []*assetsapi.AssetRef
	report       *assetsapi.AssetReport
	reportedAt   time.Time
	bytesRelayed int64
	relays       int64
	pushErr      string
	changed      chan struct{} // signalled when the policy or the needed assets change
}

// CountInto makes the catalog count relayed bytes and relays into m.
func (c *Catalog) CountInto(m *Metrics) *Catalog {
	c.metrics = m

	return c
}

// NewCatalog returns an empty catalog; sites without a policy get defaultPolicy.
func NewCatalog(defaultPolicy assetsapi.Policy, now func() time.Time) *Catalog {
	if now == nil {
		now = time.Now
	}

	return &Catalog{now: now, defaultPolicy: defaultPolicy, sites: map[string]*siteState{}}
}

func (c *Catalog) siteLocked(site string) *siteState {
	s := c.sites[site]
	if s == nil {
		s = &siteState{policy: c.defaultPolicy, changed: make(chan struct{}, 1)}
		c.sites[site] = s
	}

	return s
}

// SetPolicy sets a site's asset policy; POLICY_UNSPECIFIED gives it the default policy.
func (c *Catalog) SetPolicy(site string, p assetsapi.Policy) error {
	if _, ok := assetsapi.Policy_name[int32(p)]; !ok {
		return fmt.Errorf("set asset policy of site %s: unknown policy %d", site, p)
	}

	if p == assetsapi.Policy_POLICY_UNSPECIFIED {
		p = c.defaultPolicy
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	s := c.siteLocked(site)
	if s.policy != p {
		s.policy = p
		notify(s)
	}

	return nil
}

// Policy returns a site's asset policy.
func (c *Catalog) Policy(site string) assetsapi.Policy {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.siteLocked(site).policy
}

// SetNeeded records the assets the site's current boot plans need.
func (c *Catalog) SetNeeded(site string, refs []*assetsapi.AssetRef) {
	c.mu.Lock()
	defer c.mu.Unlock()

	s := c.siteLocked(site)
	if slices.EqualFunc(s.needed, refs, sameRef) {
		return // nothing new for the edge: no push
	}

	s.needed = refs
	notify(s)
}

// sameRef reports whether two references name the same content under the same name.
func sameRef(a, b *assetsapi.AssetRef) bool {
	return a.GetName() == b.GetName() && a.GetSha256() == b.GetSha256() && a.GetSize() == b.GetSize() &&
		slices.Equal(a.GetUrls(), b.GetUrls())
}

func notify(s *siteState) {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Needed returns what a site must hold now (as last handed to SetNeeded).
func (c *Catalog) Needed(site string) []*assetsapi.AssetRef {
	c.mu.Lock()
	defer c.mu.Unlock()

	return slices.Clone(c.siteLocked(site).needed)
}

// Serves reports whether machines at the site can boot the edge-local asset name now: its edge last reported
// it cached, or the site's policy lets its machines fetch it upstream themselves (passthrough).
func (c *Catalog) Serves(site, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()

	s, ok := c.sites[site]
	if !ok {
		return c.defaultPolicy == assetsapi.Policy_POLICY_PASSTHROUGH // no report from its edge yet
	}

	if s.policy == assetsapi.Policy_POLICY_PASSTHROUGH {
		return true
	}

	for _, a := range s.report.GetAssets() {
		if a.GetRef().GetName() == name && a.GetState() == assetsapi.AssetState_ASSET_STATE_PRESENT {
			return true
		}
	}

	return false
}

// RecordReport stores an edge's asset report.
func (c *Catalog) RecordReport(site string, rep *assetsapi.AssetReport) {
	c.mu.Lock()
	defer c.mu.Unlock()

	s := c.siteLocked(site)
	s.report = rep
	s.reportedAt = c.now()
}

// AddRelayed counts bytes relayed to a site; finished says a relay stream ended.
func (c *Catalog) AddRelayed(site string, n int64, finished bool) {
	c.mu.Lock()
	defer c.mu.Unlock()

	s := c.siteLocked(site)
	s.bytesRelayed += n

	if finished {
		s.relays++
	}

	if c.metrics != nil {
		c.metrics.relayedBytes.WithLabelValues(site).Add(float64(n))

		if finished {
			c.metrics.relays.WithLabelValues(site).Inc()
		}
	}
}

// Site returns a site's asset state.
func (c *Catalog) Site(site string) SiteAssets {
	c.mu.Lock()
	defer c.mu.Unlock()

	s := c.siteLocked(site)
	out := SiteAssets{
		SiteID: site, Policy: s.policy, BytesRelayed: s.bytesRelayed, Relays: s.relays,
		ReportedAt: s.reportedAt, Failed: map[string]string{}, PushError: s.pushErr,
	}

	present := map[string]bool{}

	if s.report != nil {
		out.BytesUsed, out.BytesCap = s.report.GetBytesUsed(), s.report.GetBytesCap()

		for _, a := range s.report.GetAssets() {
			switch a.GetState() {
			case assetsapi.AssetState_ASSET_STATE_PRESENT:
				present[a.GetRef().GetSha256()] = true
				out.Cached = append(out.Cached, a)
			case assetsapi.AssetState_ASSET_STATE_FAILED:
				out.Failed[a.GetRef().GetSha256()] = a.GetError()
			default:
			}
		}
	}

	for _, r := range s.needed {
		if !present[r.GetSha256()] {
			out.Missing = append(out.Missing, r)
		}
	}

	sort.Slice(out.Cached, func(i, j int) bool { return out.Cached[i].GetRef().GetName() < out.Cached[j].GetRef().GetName() })

	return out
}

// SiteAssets returns a site's asset state as the admin API reports it (it fits sites.AssetState).
func (c *Catalog) SiteAssets(site string) *assetsapi.SiteAssetState {
	return c.Site(site).Proto()
}

// Sites lists the sites the catalog knows.
func (c *Catalog) Sites() []string {
	c.mu.Lock()
	defer c.mu.Unlock()

	out := make([]string, 0, len(c.sites))
	for s := range c.sites {
		out = append(out, s)
	}

	sort.Strings(out)

	return out
}

// Push sends a site's policy and needed assets to its edge (EdgeAssets.Ensure over the site's session) and
// records the states the edge answers with.
func (c *Catalog) Push(ctx context.Context, site string, conn grpc.ClientConnInterface) error {
	c.mu.Lock()
	s := c.siteLocked(site)
	req := &assetsapi.EnsureRequest{Policy: s.policy, Assets: s.needed}
	c.mu.Unlock()

	resp, err := assetsapi.NewEdgeAssetsClient(conn).Ensure(ctx, req)

	c.mu.Lock()
	defer c.mu.Unlock()

	s = c.siteLocked(site)

	if err != nil {
		s.pushErr = err.Error()

		return fmt.Errorf("push assets to site %s: %w", site, err)
	}

	s.pushErr = ""
	if s.report == nil {
		s.report = &assetsapi.AssetReport{Policy: req.GetPolicy(), Assets: resp.GetStatuses()}
		s.reportedAt = c.now()
	}

	return nil
}

// OnSession runs for the life of a site's uplink session: it pushes the site's policy and needed assets when
// the session starts and again whenever they change. Wire it into the site server's OnSession hooks. A failed
// push is recorded (SiteAssets.PushError) and retried on the next change or after retryAfter.
func (c *Catalog) OnSession(ctx context.Context, site string, conn grpc.ClientConnInterface) error {
	const retryAfter = 30 * time.Second

	c.mu.Lock()
	changed := c.siteLocked(site).changed
	c.mu.Unlock()

	for {
		err := c.Push(ctx, site, conn)
		if ctx.Err() != nil {
			return nil
		}

		var retry <-chan time.Time
		if err != nil {
			retry = time.After(retryAfter)
		}

		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry:
		}
	}
}
