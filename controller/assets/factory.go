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
	cache map[string]string // profile key -> schematic ID
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

func profileKey(p Profile) string {
	return p.TalosVersion + "|" + strings.Join(p.Extensions, ",") + "|" + strings.Join(p.KernelArgs, " ")
}

// Resolve implements Resolver.
func (r *FactoryResolver) Resolve(ctx context.Context, p Profile) (Boot, error) {
	p = p.Normalize()

	if !validVersion(p.TalosVersion) || !validArch(p.Arch) {
		return Boot{}, fmt.Errorf("%w: talos version %q, arch %q", ErrNotAvailable, p.TalosVersion, p.Arch)
	}

	key := profileKey(p)

	r.mu.Lock()
	id, ok := r.cache[key]
	r.mu.Unlock()

	if !ok {
		sc := schematic.Schematic{Customization: schematic.Customization{
			ExtraKernelArgs:  p.KernelArgs,
			SystemExtensions: schematic.SystemExtensions{OfficialExtensions: p.Extensions},
		}}

		var err error

		id, _, err = r.factory.SchematicCreate(ctx, sc)
		if err != nil {
			return Boot{}, fmt.Errorf("create schematic for talos %s with %v: %w", p.TalosVersion, p.Extensions, err)
		}

		r.mu.Lock()
		r.cache[key] = id
		r.mu.Unlock()
	}

	return Boot{
		SchematicID: id,
		ScriptURL:   fmt.Sprintf("%s/pxe/%s/%s/metal-%s", r.pxeBase, id, p.TalosVersion, p.Arch),
		KernelURL:   fmt.Sprintf("%s/image/%s/%s/kernel-%s", r.pxeBase, id, p.TalosVersion, p.Arch),
		InitrdURL:   fmt.Sprintf("%s/image/%s/%s/initramfs-%s.xz", r.pxeBase, id, p.TalosVersion, p.Arch),
		KernelArgs:  p.KernelArgs,
	}, nil
}
