package fidelity

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/qemu/omni"
)

// ErrNotPossible marks a step a backend cannot take; the error says why (e.g. only a real Talos reaches a
// real Omni's Talos API).
var ErrNotPossible = errors.New("not possible with this Omni")

// Backend is an Omni the scenario runs against: a real Omni or the stand-in.
type Backend interface {
	// Name is "real" or "stand-in".
	Name() string
	// Controller returns the connection settings the controller uses (endpoint, provider key, dialer).
	Controller() controlleromni.Config
	// Admin is Omni's state seen with an admin identity (what Omni's UI and omnictl act as).
	Admin() state.State
	// Dial reaches Omni's addresses (the machine API included).
	Dial(ctx context.Context, addr string) (net.Conn, error)
	// Allocate adds the machine to a new cluster with the Talos version, as a user does.
	Allocate(ctx context.Context, machineID, cluster, talosVersion string) error
	// Release removes the machine's cluster (Omni resets it and sets a new wipe ID).
	Release(ctx context.Context, machineID, cluster string) error
	// CollectInfo is Omni collecting the machine's information (its Talos reported in); ErrNotPossible for a
	// real Omni with a machine that is not Talos.
	CollectInfo(ctx context.Context, machineID string) error
	// RemoveLink deletes the machine's SideroLink link, as a user removing the machine from Omni does.
	RemoveLink(ctx context.Context, machineID string) error
	// Reader is Omni's state seen by an account with the Reader role (the stand-in has no roles: its admin).
	Reader(ctx context.Context) (state.State, error)
}

// Provision joins machineID to Omni as Talos does at boot: SideroLink Provision at the address in the
// provider's join config, with the machine-facing join token, a WireGuard key and the JSON node-unique token.
// It returns the node-unique token sent.
func Provision(ctx context.Context, b Backend, machineID string) (string, error) {
	jc, err := safe.StateGetByID[*siderolink.ProviderJoinConfig](ctx, b.Admin(), b.Controller().ProviderID)
	if err != nil {
		return "", fmt.Errorf("read provider join config: %w", err)
	}

	token, err := omni.MachineJoinToken(jc)
	if err != nil {
		return "", err
	}

	var api *url.URL

	for _, arg := range jc.TypedSpec().Value.GetConfig().GetKernelArgs() {
		if v, ok := strings.CutPrefix(arg, "siderolink.api="); ok {
			if api, err = url.Parse(v); err != nil {
				return "", fmt.Errorf("siderolink.api: %w", err)
			}
		}
	}

	if api == nil {
		return "", errors.New("join config names no siderolink api")
	}

	creds := insecure.NewCredentials()
	if api.Scheme == "https" {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) // the lab's self-signed Omni
	}

	conn, err := grpc.NewClient("passthrough:///"+api.Host, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(b.Dial))
	if err != nil {
		return "", fmt.Errorf("dial siderolink api %s: %w", api.Host, err)
	}

	defer conn.Close() //nolint:errcheck

	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return "", err
	}

	unique := `{"Fingerprint":"fp-` + machineID + `","Token":"tok-` + machineID + `"}`
	version := "v1.11.5"

	if _, err = pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
		NodeUuid: machineID, NodePublicKey: key.PublicKey().String(), JoinToken: &token,
		NodeUniqueToken: &unique, TalosVersion: &version,
	}); err != nil {
		return "", fmt.Errorf("provision %s: %w", machineID, err)
	}

	return unique, nil
}

// removeLink deletes the machine's link as `omnictl delete link <id>` does.
func removeLink(ctx context.Context, st state.State, machineID string) error {
	if err := st.TeardownAndDestroy(ctx, siderolink.NewLink(machineID, nil).Metadata()); err != nil && !state.IsNotFoundError(err) {
		return fmt.Errorf("remove link %s: %w", machineID, err)
	}

	return nil
}
