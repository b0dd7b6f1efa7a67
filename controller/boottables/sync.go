package boottables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// OnSession keeps the edge behind conn in step with its site's table until ctx ends (it fits
// sites.Options.OnSession). Every connecting site gets a table, with the join config, before any of its
// machines has a plan.
func (t *Tables) OnSession(ctx context.Context, siteID string, conn grpc.ClientConnInterface) error {
	client := bootpb.NewBootPlansClient(conn)

	var edge *bootpb.Table // what the edge holds, as far as this session knows; nil forces a snapshot

	for {
		t.mu.Lock()
		st := t.siteLocked(siteID)
		desired, ch := st.desired, st.changed
		t.mu.Unlock()

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
				return fmt.Errorf("push boot table %d to site %s: %w", desired.GetVersion(), siteID, err)
			}

			if resp.GetVersion() != desired.GetVersion() {
				return fmt.Errorf("site %s acknowledged version %d, sent %d", siteID, resp.GetVersion(), desired.GetVersion())
			}

			edge = desired

			t.mu.Lock()
			st.acked = desired
			reachChanged := !proto.Equal(st.reach, resp.GetReach())
			st.reach = resp.GetReach()
			st.notify()
			onReach := t.onReach
			t.mu.Unlock()

			if reachChanged {
				t.log.Info("site's edge says how its machines reach it", zap.String("site", siteID),
					zap.String("http_base", resp.GetReach().GetHttpBase()), zap.String("agent_address", resp.GetReach().GetAgentAddress()))

				if onReach != nil {
					onReach(siteID)
				}
			}

			// a version is the time its table was set (or just after the one before)
			t.pushTime.Observe(time.Since(sent).Seconds())
			t.ackLag.Observe(max(0, t.now().Sub(time.Unix(0, int64(desired.GetVersion()))).Seconds()))

			t.log.Info("boot table acknowledged", zap.String("site", siteID), zap.Uint64("version", desired.GetVersion()),
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

	if !proto.Equal(from.GetDhcp(), to.GetDhcp()) {
		d.Dhcp, d.ReplaceDhcp = to.GetDhcp(), true
	}

	if from.GetSecureBoot() != to.GetSecureBoot() {
		d.SecureBoot, d.ReplaceSecureBoot = to.GetSecureBoot(), true
	}

	if !maps.EqualFunc(from.GetSignedAgent(), to.GetSignedAgent(), func(a, b *bootpb.SignedImage) bool { return proto.Equal(a, b) }) {
		d.SignedAgent, d.ReplaceSignedAgent = to.GetSignedAgent(), true
	}

	return d
}
