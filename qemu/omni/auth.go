package omni

import (
	"context"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/go-api-signature/pkg/message"
	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"github.com/siderolabs/omni/client/pkg/omni/resources/system"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const stateServicePrefix = "/cosi.resource.State/"

type identityKey struct{}

// authenticator verifies the service-account signature of every State call with the registered public keys.
type authenticator struct {
	keys map[string]*pgp.Key
}

func newAuthenticator(k *keyring) (*authenticator, error) {
	keys, err := k.publicKeys()
	if err != nil {
		return nil, err
	}

	return &authenticator{keys: keys}, nil
}

func (a *authenticator) authenticate(ctx context.Context, method string) (context.Context, error) {
	if !strings.HasPrefix(method, stateServicePrefix) {
		return ctx, nil // SideroLink Provision authenticates by join token
	}

	md, _ := metadata.FromIncomingContext(ctx)
	msg := message.NewGRPC(md, method)

	sig, err := msg.Signature()
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "missing or malformed signature: %v", err)
	}

	key, ok := a.keys[sig.Identity]
	if !ok {
		return nil, status.Errorf(codes.Unauthenticated, "unknown identity %q", sig.Identity)
	}

	if sig.KeyFingerprint != key.Fingerprint() {
		return nil, status.Errorf(codes.Unauthenticated, "key %s is not registered for %q", sig.KeyFingerprint, sig.Identity)
	}

	if err = msg.VerifySignature(key); err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "invalid signature for %q: %v", sig.Identity, err)
	}

	return context.WithValue(ctx, identityKey{}, sig.Identity), nil
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := a.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}

	return handler(ctx, req)
}

type streamWithContext struct {
	grpc.ServerStream
	ctx context.Context // the stream's own context, replaced
}

func (s streamWithContext) Context() context.Context { return s.ctx }

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := a.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}

	return handler(srv, streamWithContext{ServerStream: ss, ctx: ctx})
}

// authorize applies the rules Omni applies to an infra provider's service account: its own namespace fully,
// its own ProviderStatus, health status and the InfraMachineStatuses, read access to the shared infra-provider
// namespace (InfraMachine read-only but for finalizers), nothing of Omni's default namespace. Admins may do anything.
func authorize(st state.State, providerID string) state.CoreState {
	filtered := state.Filter(st, func(ctx context.Context, access state.Access) error {
		if err := providerRule(ctx, access, providerID); err != nil {
			return err
		}

		return ownMachine(ctx, st, access, providerID)
	})

	return &infraMachineGuard{CoreState: filtered, full: st, providerID: providerID}
}

func identityFrom(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)

	return id
}

func providerRule(ctx context.Context, access state.Access, providerID string) error {
	identity := identityFrom(ctx)

	switch identity {
	case AdminIdentity:
		return nil
	case ProviderIdentity(providerID):
	default:
		return status.Errorf(codes.PermissionDenied, "identity %q has no role", identity)
	}

	denied := status.Errorf(codes.PermissionDenied, "infra provider %q may not %s %s/%s",
		providerID, verbName(access.Verb), access.ResourceNamespace, access.ResourceType)

	switch access.ResourceNamespace {
	case resources.InfraProviderSpecificNamespacePrefix + providerID:
		return nil
	case meta.NamespaceName:
		if access.Verb.Readonly() {
			return nil
		}
	case resources.EphemeralNamespace:
		if access.Verb.Readonly() && access.ResourceType == system.SysVersionType {
			return nil
		}
	case resources.InfraProviderEphemeralNamespace:
		if access.ResourceType != infra.InfraProviderHealthStatusType {
			return denied
		}

		if access.Verb.Readonly() {
			return nil
		}

		return ownID(access, providerID)
	case resources.InfraProviderNamespace:
		if access.Verb.Readonly() {
			return nil
		}

		switch access.ResourceType {
		case infra.InfraProviderStatusType:
			return ownID(access, providerID)
		case infra.InfraMachineStatusType:
			return nil
		case infra.InfraMachineType:
			if access.Verb == state.Update {
				return nil // finalizer changes only, checked by infraMachineGuard
			}
		case siderolink.ProviderJoinConfigType, infra.BMCConfigType:
		}
	}

	return denied
}

// ownMachine lets a provider write the InfraMachineStatus of its own machines only.
func ownMachine(ctx context.Context, st state.State, access state.Access, providerID string) error {
	if identityFrom(ctx) == AdminIdentity || access.ResourceType != infra.InfraMachineStatusType ||
		(access.Verb != state.Create && access.Verb != state.Update) {
		return nil
	}

	m, err := st.Get(ctx, infra.NewMachine(access.ResourceID).Metadata())
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "infra provider %q may not report on unknown machine %q", providerID, access.ResourceID)
	}

	if owner, _ := m.Metadata().Labels().Get(omnires.LabelInfraProviderID); owner != providerID {
		return status.Errorf(codes.PermissionDenied, "machine %q belongs to infra provider %q, not %q", access.ResourceID, owner, providerID)
	}

	return nil
}

func ownID(access state.Access, providerID string) error {
	if access.Verb.Readonly() || access.ResourceID == providerID {
		return nil
	}

	return status.Errorf(codes.InvalidArgument, "infra provider %q may only write its own %s, not %q",
		providerID, access.ResourceType, access.ResourceID)
}

func verbName(v state.Verb) string {
	return [...]string{"get", "list", "watch", "create", "update", "destroy"}[v]
}

// infraMachineGuard refuses a provider's InfraMachine update that changes anything but finalizers.
type infraMachineGuard struct {
	state.CoreState
	full       state.State
	providerID string
}

func (g *infraMachineGuard) Update(ctx context.Context, r resource.Resource, opts ...state.UpdateOption) error {
	if cfg, ok := r.(*omnires.InfraMachineConfig); ok {
		if err := g.validateConfig(ctx, cfg); err != nil {
			return err
		}
	}

	if identityFrom(ctx) != AdminIdentity && r.Metadata().Type() == infra.InfraMachineType {
		cur, err := g.full.Get(ctx, r.Metadata())
		if err != nil {
			return err
		}

		if !sameButFinalizers(cur, r) {
			return status.Errorf(codes.PermissionDenied, "infra provider %q may not modify InfraMachine %s", g.providerID, r.Metadata().ID())
		}
	}

	return g.CoreState.Update(ctx, r, opts...)
}

// maxRequestIDLength is Omni's cap on the request IDs of an InfraMachineConfig.
const maxRequestIDLength = 128

// validateConfig applies Omni's checks to an InfraMachineConfig update: accepted is final, request IDs are
// bounded.
func (g *infraMachineGuard) validateConfig(ctx context.Context, cfg *omnires.InfraMachineConfig) error {
	spec := cfg.TypedSpec().Value

	if len(spec.GetRequestedRebootId()) > maxRequestIDLength || len(spec.GetPowerOffRequestId()) > maxRequestIDLength {
		return status.Errorf(codes.InvalidArgument, "request ID longer than %d bytes", maxRequestIDLength)
	}

	cur, err := safe.StateGet[*omnires.InfraMachineConfig](ctx, g.full, cfg.Metadata())
	if err != nil {
		if state.IsNotFoundError(err) {
			return nil
		}

		return err
	}

	if cur.TypedSpec().Value.GetAcceptanceStatus() == specs.InfraMachineConfigSpec_ACCEPTED &&
		spec.GetAcceptanceStatus() != specs.InfraMachineConfigSpec_ACCEPTED {
		return status.Error(codes.InvalidArgument, "an accepted machine cannot be rejected or set back to pending acceptance")
	}

	return nil
}

func sameButFinalizers(a, b resource.Resource) bool {
	if !a.Metadata().Labels().Equal(*b.Metadata().Labels()) || !a.Metadata().Annotations().Equal(*b.Metadata().Annotations()) {
		return false
	}

	pa, errA := protobuf.FromResource(a)
	pb, errB := protobuf.FromResource(b)

	if errA != nil || errB != nil {
		return false
	}

	sa, errA := pa.Marshal()
	sb, errB := pb.Marshal()

	if errA != nil || errB != nil {
		return false
	}

	return proto.Equal(sa.GetSpec(), sb.GetSpec())
}
