package vbmc_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// fakeClock is an injectable clock that only moves when told.
type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// machine is a chassis with both front ends on loopback.
type machine struct {
	ch      *vbmc.Chassis
	rf      *vbmc.Redfish
	rfSrv   *httptest.Server
	ipmiPrt int
}

func newMachine(t *testing.T, ami bool, opts ...vbmc.ChassisOption) *machine {
	t.Helper()

	return newMachineWith(t, vbmc.RedfishOptions{User: user, Password: password, AMI: ami}, opts...)
}

func newMachineWith(t *testing.T, rfOpts vbmc.RedfishOptions, opts ...vbmc.ChassisOption) *machine {
	t.Helper()

	ch := vbmc.NewChassis(opts...)
	rf := vbmc.NewRedfish(ch, rfOpts)
	srv := httptest.NewServer(rf)
	t.Cleanup(srv.Close)

	return &machine{ch: ch, rf: rf, rfSrv: srv, ipmiPrt: startIPMI(t, ch)}
}

func (m *machine) target(p bmc.Protocol) bmc.Target {
	return bmc.Target{Host: "127.0.0.1", IPMIPort: m.ipmiPrt, RedfishEndpoint: m.rfSrv.URL, Protocol: p}
}

var creds = bmc.Credentials{Username: user, Password: password}

func newManager(t *testing.T, mutate func(*bmc.Config), now func() time.Time) *bmc.Manager {
	t.Helper()

	cfg := bmc.Default()
	cfg.RatePerSecond, cfg.Burst = 1000, 100
	cfg.CallTimeout = 5 * time.Second

	if mutate != nil {
		mutate(&cfg)
	}

	m, err := bmc.New(cfg, zaptest.NewLogger(t), now)
	require.NoError(t, err)
	t.Cleanup(m.Close)

	return m
}

func TestManagerOperations(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		ami     bool
		pending bool
		proto   bmc.Protocol
		want    bmc.Protocol
	}{
		{name: "ipmi", proto: bmc.ProtocolIPMI, want: bmc.ProtocolIPMI},
		{name: "redfish probed", proto: bmc.ProtocolAuto, want: bmc.ProtocolRedfish},
		{name: "redfish ami settings object", ami: true, proto: bmc.ProtocolAuto, want: bmc.ProtocolRedfish},
		{name: "redfish ami applied at reset", ami: true, pending: true, proto: bmc.ProtocolAuto, want: bmc.ProtocolRedfish},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			mach := newMachineWith(t, vbmc.RedfishOptions{User: user, Password: password, AMI: tc.ami, ApplyOnReset: tc.pending})
			mgr := newManager(t, nil, nil)
			tgt := mach.target(tc.proto)
			ctx := t.Context()

			on, err := mgr.PowerStatus(ctx, tgt, creds)
			require.NoError(t, err)
			require.False(t, on)

			if tc.proto == bmc.ProtocolAuto {
				require.Equal(t, tc.want, mgr.Protocol(tgt))
			}

			// PXE once in BIOS mode, read back, then consumed by power on.
			require.NoError(t, mgr.SetPXEOnce(ctx, tgt, creds, metal.BIOS))

			set, pxe, mode, err := mgr.BootOverride(ctx, tgt, creds)
			require.NoError(t, err)
			require.True(t, set)
			require.True(t, pxe)
			require.Equal(t, metal.BIOS, mode)

			require.NoError(t, mgr.PowerOn(ctx, tgt, creds))

			on, err = mgr.PowerStatus(ctx, tgt, creds)
			require.NoError(t, err)
			require.True(t, on)
			require.Equal(t, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.BIOS}, mach.ch.Boots()[0])

			// PXE once in UEFI mode, then a cycle boots it.
			require.NoError(t, mgr.SetPXEOnce(ctx, tgt, creds, metal.UEFI))

			_, _, mode, err = mgr.BootOverride(ctx, tgt, creds)
			require.NoError(t, err)
			require.Equal(t, metal.UEFI, mode)

			require.NoError(t, mgr.PowerCycle(ctx, tgt, creds))
			require.Len(t, mach.ch.Boots(), 2)
			require.Equal(t, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI}, mach.ch.Boots()[1])

			// Clear an override.
			require.NoError(t, mgr.SetPXEOnce(ctx, tgt, creds, metal.UEFI))
			require.NoError(t, mgr.ClearOverride(ctx, tgt, creds))

			set, _, _, err = mgr.BootOverride(ctx, tgt, creds)
			require.NoError(t, err)
			require.False(t, set)

			require.NoError(t, mgr.PowerOff(ctx, tgt, creds))
			require.False(t, mach.ch.PowerState())

			if tc.want == bmc.ProtocolRedfish {
				require.Equal(t, 1, mach.rf.SessionsCreated(), "one session reused for every call")

				mgr.Close()
				require.Zero(t, mach.rf.Sessions(), "the session was logged out")
			}
		})
	}
}

func TestManagerSerializesCallsToOneBMC(t *testing.T) {
	t.Parallel()

	mach := newMachine(t, false, vbmc.WithLatency(20*time.Millisecond))
	mgr := newManager(t, nil, nil)
	tgt := mach.target(bmc.ProtocolAuto)

	// The emulator itself serves concurrent requests: show it first with raw HTTP.
	var wg sync.WaitGroup

	for range 4 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, mach.rfSrv.URL+"/redfish/v1/Systems/1", nil)
			req.SetBasicAuth(user, password)

			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close() //nolint:errcheck
			}
		})
	}

	wg.Wait()
	require.Greater(t, mach.ch.MaxConcurrent(), 1, "raw requests overlap in the emulator")

	// Through the manager, calls to one BMC never overlap.
	fresh := newMachine(t, false, vbmc.WithLatency(20*time.Millisecond))
	tgt = fresh.target(bmc.ProtocolAuto)

	errs := make(chan error, 8)

	for i := range 8 {
		wg.Go(func() {
			if i%2 == 0 {
				_, err := mgr.PowerStatus(t.Context(), tgt, creds)
				errs <- err
			} else {
				errs <- mgr.SetPXEOnce(t.Context(), tgt, creds, metal.UEFI)
			}
		})
	}

	wg.Wait()
	close(errs)

	for err := range errs {
		require.NoError(t, err)
	}

	require.Equal(t, 1, fresh.ch.MaxConcurrent(), "operations on one BMC were serialized")
}

func TestManagerUnreachableBMCDoesNotBlockOthers(t *testing.T) {
	t.Parallel()

	// A BMC that swallows every packet and has no Redfish.
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() }) //nolint:errcheck

	closedTCP, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + closedTCP.Addr().String()
	require.NoError(t, closedTCP.Close())

	dead := bmc.Target{Host: "127.0.0.1", IPMIPort: silent.LocalAddr().(*net.UDPAddr).Port, RedfishEndpoint: deadURL}
	good := newMachine(t, false)

	// The dead BMC's calls take their whole 3 s; a call to another BMC must be answered well within that.
	mgr := newManager(t, func(c *bmc.Config) {
		c.CallTimeout = 3 * time.Second
		c.ProbeTimeout = 500 * time.Millisecond
		c.IPMIExchangeTimeout = 300 * time.Millisecond
	}, nil)

	deadErr := make(chan error, 2)
	start := time.Now()

	for range 2 { // the second waits behind the first and must still time out in bounds
		go func() {
			_, err := mgr.PowerStatus(context.Background(), dead, creds)
			deadErr <- err
		}()
	}

	// Meanwhile another BMC answers promptly.
	for range 3 {
		t0 := time.Now()
		_, err := mgr.PowerStatus(t.Context(), good.target(bmc.ProtocolIPMI), creds)
		require.NoError(t, err)
		require.Less(t, time.Since(t0), 2*time.Second, "not held up by the dead BMC")
	}

	for range 2 {
		err := <-deadErr
		require.ErrorIs(t, err, bmc.ErrTimeout)
		require.Contains(t, err.Error(), "power status on bmc 127.0.0.1")
		require.NotContains(t, err.Error(), password)
	}

	require.Less(t, time.Since(start), 8*time.Second, "bounded wait")
}

func TestManagerProbeExpires(t *testing.T) {
	t.Parallel()

	clock := &fakeClock{}
	mach := newMachine(t, false)
	mgr := newManager(t, func(c *bmc.Config) {
		c.ProbeTTL = time.Minute
		c.CallTimeout = 2 * time.Second
		c.ProbeTimeout = time.Second
	}, clock.now)
	tgt := mach.target(bmc.ProtocolAuto)

	_, err := mgr.PowerStatus(t.Context(), tgt, creds)
	require.NoError(t, err)
	require.Equal(t, bmc.ProtocolRedfish, mgr.Protocol(tgt))

	// Redfish goes away; within the TTL the choice is remembered (and the call fails).
	mach.rfSrv.CloseClientConnections()
	mach.rfSrv.Close()

	_, err = mgr.PowerStatus(t.Context(), tgt, creds)
	require.Error(t, err)
	require.Equal(t, bmc.ProtocolRedfish, mgr.Protocol(tgt))

	// After the TTL the BMC is probed again and IPMI takes over.
	clock.advance(2 * time.Minute)
	require.Equal(t, bmc.ProtocolAuto, mgr.Protocol(tgt), "the probe result expired")

	on, err := mgr.PowerStatus(t.Context(), tgt, creds)
	require.NoError(t, err)
	require.False(t, on)
	require.Equal(t, bmc.ProtocolIPMI, mgr.Protocol(tgt))
}

func TestManagerWrongPasswordIsNotRevealed(t *testing.T) {
	t.Parallel()

	mach := newMachine(t, false)
	mgr := newManager(t, func(c *bmc.Config) { c.CallTimeout = 3 * time.Second; c.IPMIExchangeTimeout = 300 * time.Millisecond }, nil)
	wrong := bmc.Credentials{Username: user, Password: "wrong-password-xyz"}

	for _, p := range []bmc.Protocol{bmc.ProtocolIPMI, bmc.ProtocolRedfish} {
		_, err := mgr.PowerStatus(t.Context(), mach.target(p), wrong)
		require.Error(t, err, "%s", p)
		require.NotContains(t, err.Error(), wrong.Password)
		require.False(t, errors.Is(err, bmc.ErrInvalidTarget))
		require.False(t, strings.Contains(err.Error(), "wrong-password"))
	}
}

func TestManagerRateLimitsOneBMC(t *testing.T) {
	t.Parallel()

	mach := newMachine(t, false)
	other := newMachine(t, false)
	mgr := newManager(t, func(c *bmc.Config) { c.RatePerSecond, c.Burst = 10, 1 }, nil)

	start := time.Now()

	for range 6 {
		_, err := mgr.PowerStatus(t.Context(), mach.target(bmc.ProtocolIPMI), creds)
		require.NoError(t, err)
	}

	// Six operations at 10/s with a burst of one cannot finish in less than half a second.
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)

	// The limit is per BMC: another BMC's first call does not wait.
	_, err := mgr.PowerStatus(t.Context(), other.target(bmc.ProtocolIPMI), creds)
	require.NoError(t, err)
}

func TestManagerRecoversFromExpiredRedfishSession(t *testing.T) {
	t.Parallel()

	mach := newMachine(t, false)
	mgr := newManager(t, nil, nil)
	tgt := mach.target(bmc.ProtocolRedfish)

	_, err := mgr.PowerStatus(t.Context(), tgt, creds)
	require.NoError(t, err)

	mach.rf.ExpireSessions()

	// The reused session is refused; the manager logs in again once and the call succeeds.
	require.NoError(t, mgr.PowerOn(t.Context(), tgt, creds))
	require.True(t, mach.ch.PowerState())
	require.Equal(t, 2, mach.rf.SessionsCreated())
}

func TestManagerSendsBootModeOnlyWhenItChanges(t *testing.T) {
	t.Parallel()

	mach := newMachine(t, false)
	mgr := newManager(t, nil, nil)
	tgt := mach.target(bmc.ProtocolRedfish)

	for _, step := range []struct {
		mode  metal.Firmware
		patch int
	}{
		{mode: metal.BIOS, patch: 0}, // the system is in Legacy mode already
		{mode: metal.UEFI, patch: 1},
		{mode: metal.UEFI, patch: 1},
		{mode: metal.BIOS, patch: 2},
	} {
		require.NoError(t, mgr.SetPXEOnce(t.Context(), tgt, creds, step.mode))
		require.Equal(t, step.patch, mach.rf.ModePatches(), "mode %s", step.mode)
	}
}

func TestIPMICipherSuiteFallback(t *testing.T) {
	t.Parallel()

	// A BMC that only accepts cipher suite 3.
	ch := vbmc.NewChassis()
	b, err := vbmc.NewIPMI(ch, user, password, 3)
	require.NoError(t, err)

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- b.Serve(ctx, conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	tgt := bmc.Target{Host: "127.0.0.1", IPMIPort: conn.LocalAddr().(*net.UDPAddr).Port, Protocol: bmc.ProtocolIPMI}

	// Default: 17, then 3.
	_, err = newManager(t, nil, nil).PowerStatus(t.Context(), tgt, creds)
	require.NoError(t, err)

	// Configured for 17 only: refused.
	_, err = newManager(t, func(c *bmc.Config) {
		c.IPMICipherSuites = []uint8{17}
		c.CallTimeout = 2 * time.Second
		c.ProbeTimeout = time.Second
		c.IPMIExchangeTimeout = 300 * time.Millisecond
	}, nil).PowerStatus(t.Context(), tgt, creds)
	require.ErrorContains(t, err, "cipher suite id (17)")
}
