package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	pb "github.com/siderolabs/siderolink/api/siderolink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// talosVersion is what the lab machine reports as its Talos version.
const talosVersion = "v1.11.5"

// nodeUniqueToken is the node unique token as Talos sends it: JSON with the fingerprint of the machine's
// network hardware (SHA-256 of its sorted MAC addresses) and a token Talos keeps in META. The lab machine has no
// META; it derives the token from its UUID so it stays the same across boots, as a real machine's does.
func nodeUniqueToken(uuid string) (string, error) {
	var macs [][]byte

	links, _ := os.ReadDir("/sys/class/net") //nolint:errcheck // no interfaces: an empty fingerprint input
	for _, l := range links {
		if l.Name() == "lo" {
			continue
		}

		b, err := os.ReadFile(filepath.Join("/sys/class/net", l.Name(), "address"))
		if err != nil {
			continue
		}

		if hw, err := net.ParseMAC(strings.TrimSpace(string(b))); err == nil {
			macs = append(macs, hw)
		}
	}

	slices.SortFunc(macs, bytes.Compare)

	fp := sha256.New()
	for _, m := range macs {
		fp.Write(m)
	}

	tok := sha256.Sum256([]byte("node-unique-token/" + uuid))

	b, err := json.Marshal(struct{ Fingerprint, Token string }{hex.EncodeToString(fp.Sum(nil)), hex.EncodeToString(tok[:16])})
	if err != nil {
		return "", fmt.Errorf("encode node unique token: %w", err)
	}

	return string(b), nil
}

// provision calls SideroLink's Provision with the join token from the API URL, as Talos does on boot.
func provision(ctx context.Context, uuid string, api *url.URL) error {
	token := api.Query().Get("jointoken")
	if token == "" {
		return errors.New("siderolink api url has no join token")
	}

	creds := insecure.NewCredentials()
	if api.Scheme == "https" {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}

	conn, err := grpc.NewClient("passthrough:///"+api.Host, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("dial siderolink api %s: %w", api.Host, err)
	}
	defer conn.Close() //nolint:errcheck

	// Talos generates a WireGuard key per boot and sends its public half.
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return fmt.Errorf("wireguard key: %w", err)
	}

	unique, err := nodeUniqueToken(uuid)
	if err != nil {
		return err
	}

	version := talosVersion

	if _, err := pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
		NodeUuid:        uuid,
		NodePublicKey:   key.PublicKey().String(),
		JoinToken:       &token,
		NodeUniqueToken: &unique,
		TalosVersion:    &version,
	}); err != nil {
		return fmt.Errorf("provision at %s: %w", api.Host, err)
	}

	return nil
}
