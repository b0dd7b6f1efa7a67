package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// BMC methods as the simulated BMCs record them (the edge's BMC gRPC method names).
const (
	MethodPowerStatus = "PowerStatus"
	MethodPowerOn     = "PowerOn"
	MethodPowerOff    = "PowerOff"
	MethodPowerCycle  = "PowerCycle"
	MethodSetPXEOnce  = "SetPXEOnce"
)

// BMCBehaviour is how the simulated BMCs answer.
type BMCBehaviour struct {
	// Latency is how long every call to a live BMC takes, plus up to Jitter more.
	Latency time.Duration
	Jitter  time.Duration
	// FailureRate is the fraction of calls a live BMC fails with Unavailable (busy, a 5xx), from 0 to 1.
	FailureRate float64
	// DeadAfter is how long a call to a dead BMC takes before the edge gives up on it (edge/bmc with the default
	// IPMI exchange timeout of 2 s and one retry: about 4 s).
	DeadAfter time.Duration
}

// simBMC is one machine's simulated BMC: its IPMI users (set through the agent), power (the machine's), a
// one-time PXE flag, and what the benchmark reads: when the controller last learned the power state from it,
// and the calls it is waiting to see.
type simBMC struct {
	host    string
	port    uint32
	dead    bool
	machine *machine
	behave  *BMCBehaviour

	// turn serializes calls and limiter spaces them, as edge/bmc's Manager does for one BMC.
	turn    chan struct{}
	limiter *rate.Limiter

	mu         sync.Mutex
	users      map[string]string
	pxe        bool
	pxeUEFI    bool
	lastStatus time.Time // last PowerStatus answered
	mark       time.Time // see markFrom
	firstAfter time.Time // first PowerStatus answered at or after mark
	waiters    []*callWaiter
	calls      map[string]int
}

// callWaiter is told when the BMC receives a call of method.
type callWaiter struct {
	method string
	ch     chan time.Time
}

func newSimBMC(host string, m *machine, dead bool, behave *BMCBehaviour, cfg bmc.Config) *simBMC {
	return &simBMC{
		host: host, port: 623, dead: dead, machine: m, behave: behave,
		turn:    make(chan struct{}, 1),
		limiter: rate.NewLimiter(rate.Limit(cfg.RatePerSecond), cfg.Burst),
		users:   map[string]string{},
		calls:   map[string]int{},
	}
}

func (b *simBMC) key() string { return net.JoinHostPort(b.host, strconv.Itoa(int(b.port))) }

// setUser creates or updates an IPMI user (what the agent does in band).
func (b *simBMC) setUser(name, password string) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.users[name] = password
}

func (b *simBMC) hasUsers() bool {
	b.mu.Lock()
	defer b.mu.Unlock()

	return len(b.users) > 0
}

func (b *simBMC) userExists(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()

	_, ok := b.users[name]

	return ok
}

// expect returns a channel that receives the time the BMC next receives a call of method.
func (b *simBMC) expect(method string) <-chan time.Time {
	w := &callWaiter{method: method, ch: make(chan time.Time, 1)}

	b.mu.Lock()
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()

	return w.ch
}

// received notes a call as the edge's BMC service receives it.
func (b *simBMC) received(method string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.calls[method]++

	kept := b.waiters[:0]

	for _, w := range b.waiters {
		if w.method == method {
			w.ch <- at

			continue
		}

		kept = append(kept, w)
	}

	b.waiters = kept
}

// answeredStatus notes a PowerStatus answer: the controller learns the power state now.
func (b *simBMC) answeredStatus(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.lastStatus = at
	if !b.mark.IsZero() && b.firstAfter.IsZero() && !at.Before(b.mark) {
		b.firstAfter = at
	}
}

// markFrom starts watching for the first PowerStatus answered at or after t (a restarted controller's first).
func (b *simBMC) markFrom(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.mark, b.firstAfter = t, time.Time{}
}

// statusTimes returns the last PowerStatus answered and the first since the mark (zero when none).
func (b *simBMC) statusTimes() (last, firstAfterMark time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.lastStatus, b.firstAfter
}

func (b *simBMC) callCounts() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()

	out := make(map[string]int, len(b.calls))
	for k, v := range b.calls {
		out[k] = v
	}

	return out
}

// BMCService answers the edge's BMC gRPC service (shared/api/bmc) from a site's simulated BMCs.
//
// It stands in for edge/bmc's Manager and Service, not for the BMCs behind them: the real Manager speaks only
// IPMI (the controller asks for IPMI) over UDP with RMCP+ sessions, so a fleet of 20,000 would need 20,000 UDP
// sockets and two sides of RMCP+ crypto for every call in the simulator's process, on the same two cores as
// the controller it measures, and none of it is visible to the controller, which sees only this gRPC service
// over the uplink. What the controller does see is kept: one call at a time per BMC and the Manager's rate
// limit (edge/bmc.Default), its call timeout, and its error codes (Unavailable for a BMC that failed,
// DeadlineExceeded for one that did not answer, FailedPrecondition for refused credentials).
type BMCService struct {
	bmcpb.UnimplementedBMCServer

	cfg     bmc.Config
	behave  *BMCBehaviour
	bmcs    map[string]*simBMC // by host:port; fixed once the site runs
	watcher *edgeWatch         // nil: the edge does not watch its BMCs

	rndMu sync.Mutex
	rnd   *rand.Rand
}

func newBMCService(cfg bmc.Config, behave *BMCBehaviour, seed uint64) *BMCService {
	return &BMCService{cfg: cfg, behave: behave, bmcs: map[string]*simBMC{}, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} // simulation, not a secret
}

// Register registers the service (it fits edge/uplink.Options.Register).
func (s *BMCService) Register(r grpc.ServiceRegistrar) { bmcpb.RegisterBMCServer(r, s) }

func (s *BMCService) float() float64 {
	s.rndMu.Lock()
	defer s.rndMu.Unlock()

	return s.rnd.Float64()
}

func (s *BMCService) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}

	s.rndMu.Lock()
	defer s.rndMu.Unlock()

	return time.Duration(s.rnd.Int64N(int64(d)))
}

var errNoAnswer = errors.New("bmc did not answer in time (no answer from the bmc)")

// do runs op on the target's BMC as the edge's Manager would: in turn, rate-limited, within the call timeout.
func (s *BMCService) do(ctx context.Context, t *bmcpb.Target, method string, op func(*simBMC) error) error {
	at := time.Now()

	if t.GetHost() == "" || t.GetUsername() == "" {
		return status.Errorf(codes.InvalidArgument, "%s: invalid bmc target: host and username are required", method)
	}

	port := t.GetIpmiPort()
	if port == 0 {
		port = 623
	}

	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()

	b, ok := s.bmcs[net.JoinHostPort(t.GetHost(), strconv.Itoa(int(port)))]
	if !ok || b.dead {
		if ok {
			b.received(method, at)
		}

		return s.noAnswer(ctx, t, method, ok)
	}

	b.received(method, at)

	select {
	case b.turn <- struct{}{}:
	case <-ctx.Done():
		return ctxError(ctx, method, t, "waiting for the bmc's previous operation")
	}
	defer func() { <-b.turn }()

	if err := b.limiter.Wait(ctx); err != nil {
		return ctxError(ctx, method, t, "waiting for the bmc rate limit")
	}

	if err := sleep(ctx, b.behave.Latency+s.jitter(b.behave.Jitter)); err != nil {
		return ctxError(ctx, method, t, "operation")
	}

	b.mu.Lock()
	pw, known := b.users[t.GetUsername()]
	b.mu.Unlock()

	if !known || pw != t.GetPassword() {
		return status.Errorf(codes.FailedPrecondition, "%s on bmc %s: rmcp+ session refused: unauthorized name or password", method, t.GetHost())
	}

	if b.behave.FailureRate > 0 && s.float() < b.behave.FailureRate {
		return status.Errorf(codes.Unavailable, "%s on bmc %s: completion code 0xC0: node busy", method, t.GetHost())
	}

	return op(b)
}

// noAnswer waits as long as the edge waits for a BMC that never answers, then says so.
func (s *BMCService) noAnswer(ctx context.Context, t *bmcpb.Target, method string, known bool) error {
	wait := s.cfg.CallTimeout
	if known {
		wait = min(wait, s.behave.DeadAfter)
	}

	if err := sleep(ctx, wait); err != nil {
		return ctxError(ctx, method, t, "operation")
	}

	return status.Errorf(codes.DeadlineExceeded, "%s on bmc %s: %v", method, t.GetHost(), errNoAnswer)
}

func ctxError(ctx context.Context, method string, t *bmcpb.Target, doing string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return status.Errorf(codes.DeadlineExceeded, "%s on bmc %s: bmc did not answer in time (%s)", method, t.GetHost(), doing)
	}

	return status.FromContextError(ctx.Err()).Err()
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}

	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// PowerStatus implements bmcpb.BMCServer.
func (s *BMCService) PowerStatus(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerStatusResponse, error) {
	on, err := s.powerStatus(ctx, req.GetTarget(), MethodPowerStatus)
	if err != nil {
		return nil, err
	}

	return &bmcpb.PowerStatusResponse{On: on}, nil
}

// powerStatus asks a BMC whether its machine is on; method says who asks (the controller, the edge's watcher).
func (s *BMCService) powerStatus(ctx context.Context, t *bmcpb.Target, method string) (bool, error) {
	var on bool

	err := s.do(ctx, t, method, func(b *simBMC) error {
		on = b.machine.powered()
		b.answeredStatus(time.Now())

		return nil
	})

	return on, err
}

// PowerOn implements bmcpb.BMCServer.
func (s *BMCService) PowerOn(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return &bmcpb.PowerResponse{}, s.do(ctx, req.GetTarget(), MethodPowerOn, func(b *simBMC) error {
		b.machine.powerOn()

		return nil
	})
}

// PowerOff implements bmcpb.BMCServer.
func (s *BMCService) PowerOff(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return &bmcpb.PowerResponse{}, s.do(ctx, req.GetTarget(), MethodPowerOff, func(b *simBMC) error {
		b.machine.powerOff()

		return nil
	})
}

// PowerCycle implements bmcpb.BMCServer.
func (s *BMCService) PowerCycle(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return &bmcpb.PowerResponse{}, s.do(ctx, req.GetTarget(), MethodPowerCycle, func(b *simBMC) error {
		b.machine.reset()

		return nil
	})
}

// SetPXEOnce implements bmcpb.BMCServer.
func (s *BMCService) SetPXEOnce(ctx context.Context, req *bmcpb.SetPXEOnceRequest) (*bmcpb.PowerResponse, error) {
	if req.GetMode() == bmcpb.BootMode_BOOT_MODE_UNSPECIFIED {
		return nil, status.Error(codes.InvalidArgument, "set one-time pxe boot: boot mode is required")
	}

	return &bmcpb.PowerResponse{}, s.do(ctx, req.GetTarget(), MethodSetPXEOnce, func(b *simBMC) error {
		b.mu.Lock()
		b.pxe, b.pxeUEFI = true, req.GetMode() == bmcpb.BootMode_BOOT_MODE_UEFI
		b.mu.Unlock()

		return nil
	})
}

// ClearBootOverride implements bmcpb.BMCServer.
func (s *BMCService) ClearBootOverride(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return &bmcpb.PowerResponse{}, s.do(ctx, req.GetTarget(), "ClearBootOverride", func(b *simBMC) error {
		b.mu.Lock()
		b.pxe = false
		b.mu.Unlock()

		return nil
	})
}

// GetBootOverride implements bmcpb.BMCServer.
func (s *BMCService) GetBootOverride(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.GetBootOverrideResponse, error) {
	resp := &bmcpb.GetBootOverrideResponse{Mode: bmcpb.BootMode_BOOT_MODE_UEFI}

	err := s.do(ctx, req.GetTarget(), "GetBootOverride", func(b *simBMC) error {
		b.mu.Lock()
		resp.Set, resp.Pxe = b.pxe, b.pxe
		b.mu.Unlock()

		return nil
	})
	if err != nil {
		return nil, err
	}

	return resp, nil
}

// String names a BMC for logs.
func (b *simBMC) String() string { return fmt.Sprintf("bmc %s of %s", b.key(), b.machine.id) }
