package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/controller/sites"
)

// edgeWiring is everything between the lifecycle and the edges: where machines are (learned from edge
// events), the boot tables pushed to sites, and the clients for BMCs and agents.
type edgeWiring struct {
	locations *lifecycle.Locations
	watches   *lifecycle.WatchLists
	receiver  *bootplans.Receiver
	plans     *bootplans.Plans
	pusher    *bootplans.TablePusher
	clients   *lifecycle.EdgeClients
}

func newEdgeWiring(log *zap.Logger, conn machineaccess.ConnFunc, cfg config.Config) (*edgeWiring, error) {
	locations := lifecycle.NewLocations(log)
	plans := bootplans.NewPlans(log, nil)

	watches, err := lifecycle.NewWatchLists(log, cfg.BMCProtocol, locations)
	if err != nil {
		return nil, err
	}

	return &edgeWiring{
		locations: locations,
		watches:   watches,
		receiver:  bootplans.NewReceiver(log, locations, sites.SiteFromContext).WithInventory(locations),
		plans:     plans,
		pusher:    bootplans.NewTablePusher(plans),
		clients: &lifecycle.EdgeClients{Access: machineaccess.New(conn, locations), Sites: locations,
			DefaultBootMode: cfg.DefaultBootMode, BMCProtocol: cfg.BMCProtocol},
	}, nil
}

// sessionStarted gives every connecting site a boot table, so the join config reaches its edge's /config
// before any of its machines is known (a new machine needs it to join Omni at all).
//
// Agent tunnels are not forgotten when a session ends: the edge journals tunnel closes and delivers them in
// order after reconnecting, so the controller's view stays right across a WAN outage without rebooting
// machines whose agents never left.
func (w *edgeWiring) sessionStarted(_ context.Context, siteID string, _ grpc.ClientConnInterface) error {
	w.pusher.EnsureSite(siteID)

	return nil
}

// runLifecycle keeps the controller connected to Omni and the lifecycle running on it until ctx is done. The
// lifecycle controllers are built once; every connection gets a fresh COSI runtime (with the health heartbeat)
// and join config watcher on them, rebuilt with backoff whenever Omni goes away, at any uptime. Edge sessions,
// boot tables and machine locations live outside and carry on meanwhile.
func runLifecycle(ctx context.Context, cfg config.Config, log *zap.Logger, edges *edgeWiring, siteAssets *siteAssets,
	metrics *prometheus.Registry, health func(context.Context) error, siteLabels lifecycle.SiteLabels,
) error {
	resolver, err := installResolver(cfg)
	if err != nil {
		return err
	}

	// With agent images of its own the controller hands them to every site, and agent-mode plans use them.
	plannerCfg := cfg.Planner
	plannerCfg.EdgeAgentImage = cfg.AgentAssetsDir != ""

	// An empty site directory: edges write their own /config URL and agent address into agent-mode scripts.
	planner, err := bootplans.NewPlanner(plannerCfg, agentTolerant{Resolver: resolver, agent: plannerCfg}, noSiteAddresses{})
	if err != nil {
		return err
	}

	var trustedRoots string

	if cfg.TrustedRootsFile != "" {
		pem, err := os.ReadFile(cfg.TrustedRootsFile)
		if err != nil {
			return fmt.Errorf("trusted roots: %w", err)
		}

		trustedRoots = string(pem)
	}

	lifecycleMetrics := lifecycle.NewMetrics()
	keeperMetrics := omni.NewKeeperMetrics()
	metrics.MustRegister(lifecycleMetrics, edges.locations, keeperMetrics)

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
	if lifecycleCfg.StaticLabels, err = labels.Parse(cfg.MachineLabels); err != nil {
		return err
	}

	qcs, err := lifecycle.New(lifecycleCfg, lifecycle.Deps{
		Types:      types,
		Power:      edges.clients,
		Agent:      edges.clients,
		Sites:      edges.locations,
		Plans:      &assetAwarePusher{next: edges.pusher, needs: siteAssets.needs, install: newInstallFiles(cfg, siteAssets.relayDir)},
		Planner:    planner,
		Now:        time.Now,
		Rand:       rand.Reader,
		Metrics:    lifecycleMetrics,
		Secrets:    secrets,
		Watches:    edges.watches,
		SiteLabels: siteLabels,
	})
	if err != nil {
		return err
	}

	keeper, err := omni.NewKeeper(cfg.Omni, log, keeperMetrics, func(ctx context.Context, conn *omni.Connection) error {
		// Where every machine is comes first: no decision is made on an empty view after a restart.
		if err := edges.locations.Load(ctx, conn.State(), types); err != nil {
			return err
		}

		rt, err := conn.NewRuntime(health, qcs...)
		if err != nil {
			return err
		}

		watcher := conn.NewJoinConfigWatcher(trustedRoots, func(jc omni.JoinConfig) {
			edges.pusher.SetConfig([]byte(jc.Documents))
			log.Info("join config from Omni pushed to sites")
		})

		eg, ctx := errgroup.WithContext(ctx)

		eg.Go(func() error {
			if err := rt.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("lifecycle runtime: %w", err)
			}

			return nil
		})
		eg.Go(func() error { return watcher.Run(ctx) })
		eg.Go(func() error { return edges.locations.Persist(ctx, conn.State(), types) })

		return eg.Wait()
	})
	if err != nil {
		return err
	}

	return keeper.Run(ctx)
}

// installResolver resolves Talos install assets from a local directory (air-gapped sites, labs) or the image factory.
func installResolver(cfg config.Config) (assets.Resolver, error) {
	if cfg.InstallAssetsDir != "" {
		return assets.NewLocalResolver(cfg.InstallAssetsDir, cfg.InstallAssetsURL)
	}

	return assets.NewFactoryResolver(cfg.ImageFactoryURL, cfg.PXEBaseURL)
}

// agentTolerant lets agent-mode plans through when the agent image cannot be resolved: edges boot agent mode
// from their own agent assets (the cache's agent/<arch>/ entries) with their own addresses, so only the
// machine's kernel arguments matter.
type agentTolerant struct {
	assets.Resolver

	agent bootplans.PlannerConfig
}

func (a agentTolerant) Resolve(ctx context.Context, p assets.Profile) (assets.Boot, error) {
	boot, err := a.Resolver.Resolve(ctx, p)
	if err != nil && errors.Is(err, assets.ErrNotAvailable) && p.Normalize().TalosVersion == (assets.Profile{TalosVersion: a.agent.AgentTalosVersion}).Normalize().TalosVersion {
		return assets.Boot{KernelArgs: p.KernelArgs}, nil
	}

	return boot, err
}

// noSiteAddresses implements bootplans.SiteDirectory with empty addresses: the edge adds talos.config and
// metal.provider.address itself, with the address machines reached it at.
type noSiteAddresses struct{}

func (noSiteAddresses) Site(string) (bootplans.Site, error) { return bootplans.Site{}, nil }

// registryLabels gives the lifecycle the labels an operator set on each site (the site registry is local).
type registryLabels struct{ registry *sites.Registry }

func (r registryLabels) SiteLabels(siteID string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	site, err := r.registry.Get(ctx, siteID)
	if err != nil {
		return nil
	}

	return site.TypedSpec().Value.GetLabels()
}
