package assets

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// agentImageFiles are the files of an agent-mode image per iPXE architecture, under the names edges serve
// them by (/assets/agent/<arch>/vmlinuz and initramfs.xz, the edge's default agent-mode paths).
var agentImageFiles = []string{"vmlinuz", "initramfs.xz"}

// LoadAgentImages reads the agent-mode images in dir (<arch>/vmlinuz, <arch>/initramfs.xz), copies each into
// the relay directory under its SHA-256 (where the relay serves edges from), and returns their references,
// which every site is then asked to hold. Sites whose policy allows it fetch them by relay, so an air-gapped
// site boots agent mode with no image factory in reach.
func LoadAgentImages(dir, relayDir string) ([]*assetsapi.AssetRef, error) {
	archs, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("agent assets: %w", err)
	}

	var refs []*assetsapi.AssetRef

	for _, arch := range archs {
		if !arch.IsDir() || (arch.Name() != "x86_64" && arch.Name() != "arm64") {
			continue
		}

		for _, name := range agentImageFiles {
			src := filepath.Join(dir, arch.Name(), name)

			digest, size, err := copyByDigest(src, relayDir)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}

			if err != nil {
				return nil, fmt.Errorf("agent asset %s: %w", src, err)
			}

			refs = append(refs, &assetsapi.AssetRef{Name: "agent/" + arch.Name() + "/" + name, Sha256: digest, Size: size})
		}
	}

	if len(refs) == 0 {
		return nil, fmt.Errorf("agent assets: no <arch>/vmlinuz or <arch>/initramfs.xz in %s", dir)
	}

	slices.SortFunc(refs, func(a, b *assetsapi.AssetRef) int { return strings.Compare(a.GetName(), b.GetName()) })

	return refs, nil
}

// InstallFiles turns the edge-relative URLs of local install assets (/assets/install/...) into asset
// references, copying each file into the relay directory under its digest, so that a site can be asked to
// hold exactly the files its machines' plans name. Digests are remembered per file (size and modification
// time), so an unchanged multi-hundred-megabyte initramfs is hashed once.
type InstallFiles struct {
	dir, urlPrefix, relayDir string

	mu    sync.Mutex
	known map[string]knownFile
}

type knownFile struct {
	size    int64
	modTime time.Time
	digest  string
}

// NewInstallFiles returns the install files under dir, which machines fetch from the edge under url. With no
// directory, or a url that is not edge-relative (/assets/...), there is nothing for edges to hold and Refs
// returns none.
func NewInstallFiles(dir, url, relayDir string) *InstallFiles {
	if dir == "" || !strings.HasPrefix(url, "/assets/") {
		return &InstallFiles{}
	}

	return &InstallFiles{
		dir:       dir,
		urlPrefix: strings.TrimSuffix(url, "/") + "/",
		relayDir:  relayDir,
		known:     map[string]knownFile{},
	}
}

// Refs returns the references of those urls that name local install files (others are skipped); machine
// names whose plan they are, for the error.
func (f *InstallFiles) Refs(machine string, urls ...string) ([]*assetsapi.AssetRef, error) {
	if f.dir == "" {
		return nil, nil
	}

	var out []*assetsapi.AssetRef

	for _, u := range urls {
		rel, ok := strings.CutPrefix(u, f.urlPrefix)
		if !ok || rel == "" {
			continue
		}

		ref, err := f.ref(rel, strings.TrimPrefix(u, "/assets/"))
		if err != nil {
			return nil, fmt.Errorf("install asset %s of %s: %w", rel, machine, err)
		}

		out = append(out, ref)
	}

	return out, nil
}

func (f *InstallFiles) ref(rel, name string) (*assetsapi.AssetRef, error) {
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

	return &assetsapi.AssetRef{Name: name, Sha256: k.digest, Size: k.size}, nil
}

// copyByDigest hashes src and copies it to <relayDir>/<sha256> unless a file of that name is there already.
func copyByDigest(src, relayDir string) (string, int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer f.Close() //nolint:errcheck

	h := sha256.New()

	size, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}

	digest := hex.EncodeToString(h.Sum(nil))
	dst := filepath.Join(relayDir, digest)

	if _, err := os.Stat(dst); err == nil {
		return digest, size, nil
	}

	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}

	tmp, err := os.CreateTemp(relayDir, ".agent-asset-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename

	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close() //nolint:errcheck

		return "", 0, err
	}

	if err := tmp.Close(); err != nil {
		return "", 0, err
	}

	return digest, size, os.Rename(tmp.Name(), dst)
}
