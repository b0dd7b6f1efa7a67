package omni

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/gen/optional"
	"github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/security"
	"go.uber.org/zap"
)

// JoinConfig is what edges serve at /config to machines in agent mode: the Talos documents of Omni's
// ProviderJoinConfig (SideroLink, event sink, kernel log), plus a trusted-roots document when a custom CA is in use
// and the operator's extra documents (see ExtraDocuments).
type JoinConfig struct {
	Documents  string
	KernelArgs []string
}

// JoinConfigController follows Omni's ProviderJoinConfig of the provider, as a controller of the lifecycle's
// runtime (whose watch-fed cache holds it): each version is built into the JoinConfig edges serve and handed
// to onChange. A version it cannot use is logged and skipped; the last good one stays in force.
type JoinConfigController struct {
	providerID   string
	trustedRoots string
	extra        ExtraDocuments
	onChange     func(JoinConfig)
}

// NewJoinConfigController returns the controller for NewRuntime; trustedRootsPEM (optional) is appended as a
// TrustedRootsConfig document and extra (optional) are the operator's documents; onChange is called with every
// new content, e.g. to send it to the edges.
func (c *Connection) NewJoinConfigController(trustedRootsPEM string, extra ExtraDocuments, onChange func(JoinConfig)) *JoinConfigController {
	return &JoinConfigController{providerID: c.cfg.ProviderID, trustedRoots: trustedRootsPEM, extra: extra, onChange: onChange}
}

// Name implements controller.QController.
func (*JoinConfigController) Name() string { return "omni.JoinConfigController" }

// Settings implements controller.QController: Omni's ProviderJoinConfigs (a provider sees its own only) in.
func (*JoinConfigController) Settings() controller.QSettings {
	return controller.QSettings{
		Inputs: []controller.Input{{
			Namespace: resources.InfraProviderNamespace, Type: siderolink.ProviderJoinConfigType, Kind: controller.InputQPrimary,
		}},
		Concurrency: optional.Some[uint](1),
	}
}

// MapInput implements controller.QController (it has no mapped inputs).
func (*JoinConfigController) MapInput(context.Context, *zap.Logger, controller.QRuntime, controller.ReducedResourceMetadata) ([]resource.Pointer, error) {
	return nil, nil
}

// Reconcile implements controller.QController.
func (w *JoinConfigController) Reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, ptr resource.Pointer) error {
	if ptr.ID() != w.providerID {
		return nil
	}

	jc, err := safe.ReaderGet[*siderolink.ProviderJoinConfig](ctx, r, ptr)
	if state.IsNotFoundError(err) {
		return nil // Omni removes it only with the provider; machines keep what they were served
	}

	if err != nil {
		return fmt.Errorf("read provider join config: %w", err)
	}

	cfg, err := w.build(logger, jc)
	if err != nil {
		logger.Error("unusable provider join config from omni", zap.Error(err))

		return nil
	}

	logger.Info("provider join config updated", zap.String("version", jc.Metadata().Version().String()))

	if w.onChange != nil {
		w.onChange(cfg)
	}

	return nil
}

func (w *JoinConfigController) build(logger *zap.Logger, jc *siderolink.ProviderJoinConfig) (JoinConfig, error) {
	spec := jc.TypedSpec().Value

	docs := strings.TrimSpace(spec.GetConfig().GetConfig())
	if docs == "" {
		return JoinConfig{}, errors.New("join config has no documents")
	}

	if w.trustedRoots != "" {
		tr := security.NewTrustedRootsConfigV1Alpha1()
		tr.MetaName = "outpost-ca"
		tr.Certificates = w.trustedRoots

		c, err := container.New(tr)
		if err != nil {
			return JoinConfig{}, fmt.Errorf("trusted roots document: %w", err)
		}

		extra, err := c.EncodeString(encoder.WithComments(encoder.CommentsDisabled))
		if err != nil {
			return JoinConfig{}, fmt.Errorf("encode trusted roots document: %w", err)
		}

		docs += "\n---\n" + strings.TrimSpace(extra)
	}

	// The operator's documents were checked when they were loaded; one that conflicts with what Omni sends now
	// must not keep machines from joining: they get Omni's documents alone, and the log says why.
	if merged, err := w.extra.appendTo(docs); err != nil {
		logger.Error("extra machine-config documents left out of the join config", zap.Strings("documents", w.extra.Kinds()),
			zap.Error(err))
	} else {
		docs = strings.TrimSpace(merged)
	}

	return JoinConfig{Documents: docs + "\n", KernelArgs: spec.GetConfig().GetKernelArgs()}, nil
}
