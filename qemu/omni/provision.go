package omni

import (
	"context"
	"fmt"
	"net/url"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/jointoken"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
	talosruntime "github.com/siderolabs/talos/pkg/machinery/config/types/runtime"
	talossiderolink "github.com/siderolabs/talos/pkg/machinery/config/types/siderolink"
	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// providerJoinConfig builds the ProviderJoinConfig Omni publishes for a provider: a join token (version 2)
// whose signed extra data names the provider, and the Talos documents a machine needs to join.
func providerJoinConfig(providerID, secret, advertise string, tls bool) (*siderolink.ProviderJoinConfig, error) {
	tok, err := jointoken.NewWithExtraData(secret, jointoken.Version2, map[string]string{
		omnires.LabelInfraProviderID: providerID,
	})
	if err != nil {
		return nil, fmt.Errorf("build join token: %w", err)
	}

	encoded, err := tok.Encode()
	if err != nil {
		return nil, fmt.Errorf("encode join token: %w", err)
	}

	scheme := "grpc://"
	if tls {
		scheme = "https://"
	}

	apiURL, err := url.Parse(scheme + advertise + "?jointoken=" + url.QueryEscape(encoded))
	if err != nil {
		return nil, fmt.Errorf("siderolink api url: %w", err)
	}

	sl := talossiderolink.NewConfigV1Alpha1()
	sl.APIUrlConfig = meta.URL{URL: apiURL}

	sink := talosruntime.NewEventSinkV1Alpha1()
	sink.Endpoint = "[fdae:41e4:649b:9303::1]:8090"

	kmsgURL, err := url.Parse("tcp://[fdae:41e4:649b:9303::1]:8092")
	if err != nil {
		return nil, fmt.Errorf("kmsg url: %w", err)
	}

	kmsg := talosruntime.NewKmsgLogV1Alpha1()
	kmsg.MetaName = "omni-kmsg"
	kmsg.KmsgLogURL = meta.URL{URL: kmsgURL}

	c, err := container.New(sl, sink, kmsg)
	if err != nil {
		return nil, fmt.Errorf("join config documents: %w", err)
	}

	doc, err := c.EncodeString(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return nil, fmt.Errorf("encode join config documents: %w", err)
	}

	// As Omni does: the spec's join token is the provider's raw secret; the machine-facing (v2, signed) token
	// appears only inside the documents and kernel arguments.
	jc := siderolink.NewProviderJoinConfig(providerID)
	jc.Metadata().Labels().Set(omnires.LabelInfraProviderID, providerID)
	jc.TypedSpec().Value.JoinToken = secret
	jc.TypedSpec().Value.Config = &specs.JoinConfig{
		Config: doc,
		KernelArgs: []string{
			"siderolink.api=" + apiURL.String(),
			"talos.events.sink=" + sink.Endpoint,
			"talos.logging.kernel=" + kmsgURL.String(),
		},
	}

	return jc, nil
}

// provisioner serves SideroLink's ProvisionService: a machine presenting a provider's join token gets a Link
// labelled with that provider, from which Omni derives the InfraMachine.
type provisioner struct {
	pb.UnimplementedProvisionServiceServer

	s *Server
}

// Provision implements pb.ProvisionServiceServer. Its checks are Omni's: a join token that parses and is
// valid for the provider it names, a node unique token that is the JSON Talos sends, a real WireGuard key.
func (p *provisioner) Provision(ctx context.Context, req *pb.ProvisionRequest) (*pb.ProvisionResponse, error) {
	if req.GetNodeUuid() == "" {
		return nil, status.Error(codes.InvalidArgument, "node uuid is empty")
	}

	tok, err := jointoken.Parse(req.GetJoinToken())
	if err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "invalid join token %s", err)
	}

	// A provider's machines present the v2 token naming the provider; a plain token would be checked against
	// Omni's own join tokens, which the stand-in does not issue.
	if tok.Version != jointoken.Version2 || !tok.IsValid(p.s.token) {
		return nil, status.Error(codes.PermissionDenied, "unauthorized")
	}

	// Omni parses the token before anything else; its error text is what a machine sending hex gets.
	if _, err = jointoken.ParseNodeUniqueToken(req.GetNodeUniqueToken()); err != nil {
		return nil, err // already the status Omni answers with
	}

	if _, err = wgtypes.ParseKey(req.GetNodePublicKey()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "error parsing Wireguard key: %s", err)
	}

	providerID := tok.ExtraData[omnires.LabelInfraProviderID]

	link := siderolink.NewLink(req.GetNodeUuid(), &specs.SiderolinkSpec{})

	err = safe.StateModify(ctx, p.s.st, link, func(l *siderolink.Link) error {
		if providerID != "" {
			l.Metadata().Labels().Set(omnires.LabelInfraProviderID, providerID)
		}

		l.TypedSpec().Value.NodePublicKey = req.GetNodePublicKey()
		l.TypedSpec().Value.Connected = true
		l.TypedSpec().Value.NodeSubnet = "fdae:41e4:649b:9303::100/64"

		return nil
	})
	if err != nil {
		return nil, status.Errorf(codes.Internal, "create link: %v", err)
	}

	if req.GetNodeUniqueToken() != "" {
		if err = safe.StateModify(ctx, p.s.st, siderolink.NewNodeUniqueToken(req.GetNodeUuid()), func(t *siderolink.NodeUniqueToken) error {
			t.TypedSpec().Value.Token = req.GetNodeUniqueToken()

			return nil
		}); err != nil {
			return nil, status.Errorf(codes.Internal, "store node unique token: %v", err)
		}
	}

	if p.s.cfg.CollectInfoOnProvision {
		if err = NewAdmin(p.s.st).CollectInfo(ctx, req.GetNodeUuid(), req.GetTalosVersion()); err != nil {
			return nil, status.Errorf(codes.Internal, "collect machine info: %v", err)
		}
	}

	p.s.cfg.Logger.Info("machine provisioned", zap.String("component", "omni_siderolink"),
		zap.String("machine", req.GetNodeUuid()), zap.String("provider", providerID))

	serverKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "server key: %v", err)
	}

	return &pb.ProvisionResponse{
		ServerEndpoint:    []string{"127.0.0.1:50180"},
		ServerPublicKey:   serverKey.PublicKey().String(),
		NodeAddressPrefix: "fdae:41e4:649b:9303::100/64",
		ServerAddress:     "fdae:41e4:649b:9303::1",
	}, nil
}
