package admincli_test

import (
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/admincli"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

// upperConsole answers typed bytes upper-cased and records everything typed.
type upperConsole struct {
	consolepb.UnimplementedConsoleServer

	mu    sync.Mutex
	typed bytes.Buffer
	open  *consolepb.Open
}

func (u *upperConsole) Attach(stream consolepb.Console_AttachServer) error {
	f, err := stream.Recv()
	if err != nil {
		return err
	}

	u.mu.Lock()
	u.open = f.GetOpen()
	u.mu.Unlock()

	if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Attached{Attached: &consolepb.Attached{Write: true, Via: "ipmi-sol"}}}); err != nil {
		return err
	}

	for {
		f, err := stream.Recv()
		if err != nil {
			return nil // the operator detached
		}

		u.mu.Lock()
		u.typed.Write(f.GetData())
		u.mu.Unlock()

		if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Data{Data: bytes.ToUpper(f.GetData())}}); err != nil {
			return err
		}
	}
}

// TestConsoleDetaches: typed bytes reach the console up to the detach key (Ctrl-]), which ends the session;
// nothing after it is sent.
func TestConsoleDetaches(t *testing.T) {
	t.Parallel()

	sock := filepath.Join(t.TempDir(), "admin.sock")

	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)

	srv := grpc.NewServer()
	fake := &upperConsole{}
	consolepb.RegisterConsoleServer(srv, fake)

	go srv.Serve(ln) //nolint:errcheck

	t.Cleanup(srv.Stop)

	c, err := admincli.Dial(sock)
	require.NoError(t, err)

	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	var out, notes bytes.Buffer

	in := strings.NewReader("hello\r" + string(rune(admincli.DetachKey)) + "never-sent")
	require.NoError(t, c.Console(t.Context(), "m1", "alice@noc", true, in, &out, &notes))

	require.Equal(t, "HELLO\r", out.String())
	require.Contains(t, notes.String(), "[console of m1 via ipmi-sol, read-write, Ctrl-] detaches]")
	require.Contains(t, notes.String(), "[console detached]")

	fake.mu.Lock()
	defer fake.mu.Unlock()

	require.Equal(t, "hello\r", fake.typed.String())
	require.True(t, fake.open.GetWrite())
	require.Equal(t, "alice@noc", fake.open.GetOperator())
}
