package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/shared/logging"
)

// fleet is a run's shared parts: what every site and machine reaches.
type fleet struct {
	cfg     Config
	log     *zap.Logger // the run's own account, on stderr
	edgeLog *zap.Logger // every simulated edge's, in a file

	ipxeDir  string // the edges' iPXE binaries (placeholders)
	filesDir string // the edges' HTTP files: the agent-mode kernel and initramfs (placeholders)

	uplinkAddr string
	installed  func(ctx context.Context, machineID string) error

	omniMu    sync.Mutex
	omniConns map[string]*grpc.ClientConn

	rndMu sync.Mutex
	rnd   *rand.Rand

	sites    []*site
	machines []*machine
	admin    state.State
}

func newFleet(cfg Config, log *zap.Logger, edgeLogFile *os.File) (*fleet, error) {
	edgeLog, err := logging.New(edgeLogFile, cfg.EdgeLogLevel)
	if err != nil {
		return nil, err
	}

	f := &fleet{
		cfg: cfg, log: log, edgeLog: edgeLog, omniConns: map[string]*grpc.ClientConn{},
		rnd: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed+1)), // simulation, not a secret
	}

	// iPXE binaries and the agent-mode image are placeholders: nothing boots them, but the edge serves only
	// what it has.
	f.ipxeDir = filepath.Join(cfg.WorkDir, "ipxe")
	f.filesDir = filepath.Join(cfg.WorkDir, "files")

	for _, p := range []string{
		filepath.Join(f.ipxeDir, "ipxe.efi"), filepath.Join(f.ipxeDir, "undionly.kpxe"),
		filepath.Join(f.filesDir, "agent", "x86_64", "vmlinuz"), filepath.Join(f.filesDir, "agent", "x86_64", "initramfs.xz"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}

		if err := os.WriteFile(p, []byte("fleet simulator placeholder\n"), 0o644); err != nil { // served files
			return nil, err
		}
	}

	return f, nil
}

func (f *fleet) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}

	f.rndMu.Lock()
	defer f.rndMu.Unlock()

	return time.Duration(f.rnd.Int64N(int64(d)))
}

// omniConn returns the shared connection to a SideroLink API address (one for all machines: the stand-in sees
// every Provision call, not thousands of connections).
func (f *fleet) omniConn(host string) (*grpc.ClientConn, error) {
	f.omniMu.Lock()
	defer f.omniMu.Unlock()

	if c, ok := f.omniConns[host]; ok {
		return c, nil
	}

	if _, _, err := net.SplitHostPort(host); err != nil {
		return nil, fmt.Errorf("siderolink api address %q: %w", host, err)
	}

	c, err := grpc.NewClient("passthrough:///"+host, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial siderolink api %s: %w", host, err)
	}

	f.omniConns[host] = c

	return c, nil
}

func (f *fleet) closeOmniConns() {
	f.omniMu.Lock()
	defer f.omniMu.Unlock()

	for _, c := range f.omniConns {
		c.Close() //nolint:errcheck
	}
}

// pick returns k distinct indices of [0, n), chosen by the run's seed.
func (f *fleet) pick(n, k int) map[int]bool {
	f.rndMu.Lock()
	perm := f.rnd.Perm(n)
	f.rndMu.Unlock()

	out := make(map[int]bool, k)
	for _, i := range perm[:min(k, n)] {
		out[i] = true
	}

	return out
}

// roundCount is frac of n, rounded, at least 1 when frac > 0 and n > 0.
func roundCount(n int, frac float64) int {
	if frac <= 0 || n == 0 {
		return 0
	}

	return max(1, int(float64(n)*frac+0.5))
}

var errTimeout = errors.New("timed out")
