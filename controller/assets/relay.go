package assets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Files gives the relay the asset files the controller holds, by SHA-256.
type Files interface {
	// OpenAsset opens the file with this digest; fs.ErrNotExist when the controller does not have it.
	OpenAsset(sha256 string) (*os.File, error)
}

// DirFiles is a directory of asset files named by their lower-case hex SHA-256.
type DirFiles struct {
	Dir string
}

// OpenAsset opens <Dir>/<sha256> (the name is checked before; an os.Root keeps links inside Dir).
func (d DirFiles) OpenAsset(sha256 string) (*os.File, error) {
	if !digestRe.MatchString(sha256) {
		return nil, fmt.Errorf("open asset %q: %w", sha256, fs.ErrNotExist)
	}

	root, err := os.OpenRoot(d.Dir)
	if err != nil {
		return nil, fmt.Errorf("open asset directory: %w", err)
	}
	defer root.Close() //nolint:errcheck

	return root.Open(sha256)
}

var digestRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// RelayConfig configures the relay.
type RelayConfig struct {
	// ChunkSize is the payload of each Chunk message.
	ChunkSize int
}

// DefaultRelay returns the default relay configuration.
func DefaultRelay() RelayConfig {
	return RelayConfig{ChunkSize: 256 << 10}
}

// Validate checks the configuration.
func (c RelayConfig) Validate() error {
	if c.ChunkSize < 1024 || c.ChunkSize > 3<<20 {
		return fmt.Errorf("relay chunk size %d out of range 1 KiB..3 MiB (gRPC's default message limit is 4 MiB)", c.ChunkSize)
	}

	return nil
}

// Relay is the AssetRelay service the controller serves on every site session: it streams asset files in
// chunks from a requested offset (so an edge resumes after a cut) and records each site's reports and bytes
// relayed in the catalog. Edges verify the digest of what they receive.
type Relay struct {
	assetsapi.UnimplementedAssetRelayServer

	cfg     RelayConfig
	files   Files
	catalog *Catalog
	site    func(context.Context) (string, bool)
	log     *zap.Logger
}

// NewRelay returns the relay service; site tells the calling site from a handler's context
// (sites.SiteFromContext in the controller).
func NewRelay(cfg RelayConfig, files Files, catalog *Catalog, site func(context.Context) (string, bool), log *zap.Logger) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	return &Relay{cfg: cfg, files: files, catalog: catalog, site: site, log: log.With(zap.String("component", "asset-relay"))}, nil
}

// Register registers the service; pass it in the site server's Register hooks.
func (r *Relay) Register(s grpc.ServiceRegistrar) {
	assetsapi.RegisterAssetRelayServer(s, r)
}

// Fetch streams an asset from the requested offset.
func (r *Relay) Fetch(req *assetsapi.FetchRequest, stream grpc.ServerStreamingServer[assetsapi.Chunk]) error {
	site, ok := r.site(stream.Context())
	if !ok {
		return status.Error(codes.PermissionDenied, "no site identity")
	}

	if !digestRe.MatchString(req.GetSha256()) {
		return status.Errorf(codes.InvalidArgument, "invalid sha256 %q", req.GetSha256())
	}

	f, err := r.files.OpenAsset(req.GetSha256())
	if errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.NotFound, "asset %s not held by the controller", req.GetSha256())
	}

	if err != nil {
		r.log.Error("open asset for relay", zap.String("sha256", req.GetSha256()), zap.Error(err))

		return status.Error(codes.Internal, "open asset")
	}
	defer f.Close() //nolint:errcheck

	fi, err := f.Stat()
	if err != nil {
		return status.Error(codes.Internal, "stat asset")
	}

	size := fi.Size()
	if req.GetOffset() < 0 || req.GetOffset() > size {
		return status.Errorf(codes.OutOfRange, "offset %d outside asset of %d bytes", req.GetOffset(), size)
	}

	r.log.Debug("relaying asset", zap.String("site", site), zap.String("sha256", req.GetSha256()), zap.Int64("offset", req.GetOffset()))

	var sent int64

	defer func() { r.catalog.AddRelayed(site, sent, req.GetOffset()+sent == size) }()

	off := req.GetOffset()

	for off < size {
		// a fresh buffer per chunk: a message must not change after Send
		buf := make([]byte, min(int64(r.cfg.ChunkSize), size-off))

		n, err := f.ReadAt(buf, off)
		if err != nil && (!errors.Is(err, io.EOF) || n == 0) {
			return status.Errorf(codes.Internal, "read asset at %d: %v", off, err)
		}

		if err := stream.Send(&assetsapi.Chunk{Offset: off, Data: buf[:n], Size: size}); err != nil {
			return err
		}

		off += int64(n)
		sent += int64(n)
	}

	if size == 0 {
		return stream.Send(&assetsapi.Chunk{Size: 0})
	}

	return nil
}

// Report records an edge's asset state.
func (r *Relay) Report(ctx context.Context, rep *assetsapi.AssetReport) (*assetsapi.ReportResponse, error) {
	site, ok := r.site(ctx)
	if !ok {
		return nil, status.Error(codes.PermissionDenied, "no site identity")
	}

	r.catalog.RecordReport(site, rep)

	return &assetsapi.ReportResponse{}, nil
}
