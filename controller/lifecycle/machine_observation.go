package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// machineObservation keeps MachineObservation true: the machine's site (from edge events), its power state
// (from the BMC, once configured) and whether its agent answers (tunnel open and Hello succeeds).
// It looks again every PollInterval and at once when the machine's location changes (Locations.OnChange), and
// writes only changes.
type machineObservation struct {
	noTeardown

	types   resources.Types
	written *written
	sites   SiteLocator
	power   PowerClient
	agent   AgentClient
	metrics *Metrics
	now     func() time.Time
	// watches, siteLabels and policies are optional (nil: none).
	watches    *machines.WatchLists
	siteLabels SiteLabels
	policies   *machines.SitePolicies
	reach      SiteReach
	// callTimeout bounds each edge call; pollInterval is when the machine is looked at again.
	callTimeout, pollInterval time.Duration
}

const observationName = "lifecycle.MachineObservationController"

// defaultEdgeCallConcurrency is the workers of a step that waits on edge calls when EdgeCallConcurrency is 0.
const defaultEdgeCallConcurrency = 64

// callsEdge gives c, a step that waits on calls through the machine's edge, the edge-call workers.
func callsEdge(c *machineController) *machineController {
	c.concurrency = c.env.cfg.EdgeCallConcurrency
	if c.concurrency == 0 {
		c.concurrency = defaultEdgeCallConcurrency
	}

	return c
}

func newMachineObservationController(e *env, d Deps) *machineController {
	s := &machineObservation{
		types: d.Types, written: e.written, sites: d.Sites, power: d.Power, agent: d.Agent, metrics: d.Metrics, now: d.Now,
		watches: d.Watches, siteLabels: d.SiteLabels, policies: d.SitePolicies, reach: d.Reach, callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval,
	}

	return callsEdge(newMachineController(e, observationName, d.Types.MachineObservation, d.Types.Namespace, bmcRecord|observationRecord, s))
}

func (s *machineObservation) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	obs := &specs.MachineObservationSpec{}

	loc, known := s.sites.Locate(v.id)

	switch {
	case !known:
		obs.WaitingReason = "no edge has reported this machine yet"

		s.metrics.inc(ReasonMachineNotLocated)
	default:
		obs.SiteId = loc.SiteID
		obs.Alert = loc.Alert

		if s.siteLabels != nil {
			obs.SiteLabels = s.siteLabels.SiteLabels(loc.SiteID)
		}

		// what the machine's plans say of its Secure Boot (planGate.plan): a change wakes the boot plan step
		obs.SecureBoot, obs.SecureBootSource = loc.EnforcesSecureBoot(s.policies.SecureBoot(loc.SiteID))
		if obs.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_ON && s.reach != nil {
			obs.EdgeReach = s.reach.Reach(loc.SiteID) // baked into the machine's signed images (planGate.plan)
		}

		if v.managed() && v.bmc != nil {
			obs.PowerState = s.powerState(ctx, logger, loc, v, obs)
		} else if s.watches != nil {
			s.watches.Remove(v.id)
		}

		contested := loc.Alert == machines.AlertTunnelContested
		if contested {
			// Two machines answer to this UUID: whichever agent is reached may be the wrong one, so no agent
			// call (wipe, BMC provisioning) until an operator has sorted the machines out.
			obs.WaitingReason = "two machines with this UUID booted lately (a cloned UUID?): no agent call until an operator " +
				"fixes it and runs: controller machine clear-alert " + v.id
		}

		if loc.AgentConnected && !v.machine.GetCordoned() && !contested {
			callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
			err := s.agent.Hello(callCtx, loc.SiteID, v.id)

			cancel()

			if err == nil {
				obs.AgentConnected = true
			} else {
				logger.Debug("agent tunnel open but hello failed", zap.Error(err))
			}
		}
	}

	switch {
	case obs.AgentConnected:
	case v.obs.GetAgentConnected():
		obs.AgentLostAt = timestamppb.New(s.now())
	default:
		obs.AgentLostAt = v.obs.GetAgentLostAt()
	}

	// observed_at is when what the record says was observed; an observation that finds nothing new leaves the
	// record (and its observed_at) as it is, so a steady fleet writes nothing
	obs.ObservedAt = v.obs.GetObservedAt()
	if v.obs == nil || !proto.Equal(v.obs, obs) {
		obs.ObservedAt = timestamppb.New(s.now())
	}

	if err := writeOwn(ctx, s.written, r, s.types.NewMachineObservation(v.id), v.obs, obs, func(o *resources.MachineObservation) {
		o.TypedSpec().Value = obs
	}); err != nil {
		return fmt.Errorf("write machine observation: %w", err)
	}

	return controller.NewRequeueInterval(s.pollInterval)
}

// powerState is the machine's power state: what its site's edge reports from watching the BMC when the
// machine is on the edge's watch list, else the BMC's answer to a call through the edge.
func (s *machineObservation) powerState(ctx context.Context, logger *zap.Logger, loc machines.Location, v *view, obs *specs.MachineObservationSpec) specs.MachineObservationSpec_PowerState {
	site := loc.SiteID

	if s.watches != nil {
		s.watches.Set(site, v.id, v.bmc)

		if s.watches.Watching(site, v.id) && loc.Power != "" {
			switch loc.Power {
			case "on":
				return specs.MachineObservationSpec_POWER_STATE_ON
			case "off":
				return specs.MachineObservationSpec_POWER_STATE_OFF
			default:
				// the edge's own words: why it cannot reach the BMC (never "site offline": it watched)
				logger.Info("power state unknown", zap.String("site", site), zap.String("error", loc.PowerReason),
					zap.String("source", "edge bmc watch"))
				obs.WaitingReason = "power state unknown: " + loc.PowerReason

				return specs.MachineObservationSpec_POWER_STATE_UNKNOWN
			}
		}
	}

	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()

	ps, err := s.power.PowerStatus(callCtx, site, v.id, v.bmc)
	if err != nil {
		logger.Info("power state unknown", zap.String("site", site), zap.Error(err))
		obs.WaitingReason = "power state unknown: " + err.Error()

		return specs.MachineObservationSpec_POWER_STATE_UNKNOWN
	}

	switch ps {
	case machines.PowerOn:
		return specs.MachineObservationSpec_POWER_STATE_ON
	case machines.PowerOff:
		return specs.MachineObservationSpec_POWER_STATE_OFF
	default:
		return specs.MachineObservationSpec_POWER_STATE_UNKNOWN
	}
}
