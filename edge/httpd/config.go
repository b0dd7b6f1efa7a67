package httpd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"time"

	"github.com/outpost-metal/outpost/shared/metal"
)

// Config configures the HTTP server.
type Config struct {
	// Listen is the TCP address to serve (default ":80").
	Listen string
	// AdvertiseHost is host[:port] machines use to reach this server; empty means the request's Host header.
	AdvertiseHost string
	// AgentAddress is metal.provider.address for agent mode (the edge's agent tunnel endpoint);
	// empty means the advertised host with AgentPort.
	AgentAddress string
	// AgentPort is the port of the agent tunnel endpoint when AgentAddress is empty.
	AgentPort int
	// KernelArgs are used when the boot table has no table-wide args (consoles).
	KernelArgs []string
	// ArchKernelArgs replace KernelArgs for a machine of that arch: an arm64 machine's serial console is
	// ttyAMA0, not ttyS0.
	ArchKernelArgs map[metal.Arch][]string
	// AgentKernel and AgentInitrd are the default agent-mode paths; "{arch}" is replaced (x86_64, arm64).
	AgentKernel string
	AgentInitrd string
	// Retries bounds DHCP, probe and download attempts in the scripts.
	Retries int
	// AssetWait is how long a machine whose boot assets are not at the site yet waits before asking again.
	AssetWait time.Duration
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are the http.Server timeouts.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// StallTimeout ends an asset download that could send nothing for that long (a machine reset or gone in
	// the middle of its kernel download); WriteTimeout still bounds the whole response.
	StallTimeout time.Duration
	// MaxConns bounds the open connections, MaxConnsPerSource those from one client address (see
	// LimitListener). At a bound, the oldest connection that never got a response byte (a client still
	// sending its headers, as slowloris does for ReadHeaderTimeout at most) or is idle between requests is
	// closed to make room; when there is none, the new connection is reset at once.
	MaxConns          int
	MaxConnsPerSource int
}

// Default returns the production defaults.
func Default() Config {
	return Config{
		Listen:            ":80",
		AgentPort:         50042,
		KernelArgs:        []string{"console=tty0", "console=ttyS0"},
		ArchKernelArgs:    map[metal.Arch][]string{metal.ARM64: {"console=tty0", "console=ttyAMA0"}},
		AgentKernel:       "/assets/agent/{arch}/vmlinuz",
		AgentInitrd:       "/assets/agent/{arch}/initramfs.xz",
		Retries:           5,
		AssetWait:         30 * time.Second,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		StallTimeout:      time.Minute,
		// A booting machine holds one connection (iPXE fetches kernel and initrd one after the other on it),
		// two at most, for as long as its downloads take: 5,000 lets thousands of machines boot at once and
		// keeps connections (with the asset file each download opens) well inside a 20,000 open-files limit.
		MaxConns:          5000,
		MaxConnsPerSource: 32,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	if c.Listen == "" {
		errs = append(errs, errors.New("a listen address (--http-listen) is required"))
	}

	if c.AdvertiseHost != "" && !hostRE.MatchString(c.AdvertiseHost) {
		errs = append(errs, fmt.Errorf("--advertise-host %q is not host[:port]", c.AdvertiseHost))
	}

	if c.AgentAddress == "" && (c.AgentPort <= 0 || c.AgentPort > 65535) {
		errs = append(errs, fmt.Errorf("agent port %d out of range (used without --agent-address)", c.AgentPort))
	}

	if c.Retries <= 0 {
		errs = append(errs, errors.New("retries must be positive"))
	}

	if c.AssetWait < time.Second {
		errs = append(errs, fmt.Errorf("asset wait %s: at least 1s", c.AssetWait))
	}

	if c.ReadHeaderTimeout <= 0 || c.ReadTimeout <= 0 || c.WriteTimeout <= 0 || c.IdleTimeout <= 0 || c.StallTimeout <= 0 {
		errs = append(errs, errors.New("all timeouts must be positive"))
	}

	if c.MaxConns <= 0 || c.MaxConnsPerSource <= 0 || c.MaxConnsPerSource > c.MaxConns {
		errs = append(errs, fmt.Errorf("--http-max-conns %d and --http-max-conns-per-source %d: both positive, per source at most the total",
			c.MaxConns, c.MaxConnsPerSource))
	}

	return errors.Join(errs...)
}

// hostRE matches host[:port] with an IPv4, IPv6 or DNS host: nothing that could break out of a script line.
var hostRE = regexp.MustCompile(`^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$`)

// ReachableHost is host[:port] another device at the site reaches this server at without a request to tell
// it: AdvertiseHost, else the listen address when it names an address; "" when neither does.
func (c Config) ReachableHost() string {
	if c.AdvertiseHost != "" {
		return c.AdvertiseHost
	}

	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return ""
	}

	if a, err := netip.ParseAddr(host); err != nil || a.IsUnspecified() {
		return ""
	}

	if port == "80" {
		return host
	}

	return net.JoinHostPort(host, port)
}
