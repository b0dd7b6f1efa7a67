package linklab_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	yaml "go.yaml.in/yaml/v4"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/qemu/testagent"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// process is a started binary whose log the test reads.
type process struct {
	cmd *exec.Cmd
	log syncBuffer
}

func startProcess(t *testing.T, env []string, name string, args ...string) *process {
	t.Helper()

	p := &process{cmd: exec.Command(name, args...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.log
	p.cmd.Stdout = &p.log
	require.NoError(t, p.cmd.Start())

	t.Cleanup(func() {
		p.cmd.Process.Kill() //nolint:errcheck
		p.cmd.Wait()         //nolint:errcheck

		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(name), p.log.String())
		}
	})

	return p
}

// logField waits for a JSON log line with message msg and returns its field.
func (p *process) logField(t *testing.T, msg, field string) string {
	t.Helper()

	var value string

	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.log.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
				value, _ = line[field].(string)

				return true
			}
		}

		return false
	}, 60*time.Second, 50*time.Millisecond, "no %q log line", msg)

	return value
}

// TestBinariesLifecycleWithOmniStandIn runs the real controller and edge binaries against the Omni stand-in on
// loopback, with a test agent and a virtual IPMI BMC standing in for a machine: the controller registers with
// Omni and heartbeats, the join config reaches the edge's /config, and an accepted machine is wiped through its
// agent (the disk file really zeroed), reported ready to use and powered off through its BMC.
func TestBinariesLifecycleWithOmniStandIn(t *testing.T) {
	const operatorMode = "bios"

	if testing.Short() {
		t.Skip("builds and runs both binaries; skipped with -short")
	}

	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	bin := buildBinaries(t)

	// Omni, in process: its state is what the test inspects.
	stand, omniLn := serveStandIn(t)

	// The controller binary, against the stand-in, with short timers.
	stateDir := t.TempDir()
	installDir := t.TempDir()
	ctl := startProcess(t, []string{"OMNI_SERVICE_ACCOUNT_KEY=" + stand.ProviderKey()}, filepath.Join(bin, "controller"),
		"--state-dir", stateDir, "--uplink-listen", "127.0.0.1:0", "--http-listen", "",
		"--omni-endpoint", "grpc://"+omniLn.Addr().String(), "--install-assets-dir", installDir,
		"--poll-interval", "1s", "--power-cooldown", "2s", "--log-level", "debug")
	uplinkAddr := ctl.logField(t, "controller built", "uplink")

	require.Eventually(t, func() bool {
		ps, err := safe.StateGetByID[*infra.ProviderStatus](ctx, stand.State(), "bare-metal")

		return err == nil && ps.TypedSpec().Value.GetName() != ""
	}, 60*time.Second, 50*time.Millisecond, "the controller never registered its ProviderStatus")

	require.Eventually(t, func() bool {
		_, err := safe.StateGetByID[*infra.ProviderHealthStatus](ctx, stand.State(), "bare-metal")

		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "no health heartbeat")

	// A site and its edge binary.
	out, err := exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "site", "create", "lab-site").Output()
	require.NoError(t, err)

	token := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])

	ipxeDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "undionly.kpxe"), []byte("stand-in"), 0o644))

	edge := startProcess(t, nil, filepath.Join(bin, "edge"), "--state-dir", t.TempDir(), "--controller", uplinkAddr,
		"--join-token", token, "--http-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--tftp-listen", "",
		"--ipxe-dir", ipxeDir, "--log-level", "debug")
	httpAddr := edge.logField(t, "edge starting", "http")
	apiAddr := edge.logField(t, "edge starting", "agent_api")

	const machineID = "5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c11"

	// The join config Omni publishes reaches the edge's /config before any machine is known.
	joinToken, err := omni.NewAdmin(stand.State()).JoinToken(ctx, "bare-metal")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/config?u=" + machineID)
		if err != nil {
			return false
		}
		defer resp.Body.Close() //nolint:errcheck

		body, _ := io.ReadAll(resp.Body)

		return resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte("jointoken="+url.QueryEscape(joinToken)))
	}, 60*time.Second, 100*time.Millisecond, "the edge never served Omni's join config")

	// The machine: a disk file, a test agent on the edge's tunnel endpoint, and a virtual IPMI BMC whose
	// power switches the agent on and off.
	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xa5}, 1<<20), 0o600))

	machine := &fakeMachine{t: t, http: httpAddr, cfg: testagent.Config{
		Endpoint: apiAddr, MachineID: machineID, Disks: []string{disk},
		RetryInterval: 100 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	}}
	t.Cleanup(machine.stop)

	chassis := vbmc.NewChassis(vbmc.WithHook(machine.hook))
	require.NoError(t, chassis.SetPower(ctx, true))

	bmcConn := serveIPMI(t, chassis, "admin", "lab-password")

	// The machine joins Omni as its agent would (SideroLink Provision with the join token from /config);
	// the operator supplies its BMC and accepts it.
	provision(ctx, t, omniLn.Addr().String(), joinToken, machineID)

	admin := omni.NewAdmin(stand.State())
	require.NoError(t, admin.SetBMCConfig(ctx, machineID, &specs.InfraMachineBMCConfigSpec_IPMI{
		Address: "127.0.0.1", Port: uint32(bmcConn.LocalAddr().(*net.UDPAddr).Port), Username: "admin", Password: "lab-password",
	}))
	require.NoError(t, admin.Accept(ctx, machineID))

	// Accept -> BMC configured -> wiped -> ready to use.
	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)

		return err == nil && st.TypedSpec().Value.GetReadyToUse()
	}, 2*time.Minute, 100*time.Millisecond, "the machine never became ready to use")

	data, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{0}, 1<<20), data, "the agent's disk was not zeroed")

	// Another host on the site network asks for the machine's agent tunnel with its UUID: refused at the edge,
	// and the machine carries an alert label in Omni until its own tunnel opens again (after the restart below).
	rogueTunnel(ctx, t, apiAddr, "127.0.0.2", machineID)
	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)

		return err == nil && st.Metadata().Labels().Raw()[labels.Alert] == machines.AlertTunnelOtherSource
	}, time.Minute, 100*time.Millisecond, "the rogue tunnel raised no alert on the machine in Omni")
	require.True(t, edge.hasLine("agent tunnel refused", "", ""), "the edge did not log the refusal")

	// Idle and ready, with the preferred power state OFF: powered off through the BMC after the cooldown, once
	// Omni has collected the machine's information (a real Talos reports in over SideroLink; the stand-in is told).
	require.NoError(t, admin.CollectInfo(ctx, machineID, "v1.11.5"))
	require.Eventually(t, func() bool { return !chassis.PowerState() }, 2*time.Minute, 100*time.Millisecond, "never powered off")
	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)

		return err == nil && st.TypedSpec().Value.GetPowerState() == specs.InfraMachineStatusSpec_POWER_STATE_OFF
	}, time.Minute, 100*time.Millisecond, "InfraMachineStatus never said OFF")

	// Site labels: refused as a whole when one would be refused by Omni; published on the machine otherwise.
	out, err = exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "site", "label", "lab-site", "rack=r7", "bad key=x").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "label key")

	out, err = exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "site", "label", "lab-site", "rack=r7").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)
		if err != nil {
			return false
		}

		l := st.Metadata().Labels().Raw()

		return l["rack"] == "r7" && l["site"] == "lab-site"
	}, time.Minute, 100*time.Millisecond, "site and operator labels on the machine's status")

	// An operator sets the machine's boot mode (bad input refused first); the mode is kept in Omni with the
	// machine's location, so the power-on after the restart below boots the machine that way.
	out, err = exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "machine", "boot-mode", machineID, "efi").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `boot mode must be "bios", "uefi" or "auto"`)

	out, err = exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "machine", "boot-mode", machineID, operatorMode).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "boots as "+operatorMode+", set by an operator")

	boots := len(chassis.Boots())

	// The controller restarts (same state, same address) while the machine is idle and off. Where the machine
	// is comes from Omni, not from an edge event: a power-on asked for in Omni reaches its BMC at once.
	require.NoError(t, ctl.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, ctl.cmd.Wait())

	restarted := time.Now()
	ctl2 := startProcess(t, []string{"OMNI_SERVICE_ACCOUNT_KEY=" + stand.ProviderKey()}, filepath.Join(bin, "controller"),
		"--state-dir", stateDir, "--uplink-listen", uplinkAddr, "--http-listen", "",
		"--omni-endpoint", "grpc://"+omniLn.Addr().String(), "--install-assets-dir", installDir,
		"--poll-interval", "1s", "--power-cooldown", "2s", "--log-level", "debug")
	require.NoError(t, admin.SetPowerState(ctx, machineID, "on"))
	require.Eventually(t, chassis.PowerState, 10*time.Second, 50*time.Millisecond,
		"the power-on asked for in Omni did not reach the BMC within 10 s of the controller's restart")
	t.Logf("power-on reached the BMC %s after the controller restarted", time.Since(restarted).Round(10*time.Millisecond))
	require.NotContains(t, ctl2.log.String(), "machine not seen at any site")

	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)
		_, alerted := st.Metadata().Labels().Raw()[labels.Alert]

		return err == nil && !alerted
	}, time.Minute, 100*time.Millisecond, "the alert stayed after the machine's own tunnel opened again")

	after := chassis.Boots()[boots:]
	t.Logf("boots after the restart: %+v", after)
	require.NotEmpty(t, after)
	require.Equal(t, metal.Firmware(operatorMode), after[0].Mode, "the power-on did not boot in the operator's mode")

	// What Omni holds in the provider's namespace (readable by any Omni Reader) has the password sealed.
	types := resources.NewTypes("bare-metal")
	require.NoError(t, types.Register())

	stored, err := stand.State().Get(ctx, types.NewBMCConfiguration(machineID).Metadata())
	require.NoError(t, err)

	asYAML, err := resource.MarshalYAML(stored)
	require.NoError(t, err)

	dump, err := yaml.Marshal(asYAML)
	require.NoError(t, err)
	require.Contains(t, string(dump), seal.Prefix, "the stored password is sealed")
	require.NotContains(t, string(dump), "lab-password")

	// The BMC password never appears in any log.
	for _, p := range []*process{ctl, ctl2, edge} {
		require.NotContains(t, p.log.String(), "lab-password")
	}
}

// serveStandIn serves the Omni stand-in in process (its state is what a test inspects) on a loopback listener
// until the test ends.
func serveStandIn(t *testing.T) (*omni.Server, net.Listener) {
	t.Helper()

	ocfg := omni.Default()
	ocfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	stand, err := omni.New(ocfg)
	require.NoError(t, err)
	t.Cleanup(func() { stand.Close() }) //nolint:errcheck

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- stand.Serve(ctx, ln) }()

	t.Cleanup(func() {
		stop()
		<-done
	})

	return stand, ln
}

// serveIPMI serves a virtual IPMI BMC of chassis with one user on a loopback UDP port until the test ends.
func serveIPMI(t *testing.T, chassis *vbmc.Chassis, user, password string) *net.UDPConn {
	t.Helper()

	bmc, err := vbmc.NewIPMI(chassis, user, password)
	require.NoError(t, err)

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- bmc.Serve(ctx, conn) }()

	t.Cleanup(func() {
		stop()
		<-done
	})

	return conn
}

// provision joins a machine to the stand-in over SideroLink, as the agent image does at boot.
func provision(ctx context.Context, t *testing.T, omniAddr, joinToken, machineID string) {
	t.Helper()

	conn, err := grpc.NewClient(omniAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	key, err := wgtypes.GeneratePrivateKey()
	require.NoError(t, err)

	talos, unique := "v1.11.5", `{"Fingerprint":"lab","Token":"token-`+machineID+`"}`
	_, err = pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
		NodeUuid: machineID, NodePublicKey: key.PublicKey().String(), JoinToken: &joinToken, TalosVersion: &talos,
		NodeUniqueToken: &unique,
	})
	require.NoError(t, err)
}

// fakeMachine runs a test agent while its chassis is powered on. Each power-on first asks the edge at http
// for its boot script, as iPXE does: the served boot is what the edge binds the agent's tunnel to.
type fakeMachine struct {
	t    *testing.T
	http string
	cfg  testagent.Config

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

func (m *fakeMachine) hook(_ context.Context, action vbmc.Action, _ vbmc.Override) error {
	switch action {
	case vbmc.ActionPowerOff:
		m.stop()
	case vbmc.ActionPowerOn, vbmc.ActionReset:
		m.stop()
		m.start()
	}

	return nil
}

func (m *fakeMachine) start() {
	if err := m.boot(); err != nil {
		m.t.Errorf("boot script: %v", err)

		return
	}

	agent, err := testagent.New(m.cfg)
	if err != nil {
		m.t.Errorf("test agent: %v", err)

		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})

	go func() {
		defer close(done)

		agent.Run(ctx) //nolint:errcheck
	}()

	m.mu.Lock()
	m.cancel, m.done = cancel, done
	m.mu.Unlock()
}

// boot fetches the machine's boot script from the edge, as its firmware's iPXE would.
func (m *fakeMachine) boot() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	u := "http://" + m.http + "/ipxe/boot.ipxe?uuid=" + m.cfg.MachineID + "&mac=52-54-00-00-00-11&arch=x86_64"

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}

	return nil
}

func (m *fakeMachine) stop() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel, m.done = nil, nil
	m.mu.Unlock()

	if cancel != nil {
		cancel()
		<-done
	}
}

// rogueTunnel opens an agent tunnel for machineID from src (a host that did not boot as that machine) and
// waits until the edge refuses it.
func rogueTunnel(ctx context.Context, t *testing.T, endpoint, src, machineID string) {
	t.Helper()

	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", a) }))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	defer rts.Stop()

	callCtx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, machineID), 30*time.Second)
	defer cancel()

	// started only says the stream was opened; the edge's refusal ends it at once with the reason
	_, err = rts.Serve(callCtx)
	require.ErrorContains(t, err, "refused", "the edge took a tunnel from a host that did not boot as the machine")
}
