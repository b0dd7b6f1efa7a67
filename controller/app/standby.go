package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/lease"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/shared/atomicfile"
	"github.com/outpost-metal/outpost/shared/rungroup"
)

// With Omni configured, the controller keeps its sites and enrollment CA in Omni's provider namespace, and a
// lease there decides which of the provider's controllers acts: the state directory holds only caches (the
// asset store) and what a controller kept before it moved its state to Omni, which is imported once.

// loadSharedState connects to Omni for the site registry, the CA and the lease (unary calls that outlive an
// Omni restart: the client reconnects), loads or creates the CA there (importing the state directory's) and
// imports the sites the state directory holds.
func (b *builder) loadSharedState(ctx context.Context) error {
	conn, err := omni.Connect(ctx, b.cfg.Omni, b.log.Named("shared-state"))
	if err != nil {
		return err
	}

	b.onClose("omni connection (sites and lease)", conn.Close)
	b.shared = conn

	key, err := seal.KeyFromServiceAccount(b.cfg.Omni.ServiceAccountKey, sites.CASealPurpose)
	if err != nil {
		return err
	}

	box, err := seal.New(key, rand.Reader)
	if err != nil {
		return err
	}

	ca, origin, err := sites.LoadOrCreateSharedCA(ctx, conn.State(), conn.Types(), box, filepath.Join(b.cfg.StateDir, "ca"), time.Now())
	if err != nil {
		return err
	}

	b.ca = ca
	b.registry = sites.NewRegistry(conn.State(), ca, rand.Reader, time.Now, sites.Kind(conn.Types().Sites()))

	imported, err := sites.ImportSites(ctx, sites.NewRegistry(b.store, ca, rand.Reader, time.Now), b.registry, b.log)
	if err != nil {
		return fmt.Errorf("import the state directory's sites into omni: %w", err)
	}

	b.log.Info("sites and enrollment CA kept in omni", zap.String("ca", string(origin)), zap.Int("sites_imported", imported))

	return nil
}

// newLease builds the lease elector (with Omni; without, this controller always acts). The uplink's port is
// checked first, so that a port taken shows at start and not at a takeover, and the record names the address
// the port resolved to.
func (b *builder) newLease(context.Context) error {
	if b.shared == nil {
		return nil
	}

	uplinkAddr, err := checkPort(b.cfg.UplinkListen)
	if err != nil {
		return fmt.Errorf("uplink: %w", err)
	}

	b.ctrl.uplinkAddr = uplinkAddr

	holder, err := holderName(b.cfg.StateDir)
	if err != nil {
		return err
	}

	cfg := b.cfg.Lease
	if b.cfg.LeaseDuration > 0 {
		cfg = lease.ForDuration(b.cfg.LeaseDuration)
	}

	cfg.Holder = holder
	cfg.UplinkAddress = uplinkAddr.String()

	b.elector, err = lease.New(cfg, b.shared.State(), b.shared.Types(), b.log, time.Now, b.metrics)

	return err
}

// checkPort listens on addr and closes at once: the address it resolved to (the port the kernel chose for
// port 0), or why it cannot be listened on.
func checkPort(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}

	return ln.Addr(), ln.Close()
}

// holderName names this controller in the lease: its host name and an ID kept in the state directory. The ID
// outlives a restart, so a controller that crashed and starts again with the same state directory takes its own
// lease back at once instead of waiting a whole lease duration: the store's lock, taken before this, says no
// other process uses that directory, so the record's holder is this controller's dead predecessor. A new state
// directory is a new holder.
func holderName(stateDir string) (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "controller"
	}

	path := filepath.Join(stateDir, "controller-id")

	id, err := os.ReadFile(path)
	if err == nil && validHolderID(strings.TrimSpace(string(id))) {
		return host + "-" + strings.TrimSpace(string(id)), nil
	}

	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("lease holder ID: %w", err)
	}

	raw := make([]byte, 6)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("lease holder ID: %w", err)
	}

	fresh := hex.EncodeToString(raw)
	if err := atomicfile.Write(path, []byte(fresh+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("lease holder ID: %w", err)
	}

	return host + "-" + fresh, nil
}

// validHolderID reports whether a stored ID is one holderName wrote (a damaged file gets a new ID).
func validHolderID(id string) bool {
	if len(id) != 12 {
		return false
	}

	_, err := hex.DecodeString(id)

	return err == nil
}

// act adds a component that runs only while this controller holds the lease (all of them when there is no
// lease: no Omni, so no other controller to share with).
func (b *builder) act(name string, fn func(ctx context.Context) error) {
	if b.elector == nil {
		b.run(name, fn)

		return
	}

	b.acting = append(b.acting, rungroup.Component{Name: name, Run: fn})
}

// runActing adds the one component that campaigns for the lease and, in each term, runs the acting
// components under one errgroup: a lost lease stops them all and the controller stands by again; one of them
// stopping or failing ends the term and the controller (a standby takes over).
func (b *builder) runActing() {
	if b.elector == nil || len(b.acting) == 0 {
		return
	}

	acting, log, elector := b.acting, b.log.With(zap.Bool("acting", true)), b.elector

	b.run("lease", func(ctx context.Context) error {
		return elector.Run(ctx, func(ctx context.Context) error {
			err := rungroup.Run(ctx, log, acting)
			if ctx.Err() != nil {
				// The term ended (lease lost or shutdown): the components' errors are their way out.
				return nil
			}

			return err
		})
	})
}

// listenUplinkPerTerm serves the uplink only while this controller holds the lease: a standby does not listen,
// so an edge given several controller addresses is refused at once and dials the next. Its port was checked
// when the lease was built (newLease).
func (b *builder) listenUplinkPerTerm() {
	addr := b.ctrl.uplinkAddr.String()

	b.act("uplink", func(ctx context.Context) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s after taking the lease: %w", addr, err)
		}

		return errors.Join(b.uplink.Serve(ctx, ln), rungroup.IgnoreClosed(ln.Close()))
	})
}

// readyHandler answers 200 while this controller acts (holds the lease, or there is none) and 503 while it
// stands by: a Kubernetes Service in front of two controllers sends edges to the active one.
func readyHandler(elector *lease.Elector) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if elector != nil && !elector.Acting() {
			http.Error(w, "standby: another controller holds the lease", http.StatusServiceUnavailable)

			return
		}

		w.Write([]byte("acting\n")) //nolint:errcheck // the client went away
	}
}
