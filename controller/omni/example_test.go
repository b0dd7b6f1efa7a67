package omni_test

import (
	"context"
	"crypto/rand"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/omni"
)

// Example shows how controller/app wires the Omni connection, the lifecycle and the boot planner.
// The edge clients (power, agent, plan push) and the site directory are the uplink-backed implementations.
func Example() {
	ctx := context.Background()
	logger := zap.NewNop()

	var (
		power    lifecycle.PowerClient       // BMC operations over the uplink (sites.Server.Conn(site))
		agent    lifecycle.AgentClient       // management.AgentService through the edge's tunnel proxy
		pusher   lifecycle.PlanPusher        // boot-plan sync; returns once the edge acknowledged
		siteDirs bootplans.SiteDirectory     // the edge's /config URL and agent address per site
		health   func(context.Context) error // e.g. "no site connected"
	)

	cfg := omni.Default()
	cfg.Endpoint = os.Getenv("OMNI_ENDPOINT")
	cfg.ServiceAccountKey = os.Getenv("OMNI_SERVICE_ACCOUNT_KEY")

	conn, err := omni.Connect(ctx, cfg, logger) // retries while Omni is unreachable; ErrBadKey, ErrWrongProviderID
	if err != nil {
		return
	}

	defer conn.Close() //nolint:errcheck

	resolver, err := assets.NewFactoryResolver("https://factory.talos.dev", "") // or assets.NewLocalResolver(dir, url)
	if err != nil {
		return
	}

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), resolver, siteDirs)
	if err != nil {
		return
	}

	locations := lifecycle.NewLocations(logger) // fed by the edge event receiver: Seen, AgentConnected, SiteOffline

	ctrls, err := lifecycle.New(lifecycle.Default(), lifecycle.Deps{
		Types: conn.Types(), Power: power, Agent: agent, Sites: locations, Plans: pusher, Planner: planner,
		Now: time.Now, Rand: rand.Reader, Metrics: lifecycle.NewMetrics(), // register Metrics with prometheus
	})
	if err != nil {
		return
	}

	rt, err := conn.NewRuntime(health, ctrls...)
	if err != nil {
		return
	}

	joinConfig := conn.NewJoinConfigWatcher("", func(omni.JoinConfig) { /* send /config content to the edges */ })

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return rt.Run(ctx) })
	eg.Go(func() error { return joinConfig.Run(ctx) })

	_ = eg.Wait()
}
