package omni

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
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

// JoinConfigWatcher follows Omni's ProviderJoinConfig of the provider and reports every change.
type JoinConfigWatcher struct {
	st           state.State
	providerID   string
	trustedRoots string
	extra        ExtraDocuments
	onChange     func(JoinConfig)
	logger       *zap.Logger
	retry        time.Duration
}

// NewJoinConfigWatcher returns a watcher; trustedRootsPEM (optional) is appended as a TrustedRootsConfig document;
// onChange (optional) is called with every new content, e.g. to send it to the edges.
func (c *Connection) NewJoinConfigWatcher(trustedRootsPEM string, onChange func(JoinConfig)) *JoinConfigWatcher {
	return &JoinConfigWatcher{
		st: c.State(), providerID: c.cfg.ProviderID, trustedRoots: trustedRootsPEM, onChange: onChange,
		logger: c.logger.With(zap.String("component", "omni_join_config")), retry: c.cfg.RetryMin,
	}
}

// WithExtraDocuments adds the operator's documents to every join config (set before Run).
func (w *JoinConfigWatcher) WithExtraDocuments(d ExtraDocuments) *JoinConfigWatcher {
	w.extra = d

	return w
}

// Run watches until ctx ends, re-subscribing (with backoff) when the watch breaks, e.g. when Omni restarts.
func (w *JoinConfigWatcher) Run(ctx context.Context) error {
	for {
		err := w.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}

		w.logger.Warn("join config watch broke, re-subscribing", zap.Duration("backoff", w.retry), zap.Error(err))

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.retry):
		}
	}
}

func (w *JoinConfigWatcher) watch(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	events := make(chan state.Event)

	if err := w.st.Watch(ctx, siderolink.NewProviderJoinConfig(w.providerID).Metadata(), events); err != nil {
		return fmt.Errorf("watch provider join config: %w", err)
	}

	for {
		var ev state.Event

		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev = <-events:
		}

		switch ev.Type {
		case state.Errored:
			return fmt.Errorf("watch provider join config: %w", ev.Error)
		case state.Created, state.Updated:
			jc, ok := ev.Resource.(*siderolink.ProviderJoinConfig)
			if !ok {
				continue
			}

			cfg, err := w.build(jc)
			if err != nil {
				w.logger.Error("unusable provider join config from omni", zap.Error(err))

				continue
			}

			w.logger.Info("provider join config updated", zap.String("version", jc.Metadata().Version().String()))

			if w.onChange != nil {
				w.onChange(cfg)
			}
		case state.Destroyed, state.Bootstrapped, state.Noop:
		}
	}
}

func (w *JoinConfigWatcher) build(jc *siderolink.ProviderJoinConfig) (JoinConfig, error) {
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
		w.logger.Error("extra machine-config documents left out of the join config", zap.Strings("documents", w.extra.Kinds()),
			zap.Error(err))
	} else {
		docs = strings.TrimSpace(merged)
	}

	return JoinConfig{Documents: docs + "\n", KernelArgs: spec.GetConfig().GetKernelArgs()}, nil
}
