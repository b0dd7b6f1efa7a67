package realomni

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/pkg/client"
	"github.com/siderolabs/omni/client/pkg/omni/resources/system"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// probeInterval is how often Start asks a starting Omni whether it is usable.
const probeInterval = 200 * time.Millisecond

// omnictlTimeout bounds one omnictl call when the caller's context has no deadline.
const omnictlTimeout = 2 * time.Minute

// serviceAccountKeyEnv is how omnictl prints (and takes) a service-account key.
const serviceAccountKeyEnv = "OMNI_SERVICE_ACCOUNT_KEY"

// wireguardShell gives Omni a private /run/wireguard (its userspace WireGuard socket lives there) in the
// private mount namespace unshare created, then runs the command.
const wireguardShell = `mkdir -p /run/wireguard && mount -t tmpfs -o mode=0700 realomni-wg /run/wireguard && exec "$@"`

// Omni is a running real Omni with auth on, its fake image factory and registry, seen by an operator.
type Omni struct {
	// Endpoint is the API (https://IP:port): omnictl, the Omni client, infra providers.
	Endpoint string
	// MachineAPIURL is the SideroLink Provision endpoint machines join (grpc://IP:port).
	MachineAPIURL string
	// FactoryURL is the fake image factory (http://IP:port); the fake registry is on the same host.
	FactoryURL string
	// CAPEM is the CA of Omni's TLS certificate (also in CAFile).
	CAPEM []byte
	// CAFile is CAPEM's path (for SSL_CERT_FILE of processes that talk to Omni).
	CAFile string

	cfg         Config
	log         *zap.Logger
	tls         tlsFiles
	factory     *Factory
	factoryAddr string

	stopFactory context.CancelFunc
	factoryDone chan error

	mu       sync.Mutex
	proc     *process
	adminKey string
	stopped  bool
}

// Start runs a real Omni as cfg says and returns once its API answers the initial service account; Stop
// ends it. Its directory keeps its data, so a later Start on the same Dir continues with it.
func Start(ctx context.Context, cfg Config) (*Omni, error) {
	cfg.Default()

	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("real omni config: %w", err)
	}

	// ./omnictl/ holds the omnictl binaries Omni offers for download; it must exist.
	for _, d := range []string{cfg.Dir, cfg.path("tls"), cfg.path("omnictl"), cfg.path("omnictl-home"), cfg.path("templates")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create omni directory: %w", err)
		}
	}

	files := tlsFiles{CA: cfg.path("tls", "ca.pem"), Cert: cfg.path("tls", "cert.pem"), Key: cfg.path("tls", "key.pem")}

	caPEM, err := ensureTLS(files, cfg.IP, cfg.Rand, cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("omni TLS certificate: %w", err)
	}

	if err := ensurePGP(cfg.path("etcd-key.asc"), cfg.path("etcd-key.pub.asc")); err != nil {
		return nil, err
	}

	ln, err := listenIn(ctx, cfg.Netns, cfg.hostPort(cfg.Ports.Factory))
	if err != nil {
		return nil, fmt.Errorf("fake image factory: %w", err)
	}

	factoryAddr := ln.Addr().String()
	fctx, stopFactory := context.WithCancel(context.Background())

	o := &Omni{
		Endpoint:      "https://" + cfg.hostPort(cfg.Ports.API),
		MachineAPIURL: "grpc://" + cfg.hostPort(cfg.Ports.MachineAPI),
		FactoryURL:    "http://" + factoryAddr,
		CAPEM:         caPEM,
		CAFile:        files.CA,
		cfg:           cfg,
		log:           cfg.Logger.With(zap.String("component", "realomni")),
		tls:           files,
		factoryAddr:   factoryAddr,
		factory: NewFactory(FactoryConfig{
			TalosVersions: cfg.TalosVersions, KubernetesVersions: cfg.KubernetesVersions, Logger: cfg.Logger,
		}),
		stopFactory: stopFactory,
		factoryDone: make(chan error, 1),
	}

	go func() { o.factoryDone <- o.factory.Serve(fctx, ln) }()

	if err := o.start(ctx); err != nil {
		o.Stop()

		return nil, err
	}

	return o, nil
}

// args are omni's flags (see Omni's internal/pkg/config/schema.json for each x-cli-flag).
func (o *Omni) args() []string {
	c, p := &o.cfg, o.cfg.Ports
	factory := "http://" + o.factoryAddr

	return []string{
		"--name", c.Name,
		"--bind-addr", c.hostPort(p.API),
		"--advertised-api-url", o.Endpoint,
		"--cert", o.tls.Cert, "--key", o.tls.Key,
		"--machine-api-bind-addr", c.hostPort(p.MachineAPI),
		"--machine-api-advertised-url", o.MachineAPIURL,
		"--k8s-proxy-bind-addr", c.hostPort(p.KubernetesProxy),
		"--advertised-kubernetes-proxy-url", "https://" + c.hostPort(p.KubernetesProxy),
		"--metrics-bind-addr", c.hostPort(p.Metrics),
		"--siderolink-wireguard-bind-addr", c.hostPort(p.WireGuard),
		"--siderolink-wireguard-advertised-addr", c.hostPort(p.WireGuard),
		"--event-sink-port", fmt.Sprint(p.EventSink),
		"--log-server-port", fmt.Sprint(p.LogServer),
		"--embedded-discovery-service-port", fmt.Sprint(p.Discovery),
		"--local-resource-server-port", fmt.Sprint(p.LocalResource),
		"--workload-proxying-enabled=false",
		"--etcd-embedded", "--etcd-embedded-unsafe-fsync",
		"--etcd-embedded-db-path", c.path("etcd"),
		"--etcd-endpoints", "http://" + c.hostPort(p.Etcd),
		"--private-key-source", "file://" + c.path("etcd-key.asc"),
		"--public-key-files", c.path("etcd-key.pub.asc"),
		"--sqlite-storage-path", c.path("omni.sqlite"),
		"--auth-auth0-enabled", "--auth-auth0-client-id", "test-client", "--auth-auth0-domain", "auth0.invalid",
		"--initial-users", "admin@example.com",
		"--create-initial-service-account",
		"--initial-service-account-key-path", c.path("admin.key"),
		"--initial-service-account-lifetime", "720h",
		"--eula-accept-name", "Outpost tests", "--eula-accept-email", "admin@example.com",
		// Everything Omni would fetch from a public factory or registry goes to the fake one.
		"--image-factory-address", factory,
		"--image-factory-pxe-address", factory,
		"--kubernetes-registry", o.factoryAddr + "/siderolabs/kubelet",
		"--talos-installer-registry", o.factoryAddr + "/siderolabs/installer",
	}
}

// start runs the omni process and waits until it is usable.
func (o *Omni) start(ctx context.Context) error {
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", wireguardShell, "omni",
		o.cfg.Binaries.Omni}, o.args()...)
	if o.cfg.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", o.cfg.Netns}, argv...)
	}

	begin := time.Now()

	p, err := startProcess(argv, o.cfg.Dir, nil, o.Log())
	if err != nil {
		return fmt.Errorf("start omni: %w", err)
	}

	o.mu.Lock()
	o.proc = p
	o.mu.Unlock()

	if err := o.waitUsable(ctx, p); err != nil {
		p.stop(stopGrace)

		return err
	}

	o.log.Info("real omni usable", zap.String("endpoint", o.Endpoint), zap.String("netns", o.cfg.Netns),
		zap.Duration("start_to_usable", time.Since(begin).Round(time.Millisecond)))

	return nil
}

// waitUsable polls until the initial service account key exists and the API answers a read with it.
func (o *Omni) waitUsable(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.StartTimeout)
	defer cancel()

	ticker := time.NewTicker(probeInterval)
	defer ticker.Stop()

	var (
		c       *client.Client
		lastErr error
	)

	defer func() {
		if c != nil {
			c.Close() //nolint:errcheck
		}
	}()

	for {
		if c == nil {
			c, lastErr = o.probeClient()
		}

		if c != nil {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, lastErr = safe.StateGetByID[*system.SysVersion](pctx, c.Omni().State(), system.SysVersionID)

			pcancel()

			if lastErr == nil {
				return nil
			}

			c.Close() //nolint:errcheck // reconnect, reading the key again (it may have been half written)
			c = nil
		}

		select {
		case <-p.done:
			return fmt.Errorf("omni exited at start (%w); log tail:\n%s", p.err, logTail(o.Log(), 4096))
		case <-ctx.Done():
			return fmt.Errorf("omni not usable within %s (last: %w); log tail:\n%s", o.cfg.StartTimeout,
				errors.Join(lastErr, ctx.Err()), logTail(o.Log(), 4096))
		case <-ticker.C:
		}
	}
}

// probeClient reads the initial service account key (once Omni has written it) and connects with it.
func (o *Omni) probeClient() (*client.Client, error) {
	b, err := os.ReadFile(o.cfg.path("admin.key"))
	if err != nil {
		return nil, fmt.Errorf("read initial service account key: %w", err)
	}

	key := strings.TrimSpace(string(b))
	if key == "" {
		return nil, errors.New("initial service account key is empty")
	}

	c, err := client.New(o.Endpoint, client.WithServiceAccount(key), client.WithInsecureSkipTLSVerify(true),
		client.WithGrpcOpts(grpc.WithContextDialer(o.DialContext)))
	if err != nil {
		return nil, fmt.Errorf("connect to omni: %w", err)
	}

	o.mu.Lock()
	o.adminKey = key
	o.mu.Unlock()

	return c, nil
}

// AdminKey is the initial service account's key (role Admin), as --initial-service-account-key-path wrote it.
func (o *Omni) AdminKey() string {
	o.mu.Lock()
	defer o.mu.Unlock()

	return o.adminKey
}

// Log is the path of Omni's log (its output across restarts).
func (o *Omni) Log() string { return o.cfg.path("omni.log") }

// Dir is Omni's data directory.
func (o *Omni) Dir() string { return o.cfg.Dir }

// Factory is the fake image factory and registry Omni uses.
func (o *Omni) Factory() *Factory { return o.factory }

// DialContext dials addr over TCP from Omni's network namespace (for grpc.WithContextDialer).
func (o *Omni) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	return dialIn(ctx, o.cfg.Netns, addr)
}

// Omnictl runs omnictl against this Omni with the admin key (OMNI_ENDPOINT, OMNI_SERVICE_ACCOUNT_KEY,
// Omni's CA as SSL_CERT_FILE, a private HOME and omniconfig) and returns its standard output.
func (o *Omni) Omnictl(ctx context.Context, args ...string) ([]byte, error) {
	return o.omnictl(ctx, "", args...)
}

func (o *Omni) omnictl(ctx context.Context, dir string, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc

		ctx, cancel = context.WithTimeout(ctx, omnictlTimeout)
		defer cancel()
	}

	argv := append([]string{o.cfg.Binaries.Omnictl}, args...)
	if o.cfg.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", o.cfg.Netns}, argv...)
	}

	home := o.cfg.path("omnictl-home")

	var stdout, stderr bytes.Buffer

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...) // argv is built by this package
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "OMNICONFIG="+filepath.Join(home, "omniconfig"),
		"OMNI_ENDPOINT="+o.Endpoint, serviceAccountKeyEnv+"="+o.AdminKey(), "SSL_CERT_FILE="+o.CAFile)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second

	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("omnictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}

	return stdout.Bytes(), nil
}

// CreateProvider creates a static infra provider as a user does (`omnictl infraprovider create <id>`) and
// returns its service-account key.
func (o *Omni) CreateProvider(ctx context.Context, providerID string) (string, error) {
	out, err := o.Omnictl(ctx, "infraprovider", "create", providerID)
	if err != nil {
		return "", fmt.Errorf("create infra provider %s: %w", providerID, err)
	}

	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if key, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), serviceAccountKeyEnv+"="); ok && key != "" {
			return key, nil
		}
	}

	return "", fmt.Errorf("create infra provider %s: omnictl printed no %s", providerID, serviceAccountKeyEnv)
}

// CreateServiceAccount creates a service account with role (Reader, Operator, Admin) as an operator does
// (`omnictl serviceaccount create --role`) and returns its key.
func (o *Omni) CreateServiceAccount(ctx context.Context, name, role string) (string, error) {
	out, err := o.Omnictl(ctx, "serviceaccount", "create", name, "--role", role)
	if err != nil {
		return "", fmt.Errorf("create service account %s: %w", name, err)
	}

	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if key, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), serviceAccountKeyEnv+"="); ok && key != "" {
			return key, nil
		}
	}

	return "", fmt.Errorf("create service account %s: omnictl printed no %s", name, serviceAccountKeyEnv)
}

// SyncClusterTemplate applies a cluster template (`omnictl cluster template sync -f`).
func (o *Omni) SyncClusterTemplate(ctx context.Context, template []byte) error {
	f, err := os.CreateTemp(o.cfg.path("templates"), "cluster-*.yaml")
	if err != nil {
		return fmt.Errorf("write cluster template: %w", err)
	}

	_, werr := f.Write(template)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("write cluster template: %w", err)
	}

	if _, err := o.omnictl(ctx, o.cfg.path("templates"), "cluster", "template", "sync", "-f", f.Name()); err != nil {
		return fmt.Errorf("sync cluster template: %w", err)
	}

	return nil
}

// Restart stops Omni and starts it again on the same data (etcd, SQLite, keys), returning once usable.
func (o *Omni) Restart(ctx context.Context) error {
	o.mu.Lock()
	p, stopped := o.proc, o.stopped
	o.mu.Unlock()

	if stopped {
		return errors.New("restart omni: stopped")
	}

	if p != nil {
		p.stop(stopGrace)
	}

	if err := o.start(ctx); err != nil {
		return fmt.Errorf("restart omni: %w", err)
	}

	return nil
}

// Stop ends Omni (its whole process group) and the fake factory and waits for both. It is safe to call twice.
func (o *Omni) Stop() {
	o.mu.Lock()
	p, stopped := o.proc, o.stopped
	o.stopped = true
	o.mu.Unlock()

	if stopped {
		return
	}

	if p != nil {
		p.stop(stopGrace)
	}

	o.stopFactory()

	if err := <-o.factoryDone; err != nil {
		o.log.Warn("fake image factory", zap.Error(err))
	}
}

// Exited reports whether the Omni process has exited (and how) without being stopped.
func (o *Omni) Exited() (bool, error) {
	o.mu.Lock()
	p := o.proc
	o.mu.Unlock()

	if p == nil {
		return false, nil
	}

	return p.exited()
}

// AllocateWorker puts machineID into a cluster of its own as its one worker (no control plane), as a user does
// with `omnictl cluster template sync`; talosVersion is Omni's form (1.11.5) or with a v.
func (o *Omni) AllocateWorker(ctx context.Context, cluster, kubernetesVersion, talosVersion, machineID string) error {
	template := fmt.Sprintf(`kind: Cluster
name: %s
kubernetes:
  version: v%s
talos:
  version: v%s
---
kind: ControlPlane
machines: []
---
kind: Workers
machines:
  - %s
`, cluster, strings.TrimPrefix(kubernetesVersion, "v"), strings.TrimPrefix(talosVersion, "v"), machineID)

	if err := o.SyncClusterTemplate(ctx, []byte(template)); err != nil {
		return fmt.Errorf("allocate %s to cluster %s: %w", machineID, cluster, err)
	}

	return nil
}

// DeleteCluster deletes a cluster (`omnictl cluster delete`); Omni resets its machines and gives each a new
// wipe ID.
func (o *Omni) DeleteCluster(ctx context.Context, cluster string) error {
	if _, err := o.Omnictl(ctx, "cluster", "delete", cluster); err != nil {
		return fmt.Errorf("delete cluster %s: %w", cluster, err)
	}

	return nil
}
