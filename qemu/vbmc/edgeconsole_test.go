package vbmc_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

// consoleJournal is the edge's journal as the console service writes it.
type consoleJournal struct {
	mu     sync.Mutex
	events []*bootpb.ConsoleSession
}

func (j *consoleJournal) Record(e *bootpb.Event) {
	j.mu.Lock()
	defer j.mu.Unlock()

	j.events = append(j.events, e.GetConsoleSession())
}

func (j *consoleJournal) sessions() []*bootpb.ConsoleSession {
	j.mu.Lock()
	defer j.mu.Unlock()

	return append([]*bootpb.ConsoleSession(nil), j.events...)
}

// consoleClient is an operator attached to the edge's console service.
type consoleClient struct {
	stream consolepb.Console_AttachClient
	out    *lockedBuffer
	notes  *lockedBuffer
	done   chan error
}

func attachConsole(t *testing.T, cl consolepb.ConsoleClient, target *bmcpb.Target, operator string, write bool) (*consoleClient, error) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	stream, err := cl.Attach(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&consolepb.Input{Kind: &consolepb.Input_Open{Open: &consolepb.Open{Target: target, Write: write, Operator: operator}}}))

	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}

	require.Equal(t, write, first.GetAttached().GetWrite())

	c := &consoleClient{stream: stream, out: &lockedBuffer{}, notes: &lockedBuffer{}, done: make(chan error, 1)}

	go func() {
		for {
			f, err := stream.Recv()
			if err != nil {
				c.done <- err

				return
			}

			c.out.Write(f.GetData())             //nolint:errcheck
			c.notes.Write([]byte(f.GetNotice())) //nolint:errcheck
		}
	}()

	t.Cleanup(func() {
		stream.CloseSend() //nolint:errcheck
		cancel()
		<-c.done
	})

	return c, nil
}

func (c *consoleClient) typeLine(t *testing.T, s string) {
	t.Helper()
	require.NoError(t, c.stream.Send(&consolepb.Input{Kind: &consolepb.Input_Data{Data: []byte(s + "\n")}}))
}

// TestEdgeConsoleOverSOL: the edge's console service reaches a vBMC's serial line over IPMI SOL. A writer's
// typing reaches the line and its answer comes back; a reader sees output and its typing is not sent; a second
// writer is refused with the first one named.
func TestEdgeConsoleOverSOL(t *testing.T) {
	ch := vbmc.NewChassis()
	b, port := startIPMIBMC(t, ch)
	c := vbmc.NewConsole()
	b.SetConsole(c)
	guest := echoGuest(t, c)

	journal := &consoleJournal{}
	svc := bmc.NewConsoleService(newManager(t, nil, time.Now)).WithJournal(journal)
	srv := grpc.NewServer()
	svc.Register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	go srv.Serve(ln)            //nolint:errcheck
	t.Cleanup(srv.GracefulStop) // waits for the handlers: their IPMI sessions close while the BMC still answers

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	cl := consolepb.NewConsoleClient(conn)
	target := &bmcpb.Target{MachineId: "m1", Host: "127.0.0.1", IpmiPort: uint32(port), Username: user, Password: password}

	start := time.Now()
	w, err := attachConsole(t, cl, target, "alice", true)
	require.NoError(t, err)
	t.Logf("attached for writing in %s", time.Since(start))

	w.typeLine(t, "hello-edge")
	waitFor(t, "the guest's answer through the edge", func() bool { return strings.Contains(w.out.String(), "ECHO hello-edge") }, w.out)

	_, err = attachConsole(t, cl, target, "bob", true)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "a second writer is refused: %v", err)
	require.Contains(t, err.Error(), "alice", "the refusal names who holds the console")

	// The first writer leaves; a reader attaches (the BMC serves one SOL session, so one at a time here).
	require.NoError(t, w.stream.CloseSend())
	require.Error(t, <-w.done)
	w.done <- nil // for its cleanup

	// Both are journaled at the edge: the refusal, and the writer's session with what it typed.
	waitFor(t, "the writer's session journaled", func() bool { return len(journal.sessions()) == 2 })
	got := journal.sessions()
	require.Equal(t, "refused", got[0].GetResult(), "the name, for older controllers")
	require.Equal(t, bootpb.ConsoleResult_CONSOLE_RESULT_REFUSED, got[0].GetConsoleResult())
	require.Equal(t, "bob", got[0].GetOperator())
	require.Equal(t, "ok", got[1].GetResult())
	require.Equal(t, bootpb.ConsoleResult_CONSOLE_RESULT_OK, got[1].GetConsoleResult())
	require.Equal(t, "alice", got[1].GetOperator())
	require.Equal(t, uint64(len("hello-edge\n")), got[1].GetBytesIn())
	require.Positive(t, got[1].GetBytesOut())

	var r *consoleClient

	waitFor(t, "the console free for a reader", func() bool {
		r, err = attachConsole(t, cl, target, "carol", false)

		return err == nil
	})

	r.typeLine(t, "from-reader")
	waitFor(t, "the read-only notice", func() bool { return strings.Contains(r.notes.String(), "read-only") }, r.notes)

	// Output reaches a reader: the guest prints on its own.
	_, err = guest.Write([]byte("GUEST-OUTPUT-FOR-READER\r\n"))
	require.NoError(t, err)
	waitFor(t, "output at the reader", func() bool { return strings.Contains(r.out.String(), "GUEST-OUTPUT-FOR-READER") }, r.out)
	require.NotContains(t, r.out.String(), "ECHO from-reader", "a reader's typing never reaches the line")
}
