package vbmc_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/vmproto"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// IPMI network functions and commands the metal agent sends in-band (IPMI v2.0 tables G-1, 22-*, 23-*).
const (
	netFnApp       = 0x06
	netFnTransport = 0x0c

	cmdSetUserAccess   = 0x43
	cmdGetUserAccess   = 0x44
	cmdSetUserName     = 0x45
	cmdGetUserName     = 0x46
	cmdSetUserPassword = 0x47
	cmdGetLANConfig    = 0x02
)

func pad16(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)

	return b
}

// TestInBandUserReachesLAN drives the in-band front end over QEMU's external-BMC protocol with the requests
// the real metal agent makes through /dev/ipmi0 (go-ipmi's AttemptUserSetup and GetIPPort): it reads the
// BMC's LAN address, finds a free user slot, creates an administrator; that user then opens an RMCP+ session
// over the LAN front end of the same BMC (ipmitool) and reads the chassis power state.
func TestInBandUserReachesLAN(t *testing.T) {
	if _, err := exec.LookPath("ipmitool"); err != nil {
		t.Skip("ipmitool not installed (Debian ipmitool)")
	}

	b, err := vbmc.NewIPMI(vbmc.NewChassis(), user, password)
	require.NoError(t, err)

	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	port := udp.LocalAddr().(*net.UDPAddr).Port
	require.NoError(t, b.SetLANAddress(t.Context(), netip.MustParseAddr("10.77.1.50"), uint16(port)))

	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "ipmi.sock"))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	lanDone, inbandDone := make(chan error, 1), make(chan error, 1)

	go func() { lanDone <- b.Serve(ctx, udp) }()
	go func() { inbandDone <- b.ServeInBand(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-lanDone)
		require.NoError(t, <-inbandDone)
	})

	conn, err := net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	c := vmproto.NewClient(conn, 5*time.Second)

	call := func(netFn, cmd byte, data ...byte) []byte {
		t.Helper()

		cc, resp, err := c.Command(netFn, cmd, data...)
		require.NoError(t, err)
		require.Zero(t, cc, "completion code of netfn %#x cmd %#x", netFn, cmd)

		return resp
	}

	// GetIPPort: LAN parameters 3 (IP address) and 8 (primary RMCP port) of channel 1.
	ip := call(netFnTransport, cmdGetLANConfig, 0x01, 3, 0, 0)
	require.Equal(t, []byte{0x11, 10, 77, 1, 50}, ip, "revision, then the address")

	rmcp := call(netFnTransport, cmdGetLANConfig, 0x01, 8, 0, 0)
	require.Equal(t, uint16(port), uint16(rmcp[1])|uint16(rmcp[2])<<8)

	// AttemptUserSetup: the slot count from user 1's access on channel 1, then the first free slot from 2 up.
	access := call(netFnApp, cmdGetUserAccess, 0x01, 0x01)
	maxUsers := access[0] & 0x3f
	require.GreaterOrEqual(t, maxUsers, uint8(3))

	slot := uint8(0)

	for id := uint8(2); id <= maxUsers && slot == 0; id++ {
		cc, name, err := c.Command(netFnApp, cmdGetUserName, id)
		require.NoError(t, err)

		if cc != 0 || strings.TrimRight(string(name), "\x00 ") == "" {
			slot = id
		}
	}

	require.Equal(t, uint8(3), slot, "user 2 is the BMC's admin; 3 is free")

	const agentUser, agentPassword = "outpost", "0123456789abcdef"

	call(netFnApp, cmdSetUserName, append([]byte{slot}, pad16(agentUser)...)...)
	call(netFnApp, cmdSetUserPassword, append([]byte{slot, 0x02}, pad16(agentPassword)...)...) // set password, 16 bytes
	call(netFnApp, cmdSetUserAccess, 0x80|0x10|0x01, slot, 0x04, 0x00)                         // change, IPMI messaging, channel 1, administrator
	call(netFnApp, cmdSetUserPassword, slot, 0x01)                                             // enable user

	require.True(t, b.HasUser(agentUser))
	require.True(t, b.LANUser(agentUser), "enabled, allowed on the LAN channel")
	require.False(t, b.LANUser("nobody"))

	name := call(netFnApp, cmdGetUserName, slot)
	require.Equal(t, agentUser, strings.TrimRight(string(name), "\x00"))

	cmd := exec.CommandContext(t.Context(), "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(port),
		"-U", agentUser, "-E", "-C", "17", "-N", "1", "-R", "3", "chassis", "power", "status")
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+agentPassword)

	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "ipmitool as the in-band user: %s", out)
	require.Contains(t, string(out), "Chassis Power is off")

	cmd = exec.CommandContext(t.Context(), "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(port),
		"-U", agentUser, "-E", "-C", "17", "-N", "1", "-R", "1", "chassis", "power", "status")
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD=wrong-password-00")

	out, err = cmd.CombinedOutput()
	require.Error(t, err, "a wrong password must not open a session: %s", out)
}

// TestInBandUserRefused: a BMC told to refuse in-band users answers the password set with "insufficient
// privilege" that many times, leaves the user unable to log in meanwhile, and takes the next one.
func TestInBandUserRefused(t *testing.T) {
	t.Parallel()

	b, err := vbmc.NewIPMI(vbmc.NewChassis(), user, password)
	require.NoError(t, err)

	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "ipmi.sock"))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- b.ServeInBand(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	conn, err := net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	c := vmproto.NewClient(conn, 5*time.Second)

	const slot, agentUser, agentPassword = 3, "outpost", "0123456789abcdef"

	cc, _, err := c.Command(netFnApp, cmdSetUserName, append([]byte{slot}, pad16(agentUser)...)...)
	require.NoError(t, err)
	require.Zero(t, cc)

	b.RefuseInBandUsers(2)

	setPassword := func() byte {
		cc, _, err := c.Command(netFnApp, cmdSetUserPassword, append([]byte{slot, 0x02}, pad16(agentPassword)...)...)
		require.NoError(t, err)

		return cc
	}

	require.Equal(t, byte(0xd4), setPassword(), "insufficient privilege")
	require.Equal(t, byte(0xd4), setPassword())
	require.False(t, b.CheckUser(agentUser, agentPassword))
	require.Equal(t, int64(2), b.InBandUsersRefused())

	require.Zero(t, setPassword(), "the third is taken")

	cc, _, err = c.Command(netFnApp, cmdSetUserPassword, slot, 0x01) // enable user
	require.NoError(t, err)
	require.Zero(t, cc, "enabling is not a password set")
	require.True(t, b.CheckUser(agentUser, agentPassword))
	require.False(t, b.CheckUser(agentUser, "wrong"))
	require.Equal(t, int64(2), b.InBandUsersRefused())
}

// TestRedfishSharesTheIPMIUsers: a Redfish service given the IPMI BMC's user table takes a user created there
// (as the agent creates one in-band) and still refuses a wrong password.
func TestRedfishSharesTheIPMIUsers(t *testing.T) {
	t.Parallel()

	ch := vbmc.NewChassis()

	b, err := vbmc.NewIPMI(ch, user, password)
	require.NoError(t, err)

	srv := httptest.NewServer(vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password, Accounts: b.CheckUser}))
	t.Cleanup(srv.Close)

	get := func(u, p string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/redfish/v1/Systems", nil)
		require.NoError(t, err)
		req.SetBasicAuth(u, p)

		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close() //nolint:errcheck

		return resp.StatusCode
	}

	require.Equal(t, http.StatusUnauthorized, get("outpost", "0123456789abcdef"), "no such user yet")
	require.NoError(t, b.SetUser("outpost", "0123456789abcdef"))
	require.Equal(t, http.StatusOK, get("outpost", "0123456789abcdef"))
	require.Equal(t, http.StatusUnauthorized, get("outpost", "0123456789abcdeX"))
	require.Equal(t, http.StatusOK, get(user, password), "its own account still works")
}
