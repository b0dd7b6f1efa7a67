package assets

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

// UpstreamClient returns the HTTP client the controller fetches install assets with: the proxy from the
// environment (HTTPS_PROXY, NO_PROXY), the system's roots plus the PEM bundle extraRoots (a custom CA in front
// of the factory; nil: none), and time limits on everything but a body that keeps flowing.
func UpstreamClient(extraRoots []byte) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyFromEnvironment
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = time.Minute

	if len(extraRoots) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}

		if !pool.AppendCertsFromPEM(extraRoots) {
			return nil, errors.New("upstream client: no certificate in the trusted roots")
		}

		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}

	return &http.Client{Transport: tr}, nil
}

// download fetches url into the relay directory under its digest and returns its reference (without name).
func (l *Library) download(ctx context.Context, key, url string) (*assetsapi.AssetRef, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", key, err)
	}

	resp, err := l.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", key, err)
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("download %s from %s: status %s", key, url, resp.Status)
	}

	body := newIdleReader(resp.Body, l.cfg.IdleTimeout, cancel)
	defer body.stop()

	digest, size, err := l.store(key, body, resp.ContentLength, "", kindCheck(key))
	if err != nil {
		if body.idled() {
			err = fmt.Errorf("nothing received for %s: %w", l.cfg.IdleTimeout, err)
		}

		return nil, fmt.Errorf("download %s from %s: %w", key, url, err)
	}

	return &assetsapi.AssetRef{Sha256: digest, Size: size}, nil
}

// store writes r (of size bytes, -1: unknown) to the relay directory under its SHA-256, checking it against
// want (a hex digest, "" for none) and the size bound, and returns the digest and length. Nothing partial or
// wrong ever gets a digest's name.
func (l *Library) store(key string, r io.Reader, size int64, want string, check func(head []byte) error) (string, int64, error) {
	if size > l.cfg.MaxSize {
		return "", 0, fmt.Errorf("%d bytes is more than the %d one install asset may have", size, l.cfg.MaxSize)
	}

	l.addProgress(key, 0, size)

	tmp, err := os.CreateTemp(l.cfg.Dir, ".fetch-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename

	h := sha256.New()
	head := &headWriter{max: 4096}

	n, err := io.Copy(io.MultiWriter(tmp, h, head, progress{l: l, key: key}), io.LimitReader(r, l.cfg.MaxSize+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}

	digest := hex.EncodeToString(h.Sum(nil))

	switch {
	case err != nil:
		return "", 0, err
	case n > l.cfg.MaxSize:
		return "", 0, fmt.Errorf("more than %d bytes", l.cfg.MaxSize)
	case size >= 0 && n != size:
		return "", 0, fmt.Errorf("got %d of %d bytes", n, size)
	case n == 0:
		return "", 0, errors.New("empty answer")
	case want != "" && digest != want:
		return "", 0, fmt.Errorf("content has digest sha256:%s, expected sha256:%s", digest, want)
	}

	if check != nil {
		if err := check(head.b); err != nil {
			return "", 0, err
		}
	}

	if err := os.Rename(tmp.Name(), filepath.Join(l.cfg.Dir, digest)); err != nil {
		return "", 0, err
	}

	return digest, n, nil
}

type progress struct {
	l   *Library
	key string
}

func (p progress) Write(b []byte) (int, error) {
	p.l.addProgress(p.key, int64(len(b)), 0)

	return len(b), nil
}

// maxManifest bounds a manifest or index (the distribution spec's suggested limit).
const maxManifest = 4 << 20

// pullImage pulls an image (or index) and the content of its manifest for w.Arch into the relay directory:
// the manifest by tag, and every child manifest, config and layer by digest, named as the edge's registry
// serves them (shared/ocinames).
func (l *Library) pullImage(ctx context.Context, key string, w Want) ([]*assetsapi.AssetRef, error) {
	ref, err := name.ParseReference(w.Image, name.StrictValidation, name.Insecure)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", w.Image, err)
	}

	tag, ok := ref.(name.Tag)
	if !ok {
		return nil, fmt.Errorf("image %s: want a tag, not a digest", w.Image)
	}

	repo := ref.Context().RepositoryStr()
	if err := ocinames.ValidateRepository(repo); err != nil {
		return nil, fmt.Errorf("image %s: %w", w.Image, err)
	}

	if err := ocinames.ValidateTag(tag.TagStr()); err != nil {
		return nil, fmt.Errorf("image %s: %w", w.Image, err)
	}

	platform := v1.Platform{OS: "linux", Architecture: w.Arch}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(l.cfg.Client.Transport), remote.WithPlatform(platform)}

	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", w.Image, err)
	}

	p := puller{l: l, key: key, repo: repo}

	top, err := p.manifest(desc.Manifest, desc.Digest)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", w.Image, err)
	}

	p.refs = append(p.refs, &assetsapi.AssetRef{Name: ocinames.ManifestName(repo, tag.TagStr()), Sha256: top.GetSha256(), Size: top.GetSize()})

	var img v1.Image

	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", w.Image, err)
		}

		im, err := idx.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", w.Image, err)
		}

		for _, m := range im.Manifests {
			if m.Platform == nil || !m.Platform.Satisfies(platform) {
				continue
			}

			if img, err = idx.Image(m.Digest); err != nil {
				return nil, fmt.Errorf("pull %s for %s: %w", w.Image, w.Arch, err)
			}

			raw, err := img.RawManifest()
			if err != nil {
				return nil, fmt.Errorf("pull %s for %s: %w", w.Image, w.Arch, err)
			}

			if _, err := p.manifest(raw, m.Digest); err != nil {
				return nil, fmt.Errorf("pull %s for %s: %w", w.Image, w.Arch, err)
			}

			break
		}

		if img == nil {
			return nil, fmt.Errorf("pull %s: no manifest for linux/%s in its index", w.Image, w.Arch)
		}
	} else if img, err = desc.Image(); err != nil {
		return nil, fmt.Errorf("pull %s: %w", w.Image, err)
	}

	if err := p.image(img); err != nil {
		return nil, fmt.Errorf("pull %s: %w", w.Image, err)
	}

	return p.refs, nil
}

type puller struct {
	l         *Library
	key, repo string
	refs      []*assetsapi.AssetRef
}

// manifest stores a manifest's bytes, which must have digest d, as a blob of the repository.
func (p *puller) manifest(raw []byte, d v1.Hash) (*assetsapi.AssetRef, error) {
	if len(raw) > maxManifest {
		return nil, fmt.Errorf("manifest %s: %d bytes, more than %d", d, len(raw), maxManifest)
	}

	return p.blob(d, int64(len(raw)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
}

// image stores an image's config and layers.
func (p *puller) image(img v1.Image) error {
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}

	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}

	if _, err := p.blob(cfgName, int64(len(cfg)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(cfg)), nil }); err != nil {
		return err
	}

	layers, err := img.Layers()
	if err != nil {
		return err
	}

	for _, layer := range layers {
		d, err := layer.Digest()
		if err != nil {
			return err
		}

		size, err := layer.Size()
		if err != nil {
			return err
		}

		if _, err := p.blob(d, size, layer.Compressed); err != nil {
			return err
		}
	}

	return nil
}

// blob stores one blob of digest d, checking it, unless the relay directory has it already.
func (p *puller) blob(d v1.Hash, size int64, open func() (io.ReadCloser, error)) (*assetsapi.AssetRef, error) {
	if d.Algorithm != "sha256" || ocinames.ValidateHex(d.Hex) != nil {
		return nil, fmt.Errorf("blob %s: only sha256 digests are held", d)
	}

	ref := &assetsapi.AssetRef{Name: ocinames.BlobName(p.repo, d.Hex), Sha256: d.Hex, Size: size}

	if st, err := os.Stat(filepath.Join(p.l.cfg.Dir, d.Hex)); err == nil && st.Size() == size {
		p.refs = append(p.refs, ref)

		return ref, nil
	}

	rc, err := open()
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d, err)
	}
	defer rc.Close() //nolint:errcheck

	if _, _, err := p.l.store(p.key, rc, size, d.Hex, nil); err != nil {
		return nil, fmt.Errorf("blob %s: %w", d, err)
	}

	p.refs = append(p.refs, ref)

	return ref, nil
}

// headWriter keeps the first max bytes written to it.
type headWriter struct {
	b   []byte
	max int
}

func (h *headWriter) Write(p []byte) (int, error) {
	if room := h.max - len(h.b); room > 0 {
		h.b = append(h.b, p[:min(room, len(p))]...)
	}

	return len(p), nil
}

// kindCheck returns the check of what an install asset's first bytes must look like, by its logical name's
// kind: a kernel is a PE/EFI image, an x86 bzImage or an arm64 Image; a signed unified kernel image is a
// PE/EFI image (the firmware checks its signature); an initramfs is xz, gzip, zstd or a
// plain cpio archive. It keeps an error page or other garbage answered with 200 from being held as a boot
// asset (the factory publishes no digests to check against).
func kindCheck(name string) func([]byte) error {
	switch {
	case strings.HasSuffix(name, "/kernel"):
		return func(b []byte) error {
			switch {
			case bytes.HasPrefix(b, []byte("MZ")),
				len(b) >= 0x206 && string(b[0x202:0x206]) == "HdrS",
				len(b) >= 0x3c && string(b[0x38:0x3c]) == "ARM\x64":
				return nil
			}

			return fmt.Errorf("not a kernel image (first bytes %q)", printableHead(b))
		}
	case strings.HasSuffix(name, "/"+SignedKind):
		return func(b []byte) error {
			if bytes.HasPrefix(b, []byte("MZ")) {
				return nil
			}

			return fmt.Errorf("not a signed EFI image (first bytes %q)", printableHead(b))
		}
	case strings.HasSuffix(name, "/initramfs.xz"):
		return func(b []byte) error {
			for _, m := range []string{"\xfd7zXZ\x00", "\x1f\x8b", "\x28\xb5\x2f\xfd", "070701", "070702"} {
				if bytes.HasPrefix(b, []byte(m)) {
					return nil
				}
			}

			return fmt.Errorf("not an initramfs (xz, gzip, zstd or cpio; first bytes %q)", printableHead(b))
		}
	default:
		return nil
	}
}

func printableHead(b []byte) []byte { return b[:min(len(b), 16)] }

// idleReader cancels a download that receives nothing for timeout (a factory that answers, then trickles or
// stalls, would hold a worker until the whole fetch's timeout).
type idleReader struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
	fired atomic.Bool
}

func newIdleReader(r io.Reader, d time.Duration, cancel context.CancelFunc) *idleReader {
	ir := &idleReader{r: r, d: d}
	ir.timer = time.AfterFunc(d, func() {
		ir.fired.Store(true)
		cancel()
	})

	return ir
}

func (ir *idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	if n > 0 {
		ir.timer.Reset(ir.d)
	}

	return n, err
}

func (ir *idleReader) stop()       { ir.timer.Stop() }
func (ir *idleReader) idled() bool { return ir.fired.Load() }
