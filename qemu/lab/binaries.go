package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/outpost-metal/outpost/controller/assets"
)

// ControllerPort is the controller's uplink port in the core namespace.
const ControllerPort = 8443

// Controller is the running controller binary.
type Controller struct {
	Proc     *Proc
	Bin      string
	StateDir string
}

// ControllerOptions are the lab's settings for the controller.
type ControllerOptions struct {
	// LocalAssetsDir is the controller's local boot-asset directory (LocalAssets builds it).
	LocalAssetsDir string
	// PowerCooldown replaces the five-minute production cooldown between power actions.
	PowerCooldown time.Duration
	// AgentAssetsDir holds agent-mode images (<arch>/vmlinuz, <arch>/initramfs.xz; AgentAssets builds it)
	// every site is asked to cache, relayed to sites that cannot fetch them.
	AgentAssetsDir string
	// AssetPolicy is the sites' default asset policy (passthrough, cache, offline); empty keeps the default.
	AssetPolicy string
	// ImageFactoryURL is the image factory the controller resolves install profiles through
	// (--image-factory-url; used when LocalAssetsDir is empty).
	ImageFactoryURL string
	// Restart appends to the existing log (a controller restarted mid-run).
	Restart bool
	// WipeTimeout replaces the one-hour bound of a fast wipe (a test of a wipe that hangs).
	WipeTimeout time.Duration
}

// StartController runs the controller binary in the core namespace against o (trusting a real Omni's CA
// through SSL_CERT_FILE), with the lab's local install assets and short power cooldown and poll interval. Its
// HTTP listener (status pages, metrics) is on the namespace's loopback, where no token is needed.
func (l *Lab) StartController(ctx context.Context, core *Core, bin string, o *Omni, opts ControllerOptions) (*Controller, error) {
	c := &Controller{Bin: bin, StateDir: filepath.Join(l.Dir, "controller-state")}

	args := []string{
		"--state-dir", c.StateDir, "--uplink-listen", fmt.Sprintf("%s:%d", CoreAddr, ControllerPort),
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", ControllerHTTPPort), "--log-level", "debug", "--server-name", CoreAddr, "--provider-id", ProviderID,
		"--agent-talos-version", LabTalosVersion, "--console", "ttyS0",
	}
	env := []string{"OMNI_ENDPOINT=" + o.Endpoint, "OMNI_SERVICE_ACCOUNT_KEY=" + o.ProviderKey}

	// A real Omni's certificate is self-signed: the controller trusts its CA as an operator's would, through
	// the system roots Go reads from SSL_CERT_FILE (the controller has no CA flag, and verification stays on).
	if o.CAFile != "" {
		env = append(env, "SSL_CERT_FILE="+o.CAFile)
	}

	if opts.LocalAssetsDir != "" {
		args = append(args, "--install-assets-dir", opts.LocalAssetsDir)
	}

	if opts.AgentAssetsDir != "" {
		args = append(args, "--agent-assets-dir", opts.AgentAssetsDir)
	}

	if opts.ImageFactoryURL != "" {
		args = append(args, "--image-factory-url", opts.ImageFactoryURL)
	}

	if opts.AssetPolicy != "" {
		args = append(args, "--default-asset-policy", opts.AssetPolicy)
	}

	if opts.WipeTimeout > 0 {
		args = append(args, "--wipe-timeout", opts.WipeTimeout.String())
	}

	if opts.PowerCooldown > 0 {
		args = append(args, "--power-cooldown", opts.PowerCooldown.String(), "--poll-interval", opts.PowerCooldown.String())
	}

	p, err := l.Start(ProcSpec{Name: "controller", NS: core.NS, Cmd: bin, Args: args, Env: env, Append: opts.Restart})
	if err != nil {
		return nil, err
	}

	c.Proc = p

	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(c.StateDir, "admin.sock")); err == nil {
			return c, nil
		}

		select {
		case <-p.Done():
			return nil, fmt.Errorf("controller exited at start (%w):\n%s", p.Err(), p.Log.Tail(3000))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}

		if time.Now().After(deadline) {
			return nil, fmt.Errorf("controller admin socket missing after 30s:\n%s", p.Log.Tail(3000))
		}
	}
}

// CreateSite creates a site on the controller (`controller site create`) and returns its join token.
func (c *Controller) CreateSite(ctx context.Context, name string) (string, error) {
	out, err := c.site(ctx, "create", name, "--description", "lab "+name)

	return strings.TrimSpace(out), err
}

// SetSite changes a site's own settings (`controller site set <name> <flags>`).
func (c *Controller) SetSite(ctx context.Context, name string, flags ...string) error {
	_, err := c.site(ctx, append([]string{"set", name}, flags...)...)

	return err
}

// SiteShow returns `controller site show <name>`: the site's state and its asset catalog.
func (c *Controller) SiteShow(ctx context.Context, name string) (string, error) {
	return c.site(ctx, "show", name)
}

// site runs `controller site <args>` against the lab controller's admin socket and returns its standard output.
func (c *Controller) site(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	var stdout, stderr bytes.Buffer

	cmd := exec.CommandContext(ctx, c.Bin, append(append([]string{"site"}, args...), "--state-dir", c.StateDir)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("controller site %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}

	return stdout.String(), nil
}

// EdgeOptions are the lab's settings for an edge.
type EdgeOptions struct {
	// Token is the site's join token (used once, to enrol).
	Token string
	// PreseedDir is an asset bundle (PreseedBundle) the edge imports at start.
	PreseedDir string
	// Restart appends to the existing log (an edge restarted mid-run).
	Restart bool
	// ExtraArgs are further edge flags.
	ExtraArgs []string
}

// EdgeAPIPort is the edge's agent tunnel port.
const EdgeAPIPort = 50042

// StartEdge runs the edge binary on the site, enrolled with token. Flags used: --state-dir, --controller,
// --join-token, --interface, --server-ip, --http-listen, --tftp-listen, --api-listen, --ipxe-dir,
// --kernel-args, --assets-preseed-dir.
func (s *Site) StartEdge(ctx context.Context, bin string, opts EdgeOptions) (*Proc, error) {
	ipxeDir, err := IPXEDir()
	if err != nil {
		return nil, err
	}

	args := []string{
		"--state-dir", filepath.Join(s.Dir, "edge-state"),
		"--controller", fmt.Sprintf("%s:%d", CoreAddr, ControllerPort), "--join-token", opts.Token,
		"--interface", "br0", "--server-ip", s.EdgeIP(), "--http-listen", s.EdgeIP() + ":80",
		"--tftp-listen", s.EdgeIP() + ":69", "--api-listen", fmt.Sprintf("%s:%d", s.EdgeIP(), EdgeAPIPort),
		"--ipxe-dir", ipxeDir, "--kernel-args", "console=ttyS0", "--log-level", "debug",
	}

	if opts.PreseedDir != "" {
		args = append(args, "--assets-preseed-dir", opts.PreseedDir)
	}

	args = append(args, opts.ExtraArgs...)

	p, err := s.lab.Start(ProcSpec{Name: s.Name + "/edge", NS: s.NS, Cmd: bin, Append: opts.Restart, Args: args})
	if err != nil {
		return nil, err
	}

	// Ready when the HTTP server accepts connections from inside the site.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := DialerIn(s.NS)(dctx, s.EdgeIP()+":80")
		cancel()

		if err == nil {
			conn.Close() //nolint:errcheck

			return p, nil
		}

		select {
		case <-p.Done():
			return nil, fmt.Errorf("edge of %s exited at start (%w):\n%s", s.Name, p.Err(), p.Log.Tail(3000))
		case <-time.After(300 * time.Millisecond):
		}
	}

	return nil, fmt.Errorf("edge of %s not serving HTTP after 30s:\n%s", s.Name, p.Log.Tail(3000))
}

// LabTalosVersion is the Talos version the lab allocates machines with (and the agent's), in the form Omni
// writes it (no v); the controller accepts both.
const LabTalosVersion = "1.11.5"

// LocalAssets lays the lab images out as the controller's local asset directory expects
// (<schematic>/<version>/kernel-amd64, initramfs-amd64.xz) for the agent profile (the metal agent
// extension) and the install profile (no extensions), both Talos LabTalosVersion.
func LocalAssets(images Images, dir string) error {
	for _, p := range []assets.Profile{
		{TalosVersion: LabTalosVersion, Extensions: []string{"siderolabs/metal-agent"}},
		{TalosVersion: LabTalosVersion},
	} {
		id, err := assets.SchematicID(p)
		if err != nil {
			return err
		}

		version, err := assets.CanonicalTalosVersion(LabTalosVersion)
		if err != nil {
			return err
		}

		d := filepath.Join(dir, id, version)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}

		if err := copyFile(images.Kernel, filepath.Join(d, "kernel-amd64")); err != nil {
			return err
		}

		if err := copyFile(images.Initramfs, filepath.Join(d, "initramfs-amd64.xz")); err != nil {
			return err
		}
	}

	return nil
}

// AgentAssets lays the lab's agent-mode kernel and initramfs out for the controller's --agent-assets-dir.
func AgentAssets(images Images, dir string) error {
	d := filepath.Join(dir, "x86_64")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}

	if err := copyFile(images.Kernel, filepath.Join(d, "vmlinuz")); err != nil {
		return err
	}

	return copyFile(images.Initramfs, filepath.Join(d, "initramfs.xz"))
}

// ControllerSupportsOmni reports whether the controller binary has its Omni connection wired (it mentions
// OMNI_ENDPOINT in its help), with the reason when not.
func ControllerSupportsOmni(ctx context.Context, bin string) (bool, string) {
	out, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput() //nolint:errcheck
	if !strings.Contains(string(out), "OMNI_ENDPOINT") {
		return false, "the controller binary has no Omni connection yet (no OMNI_ENDPOINT in --help)"
	}

	return true, ""
}
