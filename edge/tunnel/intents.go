package tunnel

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
	"github.com/outpost-metal/outpost/shared/metal"
)

// IntentRunner carries out a call at most once per intent ID (edge/intents.Store): fn runs apart from ctx's
// cancellation and returns the encoded response; a repeat gets the recorded outcome.
type IntentRunner interface {
	Do(ctx context.Context, id, machineID, op string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error)
}

// intentOf is the call's intent ID ("" for none, or when the server has no IntentRunner).
func (s *Server) intentOf(md metadata.MD) (string, error) {
	if s.intents == nil {
		return "", nil
	}

	return intentspb.FromMetadata(md)
}

// proxyIntent forwards a unary agent call that carries an intent ID through the IntentRunner: its one request
// is read first, the call to the agent runs on even when the caller goes away (an uplink cut), and a repeat
// of the same intent is answered without reaching the agent again.
func (s *Server) proxyIntent(ss grpc.ServerStream, method string, machineID metal.ID, intentID string, md metadata.MD) error {
	req := &emptypb.Empty{}
	if err := ss.RecvMsg(req); err != nil {
		return status.Errorf(codes.InvalidArgument, "forward %s: read the request: %v", method, err)
	}

	// a unary call: nothing may follow its one request
	if err := ss.RecvMsg(&emptypb.Empty{}); !errors.Is(err, io.EOF) {
		return status.Errorf(codes.InvalidArgument, "forward %s with intent %s: want exactly one request message", method, intentID)
	}

	resp, err := s.intents.Do(ss.Context(), intentID, machineID.String(), method, func(ctx context.Context) ([]byte, error) {
		return s.forwardUnary(ctx, machineID, method, md, req)
	})
	if err != nil {
		return err
	}

	m := &emptypb.Empty{}
	if err = proto.Unmarshal(resp, m); err != nil {
		return status.Errorf(codes.Internal, "forward %s: recorded response: %v", method, err)
	}

	return ss.SendMsg(m)
}

// forwardUnary makes one unary call to the machine's agent and returns its encoded response.
func (s *Server) forwardUnary(ctx context.Context, machineID metal.ID, method string, md metadata.MD, req *emptypb.Empty) ([]byte, error) {
	ch := s.handler.KeyAsChannel(machineID)
	if !ch.Ready() {
		s.failures.WithLabelValues("no_tunnel").Inc()

		return nil, status.Errorf(codes.Unavailable, "forward %s: machine %s has no agent tunnel", method, machineID)
	}

	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc

		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}

	out := md.Copy()
	for _, h := range hopHeaders {
		delete(out, h)
	}

	if deadline, has := ctx.Deadline(); has {
		out.Set("grpc-timeout", encodeTimeout(time.Until(deadline)))
	}

	resp := &emptypb.Empty{}
	if err := ch.Invoke(metadata.NewOutgoingContext(ctx, out), method, req, resp); err != nil {
		return nil, s.callError(context.Background(), machineID, method, err)
	}

	return proto.Marshal(resp)
}
