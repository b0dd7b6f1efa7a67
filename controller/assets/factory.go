package assets

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/siderolabs/image-factory/pkg/client"
	"github.com/siderolabs/image-factory/pkg/schematic"
)

// SchematicCreator creates image factory schematics (the image factory client).
type SchematicCreator interface {
	SchematicCreate(ctx context.Context, sc schematic.Schematic) (string, *schematic.Schematic, error)
}

// FactoryResolver resolves profiles through the image factory: an extensions-only schematic (the edge appends
// each machine's kernel arguments), then the factory's kernel and initramfs for it, which sites hold under
// their logical names, and the factory's installer image for it. A Secure Boot profile gets the factory's
// signed unified kernel image and Secure Boot installer of a schematic with its kernel arguments baked in.
// Schematics are created once each (remembered by their offline ID).
type FactoryResolver struct {
	factory SchematicCreator
	// pxeBase is where the factory serves images (often the factory URL itself).
	pxeBase string
	// registry is the host (and port) of the factory's registry: the factory's own host.
	registry string

	mu    sync.Mutex
	cache map[string]string // offline schematic ID -> the factory's
}

// NewFactoryResolver returns a resolver using the image factory at factoryURL; pxeBaseURL is where it serves
// images ("" means factoryURL).
func NewFactoryResolver(factoryURL, pxeBaseURL string) (*FactoryResolver, error) {
	c, err := client.New(factoryURL)
	if err != nil {
		return nil, fmt.Errorf("image factory client for %q: %w", factoryURL, err)
	}

	return NewFactoryResolverWith(c, pxeBaseURL, factoryURL)
}

// NewFactoryResolverWith returns a resolver using the given schematic creator (tests, or a proxied client).
func NewFactoryResolverWith(factory SchematicCreator, pxeBaseURL, factoryURL string) (*FactoryResolver, error) {
	if pxeBaseURL == "" {
		pxeBaseURL = factoryURL
	}

	for _, s := range []string{pxeBaseURL, factoryURL} {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("image factory url %q: want an http(s) URL", s)
		}
	}

	f, _ := url.Parse(factoryURL) // checked above

	return &FactoryResolver{factory: factory, pxeBase: strings.TrimSuffix(pxeBaseURL, "/"), registry: f.Host, cache: map[string]string{}}, nil
}

// Resolve implements Resolver.
func (r *FactoryResolver) Resolve(ctx context.Context, p Profile) (Boot, error) {
	p = p.Normalize()

	if !validVersion(p.TalosVersion) || !validArch(p.Arch.String()) {
		return Boot{}, fmt.Errorf("%w: talos version %q, arch %q", ErrNotAvailable, p.TalosVersion, p.Arch)
	}

	id, err := r.schematic(ctx, Profile{Extensions: p.Extensions}.Schematic())
	if err != nil {
		return Boot{}, fmt.Errorf("create schematic for talos %s with %v: %w", p.TalosVersion, p.Extensions, err)
	}

	b := r.BootOf(Staged{Version: p.TalosVersion, SchematicID: id, Arch: p.Arch.String()})
	b.KernelArgs = p.KernelArgs

	if !p.SecureBoot {
		return b, nil
	}

	// The signed image's schematic carries the kernel arguments too: its command line is locked.
	signed, err := r.schematic(ctx, p.Schematic())
	if err != nil {
		return Boot{}, fmt.Errorf("create the Secure Boot schematic for talos %s with %v: %w", p.TalosVersion, p.Extensions, err)
	}

	b.SignedSchematicID = signed
	b.SignedURL = "/assets/" + InstallAssetName(p.TalosVersion, signed, p.Arch.String(), SignedKind)
	b.UpstreamSignedURL = fmt.Sprintf("%s/image/%s/%s/metal-%s-secureboot-uki.efi", r.pxeBase, signed, p.TalosVersion, p.Arch)
	b.Installer = fmt.Sprintf("%s/installer-secureboot/%s:%s", r.registry, signed, p.TalosVersion)

	return b, nil
}

// BootOf implements Stager: the factory's kernel, initramfs and installer of the schematic.
func (r *FactoryResolver) BootOf(st Staged) Boot {
	return Boot{
		SchematicID:       st.SchematicID,
		KernelURL:         "/assets/" + InstallAssetName(st.Version, st.SchematicID, st.Arch, "kernel"),
		InitrdURL:         "/assets/" + InstallAssetName(st.Version, st.SchematicID, st.Arch, "initramfs.xz"),
		UpstreamKernelURL: fmt.Sprintf("%s/image/%s/%s/kernel-%s", r.pxeBase, st.SchematicID, st.Version, st.Arch),
		UpstreamInitrdURL: fmt.Sprintf("%s/image/%s/%s/initramfs-%s.xz", r.pxeBase, st.SchematicID, st.Version, st.Arch),
		Installer:         fmt.Sprintf("%s/installer/%s:%s", r.registry, st.SchematicID, st.Version),
	}
}

// Schematic returns the schematic ID of a set of extensions (created at the factory once).
func (r *FactoryResolver) Schematic(ctx context.Context, extensions []string) (string, error) {
	return r.schematic(ctx, Profile{Extensions: extensions}.Schematic())
}

// schematic returns the factory's ID of sc, creating it there once (remembered by the ID it has offline).
func (r *FactoryResolver) schematic(ctx context.Context, sc *schematic.Schematic) (string, error) {
	key, err := sc.ID()
	if err != nil {
		return "", fmt.Errorf("schematic id: %w", err)
	}

	r.mu.Lock()
	id, ok := r.cache[key]
	r.mu.Unlock()

	if ok {
		return id, nil
	}

	id, _, err = r.factory.SchematicCreate(ctx, *sc)
	if err != nil {
		return "", err
	}

	r.mu.Lock()
	r.cache[key] = id
	r.mu.Unlock()

	return id, nil
}
