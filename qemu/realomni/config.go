package realomni

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// Ports are where a real Omni listens, all on Config.IP unless said otherwise.
type Ports struct {
	// API serves gRPC (omnictl, the Omni client, infra providers) and HTTP over TLS.
	API int
	// MachineAPI serves SideroLink Provision (machines joining), plaintext gRPC.
	MachineAPI int
	// KubernetesProxy is Omni's Kubernetes API proxy (TLS).
	KubernetesProxy int
	// Metrics serves Prometheus metrics.
	Metrics int
	// WireGuard is the SideroLink WireGuard port (UDP).
	WireGuard int
	// Etcd is the embedded etcd's client port (its peer port is a random one on localhost, fixed by Omni).
	Etcd int
	// EventSink, LogServer and Discovery listen on Omni's SideroLink address (inside its WireGuard network).
	EventSink int
	LogServer int
	Discovery int
	// LocalResource is Omni's local resource server, always on 127.0.0.1 (fixed by Omni).
	LocalResource int
	// Factory is the fake image factory and registry; 0 picks a free port.
	Factory int
}

// DefaultPorts are Omni's usual ports (the event sink moved off the machine API's 8090).
var DefaultPorts = Ports{
	API: 8099, MachineAPI: 8090, KubernetesProxy: 8095, Metrics: 2122, WireGuard: 50180, Etcd: 2379,
	EventSink: 8091, LogServer: 8092, Discovery: 8093, LocalResource: 8081,
}

// DefaultTalosVersions are the Talos versions the fake image factory lists (Omni keeps those it has
// compatible Kubernetes versions for): the lab's v1.11.0, the fidelity suite's v1.11.5 and a few more.
var DefaultTalosVersions = []string{"v1.10.7", "v1.11.0", "v1.11.5", "v1.12.8", "v1.13.5"}

// DefaultKubernetesVersions are the kubelet tags the fake registry lists.
var DefaultKubernetesVersions = []string{"v1.32.9", "v1.33.5", "v1.34.2", "v1.35.6"}

// Config describes a real Omni to run.
type Config struct {
	// Dir holds everything of this Omni: keys, certificates, etcd, SQLite, its log. A later Start (or
	// Restart) on the same Dir continues with the same data.
	Dir string
	// Netns is the network namespace (as in `ip netns`) Omni, its fake factory and the clients run in;
	// empty: the current one. Omni creates a "siderolink" network interface, so one Omni per namespace.
	Netns string
	// IP is the address every listener binds to (default 127.0.0.1).
	IP string
	// Ports default to DefaultPorts, field by field.
	Ports Ports
	// Binaries are omni and omnictl (Build).
	Binaries Binaries
	// Name is Omni's account name (default "outpost").
	Name string
	// TalosVersions and KubernetesVersions are what the fake factory and registry list.
	TalosVersions      []string
	KubernetesVersions []string
	// StartTimeout bounds start to usable (default 2 minutes).
	StartTimeout time.Duration
	// Logger gets this package's lines (Omni's own go to Log()); nil: none.
	Logger *zap.Logger
	// Rand and Now feed the TLS certificate (defaults: crypto/rand, time.Now).
	Rand io.Reader
	Now  func() time.Time
}

// Default fills the empty fields.
func (c *Config) Default() {
	if c.Dir != "" {
		if abs, err := filepath.Abs(c.Dir); err == nil {
			c.Dir = abs
		}
	}

	if c.IP == "" {
		c.IP = "127.0.0.1"
	}

	d, p := DefaultPorts, &c.Ports
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&p.API, d.API}, {&p.MachineAPI, d.MachineAPI}, {&p.KubernetesProxy, d.KubernetesProxy},
		{&p.Metrics, d.Metrics}, {&p.WireGuard, d.WireGuard}, {&p.Etcd, d.Etcd}, {&p.EventSink, d.EventSink},
		{&p.LogServer, d.LogServer}, {&p.Discovery, d.Discovery}, {&p.LocalResource, d.LocalResource},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}

	if c.Name == "" {
		c.Name = "outpost"
	}

	if len(c.TalosVersions) == 0 {
		c.TalosVersions = DefaultTalosVersions
	}

	if len(c.KubernetesVersions) == 0 {
		c.KubernetesVersions = DefaultKubernetesVersions
	}

	if c.StartTimeout == 0 {
		c.StartTimeout = 2 * time.Minute
	}

	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}

	if c.Rand == nil {
		c.Rand = rand.Reader
	}

	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports what is missing or wrong.
func (c *Config) Validate() error {
	var errs []error

	if c.Dir == "" || !filepath.IsAbs(c.Dir) {
		errs = append(errs, fmt.Errorf("dir %q: must be an absolute path", c.Dir))
	}

	if net.ParseIP(c.IP) == nil {
		errs = append(errs, fmt.Errorf("ip %q: not an IP address", c.IP))
	}

	seen := map[int]bool{}

	for _, p := range []int{
		c.Ports.API, c.Ports.MachineAPI, c.Ports.KubernetesProxy, c.Ports.Metrics, c.Ports.Etcd, c.Ports.Factory,
	} {
		if p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("port %d: out of range", p))
		}

		if p != 0 && seen[p] {
			errs = append(errs, fmt.Errorf("port %d: used twice", p))
		}

		seen[p] = true
	}

	for _, b := range []string{c.Binaries.Omni, c.Binaries.Omnictl} {
		if _, err := os.Stat(b); err != nil {
			errs = append(errs, fmt.Errorf("binary %q: %w", b, err))
		}
	}

	if c.Netns != "" {
		if _, err := os.Stat(filepath.Join("/run/netns", c.Netns)); err != nil {
			errs = append(errs, fmt.Errorf("network namespace %q: %w", c.Netns, err))
		}
	}

	return errors.Join(errs...)
}

// hostPort is IP:port.
func (c *Config) hostPort(port int) string { return net.JoinHostPort(c.IP, fmt.Sprint(port)) }

// path is a file in Dir.
func (c *Config) path(name ...string) string {
	return filepath.Join(append([]string{c.Dir}, name...)...)
}
