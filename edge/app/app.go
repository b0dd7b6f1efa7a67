// Package app is the edge's composition root. Build constructs every component from the configuration and
// opens every socket, starting nothing; Run runs the components under one errgroup (shared/rungroup), stops
// them all when one ends, and closes what Build opened once every one has returned.
//
// Files: build.go (the construction steps, in dependency order), controller.go (what the edge tells its
// controller in each session), events.go (where the boot servers report), assets.go (the upstream client).
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/journal"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/rungroup"
)

// Options are what a caller that is not the edge binary changes in how the edge is put together. The edge
// binary gives none; the lab's edges (qemu/) use them.
type Options struct {
	// ControllerAPI, when set, replaces the uplink: the services the controller reaches over the uplink
	// (boot plans, BMC operations, assets, the agent call proxy) are served on this listener as plain
	// HTTP/2 gRPC without authentication, and no controller is dialled. It is for the lab, which plays the
	// controller itself; never for a site network. The edge owns it from Build on and closes it.
	ControllerAPI net.Listener
	// WrapHTTP wraps the HTTP server's handler (the lab logs every request and notes /config fetches).
	WrapHTTP func(http.Handler) http.Handler
	// Tap is told what the edge serves, beside the journal (the lab prints it to follow a boot chain).
	Tap Tap
	// FilesDir is the directory of plain files served under /assets/, instead of <state>/files (the lab's
	// boot images).
	FilesDir string
	// BMCs, when set, answers the controller's BMC calls instead of edge/bmc speaking IPMI and Redfish to the
	// site's BMCs, and the edge watches no BMC itself (the fleet simulator's BMCs, which it watches itself,
	// journaling through Edge.Journal).
	BMCs bmcpb.BMCServer
	// Upstream, when set, is where the asset fetcher fetches from instead of the image factory over HTTP (the
	// fleet simulator has none).
	Upstream assetcache.Source
	// Dial, when set, opens the uplink's connections instead of a plain dialer (the fleet simulator's WAN
	// links, each from its site's address).
	Dial func(ctx context.Context, address string) (net.Conn, error)
}

// Edge is a built edge: every component constructed and every socket open, nothing running.
type Edge struct {
	log   *zap.Logger
	group *rungroup.Group
	addrs Addrs
	rec   *journal.Recorder
}

// Addrs are the addresses the edge serves on (TFTP nil when it is off).
type Addrs struct {
	HTTP, API, TFTP net.Addr
}

// Run builds the edge and runs it until ctx ends (the edge binary).
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	e, err := Build(ctx, cfg, log, Options{})
	if err != nil {
		return err
	}

	return e.Run(ctx)
}

// Build constructs every component of the edge and opens its sockets; nothing runs until Run. A failure
// names the component and closes what was opened before it. ctx bounds the construction only (the import of
// pre-seeded assets).
func Build(ctx context.Context, cfg config.Config, log *zap.Logger, opts Options) (*Edge, error) {
	e := &Edge{log: log, group: rungroup.New(log)}

	if opts.ControllerAPI != nil {
		e.group.OnClose("controller API listener", opts.ControllerAPI.Close)
		// The uplink is not built: the configuration need not name a controller.
		cfg.Uplink.ControllerAddress = opts.ControllerAPI.Addr().String()
	}

	if err := cfg.Validate(); err != nil {
		return nil, errors.Join(fmt.Errorf("configuration: %w", err), e.Close())
	}

	b := &builder{cfg: cfg.Resolved(), opts: opts, log: log, edge: e}

	for _, step := range b.steps() {
		if err := step(ctx); err != nil {
			return nil, errors.Join(err, e.Close())
		}
	}

	return e, nil
}

// Run runs every component until ctx ends or one of them ends: an error, or a component returning on its
// own (rungroup.ErrStoppedOnItsOwn), stops all the others and is returned, naming the component. Once every
// component has returned, Run closes what Build opened. It returns nil when ctx ended and everything stopped
// cleanly. An edge runs once (rungroup.ErrAlreadyRun).
func (e *Edge) Run(ctx context.Context) error {
	e.log.Info("edge starting", zap.Stringer("http", e.addrs.HTTP), zap.Stringer("agent_api", e.addrs.API))

	return e.group.Run(ctx)
}

// Close closes what Build opened, for an edge that is not run (Run closes it itself).
func (e *Edge) Close() error {
	return e.group.Close()
}

// Addrs returns the addresses the edge serves on.
func (e *Edge) Addrs() Addrs { return e.addrs }

// Journal is where the edge journals what it sees for the controller, for a caller that plays the site
// network itself (the fleet simulator's DHCP answers and BMC watch).
func (e *Edge) Journal() *journal.Recorder { return e.rec }

// upstreamRule is the site's asset policy as the boot scripts and /config apply it.
func upstreamRule(p assetcache.Policy) httpd.UpstreamRule {
	switch p {
	case assetcache.PolicyOffline:
		return httpd.UpstreamNever
	case assetcache.PolicyCache:
		return httpd.UpstreamViaEdge
	default:
		return httpd.UpstreamAllowed
	}
}
