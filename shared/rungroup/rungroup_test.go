package rungroup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/shared/rungroup"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// blocker runs until it is told to stop, then reports its name on stopped.
func blocker(name string, stopped chan<- string) rungroup.Component {
	return rungroup.Component{Name: name, Run: func(ctx context.Context) error {
		<-ctx.Done()
		stopped <- name

		return nil
	}}
}

// One component returning, for whatever reason, stops every other one; the error names it.
func TestRun(t *testing.T) {
	t.Parallel()

	errBroken := errors.New("broken")

	for _, tc := range []struct {
		name    string
		ender   func(ctx context.Context) error
		cancel  bool // the test cancels before the run
		wantIs  error
		wantMsg string
	}{
		{
			name:    "one fails",
			ender:   func(context.Context) error { return errBroken },
			wantIs:  errBroken,
			wantMsg: "ender: broken",
		},
		{
			name:    "one returns nil before it is told to stop",
			ender:   func(context.Context) error { return nil },
			wantIs:  rungroup.ErrStoppedOnItsOwn,
			wantMsg: "ender: stopped on its own",
		},
		{
			name: "one fails on its way out after the cancellation",
			ender: func(ctx context.Context) error {
				<-ctx.Done()

				return errBroken
			},
			cancel:  true,
			wantIs:  errBroken,
			wantMsg: "ender: broken",
		},
		{
			name: "cancelled, every component returns nil",
			ender: func(ctx context.Context) error {
				<-ctx.Done()

				return nil
			},
			cancel: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			stopped := make(chan string, 2)
			comps := []rungroup.Component{blocker("a", stopped), blocker("b", stopped), {Name: "ender", Run: tc.ender}}

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()

			if tc.cancel {
				cancel()
			}

			err := rungroup.Run(ctx, zaptest.NewLogger(t), comps)
			if tc.wantIs == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.wantIs)
				require.EqualError(t, err, tc.wantMsg)
			}

			require.ElementsMatch(t, []string{"a", "b"}, []string{<-stopped, <-stopped}, "every other component stopped")
		})
	}
}

// Every start and stop is logged once, in one style: the component's name, and why it stopped.
func TestRunLogs(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zap.InfoLevel)

	stopped := make(chan string, 1)
	err := rungroup.Run(t.Context(), zap.New(core), []rungroup.Component{
		blocker("server", stopped),
		{Name: "quitter", Run: func(context.Context) error { return nil }},
	})
	require.ErrorIs(t, err, rungroup.ErrStoppedOnItsOwn)
	require.Equal(t, "server", <-stopped)

	reasons := map[string]string{}

	for _, e := range logs.FilterMessage("component stopped").All() {
		fields := e.ContextMap()
		reasons[fmt.Sprint(fields["component"])] = fmt.Sprint(fields["reason"])
	}

	require.Equal(t, map[string]string{"server": "told to stop", "quitter": "ended early"}, reasons)
	require.Equal(t, 2, logs.FilterMessage("component started").Len())
}

// A group closes what was opened for it once every component has returned, newest first, and only once
// whichever of Run and Close comes first.
func TestGroupCloses(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		use     func(t *testing.T, ctx context.Context, g *rungroup.Group) []error
		wantRan bool
	}{
		{
			name: "run, then close",
			use: func(_ *testing.T, ctx context.Context, g *rungroup.Group) []error {
				return []error{g.Run(ctx), g.Close()}
			},
			wantRan: true,
		},
		{
			name: "run twice",
			use: func(t *testing.T, ctx context.Context, g *rungroup.Group) []error {
				t.Helper()

				first := g.Run(ctx)
				require.ErrorIs(t, g.Run(ctx), rungroup.ErrAlreadyRun)

				return []error{first}
			},
			wantRan: true,
		},
		{
			name: "closed, never run",
			use: func(t *testing.T, ctx context.Context, g *rungroup.Group) []error {
				t.Helper()

				first := g.Close()
				require.ErrorIs(t, g.Run(ctx), rungroup.ErrAlreadyRun)

				return []error{first, g.Close()}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			g := rungroup.New(zaptest.NewLogger(t))

			var ran, returned atomic.Bool

			var closed []string

			g.Go("server", func(ctx context.Context) error {
				ran.Store(true)
				<-ctx.Done()
				returned.Store(true)

				return nil
			})

			for _, name := range []string{"store", "listener", "socket"} {
				g.OnClose(name, func() error {
					require.Equal(t, ran.Load(), returned.Load(), "closed while a component runs")

					closed = append(closed, name)

					return nil
				})
			}

			ctx, cancel := context.WithCancel(t.Context())
			cancel()

			for _, err := range tc.use(t, ctx, g) {
				require.NoError(t, err)
			}

			require.Equal(t, tc.wantRan, ran.Load())
			require.Equal(t, []string{"socket", "listener", "store"}, closed)
		})
	}
}

// Failures to close are named and joined with the components' error; closing what is already closed is none.
func TestGroupCloseErrors(t *testing.T) {
	t.Parallel()

	errStuck := errors.New("stuck")

	g := rungroup.New(zaptest.NewLogger(t))
	g.Go("failing", func(context.Context) error { return errors.New("boom") })
	g.OnClose("store", func() error { return errStuck })
	g.OnClose("listener", func() error { return fmt.Errorf("close tcp: %w", net.ErrClosed) })

	err := g.Run(t.Context())
	require.ErrorIs(t, err, errStuck)
	require.EqualError(t, err, "failing: boom\nclose store: stuck")
}

func TestIgnoreClosed(t *testing.T) {
	t.Parallel()

	other := errors.New("other")

	for _, tc := range []struct {
		name string
		in   error
		want error
	}{
		{"nil", nil, nil},
		{"closed", net.ErrClosed, nil},
		{"closed, wrapped", &net.OpError{Op: "close", Net: "tcp", Err: net.ErrClosed}, nil},
		{"another error", other, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.want, rungroup.IgnoreClosed(tc.in))
		})
	}
}
