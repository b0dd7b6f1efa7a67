package bootplans

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Plans holds the desired boot table of every site and keeps each connected edge in sync: a full snapshot
// when a session starts, then deltas, each acknowledged by the edge once persisted. It is a prometheus
// Collector of its own metrics: how long a table waited for its edge's acknowledgement, and how many sites'
// edges have not acknowledged their latest table yet.
type Plans struct {
	log *zap.Logger
	now func() time.Time

	mu    sync.Mutex
	sites map[string]*siteState

	ackLag   prometheus.Histogram
	unacked  prometheus.GaugeFunc
	pushTime prometheus.Histogram
}

type siteState struct {
	desired *bootpb.Table
	// acked is the last table the edge acknowledged in the current or last session.
	acked *bootpb.Table
	// changed is closed and replaced whenever desired or acked changes.
	changed chan struct{}
}

// NewPlans returns an empty Plans. now stamps versions (nil means time.Now).
func NewPlans(logger *zap.Logger, now func() time.Time) *Plans {
	if now == nil {
		now = time.Now
	}

	p := &Plans{log: logger.With(zap.String("component", "bootplans")), now: now, sites: map[string]*siteState{}}

	p.ackLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "ack_lag_seconds",
		Help:    "From a site's boot table changing to its edge acknowledging that version (or a later one).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms to 262 s
	})
	p.pushTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "push_duration_seconds",
		Help:    "One push of a boot table (snapshot or delta) to an edge, until its acknowledgement.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
	p.unacked = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "sites_unacknowledged",
		Help: "Sites whose edge has not acknowledged the latest boot table (offline sites among them).",
	}, p.countUnacked)

	return p
}

// Describe implements prometheus.Collector.
func (p *Plans) Describe(ch chan<- *prometheus.Desc) {
	p.ackLag.Describe(ch)
	p.pushTime.Describe(ch)
	p.unacked.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Plans) Collect(ch chan<- prometheus.Metric) {
	p.ackLag.Collect(ch)
	p.pushTime.Collect(ch)
	p.unacked.Collect(ch)
}

func (p *Plans) countUnacked() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()

	n := 0

	for _, st := range p.sites {
		if st.desired.GetVersion() > st.acked.GetVersion() {
			n++
		}
	}

	return float64(n)
}

func (p *Plans) state(site string) *siteState {
	st, ok := p.sites[site]
	if !ok {
		st = &siteState{changed: make(chan struct{})}
		p.sites[site] = st
	}

	return st
}

func (st *siteState) notify() {
	close(st.changed)
	st.changed = make(chan struct{})
}

// Set makes tbl the site's desired table and returns its version. Versions come from the clock and
// always increase, so they keep increasing across controller restarts.
func (p *Plans) Set(site string, tbl *bootpb.Table) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()

	st := p.state(site)
	next := proto.Clone(tbl).(*bootpb.Table)

	v := uint64(p.now().UnixNano())
	if st.desired != nil && v <= st.desired.GetVersion() {
		v = st.desired.GetVersion() + 1
	}

	next.Version = v
	st.desired = next
	st.notify()

	return v
}

// WaitAcked blocks until the site's edge has acknowledged version (or a later one) or ctx ends.
// Power actions that depend on a new plan wait here.
func (p *Plans) WaitAcked(ctx context.Context, site string, version uint64) error {
	for {
		p.mu.Lock()
		st := p.state(site)
		acked, ch := st.acked.GetVersion(), st.changed
		p.mu.Unlock()

		if acked >= version {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for site %s to acknowledge boot table %d: %w", site, version, ctx.Err())
		case <-ch:
		}
	}
}

// OnSession keeps the edge behind conn in sync until ctx ends (it fits sites.Options.OnSession).
func (p *Plans) OnSession(ctx context.Context, site string, conn grpc.ClientConnInterface) error {
	client := bootpb.NewBootPlansClient(conn)

	var edge *bootpb.Table // what the edge holds, as far as this session knows; nil forces a snapshot

	for {
		p.mu.Lock()
		st := p.state(site)
		desired, ch := st.desired, st.changed
		p.mu.Unlock()

		if desired != nil && desired.GetVersion() != edge.GetVersion() {
			req := &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: desired}}
			if edge != nil {
				req = &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: Diff(edge, desired)}}
			}

			sent := time.Now()
			resp, err := client.Apply(ctx, req)

			switch {
			case ctx.Err() != nil:
				return nil
			case status.Code(err) == codes.FailedPrecondition:
				edge = nil // out of step: the next round sends a snapshot

				continue
			case err != nil:
				return fmt.Errorf("push boot table %d to site %s: %w", desired.GetVersion(), site, err)
			}

			if resp.GetVersion() != desired.GetVersion() {
				return fmt.Errorf("site %s acknowledged version %d, sent %d", site, resp.GetVersion(), desired.GetVersion())
			}

			edge = desired

			p.mu.Lock()
			st.acked = desired
			st.notify()
			p.mu.Unlock()

			// a version is the time its table was set (or just after the one before)
			p.pushTime.Observe(time.Since(sent).Seconds())
			p.ackLag.Observe(max(0, p.now().Sub(time.Unix(0, int64(desired.GetVersion()))).Seconds()))

			p.log.Info("boot table acknowledged", zap.String("site", site), zap.Uint64("version", desired.GetVersion()),
				zap.Bool("snapshot", req.GetSnapshot() != nil))

			continue
		}

		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
}

// Diff returns the delta that turns from into to.
func Diff(from, to *bootpb.Table) *bootpb.Delta {
	d := &bootpb.Delta{BaseVersion: from.GetVersion(), Version: to.GetVersion()}

	old := map[string]*bootpb.Plan{}
	for _, pl := range from.GetPlans() {
		old[pl.GetUuid()] = pl
	}

	seen := map[string]bool{}

	for _, pl := range to.GetPlans() {
		seen[pl.GetUuid()] = true
		if o, ok := old[pl.GetUuid()]; !ok || !proto.Equal(o, pl) {
			d.Upsert = append(d.Upsert, pl)
		}
	}

	for _, pl := range from.GetPlans() {
		if !seen[pl.GetUuid()] {
			d.Remove = append(d.Remove, pl.GetUuid())
		}
	}

	if !maps.EqualFunc(from.GetAgent(), to.GetAgent(), func(a, b *bootpb.Kernel) bool { return proto.Equal(a, b) }) {
		d.Agent, d.ReplaceAgent = to.GetAgent(), true
	}

	if !slices.Equal(from.GetKernelArgs(), to.GetKernelArgs()) {
		d.KernelArgs, d.ReplaceKernelArgs = to.GetKernelArgs(), true
	}

	if string(from.GetConfig()) != string(to.GetConfig()) {
		d.Config, d.ReplaceConfig = to.GetConfig(), true
	}

	if from.GetDiscovery() != to.GetDiscovery() {
		d.Discovery, d.ReplaceDiscovery = to.GetDiscovery(), true
	}

	if !slices.Equal(from.GetRegisteredMacs(), to.GetRegisteredMacs()) {
		d.RegisteredMacs, d.ReplaceRegisteredMacs = to.GetRegisteredMacs(), true
	}

	return d
}
