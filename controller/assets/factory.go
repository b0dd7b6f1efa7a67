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

// FactoryResolver resolves profiles through the image factory: a schematic holding the extensions and kernel
// arguments, then the factory's PXE script for it (and its kernel and initramfs, for edges that cache).
// Schematic IDs are remembered per profile.
type FactoryResolver struct {
	factory SchematicCreator
	// pxeBase is where the factory serves PXE scripts and images (often the factory URL itself).
	pxeBase string

	mu    sync.Mutex
	cache map[string]string // extensions|kernel args -> schematic ID
}

// NewFactoryResolver returns a resolver using the image factory at factoryURL; pxeBaseURL is where it serves
// PXE scripts and images ("" means factoryURL).
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

	u, err := url.Parse(pxeBaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("image factory pxe base %q: want an http(s) URL", pxeBaseURL)
	}

	return &FactoryResolver{factory: factory, pxeBase: strings.TrimSuffix(pxeBaseURL, "/"), cache: map[string]string{}}, nil
}

// Resolve implements Resolver. The PXE script comes from a schematic with the extensions and kernel arguments;
// the kernel and initramfs from an extensions-only schematic, so they are the same for every machine booting
// that Talos version with those extensions (the edge caches them once; it appends the kernel arguments itself).
func (r *FactoryResolver) Resolve(ctx context.Context, p Profile) (Boot, error) {
	p = p.Normalize()

	if !validVersion(p.TalosVersion) || !validArch(p.Arch) {
		return Boot{}, fmt.Errorf("%w: talos version %q, arch %q", ErrNotAvailable, p.TalosVersion, p.Arch)
	}

	scriptID, err := r.schematic(ctx, p.Extensions, p.KernelArgs)
	if err != nil {
		return Boot{}, fmt.Errorf("create schematic for talos %s with %v: %w", p.TalosVersion, p.Extensions, err)
	}

	imageID, err := r.schematic(ctx, p.Extensions, nil)
	if err != nil {
		return Boot{}, fmt.Errorf("create schematic for talos %s with %v: %w", p.TalosVersion, p.Extensions, err)
	}

	return Boot{
		SchematicID: scriptID,
		ScriptURL:   fmt.Sprintf("%s/pxe/%s/%s/metal-%s", r.pxeBase, scriptID, p.TalosVersion, p.Arch),
		KernelURL:   fmt.Sprintf("%s/image/%s/%s/kernel-%s", r.pxeBase, imageID, p.TalosVersion, p.Arch),
		InitrdURL:   fmt.Sprintf("%s/image/%s/%s/initramfs-%s.xz", r.pxeBase, imageID, p.TalosVersion, p.Arch),
		KernelArgs:  p.KernelArgs,
	}, nil
}

// schematic returns the ID of the schematic with extensions and kernel args, creating it once.
func (r *FactoryResolver) schematic(ctx context.Context, extensions, kernelArgs []string) (string, error) {
	key := strings.Join(extensions, ",") + "|" + strings.Join(kernelArgs, " ")

	r.mu.Lock()
	id, ok := r.cache[key]
	r.mu.Unlock()

	if ok {
		return id, nil
	}

	id, _, err := r.factory.SchematicCreate(ctx, schematic.Schematic{Customization: schematic.Customization{
		ExtraKernelArgs:  kernelArgs,
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: extensions},
	}})
	if err != nil {
		return "", err
	}

	r.mu.Lock()
	r.cache[key] = id
	r.mu.Unlock()

	return id, nil
}
