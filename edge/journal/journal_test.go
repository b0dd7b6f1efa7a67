package journal_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/edge/journal"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func cfg(dir string) journal.Config {
	c := journal.Default()
	c.Dir = dir
	c.RetryInterval = 10 * time.Millisecond

	return c
}

func open(t *testing.T, c journal.Config) *journal.Journal {
	t.Helper()

	j, err := journal.Open(c, zaptest.NewLogger(t), journal.Deps{})
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() }) //nolint:errcheck

	return j
}

func ev(file string) *bootpb.Event {
	return &bootpb.Event{Kind: &bootpb.Event_PxeSeen{PxeSeen: &bootpb.PXESeen{File: file, Via: "tftp"}}}
}

func files(evs []*bootpb.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.GetPxeSeen().GetFile())
	}

	return out
}

func seqs(evs []*bootpb.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.GetSequence())
	}

	return out
}

func TestAppendAckReplay(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	j := open(t, cfg(dir))

	for _, f := range []string{"a", "b", "c", "d"} {
		_, err := j.Append(ev(f))
		require.NoError(t, err)
	}

	p, err := j.Pending(10)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2, 3, 4}, seqs(p))
	require.NotNil(t, p[0].GetTime())

	require.NoError(t, j.Ack(2))
	id := j.ID()
	require.NoError(t, j.Close())

	// After a restart: the unacknowledged events, same order, same journal, sequence continues.
	j2 := open(t, cfg(dir))
	require.Equal(t, id, j2.ID())

	p, err = j2.Pending(10)
	require.NoError(t, err)
	require.Equal(t, []string{"c", "d"}, files(p))
	require.Equal(t, []uint64{3, 4}, seqs(p))

	seq, err := j2.Append(ev("e"))
	require.NoError(t, err)
	require.EqualValues(t, 5, seq)

	require.NoError(t, j2.Ack(5))
	require.NoError(t, j2.Close())

	j3 := open(t, cfg(dir))
	p, err = j3.Pending(10)
	require.NoError(t, err)
	require.Empty(t, p)

	seq, err = j3.Append(ev("f"))
	require.NoError(t, err)
	require.EqualValues(t, 6, seq, "sequence numbers never repeat")
}

func TestTornTailIsCut(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	j := open(t, cfg(dir))
	_, err := j.Append(ev("a"))
	require.NoError(t, err)
	_, err = j.Append(ev("b"))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	path := filepath.Join(dir, journal.LogName)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data[:len(data)-3], 0o600)) // a crash mid-write of "b"

	j2 := open(t, cfg(dir))
	p, err := j2.Pending(10)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, files(p))

	seq, err := j2.Append(ev("c"))
	require.NoError(t, err)
	require.EqualValues(t, 2, seq)
	require.NoError(t, j2.Close())

	j3 := open(t, cfg(dir))
	p, err = j3.Pending(10)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c"}, files(p), "appends after the cut are readable")
}

func TestBoundedAndCompacted(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	c := cfg(dir)
	c.MaxEvents = 5
	c.MaxBytes = 600

	j := open(t, c)

	for i := range 40 {
		_, err := j.Append(ev(string(rune('a' + i%26))))
		require.NoError(t, err)
	}

	p, err := j.Pending(100)
	require.NoError(t, err)
	require.Equal(t, []uint64{36, 37, 38, 39, 40}, seqs(p), "oldest dropped beyond MaxEvents")
	require.EqualValues(t, 35, j.Counters()["journal_dropped"])

	require.NoError(t, j.Ack(38))

	st, err := os.Stat(filepath.Join(dir, journal.LogName))
	require.NoError(t, err)
	require.LessOrEqual(t, st.Size(), 2*c.MaxBytes, "file stays bounded")
	require.NoError(t, j.Close())

	j2 := open(t, c)
	p, err = j2.Pending(100)
	require.NoError(t, err)
	require.Equal(t, []uint64{39, 40}, seqs(p))
}

// fakeController acknowledges like the controller: everything up to the last event of a batch,
// after an optional number of failures; it records what it received.
type fakeController struct {
	mu       sync.Mutex
	failures int
	got      []uint64
	calls    chan struct{}
}

func (f *fakeController) Publish(_ context.Context, in *bootpb.PublishRequest, _ ...grpc.CallOption) (*bootpb.PublishResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	defer func() {
		select {
		case f.calls <- struct{}{}:
		default:
		}
	}()

	if f.failures > 0 {
		f.failures--

		return nil, errors.New("controller unavailable")
	}

	for _, e := range in.GetEvents() {
		f.got = append(f.got, e.GetSequence())
	}

	return &bootpb.PublishResponse{Acked: in.GetEvents()[len(in.GetEvents())-1].GetSequence()}, nil
}

func (f *fakeController) received() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()

	return append([]uint64(nil), f.got...)
}

func TestDeliverInOrderWithRetries(t *testing.T) {
	t.Parallel()

	c := cfg(t.TempDir())
	c.BatchSize = 2
	j := open(t, c)

	for _, f := range []string{"a", "b", "c"} {
		_, err := j.Append(ev(f))
		require.NoError(t, err)
	}

	ctl := &fakeController{failures: 2, calls: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- j.Deliver(ctx, ctl) }()

	require.Eventually(t, func() bool { return len(ctl.received()) == 3 }, 5*time.Second, 5*time.Millisecond)

	// New events while connected are delivered promptly.
	_, err := j.Append(ev("d"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(ctl.received()) == 4 }, 5*time.Second, 5*time.Millisecond)

	// The controller has event 4; the journal acknowledges it when Publish returns.
	require.Eventually(t, func() bool { return j.Counters()["journal_pending"] == 0 }, 5*time.Second, 5*time.Millisecond)

	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []uint64{1, 2, 3, 4}, ctl.received(), "in order, once")

	p, err := j.Pending(10)
	require.NoError(t, err)
	require.Empty(t, p)
}

func TestRecordCodec(t *testing.T) {
	t.Parallel()

	b := journal.AppendRecord(nil, 1, []byte("payload"))
	b = journal.AppendRecord(b, 2, []byte{0, 0, 0, 0, 0, 0, 0, 9})

	recs, n := journal.DecodeAll(b)
	require.Len(t, recs, 2)
	require.Equal(t, len(b), n)
	require.Equal(t, []byte("payload"), recs[0].Body)

	for name, bad := range map[string][]byte{
		"short header":  b[:5],
		"short body":    b[:12],
		"bad checksum":  append([]byte{0, 0, 0, 2, 0, 0, 0, 0}, 1, 1),
		"huge length":   {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"zero length":   {0, 0, 0, 0, 0, 0, 0, 0},
		"unknown type":  journal.AppendRecord(nil, 9, nil),
		"ack too short": journal.AppendRecord(nil, 2, []byte{1}),
	} {
		_, _, err := journal.DecodeRecord(bad)
		require.ErrorIs(t, err, journal.ErrCorrupt, name)
	}
}

func FuzzDecodeRecords(f *testing.F) {
	f.Add(journal.AppendRecord(journal.AppendRecord(nil, 1, []byte("x")), 2, make([]byte, 8)))
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 1})

	f.Fuzz(func(t *testing.T, b []byte) {
		recs, n := journal.DecodeAll(b)
		if n < 0 || n > len(b) {
			t.Fatalf("valid prefix %d of %d bytes", n, len(b))
		}

		// Re-encoding the decoded records reproduces the valid prefix exactly.
		var again []byte
		for _, r := range recs {
			again = journal.AppendRecord(again, r.Type, r.Body)
		}

		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
