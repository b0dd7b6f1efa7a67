// Package omni is an Omni stand-in for tests and the emulation lab: it serves Omni's COSI State gRPC API
// with Omni's own resource types, enforces the access rules Omni applies to an infra provider's service
// account, serves SideroLink's Provision RPC and plays Omni's side of the static-provider lifecycle
// (InfraMachine derived from the link, the user's InfraMachineConfig and the allocation), as Omni v1.9.3 does.
//
// It is test tooling: nothing in the product imports it.
package omni

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/impl/store"
	"github.com/cosi-project/runtime/pkg/state/impl/store/bolt"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/omni/client/pkg/omni/resources/system"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"go.etcd.io/bbolt"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	// Omni's client compresses every call with gzip; without the codec every call fails with Unimplemented.
	_ "google.golang.org/grpc/encoding/gzip"

	// Registering Omni's resource types lets the stand-in read and persist their specs.
	_ "github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	_ "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	_ "github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
)

// BackendVersion is the Omni version the stand-in reports in system.SysVersion.
const BackendVersion = "v1.9.3"

// Config configures the stand-in.
type Config struct {
	// ProviderID is the infra provider whose service account the stand-in issues (omnictl infraprovider create <id>).
	ProviderID string
	// StateDir persists state (bolt) and keys; empty keeps everything in memory.
	StateDir string
	// AdvertiseAddress is the host:port machines use to reach the stand-in (SideroLink API); empty uses the listener's.
	AdvertiseAddress string
	// CollectInfoOnProvision marks a machine's information as collected as soon as it provisions. A real Omni
	// collects it only from a real Talos over the Talos API through SideroLink WireGuard, which the lab's machines
	// are not; until then it keeps the machine's preferred power state ON. Off by default, as Omni behaves with
	// such machines; the lab turns it on (and says so) to reach the power-off after the cooldown, and tests call
	// Admin.CollectInfo.
	CollectInfoOnProvision bool
	// RefuseResumedWatches answers a watch resumed from a bookmark with FailedPrecondition ("invalid watch
	// bookmark"), as an Omni whose store was compacted or restored from a backup does: the client cannot resume
	// any watch and must start over. The COSI runtime stops on it; a controller must rebuild its connection.
	RefuseResumedWatches bool
	// TLSCertificate makes the stand-in serve TLS (https:// endpoints); nil serves plaintext gRPC (grpc://).
	TLSCertificate *tls.Certificate
	// Calls, when set, counts every State API call served, by identity and method (benchmarks read it).
	Calls *CallCounter
	// Latency makes every State API call wait this long before it is served (a slow or distant Omni; 0: none).
	Latency time.Duration
	Logger  *zap.Logger
}

// Default returns the stand-in's default configuration.
func Default() Config {
	return Config{ProviderID: "bare-metal", Logger: zap.NewNop()}
}

// Validate reports a configuration the stand-in cannot run with.
func (c Config) Validate() error {
	if c.ProviderID == "" {
		return errors.New("provider ID is empty")
	}

	if c.Logger == nil {
		return errors.New("logger is nil")
	}

	if c.Latency < 0 {
		return fmt.Errorf("latency %s is negative", c.Latency)
	}

	return nil
}

// Server is a running Omni stand-in's state and keys; Serve exposes them over gRPC.
type Server struct {
	cfg   Config
	st    state.State // unfiltered: Omni's own view
	keys  *keyring
	bolt  *bolt.BackingStore
	token string
}

// historyOptions keep as many events per kind for a watcher that falls behind as Omni v1.9.3 keeps
// (internal/backend/runtime/omni/state_boltdb.go: 5000, gap 20); a stand-in with the default 100 ends the
// watches of a provider with thousands of machines, which Omni does not.
func historyOptions() []inmem.StateOption {
	return []inmem.StateOption{inmem.WithHistoryMaxCapacity(5000), inmem.WithHistoryGap(20)}
}

// New opens (or creates) the stand-in's state and service-account keys.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("omni stand-in config: %w", err)
	}

	s := &Server{cfg: cfg}

	var core state.CoreState

	if cfg.StateDir == "" {
		build := inmem.NewStateWithOptions(historyOptions()...)
		core = namespaced.NewState(func(ns resource.Namespace) state.CoreState { return build(ns) })
	} else {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}

		bs, err := bolt.NewBackingStore(func() (*bbolt.DB, error) {
			return bbolt.Open(filepath.Join(cfg.StateDir, "omni.db"), 0o600, &bbolt.Options{Timeout: 5 * time.Second})
		}, store.ProtobufMarshaler{})
		if err != nil {
			return nil, fmt.Errorf("open bolt store: %w", err)
		}

		s.bolt = bs
		core = namespaced.NewState(func(ns resource.Namespace) state.CoreState {
			return inmem.NewStateWithOptions(append(historyOptions(), inmem.WithBackingStore(bs.WithNamespace(ns)))...)(ns)
		})
	}

	s.st = state.WrapCore(core)

	keys, err := loadOrCreateKeys(cfg.StateDir, cfg.ProviderID)
	if err != nil {
		s.Close() //nolint:errcheck

		return nil, err
	}

	s.keys = keys
	s.token = keys.JoinToken

	return s, nil
}

// Close releases the persisted store.
func (s *Server) Close() error {
	if s.bolt != nil {
		return s.bolt.Close()
	}

	return nil
}

// State is Omni's own unfiltered state (what Omni's controllers see).
func (s *Server) State() state.State { return s.st }

// ProviderKey is the base64 service-account key of the provider (as printed by `omnictl infraprovider create`).
func (s *Server) ProviderKey() string { return s.keys.Provider }

// AdminKey is the base64 service-account key of an admin identity (what Omni's UI and omnictl act as).
func (s *Server) AdminKey() string { return s.keys.Admin }

// Serve serves the COSI State API, with provider-scoped authorization, and SideroLink's Provision on ln,
// and runs Omni's InfraMachine derivation until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	advertise := s.cfg.AdvertiseAddress
	if advertise == "" {
		advertise = ln.Addr().String()
	}

	if err := s.seed(ctx, advertise); err != nil {
		return err
	}

	auth, err := newAuthenticator(s.keys)
	if err != nil {
		return err
	}

	unaries := []grpc.UnaryServerInterceptor{auth.unary}
	streams := []grpc.StreamServerInterceptor{auth.stream}

	if s.cfg.Calls != nil {
		unaries = append(unaries, s.cfg.Calls.unary)
		streams = append(streams, s.cfg.Calls.stream)
	}

	if s.cfg.RefuseResumedWatches {
		streams = append(streams, refuseResumedWatches)
	}

	if d := s.cfg.Latency; d > 0 {
		unaries = append(unaries, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := wait(ctx, d); err != nil {
				return nil, err
			}

			return handler(ctx, req)
		})
		streams = append(streams, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := wait(ss.Context(), d); err != nil {
				return err
			}

			return handler(srv, ss)
		})
	}

	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unaries...),
		grpc.ChainStreamInterceptor(streams...),
	}

	if s.cfg.TLSCertificate != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{*s.cfg.TLSCertificate},
			MinVersion:   tls.VersionTLS12,
			NextProtos:   []string{"h2"},
		})))
	}

	srv := grpc.NewServer(opts...)

	v1alpha1.RegisterStateServer(srv, server.NewState(authorize(s.st, s.cfg.ProviderID)))
	pb.RegisterProvisionServiceServer(srv, &provisioner{s: s})

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error {
		err := srv.Serve(ln)
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}

		return err
	})

	eg.Go(func() error {
		<-ctx.Done()
		srv.Stop()

		return nil
	})

	eg.Go(func() error {
		return newDeriver(s.st, s.cfg.Logger.With(zap.String("component", "omni_infra_machine"))).Run(ctx)
	})

	return eg.Wait()
}

// refuseResumedWatches fails every State/Watch whose request resumes from a bookmark.
func refuseResumedWatches(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != v1alpha1.State_Watch_FullMethodName {
		return handler(srv, ss)
	}

	return handler(srv, &bookmarkGuard{ServerStream: ss})
}

type bookmarkGuard struct{ grpc.ServerStream }

func (g *bookmarkGuard) RecvMsg(m any) error {
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}

	if req, ok := m.(*v1alpha1.WatchRequest); ok && len(req.GetOptions().GetStartFromBookmark()) > 0 {
		return status.Error(codes.FailedPrecondition, "invalid watch bookmark: the store no longer holds it")
	}

	return nil
}

func (s *Server) seed(ctx context.Context, advertise string) error {
	v := system.NewSysVersion(system.SysVersionID)
	v.TypedSpec().Value.BackendVersion = BackendVersion
	v.TypedSpec().Value.InstanceName = "omni-stand-in"
	v.TypedSpec().Value.BackendApiVersion = 1

	if err := createOrUpdate(ctx, s.st, v); err != nil {
		return fmt.Errorf("seed sysversion: %w", err)
	}

	jc, err := providerJoinConfig(s.cfg.ProviderID, s.token, advertise, s.cfg.TLSCertificate != nil)
	if err != nil {
		return err
	}

	if err = createOrUpdate(ctx, s.st, jc); err != nil {
		return fmt.Errorf("seed provider join config: %w", err)
	}

	return nil
}

func createOrUpdate(ctx context.Context, st state.State, r resource.Resource) error {
	err := st.Create(ctx, r)
	if err == nil || !state.IsConflictError(err) {
		return err
	}

	cur, err := st.Get(ctx, r.Metadata())
	if err != nil {
		return err
	}

	r.Metadata().SetVersion(cur.Metadata().Version())

	return st.Update(ctx, r)
}

// wait waits d, or until ctx ends.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
