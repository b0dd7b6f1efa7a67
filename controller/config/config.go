// Package config is the controller's configuration: data with defaults and validation.
// Flags and environment variables that fill it live in the controller's main package only.
package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lease"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/sites"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/logging"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Config is everything the controller process needs.
type Config struct {
	// StateDir holds the enrollment CA, the site store and (by default) the admin socket.
	StateDir string
	// UplinkListen is where edges connect (TLS 1.3).
	UplinkListen string
	// HTTPListen serves /metrics, /healthz and the status pages; empty disables it.
	HTTPListen string
	// HTTPTokenFile holds the bearer token the HTTP listener requires (needed off loopback); HTTPCertFile and
	// HTTPKeyFile make it speak TLS (needed off loopback).
	HTTPTokenFile, HTTPCertFile, HTTPKeyFile string
	// AdminSocket is the unix socket of the operator API; empty means <StateDir>/admin.sock.
	AdminSocket string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// CertValidity is the lifetime of edge client certificates (renewed at two thirds).
	CertValidity time.Duration
	// ServerNames are extra DNS names in the uplink server certificate.
	ServerNames []string
	// UplinkLimits bound what clients not yet authenticated hold on the uplink port, and wrong join tokens.
	UplinkLimits sites.Limits
	// AssetsDir holds boot-asset files named by their SHA-256, which the controller relays to edges
	// that cannot fetch them themselves (air-gapped sites); empty means <StateDir>/assets.
	AssetsDir string
	// AgentAssetsDir holds the agent-mode image per iPXE architecture (<arch>/vmlinuz, <arch>/initramfs.xz);
	// every site is asked to hold it, by relay where it cannot fetch it (air-gapped sites).
	AgentAssetsDir string
	// DefaultAssetPolicy applies to sites without their own: passthrough, cache or offline (parsed where it is
	// given: assets.PolicyFlag).
	DefaultAssetPolicy assetsapi.Policy

	// Omni is the Omni connection; the lifecycle runs only when its endpoint is set.
	Omni omni.Config
	// Lease says how the controllers of one provider decide which of them acts (with Omni only; Holder and
	// UplinkAddress are filled in at start). LeaseDuration, when set, replaces it with lease.ForDuration.
	Lease         lease.Config
	LeaseDuration time.Duration
	// Lifecycle tunes the machine lifecycle.
	Lifecycle lifecycle.Config
	// Planner says what agent mode boots and how machines boot from disk.
	Planner bootplans.PlannerConfig
	// InstallAssetsDir holds Talos install assets for air-gapped sites and labs, laid out as the image factory
	// serves them (<schematic>/<version>/kernel-<arch>, initramfs-<arch>.xz); served to machines under
	// InstallAssetsURL. When empty, ImageFactoryURL resolves install assets.
	InstallAssetsDir string
	InstallAssetsURL string
	// ImageFactoryURL and PXEBaseURL locate the image factory (schematics, PXE scripts and images).
	ImageFactoryURL string
	PXEBaseURL      string
	// TrustedRootsFile is a PEM bundle added to the machines' join config (a custom CA in front of Omni).
	TrustedRootsFile string
	// ExtraMachineConfigFile holds Talos multi-documents added to the join config machines in agent mode get
	// (see omni.ExtraDocuments).
	ExtraMachineConfigFile string
	// BMCProtocol is how edges talk to BMCs: auto (Redfish when it answers, else IPMI), ipmi or redfish
	// (parsed where it is given: machines.BMCProtocolFlag).
	BMCProtocol bmcpb.Protocol
	// MachineLabels are labels published on every machine in Omni, besides its site label (parsed where they
	// are given: labels.Flag).
	MachineLabels map[string]string
	// DefaultBootMode is the firmware mode ("uefi" or "bios") of a one-time PXE boot of a machine whose
	// firmware neither its boots through the edge nor its BMC have told.
	DefaultBootMode metal.Firmware
}

// OmniEnabled reports whether the controller connects to Omni and runs the lifecycle.
func (c Config) OmniEnabled() bool { return c.Omni.Endpoint != "" }

// Default returns the default configuration.
func Default() Config {
	return Config{
		StateDir:     "/var/lib/outpost-controller",
		UplinkListen: ":8443",
		HTTPListen:   "127.0.0.1:9464",
		LogLevel:     "info",
		CertValidity: 30 * 24 * time.Hour,
		UplinkLimits: sites.DefaultLimits(),
		// Caching is what a site wants unless told otherwise: it keeps booting when the WAN is down.
		DefaultAssetPolicy: assetsapi.Policy_POLICY_CACHE,
		Omni:               omni.Default(),
		Lease:              lease.Default(),
		Lifecycle:          lifecycle.Default(),
		Planner:            bootplans.DefaultPlannerConfig(),
		InstallAssetsURL:   "/assets/install",
		DefaultBootMode:    metal.UEFI,
		BMCProtocol:        bmcpb.Protocol_PROTOCOL_AUTO,
	}
}

// AbsolutePaths makes every path setting absolute (relative to the working directory), so the admin socket's
// address and every file the controller opens mean the same thing wherever they are used.
func (c *Config) AbsolutePaths() error {
	return absolute(&c.StateDir, &c.AdminSocket, &c.AssetsDir, &c.AgentAssetsDir, &c.InstallAssetsDir, &c.TrustedRootsFile, &c.ExtraMachineConfigFile)
}

func absolute(paths ...*string) error {
	for _, p := range paths {
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

// AdminSocketPath returns the admin socket path, defaulted from the state directory.
func (c Config) AdminSocketPath() string {
	if c.AdminSocket != "" {
		return c.AdminSocket
	}

	return filepath.Join(c.StateDir, "admin.sock")
}

// AssetsDirPath returns the relay's asset directory, defaulted from the state directory.
func (c Config) AssetsDirPath() string {
	if c.AssetsDir != "" {
		return c.AssetsDir
	}

	return filepath.Join(c.StateDir, "assets")
}

// Validate checks the configuration and says what is wrong with it.
func (c Config) Validate() error {
	var errs []error

	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}

	if _, _, err := net.SplitHostPort(c.UplinkListen); err != nil {
		errs = append(errs, fmt.Errorf("uplink listen address %q: %w", c.UplinkListen, err))
	}

	if c.HTTPListen != "" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			errs = append(errs, fmt.Errorf("http listen address %q: %w", c.HTTPListen, err))
		}
	}

	if err := logging.ValidLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}

	if c.CertValidity < time.Hour {
		errs = append(errs, fmt.Errorf("certificate validity %s is shorter than an hour", c.CertValidity))
	}

	if machines.BMCProtocolName(c.BMCProtocol) == "" {
		errs = append(errs, fmt.Errorf("bmc protocol %d: want auto, ipmi or redfish", c.BMCProtocol))
	}

	if _, err := labels.Parse(labels.Pairs(c.MachineLabels)); err != nil {
		errs = append(errs, fmt.Errorf("machine labels: %w", err))
	}

	if err := c.UplinkLimits.Validate(); err != nil {
		errs = append(errs, err)
	}

	if c.DefaultBootMode != metal.UEFI && c.DefaultBootMode != metal.BIOS {
		errs = append(errs, fmt.Errorf("default boot mode %q is not uefi or bios", c.DefaultBootMode))
	}

	if !assets.ValidPolicy(c.DefaultAssetPolicy) {
		errs = append(errs, fmt.Errorf("default asset policy %d is not passthrough, cache or offline", c.DefaultAssetPolicy))
	}

	if c.OmniEnabled() {
		for _, v := range []struct {
			name string
			err  error
		}{
			{"omni", c.Omni.Validate()},
			{"lifecycle", c.Lifecycle.Validate()},
			{"planner", c.Planner.Validate()},
			{"install assets", c.validateInstallAssets()},
		} {
			if v.err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", v.name, v.err))
			}
		}
	}

	return errors.Join(errs...)
}

func (c Config) validateInstallAssets() error {
	if c.InstallAssetsDir == "" && c.ImageFactoryURL == "" {
		return errors.New("set an install assets directory or an image factory URL")
	}

	return nil
}
