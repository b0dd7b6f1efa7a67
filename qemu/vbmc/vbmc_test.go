package vbmc_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	user     = "admin"
	password = "vbmc-pass-1234"
)

// StartIPMI serves an IPMI vBMC for ch on loopback and returns its port.
func startIPMI(t *testing.T, ch *vbmc.Chassis) int {
	t.Helper()

	_, port := startIPMIBMC(t, ch)

	return port
}

// startIPMIBMC is startIPMI returning the BMC too.
func startIPMIBMC(t *testing.T, ch *vbmc.Chassis) (*vbmc.IPMI, int) {
	t.Helper()

	b, err := vbmc.NewIPMI(ch, user, password)
	require.NoError(t, err)

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- b.Serve(ctx, conn) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return b, conn.LocalAddr().(*net.UDPAddr).Port
}

func ipmitool(t *testing.T, port int, args ...string) string {
	t.Helper()

	all := append([]string{"-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(port), "-U", user, "-E", "-C", "17", "-N", "1", "-R", "3"}, args...)
	cmd := exec.CommandContext(t.Context(), "ipmitool", all...)
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)

	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "ipmitool %s: %s", strings.Join(args, " "), out)

	return string(out)
}

func TestIPMIWithIpmitool(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("ipmitool"); err != nil {
		t.Skip("ipmitool not installed (Debian package ipmitool)")
	}

	ch := vbmc.NewChassis()
	port := startIPMI(t, ch)

	require.Contains(t, ipmitool(t, port, "chassis", "power", "status"), "Chassis Power is off")

	ipmitool(t, port, "chassis", "bootdev", "pxe", "options=efiboot")
	require.Equal(t, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI}, ch.Override())

	out := ipmitool(t, port, "chassis", "bootparam", "get", "5")
	require.Contains(t, out, "Force PXE")
	require.Contains(t, out, "BIOS EFI boot")

	ipmitool(t, port, "chassis", "power", "on")
	require.Contains(t, ipmitool(t, port, "chassis", "power", "status"), "Chassis Power is on")
	require.Equal(t, []vbmc.Override{{Device: vbmc.BootPXE, Mode: metal.UEFI}}, ch.Boots(), "power-on consumed the one-time PXE")
	require.Equal(t, vbmc.BootNone, ch.Override().Device)

	ipmitool(t, port, "chassis", "bootdev", "pxe")
	ipmitool(t, port, "chassis", "power", "cycle")
	require.Len(t, ch.Boots(), 2)
	require.Equal(t, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.BIOS}, ch.Boots()[1])

	ipmitool(t, port, "chassis", "power", "off")
	require.False(t, ch.PowerState())
}

func redfishtool(t *testing.T, addr string, args ...string) string {
	t.Helper()

	all := append([]string{"-r", addr, "-S", "Never", "-A", "Session", "-u", user, "-p", password, "-T", "5"}, args...)

	var stderr strings.Builder

	cmd := exec.CommandContext(t.Context(), "redfishtool", all...)
	cmd.Stderr = &stderr

	out, err := cmd.Output()
	require.NoError(t, err, "redfishtool %s: %s %s", strings.Join(args, " "), out, stderr.String())

	return string(out)
}

func TestRedfishWithRedfishtool(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("redfishtool"); err != nil {
		t.Skip("redfishtool not installed (Debian package redfishtool)")
	}

	for _, ami := range []bool{false, true} {
		t.Run("ami="+strconv.FormatBool(ami), func(t *testing.T) {
			t.Parallel()

			ch := vbmc.NewChassis()
			rf := vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password, AMI: ami})
			srv := httptest.NewServer(rf)
			t.Cleanup(srv.Close)

			addr := strings.TrimPrefix(srv.URL, "http://")

			var sys struct {
				PowerState string
				Boot       map[string]any
			}

			require.NoError(t, json.Unmarshal([]byte(redfishtool(t, addr, "Systems", "-1", "get")), &sys))
			require.Equal(t, "Off", sys.PowerState)

			redfishtool(t, addr, "Systems", "-1", "reset", "On")
			require.True(t, ch.PowerState())

			if !ami { // redfishtool patches the system resource itself, which AMI refuses
				redfishtool(t, addr, "Systems", "-1", "setBootOverride", "Once", "Pxe")
				require.Equal(t, vbmc.BootPXE, ch.Override().Device)

				redfishtool(t, addr, "Systems", "-1", "reset", "ForceRestart")
				require.Equal(t, vbmc.BootPXE, ch.Boots()[1].Device)
			}

			redfishtool(t, addr, "Systems", "-1", "reset", "ForceOff")
			require.False(t, ch.PowerState())

			require.Zero(t, rf.Sessions(), "redfishtool logged out of every session")
		})
	}
}
