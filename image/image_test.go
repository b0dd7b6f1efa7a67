package image_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/image"
)

// edgeBinary builds ./edge when it exists in the module, else a tiny stand-in program, and returns its path.
func edgeBinary(t *testing.T) (string, string) {
	t.Helper()

	out := filepath.Join(t.TempDir(), "edge")

	if _, err := os.Stat("../edge/main.go"); err == nil {
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./edge")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", b)

		return out, "edge"
	}

	src := filepath.Join(t.TempDir(), "main.go")
	require.NoError(t, os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"outpost edge stand-in\") }\n"), 0o644))

	cmd := exec.Command("go", "build", "-o", out, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)

	return out, "stand-in"
}

// ipxeDir is Debian's iPXE as hack/ipxe.sh lays it out (fetched once, then cached under _out/ipxe).
func ipxeDir(t *testing.T) string {
	t.Helper()

	out, err := exec.Command("../hack/ipxe.sh").Output()
	if err != nil {
		t.Skipf("hack/ipxe.sh: %v (Debian's ipxe package from the machine's Debian mirrors)", err)
	}

	return strings.TrimSpace(string(out))
}

func fileSum(t *testing.T, path string) string {
	t.Helper()

	b, err := os.ReadFile(path)
	require.NoError(t, err)

	s := sha256.Sum256(b)

	return hex.EncodeToString(s[:])
}

func TestBuildImageReadBack(t *testing.T) {
	t.Parallel()

	if testing.Short() {
		t.Skip("builds a binary; skipped under -short")
	}

	bin, kind := edgeBinary(t)
	t.Logf("edge binary: %s", kind)

	preseed := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(preseed, "outpost-assets.json"), []byte(`{"version":1,"assets":[]}`), 0o644))

	cfg := image.Default()
	cfg.Version = "v0.0.0-test"
	cfg.EdgeBinary = bin
	cfg.IPXEDir = ipxeDir(t)
	cfg.PreseedDir = preseed

	out := t.TempDir()
	res, err := image.Build(cfg, &image.PatchConfig{ControllerAddress: "controller.example.test:8443", JoinToken: "tok"}, out)
	require.NoError(t, err)

	// the extension passes machinery's loader and validation (contents, service definition)
	require.NoError(t, image.ValidateExtension(res.ExtensionDir))

	// read the OCI layout back and list the layer contents
	idx, err := layout.ImageIndexFromPath(res.OCILayout)
	require.NoError(t, err)

	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	require.Equal(t, "outpost-edge:v0.0.0-test", im.Manifests[0].Annotations[image.RefNameAnnotation])

	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "amd64", cf.Architecture)

	layers, err := img.Layers()
	require.NoError(t, err)

	files := map[string]string{} // path -> sha256

	for _, l := range layers {
		rc, err := l.Uncompressed()
		require.NoError(t, err)

		tr := tar.NewReader(rc)

		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}

			require.NoError(t, err)

			if hdr.Typeflag != tar.TypeReg {
				continue
			}

			h := sha256.New()
			_, err = io.Copy(h, tr)
			require.NoError(t, err)

			files[hdr.Name] = hex.EncodeToString(h.Sum(nil))
		}

		require.NoError(t, rc.Close())
	}

	ctr := "rootfs/usr/local/lib/containers/outpost-edge"
	require.Equal(t, fileSum(t, bin), files[ctr+"/outpost-edge"], "edge binary missing or different in the image")

	for _, f := range image.IPXEFiles {
		require.Equal(t, fileSum(t, filepath.Join(cfg.IPXEDir, f)), files[ctr+"/usr/lib/ipxe/"+f], "iPXE file %s", f)
	}

	require.Contains(t, files, "manifest.yaml")
	require.Contains(t, files, "rootfs/usr/local/etc/containers/outpost-edge.yaml")
	require.Contains(t, files, ctr+"/usr/share/outpost/assets/outpost-assets.json")

	fi, err := os.Stat(res.OCIArchive)
	require.NoError(t, err)
	require.Positive(t, fi.Size())

	patch, err := os.ReadFile(res.Patch)
	require.NoError(t, err)
	require.NoError(t, image.ValidatePatch(patch))
}

func TestMachineConfigPatch(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		cfg     image.PatchConfig
		wantErr string
		want    []string
	}{
		{
			name: "uplink only",
			cfg:  image.PatchConfig{ControllerAddress: "10.0.0.1:8443", JoinToken: "site-a.secret"},
			want: []string{"kind: ExtensionServiceConfig", "name: outpost-edge", "OUTPOST_CONTROLLER=10.0.0.1:8443", "OUTPOST_JOIN_TOKEN=site-a.secret"},
		},
		{
			name: "static network",
			cfg: image.PatchConfig{
				ControllerAddress: "ctl.example.test:8443", JoinToken: "t", Hostname: "edge-site-a", Interface: "enp1s0",
				Addresses: []netip.Prefix{netip.MustParsePrefix("192.168.10.2/24")}, Gateway: netip.MustParseAddr("192.168.10.1"),
				Nameservers: []netip.Addr{netip.MustParseAddr("192.168.10.1")},
			},
			want: []string{"kind: HostnameConfig", "hostname: edge-site-a", "kind: LinkConfig", "name: enp1s0", "192.168.10.2/24", "gateway: 192.168.10.1", "kind: ResolverConfig"},
		},
		{name: "no token", cfg: image.PatchConfig{ControllerAddress: "10.0.0.1:8443"}, wantErr: "join token is empty"},
		{name: "no port", cfg: image.PatchConfig{ControllerAddress: "10.0.0.1", JoinToken: "t"}, wantErr: "want host:port"},
		{
			name: "two controllers",
			cfg:  image.PatchConfig{ControllerAddress: "ctl-a.example.test:8443,ctl-b.example.test:8443", JoinToken: "t"},
			want: []string{"OUTPOST_CONTROLLER=ctl-a.example.test:8443,ctl-b.example.test:8443"},
		},
		{name: "second without port", cfg: image.PatchConfig{ControllerAddress: "10.0.0.1:8443,10.0.0.2", JoinToken: "t"}, wantErr: `"10.0.0.2": want host:port`},
		{name: "empty second", cfg: image.PatchConfig{ControllerAddress: "10.0.0.1:8443,", JoinToken: "t"}, wantErr: `"": want host:port`},
		{name: "nine controllers", cfg: image.PatchConfig{ControllerAddress: strings.Repeat("a:1,", 8) + "a:1", JoinToken: "t"}, wantErr: "at most 8"},
		{name: "address without interface", cfg: image.PatchConfig{ControllerAddress: "a:1", JoinToken: "t", Addresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}}, wantErr: "need an interface"},
		{name: "bad hostname", cfg: image.PatchConfig{ControllerAddress: "a:1", JoinToken: "t", Hostname: strings.Repeat("a", 254)}, wantErr: "too long"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			out, err := image.MachineConfigPatch(tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)

				return
			}

			require.NoError(t, err)
			require.NoError(t, image.ValidatePatch(out))

			for _, w := range tt.want {
				require.Contains(t, string(out), w)
			}
		})
	}
}

func TestValidatePatchRefuses(t *testing.T) {
	t.Parallel()

	bad := []byte("apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: outpost-edge\n")
	require.Error(t, image.ValidatePatch(bad))

	other := []byte("apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: something-else\nenvironment:\n  - A=b\n")
	require.ErrorContains(t, image.ValidatePatch(other), "no ExtensionServiceConfig for outpost-edge")
}

func TestServiceSpec(t *testing.T) {
	t.Parallel()

	cfg := image.Default()
	data, spec, err := image.ServiceSpec(cfg)
	require.NoError(t, err)
	require.Equal(t, "outpost-edge", spec.Name)
	require.Equal(t, "./outpost-edge", spec.Container.Entrypoint)
	require.True(t, bytes.Contains(data, []byte("/var/lib/outpost-edge")))
	require.False(t, strings.Contains(string(data), "PRESEED"))
}

// The appliance ships iPXE for every firmware; an iPXE directory whose arm64 file is an x86 build, or not an EFI
// binary at all, is refused before anything is written, and a directory without it names the missing file.
func TestIPXEFilesChecked(t *testing.T) {
	bin, _ := edgeBinary(t)
	dir := ipxeDir(t)

	cfg := image.Default()
	cfg.EdgeBinary, cfg.IPXEDir = bin, dir
	require.NoError(t, cfg.Validate())

	broken := func(replace func(dir string)) image.Config {
		c := image.Default()
		c.EdgeBinary, c.IPXEDir = bin, t.TempDir()

		for _, f := range image.IPXEFiles {
			b, err := os.ReadFile(filepath.Join(dir, f))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(c.IPXEDir, f), b, 0o644))
		}

		replace(c.IPXEDir)

		return c
	}

	x86 := broken(func(d string) {
		b, err := os.ReadFile(filepath.Join(d, "ipxe.efi"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, "snp-arm64.efi"), b, 0o644))
	})
	require.ErrorContains(t, x86.Validate(), "PE machine 0x8664, want 0xaa64")

	notPE := broken(func(d string) {
		require.NoError(t, os.WriteFile(filepath.Join(d, "snponly.efi"), []byte("MZ nothing"), 0o644))
	})
	require.ErrorContains(t, notPE.Validate(), "not an EFI binary")

	missing := broken(func(d string) { require.NoError(t, os.Remove(filepath.Join(d, "snp-arm64.efi"))) })
	require.ErrorContains(t, missing.Validate(), "snp-arm64.efi")

	none := image.Default()
	none.EdgeBinary = bin
	require.ErrorContains(t, none.Validate(), "hack/ipxe.sh")

	out := t.TempDir()
	require.NoError(t, image.WriteExtension(cfg, out))
	require.Equal(t, fileSum(t, filepath.Join(dir, "snp-arm64.efi")), fileSum(t, filepath.Join(out, "rootfs/usr/local/lib/containers/outpost-edge/usr/lib/ipxe/snp-arm64.efi")))
}

// The virtual-media boot loader built by hack/vmedia-loader.sh ships where the edge looks for it; a file that is
// not an x86_64 EFI binary is refused.
func TestVMediaLoader(t *testing.T) {
	require.Equal(t, config.VMediaLoaderName, image.VMediaLoaderFile, "the appliance ships the loader under the edge's name")

	bin, _ := edgeBinary(t)
	dir := ipxeDir(t)

	notPE := image.Default()
	notPE.EdgeBinary, notPE.IPXEDir, notPE.VMediaLoader = bin, dir, bin
	require.ErrorContains(t, notPE.Validate(), "not an EFI binary")

	out, err := exec.Command("../hack/vmedia-loader.sh").Output()
	if err != nil {
		t.Skipf("hack/vmedia-loader.sh: %v (Debian grub-efi-amd64-bin, grub-common)", err)
	}

	loader := strings.TrimSpace(string(out))

	cfg := image.Default()
	cfg.EdgeBinary, cfg.IPXEDir, cfg.VMediaLoader = bin, dir, loader
	require.NoError(t, cfg.Validate())

	tree := t.TempDir()
	require.NoError(t, image.WriteExtension(cfg, tree))
	require.Equal(t, fileSum(t, loader), fileSum(t, filepath.Join(tree, "rootfs/usr/local/lib/containers/outpost-edge/usr/lib/ipxe", image.VMediaLoaderFile)))
}
