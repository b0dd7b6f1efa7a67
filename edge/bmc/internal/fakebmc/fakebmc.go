// Package fakebmc is an in-process IPMI v2.0 BMC for the bmc packages' tests: go-ipmi's simulator on a loopback
// UDP port with one administrator and a chassis whose answers a test scripts (completion codes, what boot flags
// read back as). It counts the RMCP+ Open Session requests it receives by the cipher suite they ask for.
package fakebmc

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/bmc"
	"github.com/bougou/go-ipmi/pkg/clock"
	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/hal/mock"
	"github.com/bougou/go-ipmi/pkg/server"
	"github.com/bougou/go-ipmi/pkg/transport"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
	"github.com/bougou/go-ipmi/pkg/types"
)

// Op is a chassis operation whose answer a test can script.
type Op string

// Ops.
const (
	OpPowerState   Op = "power state"    // Get Chassis Status
	OpSetPower     Op = "set power"      // Chassis Control power up / down
	OpPowerCycle   Op = "power cycle"    // Chassis Control power cycle
	OpSetBootFlags Op = "set boot flags" // Set System Boot Options parameter 5
	OpGetBootFlags Op = "get boot flags" // Get System Boot Options parameter 5
)

// Options configure a BMC.
type Options struct {
	User, Password string
	// CipherSuites limits the RMCP+ cipher suites accepted (none: go-ipmi's defaults, 17 and 3 included).
	CipherSuites []uint8
	// ReadBack turns the boot flags last set into what Get System Boot Options answers (nil: echo them).
	ReadBack func(set types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags
}

// BMC is a running fake BMC.
type BMC struct {
	// Port is its UDP port on 127.0.0.1.
	Port int

	mu       sync.Mutex
	on       bool
	flags    types.BootOptionParam_BootFlags
	refuse   map[Op]types.CompletionCode
	readBack func(types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags
	opens    map[uint8]int // Open Session requests by RMCP+ authentication algorithm
}

// Start starts a BMC on 127.0.0.1 and stops it when the test ends.
func Start(t testing.TB, opts Options) *BMC {
	t.Helper()

	f := &BMC{refuse: map[Op]types.CompletionCode{}, readBack: opts.ReadBack, opens: map[uint8]int{}}

	bopts := []bmc.Option{bmc.WithClock(clock.Real)}

	if len(opts.CipherSuites) > 0 {
		ids := make([]types.CipherSuiteID, 0, len(opts.CipherSuites))
		for _, id := range opts.CipherSuites {
			ids = append(ids, types.CipherSuiteID(id))
		}

		bopts = append(bopts, bmc.WithCipherSuites(ids))
	}

	b := bmc.New(bmc.DeviceInfo{IPMIVersion: 0x20}, [16]byte{0x0f, 0xa4}, &fakeHAL{HAL: mock.New(), chassis: chassisHAL{f: f}}, bopts...)

	admin, err := b.Users.Add(2, opts.User)
	if err != nil {
		t.Fatalf("fakebmc: add user: %v", err)
	}

	admin.SetPassword([]byte(opts.Password))
	admin.Enabled = true
	admin.ChannelAccess[1] = bmc.UserChannelAccess{MaxPrivilege: bmc.PrivilegeLevelAdministrator, Enabled: true}

	if err := b.Users.Update(2, func(u *bmc.User) error { *u = *admin; return nil }); err != nil {
		t.Fatalf("fakebmc: store user: %v", err)
	}

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("fakebmc: listen: %v", err)
	}

	f.Port = conn.LocalAddr().(*net.UDPAddr).Port

	srv := server.NewServer(b, &countingConn{PacketConn: udp.Wrap(conn, udp.WithReadTimeout(100*time.Millisecond)), f: f})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})

	go func() {
		defer close(done)

		_ = srv.Serve(ctx) //nolint:errcheck // ends with the test
	}()

	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close() //nolint:errcheck
	})

	return f
}

// Refuse makes every later call of op answer cc (0: answer normally again).
func (f *BMC) Refuse(op Op, cc types.CompletionCode) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if cc == types.CodeOK {
		delete(f.refuse, op)

		return
	}

	f.refuse[op] = cc
}

// PowerState reports whether the chassis is on.
func (f *BMC) PowerState() bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.on
}

// BootFlags returns the boot flags last set.
func (f *BMC) BootFlags() types.BootOptionParam_BootFlags {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.flags
}

// Authentication algorithms of RMCP+ Open Session requests (IPMI v2.0 §13.28): cipher suite 17 asks for
// HMAC-SHA256, cipher suite 3 for HMAC-SHA1.
const (
	AuthHMACSHA1   uint8 = 0x01
	AuthHMACSHA256 uint8 = 0x03
)

// OpenSessions returns how many Open Session requests asked for the authentication algorithm alg.
func (f *BMC) OpenSessions(alg uint8) int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.opens[alg]
}

func (f *BMC) refusal(op Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if cc, ok := f.refuse[op]; ok {
		return cc // go-ipmi's handlers answer a CompletionCode error with that code
	}

	return nil
}

// countingConn counts Open Session requests on their way in.
type countingConn struct {
	transport.PacketConn

	f *BMC
}

func (c *countingConn) ReadFrom(buf []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(buf)

	// RMCP header (4 bytes), auth type 06h (RMCP+), payload type 10h Open Session Request (§13.6, §13.17); the
	// payload starts at 16: tag, privilege, 2 reserved, the console's session ID (4), then the authentication
	// payload whose algorithm is its byte 4.
	const algAt = 16 + 8 + 4
	if err == nil && n > algAt && buf[4] == 0x06 && buf[5]&0x3f == 0x10 {
		c.f.mu.Lock()
		c.f.opens[buf[algAt]&0x3f]++
		c.f.mu.Unlock()
	}

	return n, addr, err
}

type fakeHAL struct {
	*mock.HAL

	chassis chassisHAL
}

func (h *fakeHAL) Chassis() hal.ChassisHAL { return h.chassis }

type chassisHAL struct{ f *BMC }

func (c chassisHAL) PowerState(context.Context) (bool, error) {
	if err := c.f.refusal(OpPowerState); err != nil {
		return false, err
	}

	return c.f.PowerState(), nil
}

func (c chassisHAL) SetPower(_ context.Context, on bool) error {
	if err := c.f.refusal(OpSetPower); err != nil {
		return err
	}

	c.f.mu.Lock()
	c.f.on = on
	c.f.mu.Unlock()

	return nil
}

func (c chassisHAL) PowerCycle(context.Context) error {
	if err := c.f.refusal(OpPowerCycle); err != nil {
		return err
	}

	c.f.mu.Lock()
	c.f.on = true
	c.f.mu.Unlock()

	return nil
}

func (c chassisHAL) ColdReset(ctx context.Context) error { return c.PowerCycle(ctx) }

func (c chassisHAL) WarmReset(ctx context.Context) error { return c.PowerCycle(ctx) }

func (c chassisHAL) Identify(context.Context, uint8) error { return nil }

func (c chassisHAL) IntrusionState(context.Context) (bool, error) { return false, nil }

func (c chassisHAL) SetBootFlags(_ context.Context, flags *types.BootOptionParam_BootFlags) error {
	if err := c.f.refusal(OpSetBootFlags); err != nil {
		return err
	}

	if flags == nil {
		return errors.New("no boot flags")
	}

	c.f.mu.Lock()
	c.f.flags = *flags
	c.f.mu.Unlock()

	return nil
}

func (c chassisHAL) GetBootFlags(context.Context) (*types.BootOptionParam_BootFlags, error) {
	if err := c.f.refusal(OpGetBootFlags); err != nil {
		return nil, err
	}

	c.f.mu.Lock()
	defer c.f.mu.Unlock()

	got := c.f.flags
	if c.f.readBack != nil {
		got = c.f.readBack(got)
	}

	return &got, nil
}

func (c chassisHAL) SetBootInfoAcknowledge(context.Context, *types.BootOptionParam_BootInfoAcknowledge) error {
	return nil
}

func (c chassisHAL) GetBootInfoAcknowledge(context.Context) (*types.BootOptionParam_BootInfoAcknowledge, error) {
	return &types.BootOptionParam_BootInfoAcknowledge{}, nil
}
