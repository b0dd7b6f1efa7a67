package omni_test

import (
	"context"
	"crypto/rand"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/omni"
)

// Example shows how controller/app wires the Omni connection, the lifecycle and the boot planner.
// The edge clients (power, agent, plan push) are the uplink-backed implementations.
func Example() {
	ctx := context.Background()
	logger := zap.NewNop()

	var (
		access *machineaccess.Client       // machineaccess.New(sitesServer.Conn, locations.ByResourceID())
		tables *boottables.Tables          // the sites' boot tables (its OnSession goes into sites.Options.OnSession)
		health func(context.Context) error // e.g. "no site connected"
	)

	cfg := omni.Default()
	cfg.Endpoint = os.Getenv("OMNI_ENDPOINT")
	cfg.ServiceAccountKey = os.Getenv("OMNI_SERVICE_ACCOUNT_KEY")

	conn, err := omni.Connect(ctx, cfg, logger) // retries while Omni is unreachable; ErrBadKey, ErrWrongProviderID
	if err != nil {
		return
	}

	defer conn.Close() //nolint:errcheck

	resolver, err := assets.NewFactoryResolver(os.Getenv("IMAGE_FACTORY_URL"), "") // or assets.NewLocalResolver(dir, url)
	if err != nil {
		return
	}

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), resolver)
	if err != nil {
		return
	}

	// fed by the edges' events: bootevents.NewReceiver(logger, sites.SiteFromContext, locations, timelines);
	// call locations.SiteOffline(site) when a site's session ends
	locations := machines.NewLocations(logger)
	edges := &machines.EdgeClients{Access: access, Sites: locations} // PowerClient and AgentClient

	ctrls, err := lifecycle.New(lifecycle.Default(), lifecycle.Deps{
		Types: conn.Types(), Power: edges, Agent: edges, Intents: edges, Sites: locations.ByResourceID(), Plans: tables, Planner: planner,
		Now: time.Now, Rand: rand.Reader, Metrics: lifecycle.NewMetrics(), // register Metrics with prometheus
	})
	if err != nil {
		return
	}

	joinConfig := conn.NewJoinConfigController("", omni.ExtraDocuments{}, func(jc omni.JoinConfig) { tables.SetConfig([]byte(jc.Documents)) })

	rt, err := conn.NewRuntime(health, append(ctrls, joinConfig)...)
	if err != nil {
		return
	}

	_ = rt.Run(ctx)
}
