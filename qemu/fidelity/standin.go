package fidelity

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/client"
	"go.uber.org/zap"

	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/qemu/omni"
)

// StandIn is the Omni stand-in as a Backend, served on loopback in this process. Admin actions go over gRPC
// with the admin key, so the stand-in's checks apply to them as Omni's do.
type StandIn struct {
	srv    *omni.Server
	addr   string
	admin  *client.Client
	cancel context.CancelFunc
	done   chan error
}

// StartStandIn serves a stand-in for providerID until Stop.
func StartStandIn(providerID string, logger *zap.Logger) (*StandIn, error) {
	cfg := omni.Default()
	cfg.ProviderID = providerID
	cfg.Logger = logger

	srv, err := omni.New(cfg)
	if err != nil {
		return nil, err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close() //nolint:errcheck

		return nil, fmt.Errorf("listen: %w", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s := &StandIn{srv: srv, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}

	go func() { s.done <- srv.Serve(ctx, ln) }()

	if s.admin, err = client.New("grpc://"+s.addr, client.WithServiceAccount(srv.AdminKey())); err != nil {
		s.Stop() //nolint:errcheck // the client error is the one to report

		return nil, fmt.Errorf("admin client: %w", err)
	}

	return s, nil
}

// Stop stops serving and closes the store; it returns what serving ended with.
func (s *StandIn) Stop() error {
	if s.admin != nil {
		s.admin.Close() //nolint:errcheck
	}

	s.cancel()
	err := <-s.done
	s.srv.Close() //nolint:errcheck

	return err
}

// Name implements Backend.
func (s *StandIn) Name() string { return "stand-in" }

// Controller implements Backend.
func (s *StandIn) Controller() controlleromni.Config {
	cfg := controlleromni.Default()
	cfg.Endpoint = "grpc://" + s.addr
	cfg.ServiceAccountKey = s.srv.ProviderKey()
	cfg.HealthInterval = time.Second
	cfg.RetryMin, cfg.RetryMax = 50*time.Millisecond, time.Second

	return cfg
}

// Reader implements Backend: the stand-in has no roles, so a reader sees what its admin sees.
func (s *StandIn) Reader(context.Context) (state.State, error) { return s.Admin(), nil }

// Admin implements Backend.
func (s *StandIn) Admin() state.State { return s.admin.Omni().State() }

// Dial implements Backend.
func (s *StandIn) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
}

// Allocate implements Backend: the resources `omnictl cluster template sync` writes.
func (s *StandIn) Allocate(ctx context.Context, machineID, cluster, talosVersion string) error {
	return omni.NewAdmin(s.Admin()).Allocate(ctx, machineID, cluster, talosVersion, nil, false)
}

// Release implements Backend.
func (s *StandIn) Release(ctx context.Context, machineID, _ string) error {
	return omni.NewAdmin(s.Admin()).Release(ctx, machineID)
}

// CollectInfo implements Backend: the stand-in is told what a real Talos would report.
func (s *StandIn) CollectInfo(ctx context.Context, machineID string) error {
	return omni.NewAdmin(s.Admin()).CollectInfo(ctx, machineID, "v1.11.5")
}

// RemoveLink implements Backend.
func (s *StandIn) RemoveLink(ctx context.Context, machineID string) error {
	return removeLink(ctx, s.Admin(), machineID)
}
