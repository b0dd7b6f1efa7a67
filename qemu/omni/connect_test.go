package omni_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/siderolabs/omni/client/pkg/jointoken"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/shared/nettest"
)

func connectConfig(s *standIn, key string) controlleromni.Config {
	cfg := controlleromni.Default()
	cfg.Endpoint = s.endpoint
	cfg.ServiceAccountKey = key
	cfg.HealthInterval = 50 * time.Millisecond
	cfg.RetryMin = 20 * time.Millisecond
	cfg.RetryMax = 100 * time.Millisecond

	return cfg
}

func TestControllerRegistersAndHeartbeats(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())

	conn, err := controlleromni.Connect(ctx, connectConfig(s, s.ProviderKey()), zaptest.NewLogger(t))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	ps, err := safe.StateGetByID[*infra.ProviderStatus](ctx, s.State(), "bare-metal")
	require.NoError(t, err)
	require.Contains(t, ps.Metadata().Labels().Raw(), omnires.LabelIsStaticInfraProvider)
	require.Equal(t, "Outpost", ps.TypedSpec().Value.Name)

	rt, err := conn.NewRuntime(func(context.Context) error { return errors.New("no site connected") })
	require.NoError(t, err)

	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- rt.Run(rctx) }()

	// two distinct heartbeats
	var first time.Time

	_, err = s.State().WatchFor(ctx, infra.NewProviderHealthStatus("bare-metal").Metadata(), state.WithCondition(func(r resource.Resource) (bool, error) {
		hs, ok := r.(*infra.ProviderHealthStatus)
		if !ok {
			return false, nil // not written yet
		}

		hb := hs.TypedSpec().Value.LastHeartbeatTimestamp.AsTime()
		if first.IsZero() {
			first = hb
		}

		return hb.After(first) && hs.TypedSpec().Value.Error == "no site connected", nil
	}))
	require.NoError(t, err)

	rcancel()
	require.NoError(t, <-done)
}

// strangerKey is a well-formed provider key Omni never issued.
func strangerKey(t *testing.T) string {
	t.Helper()

	key, err := pgp.GenerateKey(omni.ProviderIdentity("bare-metal"), "", omni.ProviderIdentity("bare-metal"), time.Hour)
	require.NoError(t, err)

	enc, err := serviceaccount.Encode(omni.ProviderIdentity("bare-metal"), key)
	require.NoError(t, err)

	return enc
}

func TestControllerStartUpErrors(t *testing.T) {
	t.Parallel()

	s := startStandIn(t, omni.Default())

	strangerKey := strangerKey(t)

	deadAddr := nettest.RefusingAddr(t)

	for _, tc := range []struct {
		name   string
		modify func(*controlleromni.Config)
		want   error
	}{
		{name: "unreachable", want: controlleromni.ErrUnreachable, modify: func(c *controlleromni.Config) {
			c.Endpoint = "grpc://" + deadAddr
			c.ConnectTimeout = 300 * time.Millisecond
		}},
		{name: "unregistered key", want: controlleromni.ErrBadKey, modify: func(c *controlleromni.Config) { c.ServiceAccountKey = strangerKey }},
		{name: "undecodable key", want: controlleromni.ErrBadKey, modify: func(c *controlleromni.Config) { c.ServiceAccountKey = "bm9wZQ==" }},
		{name: "wrong provider id", want: controlleromni.ErrWrongProviderID, modify: func(c *controlleromni.Config) { c.ProviderID = "other" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()

			cfg := connectConfig(s, s.ProviderKey())
			tc.modify(&cfg)

			_, err := controlleromni.Connect(ctx, cfg, zaptest.NewLogger(t))
			require.ErrorIs(t, err, tc.want)
			t.Log(err)
		})
	}
}

// A running controller never gives up on Omni: a key Omni refuses is retried with backoff (an operator may be
// fixing it in Omni), each failure counted by reason, and no session runs on it.
func TestKeeperRetriesRefusedKey(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())

	cfg := connectConfig(s, strangerKey(t))

	metrics := controlleromni.NewKeeperMetrics()
	sessions := make(chan struct{}, 1)

	keeper, err := controlleromni.NewKeeper(cfg, zaptest.NewLogger(t), metrics, func(ctx context.Context, _ *controlleromni.Connection) error {
		sessions <- struct{}{}
		<-ctx.Done()

		return nil
	})
	require.NoError(t, err)

	kctx, kcancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- keeper.Run(kctx) }()

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.SessionsEnded("bad_key")) >= 3
	}, 20*time.Second, 10*time.Millisecond, "refusals retried and counted")
	require.Empty(t, sessions, "no session on a refused key")

	kcancel()
	require.NoError(t, <-done)

	// with the key Omni issued, the session runs; its requests to Omni are counted by method
	cfg.ServiceAccountKey = s.ProviderKey()
	metrics = controlleromni.NewKeeperMetrics()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics))

	keeper, err = controlleromni.NewKeeper(cfg, zaptest.NewLogger(t), metrics, func(ctx context.Context, conn *controlleromni.Connection) error {
		for range 3 {
			if _, err := conn.State().List(ctx, infra.NewMachine("").Metadata()); err != nil {
				return err
			}
		}

		sessions <- struct{}{}
		<-ctx.Done()

		return nil
	})
	require.NoError(t, err)

	kctx, kcancel = context.WithCancel(ctx)
	defer kcancel()

	go func() { done <- keeper.Run(kctx) }()

	select {
	case <-sessions:
	case <-ctx.Done():
		t.Fatal("no session with a working key")
	}

	require.Equal(t, 3.0, omniRequests(t, reg, "List"), "each list of the session was one request")
	require.Positive(t, omniRequests(t, reg, "Get"), "the provider's registration reads its resources")

	kcancel()
	require.NoError(t, <-done)
}

// omniRequests is outpost_omni_requests_total{method} as reg gathers it (0 when not counted yet).
func omniRequests(t *testing.T, reg prometheus.Gatherer, method string) float64 {
	t.Helper()

	families, err := reg.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() != "outpost_omni_requests_total" {
			continue
		}

		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == method {
					return m.GetCounter().GetValue()
				}
			}
		}
	}

	return 0
}

func TestJoinConfigFollowsOmni(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())

	conn, err := controlleromni.Connect(ctx, connectConfig(s, s.ProviderKey()), zaptest.NewLogger(t))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	extra, err := controlleromni.ParseExtraDocuments([]byte("apiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: 10.0.0.53\n"))
	require.NoError(t, err)

	changes := make(chan controlleromni.JoinConfig, 4)
	joinConfig := conn.NewJoinConfigController("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", extra,
		func(jc controlleromni.JoinConfig) { changes <- jc })

	rt, err := conn.NewRuntime(func(context.Context) error { return nil }, joinConfig)
	require.NoError(t, err)

	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- rt.Run(wctx) }()

	defer func() {
		wcancel()

		if err := <-done; !errors.Is(err, context.Canceled) {
			require.NoError(t, err)
		}
	}()

	jc := <-changes
	require.Contains(t, jc.Documents, "kind: SideroLinkConfig")
	require.Contains(t, jc.Documents, "kind: EventSinkConfig")
	require.Contains(t, jc.Documents, "kind: TrustedRootsConfig")
	require.Contains(t, jc.Documents, "kind: ResolverConfig", "the operator's extra documents are served with Omni's")

	// the machine-facing token is in the siderolink.api argument (the spec's join_token is the raw secret)
	var machineToken string

	for _, a := range jc.KernelArgs {
		if v, ok := strings.CutPrefix(a, "siderolink.api="); ok {
			u, err := url.Parse(v)
			require.NoError(t, err)

			machineToken = u.Query().Get("jointoken")
		}
	}

	tok, err := jointoken.Parse(machineToken)
	require.NoError(t, err)
	require.Equal(t, "bare-metal", tok.ExtraData[omnires.LabelInfraProviderID], "the join token names the provider")

	// Omni changes it: the watcher follows
	_, err = safe.StateUpdateWithConflicts(ctx, s.State(), siderolink.NewProviderJoinConfig("bare-metal").Metadata(), func(r *siderolink.ProviderJoinConfig) error {
		r.TypedSpec().Value.Config.Config += "---\napiVersion: v1alpha1\nkind: KmsgLogConfig\nname: extra\nurl: tcp://[fdae::1]:1\n"

		return nil
	})
	require.NoError(t, err)

	jc = <-changes
	require.Contains(t, jc.Documents, "name: extra")
}

func TestControllerOverTLS(t *testing.T) {
	t.Parallel()

	cert, err := omni.SelfSignedCertificate("127.0.0.1")
	require.NoError(t, err)

	cfg := omni.Default()
	cfg.TLSCertificate = cert
	s := startStandIn(t, cfg)

	for _, tc := range []struct {
		name string
		skip bool
		want error
	}{
		{name: "insecure skip verify", skip: true},
		{name: "unknown ca", want: controlleromni.ErrTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()

			c := connectConfig(s, s.ProviderKey())
			c.Endpoint = "https://" + s.addr
			c.InsecureSkipVerify = tc.skip

			conn, err := controlleromni.Connect(ctx, c, zaptest.NewLogger(t))
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				t.Log(err)

				return
			}

			require.NoError(t, err)
			require.NoError(t, conn.Close())
		})
	}
}
