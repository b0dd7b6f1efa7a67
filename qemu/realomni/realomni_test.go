package realomni_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/api/omni/management"
	"github.com/siderolabs/omni/client/pkg/client"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/qemu/lab/tmpcheck"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// TestMain checks for leaked goroutines, and runs the tests in a temporary directory of their own that they
// must leave empty (tmpcheck).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(tmpcheck.Wrap(m))
}

// clusterTemplate is a cluster with no machines: Omni accepts it only when it knows both versions, which
// it learns from the fake factory and registry.
const clusterTemplate = `kind: Cluster
name: realomni-test
kubernetes:
  version: v1.34.2
talos:
  version: v1.11.5
---
kind: ControlPlane
machines: []
`

// TestRealOmni starts a real Omni in a fresh network namespace, creates an infra provider as a user does,
// reads what Omni makes for it, creates a cluster and restarts Omni on the same data.
func TestRealOmni(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a real Omni (minutes on a cold cache); skipped with -short")
	}

	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and a private mount namespace for Omni")
	}

	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()

	log := zaptest.NewLogger(t)

	bins, err := realomni.Build(ctx, realomni.BuildOptions{Logger: log})
	require.NoError(t, err)

	ns := netns(t)

	o, err := realomni.Start(ctx, realomni.Config{Dir: t.ArtifactDir(), Netns: ns, Binaries: bins, Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() {
		o.Stop()

		if t.Failed() {
			b, _ := os.ReadFile(o.Log()) //nolint:errcheck
			t.Logf("omni log (%s; kept with -artifacts), last 8 KiB:\n%s", o.Log(), b[max(0, len(b)-8192):])
		}
	})

	require.NotEmpty(t, o.AdminKey())
	require.Contains(t, string(o.CAPEM), "BEGIN CERTIFICATE")

	providerKey, err := o.CreateProvider(ctx, "bare-metal")
	require.NoError(t, err)
	require.NotEqual(t, o.AdminKey(), providerKey)

	provider := connect(t, o, providerKey).Omni().State()
	adminClient := connect(t, o, o.AdminKey())
	admin := adminClient.Omni().State()

	joinConfig := func(st state.State) *siderolink.ProviderJoinConfig {
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()

		r, err := st.WatchFor(wctx, siderolink.NewProviderJoinConfig("bare-metal").Metadata(),
			state.WithEventTypes(state.Created, state.Updated))
		require.NoError(t, err, "ProviderJoinConfig for the provider")

		jc, ok := r.(*siderolink.ProviderJoinConfig)
		require.True(t, ok, "%T", r)

		return jc
	}

	jc := joinConfig(provider)
	spec := jc.TypedSpec().Value
	// The raw secret: 32 random bytes in base62, whose length varies (43 or 44 characters).
	require.Regexp(t, "^[0-9A-Za-z]{42,44}$", spec.GetJoinToken(), "the join token is the raw secret")
	require.Contains(t, spec.GetConfig().GetConfig(), "jointoken=v2%3A", "the machine-facing token (v2:...) is in the config")
	require.Contains(t, spec.GetConfig().GetConfig(), strings.TrimPrefix(o.MachineAPIURL, "grpc://"))
	require.NotEmpty(t, spec.GetConfig().GetKernelArgs())

	// The fake factory and registry are enough for Omni to list versions.
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()

	r, err := admin.WatchFor(wctx, omnires.NewTalosVersion("1.11.5").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err, "TalosVersion 1.11.5")

	tv, ok := r.(*omnires.TalosVersion)
	require.True(t, ok, "%T", r)
	require.Contains(t, tv.TypedSpec().Value.GetCompatibleKubernetesVersions(), "1.34.2")

	_, err = admin.WatchFor(wctx, omnires.NewKubernetesVersion("1.34.2").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err, "KubernetesVersion 1.34.2")

	// Schematics go through Omni to the fake factory, which gives them the real factory's IDs.
	sch, err := adminClient.Management().CreateSchematic(ctx, &management.CreateSchematicRequest{
		Extensions: []string{"siderolabs/iscsi-tools"}, TalosVersion: "1.11.5",
	})
	require.NoError(t, err)
	require.Contains(t, o.Factory().Schematics(), sch.GetSchematicId())

	require.NoError(t, o.SyncClusterTemplate(ctx, []byte(clusterTemplate)))

	cluster, err := safe.StateGetByID[*omnires.Cluster](ctx, admin, "realomni-test")
	require.NoError(t, err)
	require.Equal(t, "1.11.5", cluster.TypedSpec().Value.GetTalosVersion(), "Omni keeps Talos versions without the v")

	// Restart on the same data: the provider key still works and everything is still there.
	require.NoError(t, o.Restart(ctx))

	again := connect(t, o, providerKey).Omni().State()
	require.Equal(t, spec.GetJoinToken(), joinConfig(again).TypedSpec().Value.GetJoinToken())

	_, err = safe.StateGetByID[*omnires.Cluster](ctx, connect(t, o, o.AdminKey()).Omni().State(), "realomni-test")
	require.NoError(t, err, "the cluster survived the restart")

	// Nothing went to a public factory or registry, and the fake answered everything Omni asked.
	require.Empty(t, o.Factory().Unanswered())

	logb, err := os.ReadFile(o.Log())
	require.NoError(t, err)

	for _, public := range []string{"factory.talos.dev", "ghcr.io", "registry.k8s.io", "docker.io"} {
		require.NotContains(t, string(logb), public)
	}
}

// netns creates a network namespace with its loopback up, deleted when the test ends.
func netns(t *testing.T) string {
	t.Helper()

	b := make([]byte, 3)
	_, err := rand.Read(b)
	require.NoError(t, err)

	ns := "ro-test-" + hex.EncodeToString(b)

	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() {
		out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput()
		require.NoError(t, err, "%s", out)
	})

	out, err = exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput()
	require.NoError(t, err, "%s", out)

	return ns
}

// connect is an Omni client with the service account key, its connection dialed inside Omni's namespace.
func connect(t *testing.T, o *realomni.Omni, key string) *client.Client {
	t.Helper()

	c, err := client.New(o.Endpoint, client.WithServiceAccount(key), client.WithInsecureSkipTLSVerify(true),
		client.WithGrpcOpts(grpc.WithContextDialer(o.DialContext)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })

	return c
}
