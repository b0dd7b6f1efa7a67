package assetcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// HTTPSource fetches assets from their URLs (the image factory) with ranged GETs for resuming.
type HTTPSource struct {
	// Client is the HTTP client; it must have a timeout on connection set-up (the body may take long).
	Client *http.Client
}

// Name returns "http".
func (HTTPSource) Name() string { return "http" }

// Open fetches the first of ref's URLs that answers, from offset.
func (h HTTPSource) Open(ctx context.Context, ref Ref, offset int64) (io.ReadCloser, error) {
	if len(ref.URLs) == 0 {
		return nil, PermanentError(fmt.Errorf("asset %s has no URL", ref.Name))
	}

	var errs []error

	for _, u := range ref.URLs {
		rc, err := h.open(ctx, u, offset)
		if err == nil {
			return rc, nil
		}

		errs = append(errs, err)
	}

	return nil, errors.Join(errs...)
}

func (h HTTPSource) open(ctx context.Context, url string, offset int64) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, PermanentError(fmt.Errorf("request %s: %w", url, err))
	}

	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}

	resp, err := h.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}

	switch {
	case resp.StatusCode == http.StatusPartialContent && offset > 0:
		return resp.Body, nil
	case resp.StatusCode == http.StatusOK:
		if offset > 0 { // server ignored the range: skip what we have
			if _, err := io.CopyN(io.Discard, resp.Body, offset); err != nil {
				resp.Body.Close() //nolint:errcheck

				return nil, fmt.Errorf("get %s: skip to %d: %w", url, offset, err)
			}
		}

		return resp.Body, nil
	default:
		resp.Body.Close() //nolint:errcheck

		return nil, fmt.Errorf("get %s: status %s", url, resp.Status)
	}
}

// RelaySource fetches assets from the controller's AssetRelay over the uplink.
type RelaySource struct {
	Client assetsapi.AssetRelayClient
}

// Name returns "relay".
func (RelaySource) Name() string { return "relay" }

// Open starts a relay stream at offset.
func (r RelaySource) Open(ctx context.Context, ref Ref, offset int64) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)

	// wait for the uplink to come back instead of failing at once after a cut; ctx bounds the wait
	stream, err := r.Client.Fetch(ctx, &assetsapi.FetchRequest{Sha256: ref.SHA256, Offset: offset}, grpc.WaitForReady(true))
	if err != nil {
		cancel()

		return nil, relayError(err)
	}

	return &relayReader{stream: stream, cancel: cancel, offset: offset, size: ref.Size}, nil
}

func relayError(err error) error {
	switch status.Code(err) {
	case codes.NotFound, codes.InvalidArgument, codes.PermissionDenied, codes.OutOfRange:
		return PermanentError(fmt.Errorf("relay: %w", err))
	default:
		return fmt.Errorf("relay: %w", err)
	}
}

type relayReader struct {
	stream assetsapi.AssetRelay_FetchClient
	cancel context.CancelFunc
	offset int64
	size   int64
	buf    []byte
}

func (r *relayReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		c, err := r.stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}

		if err != nil {
			return 0, relayError(err)
		}

		if c.GetOffset() != r.offset {
			return 0, PermanentError(fmt.Errorf("relay: chunk at offset %d, expected %d", c.GetOffset(), r.offset))
		}

		if c.GetSize() != r.size {
			return 0, PermanentError(fmt.Errorf("%w: relay says %d bytes, expected %d", ErrSizeMismatch, c.GetSize(), r.size))
		}

		r.buf = c.GetData()
		r.offset += int64(len(r.buf))
	}

	n := copy(p, r.buf)
	r.buf = r.buf[n:]

	return n, nil
}

func (r *relayReader) Close() error {
	r.cancel()

	return nil
}
