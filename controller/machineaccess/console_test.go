package machineaccess_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

// fakeEdge is an edge's console: it echoes typed bytes upper-cased and refuses a writer while one holds it.
type fakeEdge struct {
	consolepb.UnimplementedConsoleServer

	mu     sync.Mutex
	opens  []*consolepb.Open
	writer string
}

func (e *fakeEdge) Attach(stream consolepb.Console_AttachServer) error {
	f, err := stream.Recv()
	if err != nil {
		return err
	}

	open := f.GetOpen()

	e.mu.Lock()
	e.opens = append(e.opens, open)
	held := e.writer

	if open.GetWrite() && held == "" {
		e.writer = open.GetOperator()
	}
	e.mu.Unlock()

	if open.GetWrite() && held != "" {
		return status.Errorf(codes.FailedPrecondition, "console of %s: console is held for writing by %s", open.GetMachine(), held)
	}

	if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Attached{Attached: &consolepb.Attached{Write: open.GetWrite(), Via: "ipmi-sol"}}}); err != nil {
		return err
	}

	for {
		f, err := stream.Recv()
		if err != nil {
			return nil // the operator left
		}

		if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Data{Data: bytes.ToUpper(f.GetData())}}); err != nil {
			return err
		}
	}
}

type targets map[string]string

func (t targets) Target(id string) (string, *bmcpb.Target, bool) {
	site, ok := t[id]
	if !ok {
		return "", nil, false
	}

	return site, &bmcpb.Target{Host: "192.0.2.7", Username: "admin", Password: "secret"}, true
}

func serve(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()

	srv := grpc.NewServer()
	register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	return conn
}

func attach(t *testing.T, cl consolepb.ConsoleClient, machine, operator string, write bool) (consolepb.Console_AttachClient, error) {
	t.Helper()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)

	s, err := cl.Attach(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(&consolepb.Input{Kind: &consolepb.Input_Open{Open: &consolepb.Open{Machine: machine, Write: write, Operator: operator}}}))

	if _, err := s.Recv(); err != nil {
		return nil, err
	}

	return s, nil
}

// TestConsolesRelay: the controller carries a console to the machine's site's edge with the BMC it knows,
// passes the edge's refusal of a second writer through, and refuses machines it has no BMC for.
func TestConsolesRelay(t *testing.T) {
	t.Parallel()

	edge := &fakeEdge{}
	edgeConn := serve(t, func(s *grpc.Server) { consolepb.RegisterConsoleServer(s, edge) })

	access := machineaccess.New(func(site string) (grpc.ClientConnInterface, error) {
		if site != "site1" {
			return nil, errors.New("offline")
		}

		return edgeConn, nil
	}, locator{here: "site1"})

	svc := machineaccess.NewConsoles(access, targets{here: "site1", there: "site2"}, zaptest.NewLogger(t), time.Now)
	cl := consolepb.NewConsoleClient(serve(t, func(s *grpc.Server) { consolepb.RegisterConsoleServer(s, svc) }))

	w, err := attach(t, cl, here, "alice@noc", true)
	require.NoError(t, err)
	require.NoError(t, w.Send(&consolepb.Input{Kind: &consolepb.Input_Data{Data: []byte("hello")}}))

	f, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, "HELLO", string(f.GetData()))

	edge.mu.Lock()
	first := edge.opens[0]
	edge.mu.Unlock()
	require.Equal(t, here, first.GetTarget().GetMachineId())
	require.Equal(t, "secret", first.GetTarget().GetPassword(), "the edge gets the credentials the operator never sees")
	require.Equal(t, "alice@noc", first.GetOperator())

	_, err = attach(t, cl, here, "bob@noc", true)
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.Contains(t, err.Error(), "alice@noc")

	_, err = attach(t, cl, "unknown-machine", "bob@noc", false)
	require.Equal(t, codes.NotFound, status.Code(err))

	_, err = attach(t, cl, there, "bob@noc", false)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.True(t, strings.Contains(err.Error(), "site2"), err.Error())

	// An oversized frame ends the session.
	require.NoError(t, w.Send(&consolepb.Input{Kind: &consolepb.Input_Data{Data: make([]byte, 4<<10)}}))

	for {
		if _, err := w.Recv(); err != nil {
			break
		}
	}

	// The session's end is counted before its status reaches the operator (the handler's return).
	sessions, attached, bytes := metricsOf(svc)
	for _, c := range []struct {
		mode, result string
		want         float64
	}{
		{"write", "ok", 1}, {"write", "refused", 1}, {"read", "unknown", 1}, {"read", "offline", 1}, {"read", "ok", 0},
	} {
		require.InDelta(t, c.want, testutil.ToFloat64(sessions.WithLabelValues(c.mode, c.result)), 0, "sessions %s/%s", c.mode, c.result)
	}

	require.InDelta(t, 0, testutil.ToFloat64(attached), 0, "no session is attached any more")
	require.InDelta(t, 5, testutil.ToFloat64(bytes.WithLabelValues("out")), 0, "HELLO went out")
	require.InDelta(t, 5, testutil.ToFloat64(bytes.WithLabelValues("in")), 0, "hello was typed; the oversized frame was not relayed")
}

// metricsOf returns the console service's session counter, attached gauge and byte counter.
func metricsOf(svc *machineaccess.Consoles) (sessions *prometheus.CounterVec, attached prometheus.Gauge, bytes *prometheus.CounterVec) {
	for _, c := range svc.Collectors() {
		switch m := c.(type) {
		case *prometheus.CounterVec:
			if sessions == nil {
				sessions = m
			} else {
				bytes = m
			}
		case prometheus.Gauge:
			attached = m
		}
	}

	return sessions, attached, bytes
}
