package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"

	pb "github.com/siderolabs/siderolink/api/siderolink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// talosVersion is what the lab machine reports as its Talos version.
const talosVersion = "v1.11.0"

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

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}

	// Talos keeps its unique token in META; the lab derives a stable one from the UUID.
	sum := sha256.Sum256([]byte("node-unique-token/" + uuid))
	unique := hex.EncodeToString(sum[:16])
	version := talosVersion

	if _, err := pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
		NodeUuid:        uuid,
		NodePublicKey:   base64.StdEncoding.EncodeToString(key),
		JoinToken:       &token,
		NodeUniqueToken: &unique,
		TalosVersion:    &version,
	}); err != nil {
		return fmt.Errorf("provision at %s: %w", api.Host, err)
	}

	return nil
}
