package omni

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
)

// CallKey names one kind of State API call: who made it (the service-account identity) and which method
// ("Get", "List", "Watch", "Create", "Update", "Destroy", ...).
type CallKey struct {
	Identity string
	Method   string
}

// CallCounter counts the State API calls the stand-in serves, by identity and method, so that a benchmark can
// tell how often a provider reads Omni (Config.Calls; nil counts nothing). A Watch counts once, when it opens.
// It is safe for concurrent use.
type CallCounter struct {
	mu     sync.Mutex
	counts map[CallKey]uint64
}

// NewCallCounter returns an empty counter.
func NewCallCounter() *CallCounter { return &CallCounter{counts: map[CallKey]uint64{}} }

// Snapshot returns the counts so far.
func (c *CallCounter) Snapshot() map[CallKey]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()

	out := make(map[CallKey]uint64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}

	return out
}

func (c *CallCounter) count(ctx context.Context, fullMethod string) {
	method, ok := strings.CutPrefix(fullMethod, stateServicePrefix)
	if !ok {
		return // SideroLink Provision: not a State call
	}

	k := CallKey{Identity: identityFrom(ctx), Method: method}

	c.mu.Lock()
	c.counts[k]++
	c.mu.Unlock()
}

// unary counts a unary call; it runs after authentication, so the identity is known.
func (c *CallCounter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c.count(ctx, info.FullMethod)

	return handler(ctx, req)
}

// stream counts a streaming call (List, Watch) when it opens.
func (c *CallCounter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c.count(ss.Context(), info.FullMethod)

	return handler(srv, ss)
}
