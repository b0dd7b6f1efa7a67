package intents_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/intents"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

const machine = "5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c11"

func open(t *testing.T, dir string, maxEntries int) *intents.Store {
	t.Helper()

	cfg := intents.Default()
	cfg.Dir, cfg.MaxEntries = dir, maxEntries

	s, err := intents.Open(cfg, zaptest.NewLogger(t), time.Now)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() }) //nolint:errcheck

	return s
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRepeatedCallIsAnsweredFromTheRecord(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := open(t, dir, 100)

	var calls atomic.Int32

	wipe := func(context.Context) ([]byte, error) { calls.Add(1); return []byte("ok"), nil }

	for range 3 {
		resp, err := s.Do(t.Context(), "i1", machine, "/management.AgentService/WipeDisks", wipe)
		require.NoError(t, err)
		require.Equal(t, []byte("ok"), resp)
	}

	require.EqualValues(t, 1, calls.Load())

	// A failure is recorded too: the same ID is never tried again.
	fail := func(context.Context) ([]byte, error) {
		calls.Add(1)
		return nil, status.Error(codes.Unavailable, "bmc did not answer")
	}

	for range 2 {
		_, err := s.Do(t.Context(), "i2", machine, "/outpost.bmc.BMC/PowerCycle", fail)
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.ErrorContains(t, err, "bmc did not answer")
	}

	require.EqualValues(t, 2, calls.Load())

	// The same ID for another machine or call is refused, not carried out.
	_, err := s.Do(t.Context(), "i1", "5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c12", "/management.AgentService/WipeDisks", wipe)
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	_, err = s.Do(t.Context(), "i1", machine, "/outpost.bmc.BMC/PowerCycle", wipe)
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.EqualValues(t, 2, calls.Load())

	_, err = s.Do(t.Context(), "bad/id", machine, "op", wipe)
	require.Equal(t, codes.InvalidArgument, status.Code(err))

	// After a restart the records answer.
	require.NoError(t, s.Close())

	s2 := open(t, dir, 100)

	resp, err := s2.Do(t.Context(), "i1", machine, "/management.AgentService/WipeDisks", wipe)
	require.NoError(t, err)
	require.Equal(t, []byte("ok"), resp)
	_, err = s2.Do(t.Context(), "i2", machine, "/outpost.bmc.BMC/PowerCycle", fail)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.EqualValues(t, 2, calls.Load())

	out, err := s2.Outcome("i1", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_DONE, out.GetState())
	require.Equal(t, "/management.AgentService/WipeDisks", out.GetOp())

	out, err = s2.Outcome("i2", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_FAILED, out.GetState())
	require.EqualValues(t, codes.Unavailable, out.GetCode())

	out, err = s2.Outcome("never-sent", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_UNKNOWN, out.GetState())

	_, err = s2.Outcome("i1", "5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c12")
	require.Equal(t, codes.AlreadyExists, status.Code(err))
}

// A caller that goes away (an uplink cut) does not stop the call; a repeat joins it instead of starting
// another, and gets its outcome.
func TestCallOutlivesItsCallerAndRepeatsJoinIt(t *testing.T) {
	t.Parallel()

	s := open(t, t.TempDir(), 100)

	var (
		calls   atomic.Int32
		release = make(chan struct{})
		started = make(chan struct{})
	)

	wipe := func(ctx context.Context) ([]byte, error) {
		calls.Add(1)
		close(started)

		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	cut, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)

	go func() {
		_, err := s.Do(cut, "w", machine, "wipe", wipe)
		first <- err
	}()

	<-started
	cancel()
	require.Equal(t, codes.Canceled, status.Code(<-first))

	out, err := s.Outcome("w", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_RUNNING, out.GetState(), "the call went on without its caller")

	var wg sync.WaitGroup

	errs := make(chan error, 3)

	for range 3 {
		wg.Go(func() {
			_, err := s.Do(t.Context(), "w", machine, "wipe", wipe)
			errs <- err
		})
	}

	close(release)
	wg.Wait()
	close(errs)

	for err := range errs {
		require.NoError(t, err)
	}

	require.EqualValues(t, 1, calls.Load())
}

// An intent that started before a restart and has no outcome is never carried out again.
func TestInterruptedIntentIsNotCarriedOutAgain(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := open(t, dir, 100)

	release := make(chan struct{})
	started := make(chan struct{})

	go s.Do(context.Background(), "c", machine, "/outpost.bmc.BMC/PowerCycle", func(context.Context) ([]byte, error) { //nolint:errcheck
		close(started)
		<-release

		return nil, nil
	})

	<-started

	// What a restart finds on disk now: the start, no outcome.
	s2 := open(t, dir, 100)

	out, err := s2.Outcome("c", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_INTERRUPTED, out.GetState())

	_, err = s2.Do(t.Context(), "c", machine, "/outpost.bmc.BMC/PowerCycle", func(context.Context) ([]byte, error) {
		t.Error("an interrupted intent was carried out again")

		return nil, nil
	})
	require.Equal(t, codes.Aborted, status.Code(err))
	require.ErrorContains(t, err, "unknown")

	close(release)
	require.Eventually(t, func() bool {
		out, err := s.Outcome("c", machine)

		return err == nil && out.GetState() == intentspb.State_STATE_DONE
	}, 5*time.Second, 5*time.Millisecond)
}

// The store keeps at most MaxEntries intents, and its file stays bounded however many pass through.
func TestStoreIsBounded(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := open(t, dir, 8)

	ok := func(context.Context) ([]byte, error) { return nil, nil }

	for i := range 200 {
		_, err := s.Do(t.Context(), "n"+itoa(i), machine, "op", ok)
		require.NoError(t, err)
	}

	out, err := s.Outcome("n0", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_UNKNOWN, out.GetState(), "the oldest is forgotten")

	out, err = s.Outcome("n199", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_DONE, out.GetState())

	st, err := os.Stat(filepath.Join(dir, intents.FileName))
	require.NoError(t, err)
	require.Less(t, st.Size(), int64(200*100), "the file is compacted")

	// A torn tail (a crash mid-write) is dropped; what precedes it is kept.
	require.NoError(t, s.Close())

	f, err := os.OpenFile(filepath.Join(dir, intents.FileName), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{0, 0, 0, 40, 1, 2})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	s2 := open(t, dir, 8)
	out, err = s2.Outcome("n199", machine)
	require.NoError(t, err)
	require.Equal(t, intentspb.State_STATE_DONE, out.GetState())
}

func itoa(i int) string {
	const digits = "0123456789"

	if i < 10 {
		return digits[i : i+1]
	}

	return itoa(i/10) + digits[i%10:i%10+1]
}

type fakeBMC struct {
	bmcpb.UnimplementedBMCServer

	cycles atomic.Int32
	fail   error
}

func (f *fakeBMC) PowerCycle(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	f.cycles.Add(1)

	return &bmcpb.PowerResponse{}, f.fail
}

func TestBMCPowerActionsOncePerIntent(t *testing.T) {
	t.Parallel()

	inner := &fakeBMC{}
	b := intents.WrapBMC(inner, open(t, t.TempDir(), 100))

	req := &bmcpb.PowerRequest{Target: &bmcpb.Target{MachineId: machine}, IntentId: "r1"}
	for range 3 {
		_, err := b.PowerCycle(t.Context(), req)
		require.NoError(t, err)
	}

	require.EqualValues(t, 1, inner.cycles.Load())

	// Without an intent ID every call goes through.
	for range 2 {
		_, err := b.PowerCycle(t.Context(), &bmcpb.PowerRequest{Target: &bmcpb.Target{MachineId: machine}})
		require.NoError(t, err)
	}

	require.EqualValues(t, 3, inner.cycles.Load())

	inner.fail = status.Error(codes.DeadlineExceeded, "bmc timed out")
	_, err := b.PowerCycle(t.Context(), &bmcpb.PowerRequest{Target: &bmcpb.Target{MachineId: machine}, IntentId: "r2"})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	_, err = b.PowerCycle(t.Context(), &bmcpb.PowerRequest{Target: &bmcpb.Target{MachineId: machine}, IntentId: "r2"})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.EqualValues(t, 4, inner.cycles.Load())

	_, err = b.PowerCycle(t.Context(), &bmcpb.PowerRequest{Target: &bmcpb.Target{}, IntentId: "r3"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}
