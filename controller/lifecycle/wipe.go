package lifecycle

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/safe"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// wipe wipes a machine's disks through its agent on acceptance and whenever Omni sets a new wipe ID, and
// records the wipe (with the install counter and node token at that time) in WipeStatus.
type wipe struct {
	noTeardown

	env *env
}

func newWipeController(e *env) *machineController {
	return newMachineController(e, "lifecycle.WipeController", e.Types.WipeStatus, e.Types.Namespace, &wipe{env: e})
}

func (s *wipe) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	if !v.managed() || !v.bmcConfigured() || !v.requiresWipe() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return s.env.waitFor(logger, "machine not seen at any site")
	}

	if !v.agentConnected() {
		return s.env.waitFor(logger, "wipe waits for the agent") // the reboot controller brings it to agent mode
	}

	logger.Info("wiping disks", zap.String("site", site), zap.String("wipe_id", v.machine.GetWipeId()))

	wipeCtx, cancel := context.WithTimeout(ctx, s.env.cfg.WipeTimeout)
	defer cancel()

	if err := s.env.Agent.WipeDisks(wipeCtx, site, v.id, false); err != nil {
		return s.env.failed(fmt.Errorf("wipe %s at site %s: %w", v.id, site, err))
	}

	if err := safe.WriterModify(ctx, r, s.env.Types.NewWipeStatus(v.id), func(w *resources.WipeStatus) error {
		w.TypedSpec().Value = &specs.WipeStatusSpec{
			LastWipeId:           v.machine.GetWipeId(),
			InstallEventIdAtWipe: v.machine.GetInstallEventId(),
			WipedNodeUniqueToken: v.machine.GetNodeUniqueToken(),
			WipedAt:              timestamppb.New(s.env.Now()),
		}

		return nil
	}); err != nil {
		return fmt.Errorf("record wipe: %w", err)
	}

	logger.Info("disks wiped", zap.String("site", site))

	return nil
}
