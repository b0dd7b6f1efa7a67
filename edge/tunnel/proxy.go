package tunnel

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/outpost-metal/outpost/shared/metal"
)

// AgentServicePrefix is the method prefix the proxy forwards; everything else is Unimplemented.
const AgentServicePrefix = "/management.AgentService/"

// ProxyHandler returns the stream handler that forwards /management.AgentService/* calls to the
// tunnel of the machine in the call's machine-id metadata. Install it on the gRPC server the
// controller reaches (the uplink) with grpc.UnknownServiceHandler; no codec option is needed:
// frames travel as the unknown fields of an empty message, which keeps them byte-exact.
func (s *Server) ProxyHandler() grpc.StreamHandler {
	return s.proxy
}

// ServerOption returns grpc.UnknownServiceHandler(s.ProxyHandler()).
func (s *Server) ServerOption() grpc.ServerOption {
	return grpc.UnknownServiceHandler(s.ProxyHandler())
}

// headers that belong to the incoming HTTP/2 call, not to the forwarded one.
var hopHeaders = []string{":authority", "content-type", "user-agent", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout", "te"}

func (s *Server) proxy(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok || !strings.HasPrefix(method, AgentServicePrefix) {
		s.failures.WithLabelValues("unknown_method").Inc()

		return status.Errorf(codes.Unimplemented, "unknown method %q", method)
	}

	md, _ := metadata.FromIncomingContext(ss.Context())

	id, err := MachineIDFromMetadata(md)
	if err != nil {
		s.failures.WithLabelValues("machine_id").Inc()

		return status.Errorf(codes.InvalidArgument, "forward %s: %v", method, err)
	}

	// A call that carries an intent ID is carried out at most once, even without a tunnel now: a repeat of
	// one done is answered from the record.
	if intentID, err := s.intentOf(md); err != nil {
		s.failures.WithLabelValues("intent_id").Inc()

		return status.Errorf(codes.InvalidArgument, "forward %s: %v", method, err)
	} else if intentID != "" {
		return s.proxyIntent(ss, method, id, intentID, md)
	}

	ch := s.handler.KeyAsChannel(id)
	if !ch.Ready() {
		s.failures.WithLabelValues("no_tunnel").Inc()

		return status.Errorf(codes.Unavailable, "forward %s: machine %s has no agent tunnel", method, id)
	}

	callerCtx := ss.Context()

	ctx, cancel := context.WithCancel(callerCtx)
	defer cancel()

	if _, has := ctx.Deadline(); !has {
		ctx, cancel = context.WithTimeout(ctx, s.timeout) //nolint:govet // cancel is deferred below
		defer cancel()
	}

	out := md.Copy()
	for _, h := range hopHeaders {
		delete(out, h)
	}

	// The tunnel does not carry deadlines: pass ours on as grpc-timeout so the agent sees it.
	if deadline, has := ctx.Deadline(); has {
		out.Set("grpc-timeout", encodeTimeout(time.Until(deadline)))
	}

	cs, err := ch.NewStream(metadata.NewOutgoingContext(ctx, out),
		&grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return s.callError(callerCtx, id, method, err)
	}

	// Caller -> agent.
	go func() {
		for {
			m := &emptypb.Empty{}
			if err := ss.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend() //nolint:errcheck // the agent side reports its own errors
				} else {
					cancel()
				}

				return
			}

			if err := cs.SendMsg(m); err != nil {
				return // RecvMsg below reports it
			}
		}
	}()

	// Agent -> caller.
	if hdr, err := cs.Header(); err == nil && len(hdr) > 0 {
		if err := ss.SendHeader(hdr); err != nil {
			return s.callError(callerCtx, id, method, err)
		}
	}

	for {
		m := &emptypb.Empty{}

		err := cs.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			ss.SetTrailer(cs.Trailer())

			return nil
		}

		if err != nil {
			ss.SetTrailer(cs.Trailer())

			return s.callError(callerCtx, id, method, err)
		}

		if err := ss.SendMsg(m); err != nil {
			return s.callError(callerCtx, id, method, err)
		}
	}
}

// callError maps a failure of the forwarded call to what the caller should see: an agent that
// vanished mid-call surfaces from grpctunnel as Canceled and becomes Unavailable unless the
// caller itself cancelled.
func (s *Server) callError(callerCtx context.Context, id metal.ID, method string, err error) error {
	st, _ := status.FromError(err)

	switch {
	case callerCtx.Err() != nil:
		return status.FromContextError(callerCtx.Err()).Err()
	case st.Code() == codes.Canceled:
		s.failures.WithLabelValues("tunnel_closed").Inc()
		s.log.Debug("agent tunnel closed during a call", zap.Stringer("machine_id", id), zap.String("method", method))

		return status.Errorf(codes.Unavailable, "agent tunnel closed during the call (forward %s of machine %s)", method, id)
	default:
		// The agent's own status (or a deadline) passes through unchanged.
		return st.Err()
	}
}

// encodeTimeout renders d in the gRPC wire format (at most 8 digits and a unit).
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}

	units := []struct {
		unit string
		size time.Duration
	}{
		{"n", time.Nanosecond}, {"u", time.Microsecond}, {"m", time.Millisecond},
		{"S", time.Second}, {"M", time.Minute}, {"H", time.Hour},
	}

	const maxValue = 99999999

	for _, u := range units {
		v := (d + u.size - 1) / u.size
		if v <= maxValue {
			return strconv.FormatInt(int64(v), 10) + u.unit
		}
	}

	return strconv.FormatInt(maxValue, 10) + "H"
}
