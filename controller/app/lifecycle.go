package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/controller/timeline"
)

// newLifecycle builds the machine lifecycle and the keeper of the Omni connection it runs on, and adds the
// keeper to the run list. The lifecycle controllers are built once; every connection gets a fresh COSI
// runtime (with the health heartbeat) and join config watcher on them, rebuilt with backoff whenever Omni
// goes away, at any uptime. Edge sessions, boot tables and machine locations live outside and carry on
// meanwhile. Without an Omni endpoint the controller serves sites and edges only.
func (b *builder) newLifecycle(context.Context) error {
	if !b.cfg.OmniEnabled() {
		b.log.Warn("no Omni endpoint configured: sites and edges are served, machines are not managed (set --omni-endpoint)")

		return nil
	}

	cfg := b.cfg

	resolver := b.assets.resolver

	// With agent images of its own the controller hands them to every site, and agent-mode plans use them.
	plannerCfg := cfg.Planner
	plannerCfg.EdgeAgentImage = cfg.AgentAssetsDir != ""

	planner, err := bootplans.NewPlanner(plannerCfg, assets.TolerateMissingAgent(resolver, plannerCfg.AgentTalosVersion))
	if err != nil {
		return err
	}

	lifecycleMetrics := lifecycle.NewMetrics()
	keeperMetrics := omni.NewKeeperMetrics()

	if err := registerAll(b.metrics, lifecycleMetrics, b.edges.locations, b.edges.tables, keeperMetrics, omni.RuntimeMetrics()); err != nil {
		return err
	}

	types := resources.NewTypes(cfg.Omni.ProviderID)

	// BMC passwords are sealed with a key derived from the provider's service-account key: every controller of
	// the provider has it, an Omni Reader (who can read the provider's namespace) does not.
	sealingKey, err := seal.KeyFromServiceAccount(cfg.Omni.ServiceAccountKey, "bmc credentials")
	if err != nil {
		return fmt.Errorf("sealing key: %w", err)
	}

	secrets, err := seal.New(sealingKey, rand.Reader)
	if err != nil {
		return err
	}

	lifecycleCfg := cfg.Lifecycle
	lifecycleCfg.StaticLabels = maps.Clone(cfg.MachineLabels)

	deps := b.lifecycleDeps
	deps.Types = types
	deps.Power = b.edges.clients
	deps.Agent = b.edges.clients
	deps.Reach = b.edges.tables
	deps.Intents = b.edges.clients
	deps.Sites = b.edges.locations.ByResourceID()
	deps.SecureBoot = b.edges.locations
	deps.Plans = &assetAwarePusher{next: b.edges.tables, needs: b.assets.needs, install: b.assets.install, catalog: b.assets.catalog}
	deps.Planner = planner

	// At a site whose machines enforce Secure Boot, a first boot gets agent mode as a signed image.
	b.signed = newSignedAgents(b.log, planner, b.edges.tables, b.edges.policies, b.assets.needs, b.assets.install)
	b.edges.tables.OnReach(b.signed.Kick)

	for _, site := range b.edges.policies.SecureBootSites() {
		b.signed.Kick(site)
	}

	b.act("signed agent images", b.signed.Run)
	deps.Now = time.Now
	deps.Rand = rand.Reader
	deps.Metrics = lifecycleMetrics
	deps.Secrets = secrets
	deps.Watches = b.edges.watches
	deps.SiteLabels = b.edges.policies
	deps.SitePolicies = b.edges.policies

	qcs, err := lifecycle.New(lifecycleCfg, deps)
	if err != nil {
		return err
	}

	session := &omniSession{
		log: b.log, edges: b.edges, types: types, health: b.uplink.Health, trustedRoots: b.trustedRoots, extra: b.extraDocs,
		controllers: qcs, timelines: b.timelines,
	}

	keeper, err := omni.NewKeeper(cfg.Omni, b.log, keeperMetrics, session.run)
	if err != nil {
		return err
	}

	b.act("lifecycle", keeper.Run)

	return nil
}

// omniSession is what runs on every connection to Omni.
type omniSession struct {
	log          *zap.Logger
	edges        *edgeWiring
	types        resources.Types
	health       func(context.Context) error
	trustedRoots string
	extra        omni.ExtraDocuments
	controllers  []controller.QController
	// timelines are loaded from Omni before the lifecycle runs and written back while it does (nil: none).
	timelines *timeline.Book
}

// run loads where every machine is, then runs the lifecycle runtime, the join config watcher (which hands
// Omni's join config to every site's boot table) and the persistence of machine locations until one of them
// ends or ctx does.
func (s *omniSession) run(ctx context.Context, conn *omni.Connection) error {
	// Where every machine is comes first: no decision is made on an empty view after a restart.
	if err := s.edges.locations.Load(ctx, conn.State(), s.types); err != nil {
		return err
	}

	// Timelines are for operators: one that cannot be read never holds the lifecycle up (it is written again).
	if s.timelines != nil {
		if err := s.timelines.Load(ctx, conn.State(), s.types, s.log); err != nil && ctx.Err() == nil {
			s.log.Warn("machine timelines not loaded from omni; going on without the stored ones", zap.Error(err))
		}
	}

	joinConfig := conn.NewJoinConfigController(s.trustedRoots, s.extra, func(jc omni.JoinConfig) {
		s.edges.tables.SetConfig([]byte(jc.Documents))
		s.log.Info("join config from Omni pushed to sites")
	})

	rt, err := conn.NewRuntime(s.health, append(slices.Clone(s.controllers), joinConfig)...)
	if err != nil {
		return err
	}

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error {
		if err := rt.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("lifecycle runtime: %w", err)
		}

		return nil
	})
	eg.Go(func() error { return s.edges.locations.Persist(ctx, conn.State(), s.types) })

	if s.timelines != nil {
		eg.Go(func() error { return s.timelines.Persist(ctx, conn.State(), s.types, s.log) })
	}

	return eg.Wait()
}

// installResolver resolves Talos install assets from a local directory (air-gapped sites, labs) or the image factory.
func installResolver(cfg config.Config) (installSource, error) {
	if cfg.InstallAssetsDir != "" {
		return assets.NewLocalResolver(cfg.InstallAssetsDir, cfg.InstallAssetsURL)
	}

	return assets.NewFactoryResolver(cfg.ImageFactoryURL, cfg.PXEBaseURL)
}

// installSource is where install assets come from: it resolves profiles for plans and gives the boot of a
// staged profile.
type installSource interface {
	assets.Resolver
	assets.Stager
	// Schematic returns the schematic ID of a set of extensions.
	Schematic(ctx context.Context, extensions []string) (string, error)
}
