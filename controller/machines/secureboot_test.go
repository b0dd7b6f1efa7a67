package machines_test

import (
	"context"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

const (
	on   = bootpb.SecureBoot_SECURE_BOOT_ON
	off  = bootpb.SecureBoot_SECURE_BOOT_OFF
	none = bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED
)

// Who decides a machine's Secure Boot, first match wins: an operator's word for the machine, its site's
// setting, its BMC's answer; nobody at all leaves it to the edge's own setting.
func TestEnforcesSecureBoot(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name          string
		bmc, override bootpb.SecureBoot
		site          bootpb.SecureBoot
		want          bootpb.SecureBoot
		source        string
	}{
		{name: "nobody says", want: none},
		{name: "the bmc", bmc: on, want: on, source: "bmc"},
		{name: "the site over the bmc", bmc: on, site: off, want: off, source: "site"},
		{name: "the operator over the site", bmc: on, site: off, override: on, want: on, source: "operator"},
		{name: "the operator alone", override: off, want: off, source: "operator"},
	} {
		loc := machines.Location{SecureBoot: tc.bmc, SecureBootOverride: tc.override}
		got, source := loc.EnforcesSecureBoot(tc.site)
		require.Equal(t, tc.want, got, tc.name)
		require.Equal(t, tc.source, source, tc.name)
	}
}

// What a machine's BMC and an operator said of its Secure Boot is kept in Omni with its location, and read
// back by a restarted controller, also when its edge reported the machine before the records were read.
func TestSecureBootPersists(t *testing.T) {
	t.Parallel()

	const (
		a       = "4c4c4544-0042-3510-8052-b4c04f384833"
		b       = "4c4c4544-0042-3510-8052-b4c04f384834"
		unknown = "4c4c4544-0042-3510-8052-b4c04f384899"
	)

	st := state.WrapCore(namespaced.NewState(inmem.Build))
	types := resources.NewTypes("bare-metal")
	require.NoError(t, types.Register())

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	first := machines.NewLocations(zaptest.NewLogger(t))
	done := make(chan error, 1)

	go func() { done <- first.Persist(ctx, st, types) }()

	for _, id := range []metal.ID{a, b} {
		_, err := first.Seen("site-a", id)
		require.NoError(t, err)
	}

	first.SetSecureBoot(a, on)
	first.SetSecureBoot(b, off)

	loc, err := first.OverrideSecureBoot(b, on)
	require.NoError(t, err)
	got, _ := loc.EnforcesSecureBoot(none)
	require.Equal(t, on, got, "the operator's word over the bmc's")

	_, err = first.OverrideSecureBoot(unknown, on)
	require.ErrorIs(t, err, machines.ErrNotLocated)

	first.SetSecureBoot(unknown, on) // ignored: nothing to attach it to
	_, ok := first.Locate(unknown)
	require.False(t, ok)

	require.Eventually(t, func() bool {
		list, err := st.List(ctx, types.NewMachineLocation("").Metadata())
		if err != nil || len(list.Items) != 2 {
			return false
		}

		for _, r := range list.Items {
			if loc, ok := r.(*resources.MachineLocation); !ok || loc.TypedSpec().Value.GetSecureBoot() == none {
				return false
			}
		}

		return true
	}, 5*time.Second, 5*time.Millisecond, "both records written with what the BMCs said")

	cancel()
	require.NoError(t, <-done)

	// the restarted controller; its edge reported b before the records were read
	second := machines.NewLocations(zaptest.NewLogger(t))
	_, err = second.Seen("site-a", b)
	require.NoError(t, err)
	require.NoError(t, second.Load(t.Context(), st, types))

	la, lb := must(second.Locate(a)), must(second.Locate(b))
	require.Equal(t, []bootpb.SecureBoot{on, none}, []bootpb.SecureBoot{la.SecureBoot, la.SecureBootOverride})
	require.Equal(t, []bootpb.SecureBoot{off, on}, []bootpb.SecureBoot{lb.SecureBoot, lb.SecureBootOverride}, "merged into the edge's report")

	// handed back: the BMC's answer decides again
	loc, err = second.OverrideSecureBoot(b, none)
	require.NoError(t, err)
	got, source := loc.EnforcesSecureBoot(none)
	require.Equal(t, off, got)
	require.Equal(t, "bmc", source)
}

// An operator's words for Secure Boot: on, off, auto; anything else is refused naming what is wanted.
func TestParseSecureBoot(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]bootpb.SecureBoot{"on": on, "off": off, "auto": none, "": none} {
		got, err := machines.ParseSecureBoot(in)
		require.NoError(t, err)
		require.Equal(t, want, got, in)
		require.Equal(t, map[bootpb.SecureBoot]string{on: "on", off: "off", none: "auto"}[want], machines.SecureBootName(got))
	}

	_, err := machines.ParseSecureBoot("yes")
	require.EqualError(t, err, `secure boot must be "on", "off" or "auto": "yes"`)
}
