package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/qemu/omni"
)

// OmniConfig configures the stand-in the simulator runs in a child process (ServeOmni).
type OmniConfig struct {
	// Listen is the State API and SideroLink address; CallsListen serves the call counts (GET /calls).
	Listen      string
	CallsListen string
	// StateDir persists the stand-in's state (empty: memory only).
	StateDir string
	// ProviderID is the infra provider's ID.
	ProviderID string
	// Latency delays every State API call (a slow Omni; 0: none).
	Latency time.Duration
	Logger  *zap.Logger
}

// OmniEndpoints is what the stand-in's child process tells its parent on its first line of output.
type OmniEndpoints struct {
	Endpoint    string `json:"endpoint"`
	ProviderKey string `json:"provider_key"`
	AdminKey    string `json:"admin_key"`
	CallsURL    string `json:"calls_url"`
}

// OmniCall is one row of the stand-in's call counts.
type OmniCall struct {
	Identity string `json:"identity"`
	Method   string `json:"method"`
	Count    uint64 `json:"count"`
}

// ServeOmni runs the Omni stand-in with a call counter until ctx ends; it writes its OmniEndpoints as one JSON
// line to out once it serves.
func ServeOmni(ctx context.Context, cfg OmniConfig, out io.Writer) error {
	calls := omni.NewCallCounter()

	ocfg := omni.Default()
	ocfg.ProviderID = cfg.ProviderID
	ocfg.StateDir = cfg.StateDir
	ocfg.Calls = calls
	ocfg.Latency = cfg.Latency
	ocfg.Logger = cfg.Logger

	srv, err := omni.New(ocfg)
	if err != nil {
		return err
	}
	defer srv.Close() //nolint:errcheck

	var lc net.ListenConfig

	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("omni listener: %w", err)
	}

	cln, err := lc.Listen(ctx, "tcp", cfg.CallsListen)
	if err != nil {
		ln.Close() //nolint:errcheck

		return fmt.Errorf("calls listener: %w", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		rows := make([]OmniCall, 0, 16)
		for k, v := range calls.Snapshot() {
			rows = append(rows, OmniCall{Identity: k.Identity, Method: k.Method, Count: v})
		}

		sort.Slice(rows, func(i, j int) bool {
			return rows[i].Identity+rows[i].Method < rows[j].Identity+rows[j].Method
		})

		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rows) //nolint:errcheck
	})

	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return srv.Serve(ctx, ln) })
	eg.Go(func() error {
		if err := hs.Serve(cln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}

		return nil
	})
	eg.Go(func() error {
		<-ctx.Done()

		return hs.Close()
	})

	line, err := json.Marshal(OmniEndpoints{
		Endpoint: "grpc://" + ln.Addr().String(), ProviderKey: srv.ProviderKey(), AdminKey: srv.AdminKey(),
		CallsURL: "http://" + cln.Addr().String() + "/calls",
	})
	if err != nil {
		return err
	}

	if _, err = fmt.Fprintf(out, "%s\n", line); err != nil {
		return err
	}

	return eg.Wait()
}

// omniChild is the stand-in's child process.
type omniChild struct {
	cmd       *exec.Cmd
	endpoints OmniEndpoints
	done      chan error
}

// startOmniChild runs `<this binary> omni ...` and waits for its endpoints.
func startOmniChild(ctx context.Context, self, stateDir string, latency time.Duration, logFile *os.File) (*omniChild, error) {
	args := []string{"omni", "--listen", "127.0.0.1:0", "--calls-listen", "127.0.0.1:0", "--latency", latency.String()}
	if stateDir != "" {
		args = append(args, "--state-dir", stateDir)
	}

	cmd := exec.Command(self, args...) // our own binary
	cmd.Stderr = logFile

	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}

	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start omni stand-in: %w", err)
	}

	c := &omniChild{cmd: cmd, done: make(chan error, 1)}

	lines := make(chan string, 1)

	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}

		close(lines)
		io.Copy(io.Discard, stdout) //nolint:errcheck
	}()

	go func() { c.done <- cmd.Wait() }()

	select {
	case line, ok := <-lines:
		if !ok {
			return nil, fmt.Errorf("omni stand-in exited before serving: %w", <-c.done)
		}

		if err := json.Unmarshal([]byte(line), &c.endpoints); err != nil {
			c.stop()

			return nil, fmt.Errorf("omni stand-in endpoints: %w", err)
		}

		return c, nil
	case <-time.After(time.Minute):
		c.stop()

		return nil, errors.New("omni stand-in did not start within a minute")
	case <-ctx.Done():
		c.stop()

		return nil, ctx.Err()
	}
}

func (c *omniChild) pid() int { return c.cmd.Process.Pid }

// stop ends the child (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (c *omniChild) stop() {
	c.cmd.Process.Signal(os.Interrupt) //nolint:errcheck

	select {
	case <-c.done: //nolint:errcheck // stopped: its exit status says so
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill() //nolint:errcheck
		<-c.done             //nolint:errcheck // killed: its exit status says so
	}
}

// calls reads the stand-in's call counts.
func (c *omniChild) calls(ctx context.Context) ([]OmniCall, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoints.CallsURL, nil)
	if err != nil {
		return nil, err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("omni call counts: %w", err)
	}
	defer resp.Body.Close() //nolint:errcheck

	var rows []OmniCall
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		return nil, fmt.Errorf("omni call counts: %w", err)
	}

	return rows, nil
}
