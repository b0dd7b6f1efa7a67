package fidelity_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/image-factory/pkg/schematic"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lease"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/machines"
	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/qemu/fidelity"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Machine IDs of the scenario (SMBIOS UUIDs, as Talos reports them).
const (
	m1 = "0b6e4a4c-1f2d-4c3b-9a8e-5d7f6c1b2a01"
	m2 = "0b6e4a4c-1f2d-4c3b-9a8e-5d7f6c1b2a02"
)

// cooldown is the controller's power cooldown in the scenario: long enough to tell "kept on" from "off".
const cooldown = 2 * time.Second

// transcript is what the controller read and wrote at each step, in order. A step a backend cannot take has
// the reason instead of observations.
type transcript struct {
	mu    sync.Mutex
	steps []step
}

type step struct {
	name     string
	observed []string
	skipped  string
}

func (tr *transcript) add(name string, observed ...string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()

	tr.steps = append(tr.steps, step{name: name, observed: observed})
}

func (tr *transcript) skip(name, reason string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()

	tr.steps = append(tr.steps, step{name: name, skipped: reason})
}

// run is one scenario run: the controller's Omni side (the Keeper, the lifecycle and the join config watcher,
// as the binary runs them) against a backend, with a fake site edge.
type run struct {
	t     *testing.T
	b     fidelity.Backend
	edge  *lifecycletest.FakeEdge
	tr    *transcript
	admin *omni.Admin
	jc    chan controlleromni.JoinConfig
	// inventory reads machines' hardware inventories (nil: none are read).
	inventory lifecycle.InventoryClient
}

const waitFor = 60 * time.Second

// eventually polls cond until it holds, failing the test after the deadline.
func (r *run) eventually(what string, cond func() bool) {
	r.t.Helper()
	require.Eventually(r.t, cond, waitFor, 20*time.Millisecond, "%s: %s", r.b.Name(), what)
}

func (r *run) machine(ctx context.Context, id string) *infra.Machine {
	m, err := safe.StateGetByID[*infra.Machine](ctx, r.b.Admin(), id)
	if err != nil {
		return nil
	}

	return m
}

func (r *run) status(ctx context.Context, id string) *omnispecs.InfraMachineStatusSpec {
	s, err := safe.StateGetByID[*infra.MachineStatus](ctx, r.b.Admin(), id)
	if err != nil {
		return nil
	}

	return s.TypedSpec().Value
}

// startController runs the controller's Omni side against r.b until the test ends.
func (r *run) startController(ctx context.Context) {
	t := r.t

	// Install assets resolve through the image factory as the controller binary resolves them (the schematic
	// is computed in process: nothing is fetched).
	resolver, err := assets.NewFactoryResolverWith(schematicIDs{}, "", fidelityFactory)
	require.NoError(t, err)

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), resolver)
	require.NoError(t, err)

	cfg := lifecycle.Default()
	cfg.Cooldown = cooldown
	cfg.PollInterval = 200 * time.Millisecond
	cfg.CallTimeout = 5 * time.Second

	ocfg := r.b.Controller()

	// BMC passwords are sealed as the controller binary seals them: with a key derived from the provider's.
	key, err := seal.KeyFromServiceAccount(ocfg.ServiceAccountKey, "bmc credentials")
	require.NoError(t, err)
	secrets, err := seal.New(key, rand.Reader)
	require.NoError(t, err)

	ctrls, err := lifecycle.New(cfg, lifecycle.Deps{
		Types: resources.NewTypes(ocfg.ProviderID), Power: r.edge, Agent: r.edge, Intents: r.edge, Sites: r.edge, Plans: r.edge,
		Planner: planner, Now: time.Now, Rand: rand.Reader, Secrets: secrets, Inventory: r.inventory, SecureBoot: r.edge,
	})
	require.NoError(t, err)

	keeper, err := controlleromni.NewKeeper(ocfg, zaptest.NewLogger(t).Named(r.b.Name()), nil,
		func(ctx context.Context, conn *controlleromni.Connection) error {
			// The provider's health is the sites' (as the controller's uplink reports it), here the fake edge's.
			health := func(context.Context) error {
				return sites.HealthOf(fidelitySites, func(site string) bool { return !r.edge.Offline(site) })
			}

			joinConfig := conn.NewJoinConfigController("", controlleromni.ExtraDocuments{}, func(jc controlleromni.JoinConfig) {
				select {
				case r.jc <- jc:
				default:
				}
			})

			rt, err := conn.NewRuntime(health, append(slices.Clone(ctrls), joinConfig)...)
			if err != nil {
				return err
			}

			return rt.Run(ctx)
		})
	require.NoError(t, err)

	kctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- keeper.Run(kctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// readerSeesBMC reads, as an account with Omni's Reader role, the BMC configuration the controller keeps for m1
// (a password it provisioned through the agent) and for m2 (copied from Omni's BMC config), and reports whether
// any clear password is to be had.
func readerSeesBMC(ctx context.Context, t *testing.T, b fidelity.Backend, provisioned string) []string {
	t.Helper()

	require.NotEmpty(t, provisioned, "the agent was given a password")

	reader, err := b.Reader(ctx)
	require.NoError(t, err)

	types := resources.NewTypes(b.Controller().ProviderID)

	var out []string

	for _, id := range []string{m1, m2} {
		rec, err := safe.StateGet[*resources.BMCConfiguration](ctx, reader, types.NewBMCConfiguration(id).Metadata())
		require.NoError(t, err, "a reader can read the provider's namespace")

		pw := rec.TypedSpec().Value.GetIpmi().GetPassword()
		clear := pw != "" && !seal.Sealed(pw)

		out = append(out, fmt.Sprintf("%s_source=%s", id[len(id)-2:], rec.TypedSpec().Value.GetSource()),
			fmt.Sprintf("%s_sealed=%v", id[len(id)-2:], seal.Sealed(pw)), fmt.Sprintf("%s_clear=%v", id[len(id)-2:], clear))
		require.NotContains(t, pw, provisioned)
		require.NotContains(t, pw, "bmc-secret")
	}

	return out
}

// sitesInOmni keeps a site and the enrollment CA in Omni as one controller does, then starts a second one
// with a state directory of its own, as a moved or standby controller would, and reports what it found.
func sitesInOmni(ctx context.Context, t *testing.T, b fidelity.Backend) []string {
	t.Helper()

	ocfg := b.Controller()

	conn, err := controlleromni.Connect(ctx, ocfg, zaptest.NewLogger(t).Named("sites"))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	key, err := seal.KeyFromServiceAccount(ocfg.ServiceAccountKey, sites.CASealPurpose)
	require.NoError(t, err)
	box, err := seal.New(key, rand.Reader)
	require.NoError(t, err)

	open := func() (*sites.CA, sites.CAOrigin, *sites.Registry) {
		ca, origin, err := sites.LoadOrCreateSharedCA(ctx, conn.State(), conn.Types(), box, t.TempDir(), time.Now())
		require.NoError(t, err)

		return ca, origin, sites.NewRegistry(conn.State(), ca, rand.Reader, time.Now, sites.Kind(conn.Types().Sites()))
	}

	ca1, origin1, reg1 := open()
	tok, _, err := reg1.Create(ctx, "branch-1", "first controller", sites.TokenOptions{})
	require.NoError(t, err)

	ca2, origin2, reg2 := open()
	list, err := reg2.List(ctx)
	require.NoError(t, err)

	rec, err := safe.StateGet[*resources.EnrollmentCA](ctx, b.Admin(), conn.Types().NewEnrollmentCA(resources.EnrollmentCAID).Metadata())
	require.NoError(t, err)

	enrols := reg2.CheckToken(ctx, tok) == nil

	// A site revoked through one controller's registry is seen by the other's watch (the acting controller
	// ends the site's session on it). The watch starts at some point after the goroutine does, and a write
	// that changes nothing sends no event: first change the site's labels until the watch has seen a change
	// (it is live), then revoke it once.
	var seen, revoked atomic.Bool // a change of branch-1 seen; one after which reg1 reads it revoked

	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)

	go func() {
		watched <- reg1.Watch(wctx, func(id string) {
			if id != "branch-1" {
				return
			}

			seen.Store(true)

			if site, err := reg1.Get(wctx, id); err == nil && site.TypedSpec().Value.GetRevoked() {
				revoked.Store(true)
			}
		})
	}()

	seenWithin := func(d time.Duration, got *atomic.Bool, change func(i int)) bool {
		for i, deadline := 0, time.Now().Add(d); time.Now().Before(deadline); i++ {
			change(i)

			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return false
			}

			if got.Load() {
				return true
			}
		}

		return false
	}

	require.True(t, seenWithin(30*time.Second, &seen, func(i int) {
		require.NoError(t, reg2.SetLabels(ctx, "branch-1", map[string]string{"fidelity-probe": strconv.Itoa(i)}))
	}), "the other registry's watch never saw a label change")

	require.NoError(t, reg2.Revoke(ctx, "branch-1"))

	revokedSeen := seenWithin(30*time.Second, &revoked, func(int) {})

	stopWatch()
	require.NoError(t, <-watched)

	return []string{
		"first=" + string(origin1), "second=" + string(origin2),
		fmt.Sprintf("same_ca=%v", ca1.Fingerprint() == ca2.Fingerprint()), fmt.Sprintf("sites_seen=%d", len(list)),
		fmt.Sprintf("token_enrols=%v", enrols),
		fmt.Sprintf("reader_sees_key_sealed=%v", seal.Sealed(rec.TypedSpec().Value.GetSealedKey())),
		fmt.Sprintf("revoke_seen_by_other=%v", revokedSeen),
	}
}

// standby runs two lease electors of the provider against Omni: one acts, the other stands by; when the first
// leaves, the second acts. It reports who acted when, and the most that ever acted at once.
func standby(ctx context.Context, t *testing.T, b fidelity.Backend) []string {
	t.Helper()

	conn, err := controlleromni.Connect(ctx, b.Controller(), zaptest.NewLogger(t).Named("lease"))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	var (
		mu          sync.Mutex
		acting      []string
		most, terms int
	)

	lead := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			mu.Lock()
			acting = append(acting, name)
			most = max(most, len(acting))
			terms++
			mu.Unlock()

			<-ctx.Done()

			mu.Lock()
			acting = slices.DeleteFunc(acting, func(n string) bool { return n == name })
			mu.Unlock()

			return nil
		}
	}

	actingNow := func() []string {
		mu.Lock()
		defer mu.Unlock()

		return slices.Clone(acting)
	}

	run := func(name string) (context.CancelFunc, chan error) {
		cfg := lease.Config{Holder: name, Duration: 3 * time.Second, Renew: 500 * time.Millisecond, Margin: time.Second}
		e, err := lease.New(cfg, conn.State(), conn.Types(), zaptest.NewLogger(t).Named(name), time.Now, nil)
		require.NoError(t, err)

		ectx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)

		go func() { done <- e.Run(ectx, lead(name)) }()

		return cancel, done
	}

	stopA, doneA := run("controller-a")
	require.Eventually(t, func() bool { return slices.Equal(actingNow(), []string{"controller-a"}) }, time.Minute, 50*time.Millisecond)

	stopB, doneB := run("controller-b")
	defer func() { stopB(); <-doneB }()

	// b stands by while a renews: over two lease durations nothing changes
	require.Never(t, func() bool { return !slices.Equal(actingNow(), []string{"controller-a"}) }, 6*time.Second, 100*time.Millisecond)

	stopA()
	require.NoError(t, <-doneA)
	require.Eventually(t, func() bool { return slices.Equal(actingNow(), []string{"controller-b"}) }, time.Minute, 50*time.Millisecond)

	rec, err := safe.StateGet[*resources.ControllerLease](ctx, b.Admin(), conn.Types().NewControllerLease(resources.ControllerLeaseID).Metadata())
	require.NoError(t, err)

	mu.Lock()
	defer mu.Unlock()

	return []string{
		"first=controller-a", "after_it_left=" + rec.TypedSpec().Value.GetHolder(),
		fmt.Sprintf("most_acting_at_once=%d", most), fmt.Sprintf("terms=%d", terms),
	}
}

// scenario is the contract: every step the controller takes with Omni, in the order a machine meets them.
func scenario(t *testing.T, b fidelity.Backend) *transcript {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	r := &run{t: t, b: b, edge: lifecycletest.NewFakeEdge(t), tr: &transcript{}, admin: omni.NewAdmin(b.Admin()),
		jc: make(chan controlleromni.JoinConfig, 1)}
	providerID := b.Controller().ProviderID

	r.startController(ctx)

	// register: the provider's status, marked static
	r.eventually("provider registered", func() bool {
		ps, err := safe.StateGetByID[*infra.ProviderStatus](ctx, b.Admin(), providerID)

		return err == nil && ps.TypedSpec().Value.GetName() != ""
	})

	ps, err := safe.StateGetByID[*infra.ProviderStatus](ctx, b.Admin(), providerID)
	require.NoError(t, err)

	_, static := ps.Metadata().Labels().Get(omnires.LabelIsStaticInfraProvider)
	r.tr.add("register", fmt.Sprintf("name=%s", ps.TypedSpec().Value.GetName()), fmt.Sprintf("static=%v", static))

	// heartbeat
	r.eventually("health heartbeat", func() bool {
		hs, err := safe.StateGetByID[*infra.ProviderHealthStatus](ctx, b.Admin(), providerID)

		return err == nil && hs.TypedSpec().Value.GetLastHeartbeatTimestamp().IsValid()
	})
	r.tr.add("heartbeat", "written=true")

	// site health: a site whose link is cut is named in the provider's health within a minute, and the
	// health clears when it is back
	r.tr.add("site health", siteHealth(ctx, t, b, r.edge, providerID)...)

	// sites and the enrollment CA kept in Omni: a second controller with an empty state directory has both
	r.tr.add("sites in omni", sitesInOmni(ctx, t, b)...)

	// two controllers: one acts, the other stands by and takes over when the first leaves
	r.tr.add("standby", standby(ctx, t, b)...)

	// join config: the documents the edges serve at /config
	var jc controlleromni.JoinConfig

	select {
	case jc = <-r.jc:
	case <-ctx.Done():
		t.Fatal("no join config reached the controller")
	}

	r.tr.add("join config", "documents="+strings.Join(documentKinds(jc.Documents), ","), "kernel_args="+strings.Join(argKeys(jc.KernelArgs), ","),
		fmt.Sprintf("siderolink_api_has_token=%v", strings.Contains(jc.Documents, "jointoken=")))

	// provision: the machine's Talos joins over SideroLink; Omni makes a pending InfraMachine
	r.edge.Add(m1, "site-a")
	token1, err := fidelity.Provision(ctx, b, m1)
	require.NoError(t, err)

	r.eventually("infra machine created", func() bool { return r.machine(ctx, m1) != nil })
	m := r.machine(ctx, m1)
	_, pending := m.Metadata().Labels().Get(omnires.LabelMachinePendingAccept)
	owner, _ := m.Metadata().Labels().Get(omnires.LabelInfraProviderID)
	r.tr.add("provision", "acceptance="+m.TypedSpec().Value.GetAcceptanceStatus().String(), fmt.Sprintf("pending_label=%v", pending),
		"provider_label="+owner, fmt.Sprintf("node_unique_token_as_sent=%v", m.TypedSpec().Value.GetNodeUniqueToken() == token1),
		"preferred_power="+m.TypedSpec().Value.GetPreferredPowerState().String(), fmt.Sprintf("wipe_id_set=%v", m.TypedSpec().Value.GetWipeId() != ""))

	// pending: agent mode, nothing touched
	r.eventually("pending machine gets the agent plan", func() bool { return r.edge.Machine(m1).Acked.Mode == bootplans.ModeAgent })
	r.tr.add("pending", "plan="+string(r.edge.Machine(m1).Acked.Mode), fmt.Sprintf("bmc_or_wipe_calls=%d",
		r.edge.Count(m1, "GetPowerManagement")+r.edge.Count(m1, "SetPowerManagement")+r.edge.Count(m1, "WipeDisks")))

	// reject a pending machine: it must not network boot
	require.NoError(t, r.admin.Reject(ctx, m1))
	r.eventually("rejected plan", func() bool { return r.edge.Machine(m1).Acked.Mode == bootplans.ModeDeny })
	r.tr.add("reject pending", "acceptance="+r.machine(ctx, m1).TypedSpec().Value.GetAcceptanceStatus().String(),
		"plan="+string(r.edge.Machine(m1).Acked.Mode))

	// accept: BMC through the agent, wipe, ready
	require.NoError(t, r.admin.Accept(ctx, m1))
	r.eventually("ready to use", func() bool { s := r.status(ctx, m1); return s != nil && s.GetReadyToUse() })
	st := r.status(ctx, m1)
	r.tr.add("accept", fmt.Sprintf("set_power_management=%d", r.edge.Count(m1, "SetPowerManagement")),
		fmt.Sprintf("wipes=%d", r.edge.Count(m1, "WipeDisks")), fmt.Sprintf("wiped_token_is_node_token=%v", st.GetWipedNodeUniqueToken() == token1),
		fmt.Sprintf("ready=%v", st.GetReadyToUse()))

	// accepted is final
	err = r.admin.Reject(ctx, m1)
	r.tr.add("reject accepted", fmt.Sprintf("refused=%v", err != nil && strings.Contains(err.Error(), "accepted machine cannot be rejected")))

	// Omni keeps the machine on until it has collected its information: past the cooldown it stays on
	require.Never(t, func() bool { return !r.edge.Machine(m1).Power }, 2*cooldown, 50*time.Millisecond, "%s: powered off before info collection", b.Name())
	r.tr.add("kept on", "preferred_power="+r.machine(ctx, m1).TypedSpec().Value.GetPreferredPowerState().String(),
		fmt.Sprintf("power_on=%v", r.edge.Machine(m1).Power), "reported="+r.status(ctx, m1).GetPowerState().String())

	// BMC from Omni's BMC config: no IPMI user is created through the agent
	r.edge.Add(m2, "site-b")
	_, err = fidelity.Provision(ctx, b, m2)
	require.NoError(t, err)
	r.eventually("second infra machine", func() bool { return r.machine(ctx, m2) != nil })
	require.NoError(t, r.admin.SetBMCConfig(ctx, m2, &omnispecs.InfraMachineBMCConfigSpec_IPMI{
		Address: "10.0.0.9", Port: 623, Username: "operator", Password: "bmc-secret",
	}))
	r.eventually("omni's bmc config reaches the provider", func() bool {
		_, err := safe.StateGetByID[*infra.BMCConfig](ctx, b.Admin(), m2)

		return err == nil
	})
	require.NoError(t, r.admin.Accept(ctx, m2))
	r.eventually("second machine ready", func() bool { s := r.status(ctx, m2); return s != nil && s.GetReadyToUse() })
	r.tr.add("bmc from omni", fmt.Sprintf("set_power_management=%d", r.edge.Count(m2, "SetPowerManagement")),
		fmt.Sprintf("wipes=%d", r.edge.Count(m2, "WipeDisks")))

	// what an Omni account with the Reader role sees of the BMC passwords: the provider's records, sealed
	r.tr.add("reader sees bmc", readerSeesBMC(ctx, t, b, r.edge.Machine(m1).IPMIPass)...)

	// site labels: Omni shows them on its MachineStatus, where a selector for one site picks that site's machines
	// labelled lists the machines whose MachineStatus in Omni has the provider's label key=value.
	labelled := func(key, value string) []string {
		label := fmt.Sprintf(omnires.InfraProviderLabelPrefixFormat, providerID) + key

		list, err := safe.StateListAll[*omnires.MachineStatus](ctx, b.Admin(), state.WithLabelQuery(resource.LabelEqual(label, value)))
		if err != nil {
			return nil
		}

		var ids []string
		for ms := range list.All() {
			ids = append(ids, ms.Metadata().ID())
		}

		return ids
	}
	bySite := func(site string) []string { return labelled(labels.Site, site) }

	r.eventually("site labels reach omni", func() bool {
		return slices.Equal(bySite("site-a"), []string{m1}) && slices.Equal(bySite("site-b"), []string{m2})
	})
	r.tr.add("site labels", "site-a="+strings.Join(bySite("site-a"), ","), "site-b="+strings.Join(bySite("site-b"), ","))

	// an identity alert (another host asked for the machine's agent tunnel) reaches Omni as a label while it
	// lasts, where an operator filters machines by it
	alerted := func() []string { return labelled(labels.Alert, machines.AlertSecondTunnel) }

	r.edge.SetAlert(m1, machines.AlertSecondTunnel)
	r.eventually("the alert label reaches omni", func() bool { return slices.Equal(alerted(), []string{m1}) })
	raised := strings.Join(alerted(), ",")

	r.edge.SetAlert(m1, "")
	r.eventually("the alert label leaves omni", func() bool { return len(alerted()) == 0 })
	r.tr.add("identity alert", "raised_on="+raised, fmt.Sprintf("cleared=%v", len(alerted()) == 0))

	// cordon: reaches the InfraMachine; a reboot request is then left alone
	require.NoError(t, r.admin.Cordon(ctx, m2, true))
	r.eventually("cordoned", func() bool { return r.machine(ctx, m2).TypedSpec().Value.GetCordoned() })
	_, err = r.admin.Reboot(ctx, m2)
	require.NoError(t, err)
	require.Never(t, func() bool { return r.edge.Count(m2, "PowerCycle") > 0 }, time.Second, 50*time.Millisecond, "%s: cordoned machine rebooted", b.Name())
	r.tr.add("cordon", "cordoned=true", fmt.Sprintf("reboots=%d", r.edge.Count(m2, "PowerCycle")))

	// uncordoned, the reboot asked for meanwhile is carried out
	require.NoError(t, r.admin.Cordon(ctx, m2, false))
	r.eventually("reboot after uncordon", func() bool { return r.edge.Count(m2, "PowerCycle") == 1 })
	r.tr.add("uncordon", fmt.Sprintf("reboots=%d", r.edge.Count(m2, "PowerCycle")))

	// reboot request
	rebootID, err := r.admin.Reboot(ctx, m1)
	require.NoError(t, err)
	r.eventually("rebooted", func() bool { s := r.status(ctx, m1); return s != nil && s.GetLastRebootId() == rebootID })
	r.tr.add("reboot request", fmt.Sprintf("power_cycles=%d", r.edge.Count(m1, "PowerCycle")), "last_reboot_id=request")

	// power-off request of an unallocated machine: Omni clears it, nothing happens
	_, err = r.admin.PowerOff(ctx, m1)
	require.NoError(t, err)
	require.Never(t, func() bool {
		return r.machine(ctx, m1).TypedSpec().Value.GetPowerOffRequestId() != "" || r.edge.Count(m1, "PowerOff") > 0
	},
		2*time.Second, 50*time.Millisecond, "%s: power-off of an unallocated machine", b.Name())
	r.tr.add("power-off unallocated", "request_on_infra_machine=false", fmt.Sprintf("power_offs=%d", r.edge.Count(m1, "PowerOff")))

	// the request stays in the user's config and would take effect on allocation: withdraw it
	require.NoError(t, r.admin.ClearPowerOff(ctx, m1))

	// allocation through a cluster: the installer boots with a way back to Omni
	require.NoError(t, b.Allocate(ctx, m1, "fidelity", "1.11.5"))
	r.eventually("allocated", func() bool { return r.machine(ctx, m1).TypedSpec().Value.GetClusterTalosVersion() != "" })
	r.eventually("installer booted", func() bool { return r.edge.Machine(m1).Booted == "install" })
	m = r.machine(ctx, m1)
	cluster, _ := m.Metadata().Labels().Get(omnires.LabelCluster)
	plan := r.edge.Machine(m1).Acked
	r.tr.add("allocate", "talos_version="+m.TypedSpec().Value.GetClusterTalosVersion(), "cluster_label="+cluster,
		"plan="+string(plan.Mode), fmt.Sprintf("talos_config_arg=%v", slices.ContainsFunc(plan.KernelArgs, func(a string) bool {
			return strings.HasPrefix(a, "talos.config=")
		})), "kernel="+plan.KernelURL)
	r.tr.add("install assets by site policy", installURLs(t, plan)...)

	// release: Omni resets the machine and sets a new wipe ID; the controller wipes it again
	wipeID := m.TypedSpec().Value.GetWipeId()
	require.NoError(t, b.Release(ctx, m1, "fidelity"))
	r.eventually("new wipe id", func() bool {
		m := r.machine(ctx, m1)

		return m.TypedSpec().Value.GetWipeId() != wipeID && m.TypedSpec().Value.GetClusterTalosVersion() == ""
	})
	r.eventually("wiped again and ready", func() bool {
		s := r.status(ctx, m1)

		return r.edge.Count(m1, "WipeDisks") == 2 && s != nil && s.GetReadyToUse()
	})
	_, stillLabelled := r.machine(ctx, m1).Metadata().Labels().Get(omnires.LabelCluster)
	r.tr.add("release", "wipe_id_changed=true", fmt.Sprintf("cluster_label=%v", stillLabelled), fmt.Sprintf("wipes=%d", r.edge.Count(m1, "WipeDisks")))

	// information collected (a real Talos reports in): the idle machine is powered off after the cooldown
	switch err = b.CollectInfo(ctx, m2); {
	case errors.Is(err, fidelity.ErrNotPossible):
		r.tr.skip("info collected", err.Error())
	case err != nil:
		require.NoError(t, err)
	default:
		r.eventually("powered off after info collected", func() bool { return !r.edge.Machine(m2).Power })
		r.tr.add("info collected", "powered_off=true")
	}

	// removing the machine from Omni tears the provider's side down
	require.NoError(t, b.RemoveLink(ctx, m2))
	r.eventually("infra machine gone", func() bool { return r.machine(ctx, m2) == nil })
	r.tr.add("remove link", "infra_machine_gone=true", fmt.Sprintf("status_gone=%v", r.status(ctx, m2) == nil))

	return r.tr
}

func documentKinds(docs string) []string {
	var kinds []string

	for _, line := range strings.Split(docs, "\n") {
		if k, ok := strings.CutPrefix(line, "kind: "); ok {
			kinds = append(kinds, strings.TrimSpace(k))
		}
	}

	slices.Sort(kinds)

	return kinds
}

func argKeys(args []string) []string {
	keys := make([]string, 0, len(args))

	for _, a := range args {
		k, _, _ := strings.Cut(a, "=")
		keys = append(keys, k)
	}

	slices.Sort(keys)

	return keys
}

// fidelitySites are the sites the scenario's machines are at.
var fidelitySites = []string{"site-a", "site-b"}

// siteHealth cuts site-b's link and waits (a minute at most) for Omni's provider health to name it, then
// restores it and waits for the health to clear.
func siteHealth(ctx context.Context, t *testing.T, b fidelity.Backend, edge *lifecycletest.FakeEdge, providerID string) []string {
	t.Helper()

	healthError := func() string {
		hs, err := safe.StateGetByID[*infra.ProviderHealthStatus](ctx, b.Admin(), providerID)
		if err != nil {
			return "unreadable: " + err.Error()
		}

		return hs.TypedSpec().Value.GetError()
	}

	cut := time.Now()
	edge.SetOffline("site-b", true)

	var named string

	require.Eventually(t, func() bool { named = healthError(); return strings.Contains(named, "offline: site-b") },
		time.Minute, 100*time.Millisecond, "provider health %q does not name site-b a minute after its link was cut", named)

	took := time.Since(cut)
	within := took < time.Minute
	t.Logf("%s: provider health named the cut site %s after its link was cut", b.Name(), took.Round(10*time.Millisecond))

	edge.SetOffline("site-b", false)
	require.Eventually(t, func() bool { return healthError() == "" }, time.Minute, 100*time.Millisecond, "provider health still %q", healthError())

	return []string{"offline=" + named, fmt.Sprintf("named_within_a_minute=%v", within), "back=healthy"}
}

// fidelityFactory is the image factory the scenario's controller resolves install assets with (nothing listens).
const fidelityFactory = "http://127.0.0.1:9"

// schematicIDs creates schematics in process, with the ID the factory would give them.
type schematicIDs struct{}

func (schematicIDs) SchematicCreate(_ context.Context, sc schematic.Schematic) (string, *schematic.Schematic, error) {
	id, err := sc.ID()

	return id, &sc, err
}

// installURLs is what a site's edge does with an install plan under each asset policy, as the edge's own
// boot-script decision gives it: at cache and offline sites the machine boots only edge-local files (and waits
// for them while the edge lacks them), at a passthrough site it fetches them from the factory itself.
func installURLs(t *testing.T, plan bootplans.Plan) []string {
	t.Helper()

	pb, err := bootplans.ToProto(plan)
	require.NoError(t, err)

	entry := boot.Entry{Known: true, UUID: metal.ID(pb.GetUuid()), Mode: pb.GetMode(), Install: pb.GetInstall()}
	require.True(t, strings.HasPrefix(pb.GetInstall().GetKernelUrl(), "/assets/talos/"), "edge-local kernel: %s", pb.GetInstall().GetKernelUrl())

	var out []string

	for _, tc := range []struct {
		policy string
		rule   httpd.UpstreamRule
	}{{"cache", httpd.UpstreamViaEdge}, {"offline", httpd.UpstreamNever}, {"passthrough", httpd.UpstreamAllowed}} {
		a := httpd.Decide(httpd.Default(), httpd.Request{Host: "edge.site", Plan: entry, Upstream: tc.rule, Now: time.Now()})

		switch a.Kind {
		case httpd.KindWait:
			require.NotEqual(t, httpd.UpstreamAllowed, tc.rule)
			out = append(out, tc.policy+"=waits_for_edge:"+strings.Join(a.Missing, ","))
		case httpd.KindKernel:
			require.Equal(t, httpd.UpstreamAllowed, tc.rule, "only a passthrough site's machines leave the site")
			require.True(t, strings.HasPrefix(a.Kernel.GetKernelUrl(), fidelityFactory+"/image/"), a.Kernel.GetKernelUrl())
			out = append(out, tc.policy+"=factory:"+strings.TrimPrefix(a.Kernel.GetKernelUrl(), fidelityFactory))
		default:
			require.Failf(t, "unexpected answer", "%s: %+v", tc.policy, a)
		}
	}

	return append(out, "installer="+strings.TrimPrefix(pb.GetInstall().GetInstaller(), "127.0.0.1:9/"))
}
