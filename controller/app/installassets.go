package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
)

// assetAwarePusher tells a site which assets a machine's plan needs before handing the plan to the edge, so
// the site caches (or receives by relay) the kernel and initramfs the plan names from the controller's local
// install assets (install or agent mode), and never evicts them while a plan names them.
type assetAwarePusher struct {
	next    lifecycle.PlanPusher
	needs   *assets.Needs
	install *installFiles
}

// Push implements lifecycle.PlanPusher.
func (p *assetAwarePusher) Push(ctx context.Context, siteID string, plan bootplans.Plan) (uint64, error) {
	refs, err := p.install.refs(plan)
	if err != nil {
		return 0, err
	}

	p.needs.SetMachine(siteID, plan.MachineID, refs)

	return p.next.Push(ctx, siteID, plan)
}

// installFiles turns the edge-relative URLs of local install assets (/assets/install/...) into asset
// references, copying each file into the relay directory under its digest. Digests are remembered per file
// (size and modification time), so an unchanged multi-hundred-megabyte initramfs is hashed once.
type installFiles struct {
	dir, urlPrefix, relayDir string

	mu    sync.Mutex
	known map[string]knownFile
}

type knownFile struct {
	size    int64
	modTime time.Time
	digest  string
}

func newInstallFiles(cfg config.Config, relayDir string) *installFiles {
	if cfg.InstallAssetsDir == "" || !strings.HasPrefix(cfg.InstallAssetsURL, "/assets/") {
		return &installFiles{} // factory URLs or assets served elsewhere: nothing for edges to hold
	}

	return &installFiles{
		dir:       cfg.InstallAssetsDir,
		urlPrefix: strings.TrimSuffix(cfg.InstallAssetsURL, "/") + "/",
		relayDir:  relayDir,
		known:     map[string]knownFile{},
	}
}

func (f *installFiles) refs(plan bootplans.Plan) ([]*assetspb.AssetRef, error) {
	// Agent-mode plans count too: without agent images of its own (--agent-assets-dir) the controller
	// resolves agent mode from these same local assets (the metal-agent schematic).
	if f.dir == "" || !plan.Mode.PXE() {
		return nil, nil
	}

	var out []*assetspb.AssetRef

	for _, u := range []string{plan.KernelURL, plan.InitrdURL} {
		rel, ok := strings.CutPrefix(u, f.urlPrefix)
		if !ok || rel == "" {
			continue
		}

		ref, err := f.ref(rel, strings.TrimPrefix(u, "/assets/"))
		if err != nil {
			return nil, fmt.Errorf("install asset %s of %s: %w", rel, plan.MachineID, err)
		}

		out = append(out, ref)
	}

	return out, nil
}

func (f *installFiles) ref(rel, name string) (*assetspb.AssetRef, error) {
	path := filepath.Join(f.dir, filepath.FromSlash(rel))

	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}

	f.mu.Lock()
	k, ok := f.known[path]
	f.mu.Unlock()

	if !ok || k.size != st.Size() || !k.modTime.Equal(st.ModTime()) {
		digest, size, err := copyByDigest(path, f.relayDir)
		if err != nil {
			return nil, err
		}

		k = knownFile{size: size, modTime: st.ModTime(), digest: digest}

		f.mu.Lock()
		f.known[path] = k
		f.mu.Unlock()
	}

	return &assetspb.AssetRef{Name: name, Sha256: k.digest, Size: k.size}, nil
}
