package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

// controllerProc is a running controller binary.
type controllerProc struct {
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan error
}

// controllerArgs are the controller's flags for the run; the uplink and HTTP addresses stay the same across a
// restart.
func (f *fleet) controllerArgs(stateDir, uplinkAddr, httpAddr, omniEndpoint, installDir string) []string {
	return []string{
		"--state-dir", stateDir, "--uplink-listen", uplinkAddr, "--http-listen", httpAddr,
		"--omni-endpoint", omniEndpoint, "--install-assets-dir", installDir,
		"--default-asset-policy", "passthrough",
		"--poll-interval", f.cfg.PollInterval.String(), "--power-cooldown", f.cfg.Cooldown.String(),
		"--log-level", f.cfg.ControllerLogLevel,
	}
}

func startController(binary string, args, env []string, logPath string) (*controllerProc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}

	cmd := exec.Command(binary, args...) // the controller under test
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile

	started := time.Now()

	if err := cmd.Start(); err != nil {
		logFile.Close() //nolint:errcheck

		return nil, fmt.Errorf("start controller: %w", err)
	}

	p := &controllerProc{cmd: cmd, logPath: logPath, started: started, done: make(chan error, 1)}

	go func() {
		p.done <- cmd.Wait()
		logFile.Close() //nolint:errcheck
	}()

	return p, nil
}

func (p *controllerProc) pid() int { return p.cmd.Process.Pid }

// kill ends the controller at once (SIGKILL: a crash) and waits for it.
func (p *controllerProc) kill() {
	p.cmd.Process.Kill() //nolint:errcheck
	<-p.done             //nolint:errcheck // killed: its exit status says so
}

// stop ends the controller gracefully (SIGTERM, SIGKILL after 20 s) and waits for it.
func (p *controllerProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck

	select {
	case <-p.done: //nolint:errcheck // stopped: its exit status says so
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

// waitHealthy waits for the controller's /healthz.
func (p *controllerProc) waitHealthy(ctx context.Context, httpAddr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)

	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err

			return fmt.Errorf("controller exited: %w (see %s)", err, p.logPath)
		default:
		}

		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/healthz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close() //nolint:errcheck

			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}

		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}

	return fmt.Errorf("controller not healthy within %s: %w", timeout, errTimeout)
}

// logLine is one JSON line of the controller's log.
type logLine struct {
	at     time.Time
	fields map[string]any
}

// findLogLines returns the controller's log lines with message msg so far.
func findLogLines(path, msg string) ([]logLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck

	var out []logLine

	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)

	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil || m["msg"] != msg {
			continue
		}

		ts, _ := m["ts"].(string)

		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}

		out = append(out, logLine{at: at, fields: m})
	}

	return out, sc.Err()
}

func numberField(l logLine, key string) int {
	switch v := l.fields[key].(type) {
	case float64:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)

		return n
	default:
		return 0
	}
}

// createSites creates the sites over the controller's admin socket (the API `controller site create` uses) and
// returns their join tokens.
func createSites(ctx context.Context, stateDir string, n int) ([]string, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(stateDir, "admin.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	defer conn.Close() //nolint:errcheck

	api := adminpb.NewAdminClient(conn)
	tokens := make([]string, n)

	for i := range n {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := api.CreateSite(cctx, &adminpb.CreateSiteRequest{
			SiteId: siteID(i), Description: "fleet simulator site " + strconv.Itoa(i), TokenTtl: durationpb.New(24 * time.Hour),
		})

		cancel()

		if err != nil {
			return nil, fmt.Errorf("create site %s: %w", siteID(i), err)
		}

		tokens[i] = resp.GetJoinToken()
	}

	return tokens, nil
}

// freeAddr returns a loopback address with a port free now (for addresses that must survive a restart).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}

	addr := ln.Addr().String()

	return addr, ln.Close()
}
