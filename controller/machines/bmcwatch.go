package machines

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// WatchLists tells each site's edge which BMCs to watch: every managed machine of the site with a BMC
// configuration. The edge polls them itself and journals power changes, which reach the lifecycle through the
// locations (Locations.HandleEvent); the controller polls no BMC across the WAN. A list is sent whole at the
// start of every session and again, shortly after, whenever it changes.
type WatchLists struct {
	log      *zap.Logger
	protocol bmcpb.Protocol // the controller's; a site's own in policies comes first
	policies *SitePolicies
	settle   time.Duration
	power    PowerReports

	mu      sync.Mutex
	sites   map[string]map[string]*bmcpb.Target // site -> machine -> target
	where   map[string]string                   // machine -> site
	changed map[string]chan struct{}            // site -> closed on change
}

// PowerReports takes the power states an edge knows when it is handed its list (Locations).
type PowerReports interface {
	PowerReported(site string, machineID metal.ID, state bmcpb.PowerState, reason string)
}

// NewWatchLists returns empty lists; protocol is how the edge reaches the BMCs unless a site's own policy
// (policies, optional) says otherwise; power (optional) takes the states the edges know.
func NewWatchLists(log *zap.Logger, protocol bmcpb.Protocol, policies *SitePolicies, power PowerReports) *WatchLists {
	w := &WatchLists{
		log: log.With(zap.String("component", "bmc_watch_lists")), protocol: protocol, policies: policies, settle: time.Second, power: power,
		sites: map[string]map[string]*bmcpb.Target{}, where: map[string]string{}, changed: map[string]chan struct{}{},
	}

	if policies != nil {
		policies.OnBMCProtocolChange(w.reprotocol)
	}

	return w
}

// reprotocol gives every target of site the site's protocol now (an operator changed it).
func (w *WatchLists) reprotocol(site string) {
	p := w.policies.BMCProtocol(site, w.protocol)

	w.mu.Lock()
	defer w.mu.Unlock()

	changed := false

	for id, t := range w.sites[site] {
		if t.GetProtocol() != p {
			t = proto.Clone(t).(*bmcpb.Target)
			t.Protocol = p
			w.sites[site][id] = t
			changed = true
		}
	}

	if changed {
		w.notifyLocked(site)
	}
}

func (w *WatchLists) notifyLocked(site string) {
	if ch, ok := w.changed[site]; ok {
		close(ch)
	}

	w.changed[site] = make(chan struct{})
}

// Set makes machineID's BMC (cfg, with its password opened) part of site's list.
func (w *WatchLists) Set(site, machineID string, cfg *specs.BMCConfigurationSpec) {
	t, err := target(cfg, w.policies.BMCProtocol(site, w.protocol))
	if err != nil {
		w.Remove(machineID)

		return
	}

	t.MachineId = machineID

	w.mu.Lock()
	defer w.mu.Unlock()

	if old, ok := w.where[machineID]; ok && old != site {
		delete(w.sites[old], machineID)
		w.notifyLocked(old)
	}

	list, ok := w.sites[site]
	if !ok {
		list = map[string]*bmcpb.Target{}
		w.sites[site] = list
	}

	if cur, ok := list[machineID]; ok && proto.Equal(cur, t) {
		return
	}

	list[machineID] = t
	w.where[machineID] = site
	w.notifyLocked(site)
}

// Remove takes machineID off its site's list.
func (w *WatchLists) Remove(machineID string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	site, ok := w.where[machineID]
	if !ok {
		return
	}

	delete(w.where, machineID)
	delete(w.sites[site], machineID)
	w.notifyLocked(site)
}

// Watching reports whether machineID is on site's list, so its edge reports its power changes.
func (w *WatchLists) Watching(site, machineID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()

	return w.where[machineID] == site
}

func (w *WatchLists) snapshot(site string) ([]*bmcpb.Target, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()

	ch, ok := w.changed[site]
	if !ok {
		ch = make(chan struct{})
		w.changed[site] = ch
	}

	list := w.sites[site]
	out := make([]*bmcpb.Target, 0, len(list))

	for _, id := range slices.Sorted(maps.Keys(list)) {
		out = append(out, list[id])
	}

	return out, ch
}

// OnSession keeps the edge behind conn watching its site's list until ctx ends (it fits
// sites.Options.OnSession). An edge that does not watch BMCs (an older one) is left alone.
func (w *WatchLists) OnSession(ctx context.Context, site string, conn grpc.ClientConnInterface) error {
	client := bmcpb.NewBMCClient(conn)

	for {
		list, changed := w.snapshot(site)

		callCtx, cancel := context.WithTimeout(ctx, time.Minute)
		resp, err := client.Watch(callCtx, &bmcpb.WatchRequest{Targets: list})

		cancel()

		switch {
		case ctx.Err() != nil:
			return nil
		case status.Code(err) == codes.Unimplemented:
			w.log.Warn("edge does not watch its BMCs; the controller asks them itself", zap.String("site", site))

			return nil
		case err != nil:
			return fmt.Errorf("send bmc watch list to site %s: %w", site, err)
		}

		w.log.Debug("bmc watch list sent", zap.String("site", site), zap.Int("bmcs", len(list)), zap.Uint32("watching", resp.GetWatching()))

		if w.power != nil {
			for _, k := range resp.GetKnown() {
				if id, err := metal.ParsePeerID(k.GetMachineId()); err == nil {
					w.power.PowerReported(site, id, k.ReportedState(), "")
				}
			}
		}

		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}

		// let a burst of changes (a whole site's machines configured at once) settle into one list
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.settle):
		}
	}
}
