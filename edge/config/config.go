// Package config is the edge's configuration: data with defaults and validation.
// Flags and environment variables that fill it live in the edge's main package only.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/shared/logging"
)

// VMediaLoaderName is the virtual-media boot loader's file name in the iPXE directory (the appliance ships it
// there).
const VMediaLoaderName = "vmedia-x86_64.efi"

// Config is everything the edge process needs. Component sections hold the components' own configurations;
// StateDir fills in their directories.
type Config struct {
	// StateDir holds the edge's identity, boot table, event journal and asset cache.
	StateDir string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// IPXEDir holds the iPXE binaries served over TFTP and HTTP (Debian's ipxe package).
	IPXEDir string
	// APIListen is the agents' tunnel endpoint (plain HTTP/2); machines get metal.provider.address for it.
	APIListen string
	// AssetsPreseedDir is an asset bundle imported into the cache at start (appliances with baked-in assets).
	AssetsPreseedDir string
	// VMediaLoader is the EFI boot loader of virtual-media images (hack/vmedia-loader.sh); empty: VMediaLoaderName
	// in IPXEDir. Without the file, machines at a site without DHCP cannot boot from images (a clear refusal).
	VMediaLoader string
	// JoinTokenFile holds the join token (preferred to a flag, which any local user sees in the process list).
	JoinTokenFile string

	// DHCP is the ProxyDHCP; it is off unless an interface or a server address is given.
	DHCP dhcp.Config
	// TFTP serves the iPXE binaries; an empty Listen turns it off.
	TFTP tftp.Config
	// HTTP serves iPXE scripts, binaries, assets, /config, /metrics and /healthz.
	HTTP httpd.Config
	// Assets is the boot-asset cache.
	Assets assetcache.Config
	// Fetcher fills the cache according to the site's policy.
	Fetcher assetcache.FetcherConfig
	// BMC is how the edge talks to BMCs.
	BMC bmc.Config
	// Uplink is the connection to the controller.
	Uplink uplink.Config
	// Tunnels bounds the agent tunnels and the connections of the agent API port.
	Tunnels tunnel.Limits
	// AgentBinding is what an agent's tunnel must prove: address (the address its boot fetched from; the
	// default) or off (first tunnel per machine wins, whatever its source: trusted networks only).
	AgentBinding tunnel.Binding
}

// Default returns the default configuration.
func Default() Config {
	return Config{
		StateDir:     "/var/lib/outpost-edge",
		LogLevel:     "info",
		IPXEDir:      bootfiles.DefaultDir,
		APIListen:    ":50042",
		DHCP:         dhcp.Default(),
		TFTP:         tftp.Default(),
		HTTP:         httpd.Default(),
		Assets:       assetcache.Default(),
		Fetcher:      assetcache.DefaultFetcher(),
		BMC:          bmc.Default(),
		Uplink:       uplink.Default(),
		Tunnels:      tunnel.DefaultLimits(),
		AgentBinding: tunnel.BindAddress,
	}
}

// AbsolutePaths makes every path setting absolute (relative to the working directory).
func (c *Config) AbsolutePaths() error {
	for _, p := range []*string{&c.StateDir, &c.IPXEDir, &c.AssetsPreseedDir, &c.JoinTokenFile, &c.VMediaLoader} {
		if *p == "" || filepath.IsAbs(*p) {
			continue
		}

		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("path %q: %w", *p, err)
		}

		*p = abs
	}

	return nil
}

// LoadJoinToken reads the join token from JoinTokenFile when one is named (giving both a file and a token is
// an error: which one is meant?).
func (c *Config) LoadJoinToken() error {
	if c.JoinTokenFile == "" {
		return nil
	}

	if c.Uplink.JoinToken != "" {
		return errors.New("join token given both directly and as a file: give one")
	}

	b, err := os.ReadFile(c.JoinTokenFile)
	if err != nil {
		return fmt.Errorf("join token file: %w", err)
	}

	if len(b) > 4096 {
		return fmt.Errorf("join token file %s: %d bytes is not a join token", c.JoinTokenFile, len(b))
	}

	c.Uplink.JoinToken = strings.TrimSpace(string(b))

	return nil
}

// DHCPEnabled reports whether the ProxyDHCP runs.
func (c Config) DHCPEnabled() bool {
	return c.DHCP.Interface != "" || c.DHCP.ServerIP != ""
}

// Resolved returns the configuration with the component directories and ports derived from the edge-wide
// settings: the state directory, the iPXE directory and the HTTP and API ports.
func (c Config) Resolved() Config {
	c.Uplink.StateDir = c.StateDir
	c.Assets.Dir = filepath.Join(c.StateDir, "assets")
	c.TFTP.Dir = c.IPXEDir

	if _, port, err := net.SplitHostPort(c.HTTP.Listen); err == nil {
		if p, err := strconv.Atoi(port); err == nil && p > 0 {
			c.DHCP.HTTPPort = p
		}
	}

	if _, port, err := net.SplitHostPort(c.APIListen); err == nil && c.HTTP.AgentAddress == "" {
		if p, err := strconv.Atoi(port); err == nil && p > 0 {
			c.HTTP.AgentPort = p
		}
	}

	return c
}

// Validate checks the configuration and says what is wrong with it.
func (c Config) Validate() error {
	if c.AgentBinding != tunnel.BindAddress && c.AgentBinding != tunnel.BindOff {
		return fmt.Errorf("agent binding %q: want address or off", c.AgentBinding)
	}

	c = c.Resolved()

	var errs []error

	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}

	if err := logging.ValidLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}

	if _, _, err := net.SplitHostPort(c.APIListen); err != nil {
		errs = append(errs, fmt.Errorf("agent API listen address %q: %w", c.APIListen, err))
	}

	type validator interface{ Validate() error }

	sections := []struct {
		name string
		v    validator
		on   bool
	}{
		{"dhcp", c.DHCP, c.DHCPEnabled()},
		{"tftp", c.TFTP, c.TFTP.Listen != ""},
		{"http", c.HTTP, true},
		{"assets", c.Assets, true},
		{"asset fetcher", c.Fetcher, true},
		{"bmc", c.BMC, true},
		{"uplink", c.Uplink, true},
		{"agent tunnels", c.Tunnels, true},
	}

	for _, s := range sections {
		if !s.on {
			continue
		}

		if err := s.v.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}

	if c.Tunnels.MaxConns < c.Tunnels.MaxTunnels {
		errs = append(errs, fmt.Errorf("agent tunnels: %d connections for %d tunnels: every tunnel needs a connection", c.Tunnels.MaxConns, c.Tunnels.MaxTunnels))
	}

	return errors.Join(errs...)
}

// OpenFiles is how many files the connection limits let the site network make the edge open: two per HTTP
// connection (a download opens its asset), one per agent API connection, and 1,024 for everything else
// (state, journal, asset cache, uplink, the TFTP port: TFTP transfers share it and open nothing).
func (c Config) OpenFiles() int {
	return 2*c.HTTP.MaxConns + c.Tunnels.MaxConns + 1024
}
