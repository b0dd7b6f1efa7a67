package assets_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/siderolabs/image-factory/pkg/schematic"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/shared/metal"
)

// fakeFactory is an in-process image factory: it stores schematics by their real ID and counts creations.
type fakeFactory struct {
	created atomic.Int32
	fail    atomic.Bool
	last    atomic.Pointer[schematic.Schematic]
}

func (f *fakeFactory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/schematics" {
		http.NotFound(w, r)

		return
	}

	if f.fail.Load() {
		http.Error(w, "factory down", http.StatusServiceUnavailable)

		return
	}

	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)

		return
	}

	sc, err := schematic.Unmarshal(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)

		return
	}

	id, err := sc.ID()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)

		return
	}

	f.created.Add(1)
	f.last.Store(sc)

	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"id": id, "schematic": string(body)}) //nolint:errcheck
}

func TestFactoryResolver(t *testing.T) {
	t.Parallel()

	fake := &fakeFactory{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)

	r, err := assets.NewFactoryResolver(srv.URL, "https://pxe.example")
	require.NoError(t, err)

	ctx := context.Background()
	p := assets.Profile{TalosVersion: "v1.11.0", Extensions: []string{"siderolabs/metal-agent", "siderolabs/iscsi-tools"}, KernelArgs: []string{"console=ttyS0"}}

	b, err := r.Resolve(ctx, p)
	require.NoError(t, err)

	imageOnly := &schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/iscsi-tools", "siderolabs/metal-agent"}},
	}}
	imageID, err := imageOnly.ID()
	require.NoError(t, err)

	u, err := url.Parse(srv.URL)
	require.NoError(t, err)

	require.Equal(t, assets.Boot{
		SchematicID:       imageID,
		KernelURL:         "/assets/talos/v1.11.0/" + imageID + "/amd64/kernel",
		InitrdURL:         "/assets/talos/v1.11.0/" + imageID + "/amd64/initramfs.xz",
		UpstreamKernelURL: "https://pxe.example/image/" + imageID + "/v1.11.0/kernel-amd64",
		UpstreamInitrdURL: "https://pxe.example/image/" + imageID + "/v1.11.0/initramfs-amd64.xz",
		Installer:         u.Host + "/installer/" + imageID + ":v1.11.0",
		KernelArgs:        []string{"console=ttyS0"},
	}, b, "kernel, initramfs and installer of the extensions-only schematic; the kernel args stay with the plan")

	// the same profile (extensions in another order) reuses the schematic
	p.Extensions = []string{"siderolabs/iscsi-tools", "siderolabs/metal-agent"}
	_, err = r.Resolve(ctx, p)
	require.NoError(t, err)
	require.EqualValues(t, 1, fake.created.Load())

	// another machine's kernel args: the same schematic and files
	p.KernelArgs = []string{"console=ttyS1"}
	b2, err := r.Resolve(ctx, p)
	require.NoError(t, err)
	require.EqualValues(t, 1, fake.created.Load())
	require.Equal(t, b.UpstreamKernelURL, b2.UpstreamKernelURL)
	require.Equal(t, []string{"console=ttyS1"}, b2.KernelArgs)

	// Omni's form of the version (no v) is the same profile: same schematic, same URLs
	omniStyle := p
	omniStyle.TalosVersion = "1.11.0"
	b3, err := r.Resolve(ctx, omniStyle)
	require.NoError(t, err)
	require.EqualValues(t, 1, fake.created.Load())
	require.Equal(t, b2, b3)

	// a factory failure is an error, not a plan
	fake.fail.Store(true)

	_, err = r.Resolve(ctx, assets.Profile{TalosVersion: "v1.10.0"})
	require.Error(t, err)

	for _, bad := range []assets.Profile{{TalosVersion: "1.11"}, {TalosVersion: "v1.11.0/../x"}, {TalosVersion: "v1.11.0", Arch: "mips"}} {
		_, err = r.Resolve(ctx, bad)
		require.ErrorIs(t, err, assets.ErrNotAvailable, bad)
	}
}

// A Secure Boot profile resolves to the factory's signed image and Secure Boot installer of a schematic that
// holds the kernel arguments (its command line is locked), besides the extensions-only kernel; another
// machine's arguments are another schematic, the same arguments the same one, created once.
func TestFactoryResolverSecureBoot(t *testing.T) {
	t.Parallel()

	fake := &fakeFactory{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)

	r, err := assets.NewFactoryResolver(srv.URL, "https://pxe.example")
	require.NoError(t, err)

	ctx := context.Background()
	args := []string{"talos.platform=metal", "talos.config=http://10.0.0.2:8080/config?u=${uuid}"}
	p := assets.Profile{TalosVersion: "1.11.0", Extensions: []string{"siderolabs/metal-agent"}, KernelArgs: args, Arch: metal.ARM64, SecureBoot: true}

	b, err := r.Resolve(ctx, p)
	require.NoError(t, err)
	require.EqualValues(t, 2, fake.created.Load(), "the extensions-only schematic and the Secure Boot one")
	require.Equal(t, args, fake.last.Load().Customization.ExtraKernelArgs, "the kernel arguments are baked into the signed image's schematic")

	signed := &schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/metal-agent"}},
		ExtraKernelArgs:  args,
	}}
	signedID, err := signed.ID()
	require.NoError(t, err)
	require.NotEqual(t, b.SchematicID, signedID)

	u, err := url.Parse(srv.URL)
	require.NoError(t, err)

	require.Equal(t, signedID, b.SignedSchematicID)
	require.Equal(t, "/assets/talos/v1.11.0/"+signedID+"/arm64/secureboot-uki.efi", b.SignedURL)
	require.Equal(t, "https://pxe.example/image/"+signedID+"/v1.11.0/metal-arm64-secureboot-uki.efi", b.UpstreamSignedURL)
	require.Equal(t, u.Host+"/installer-secureboot/"+signedID+":v1.11.0", b.Installer)

	wants := b.Wants("arm64")
	require.Contains(t, wants, assets.Want{Name: "talos/v1.11.0/" + signedID + "/arm64/secureboot-uki.efi", URL: b.UpstreamSignedURL},
		"the library fetches the signed image once, and the site holds it")

	// the same profile again: no new schematic
	_, err = r.Resolve(ctx, p)
	require.NoError(t, err)
	require.EqualValues(t, 2, fake.created.Load())

	// another edge address is another signed image
	other := p
	other.KernelArgs = []string{"talos.platform=metal", "talos.config=http://10.0.1.2:8080/config?u=${uuid}"}
	b2, err := r.Resolve(ctx, other)
	require.NoError(t, err)
	require.EqualValues(t, 3, fake.created.Load())
	require.NotEqual(t, b.SignedURL, b2.SignedURL)
	require.Equal(t, b.KernelURL, b2.KernelURL, "the extensions-only kernel is shared")

	// without Secure Boot: no signed image
	plain := p
	plain.SecureBoot = false
	b3, err := r.Resolve(ctx, plain)
	require.NoError(t, err)
	require.Empty(t, b3.SignedURL)
	require.Equal(t, u.Host+"/installer/"+b3.SchematicID+":v1.11.0", b3.Installer)
}

func TestLocalResolver(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	p := assets.Profile{TalosVersion: "v1.11.0", Extensions: []string{"siderolabs/metal-agent"}, KernelArgs: []string{"talos.config=http://edge/config?u=${uuid}"}}

	r, err := assets.NewLocalResolver(dir, "http://edge/assets/")
	require.NoError(t, err)

	_, err = r.Resolve(context.Background(), p)
	require.ErrorIs(t, err, assets.ErrNotAvailable)

	id, err := assets.SchematicID(p)
	require.NoError(t, err)

	vdir := filepath.Join(dir, id, "v1.11.0")
	require.NoError(t, os.MkdirAll(vdir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(vdir, "kernel-amd64"), []byte("k"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(vdir, "initramfs-amd64.xz"), []byte("i"), 0o644))

	b, err := r.Resolve(context.Background(), p)
	require.NoError(t, err)

	// Omni writes a cluster's Talos version without the v: the same files
	omniStyle := p
	omniStyle.TalosVersion = "1.11.0"
	b2, err := r.Resolve(context.Background(), omniStyle)
	require.NoError(t, err)
	require.Equal(t, b, b2)

	require.Equal(t, "http://edge/assets/"+id+"/v1.11.0/kernel-amd64", b.KernelURL)
	require.Equal(t, "http://edge/assets/"+id+"/v1.11.0/initramfs-amd64.xz", b.InitrdURL)
	require.Equal(t, p.KernelArgs, b.KernelArgs)
	require.Empty(t, b.UpstreamKernelURL+b.Installer, "local files have no upstream")
}

func TestCanonicalTalosVersion(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, in, want string
	}{
		{name: "omni form", in: "1.11.5", want: "v1.11.5"},
		{name: "factory form", in: "v1.11.5", want: "v1.11.5"},
		{name: "pre-release", in: "1.14.0-alpha.2", want: "v1.14.0-alpha.2"},
		{name: "two parts", in: "1.11"},
		{name: "empty", in: ""},
		{name: "only v", in: "v"},
		{name: "path", in: "v1.11.0/../x"},
		{name: "double v", in: "vv1.11.0"},
		{name: "space", in: "1.11.5 "},
		{name: "query", in: "1.11.5?x=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := assets.CanonicalTalosVersion(tc.in)
			if tc.want == "" {
				require.Error(t, err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzProfileResolve(f *testing.F) {
	dir := f.TempDir()

	r, err := assets.NewLocalResolver(dir, "http://edge/assets")
	require.NoError(f, err)

	f.Add("v1.11.0", "amd64", "siderolabs/metal-agent")
	f.Add("../../etc", "arm64", "")

	f.Fuzz(func(t *testing.T, version, arch, ext string) {
		_, err := r.Resolve(context.Background(), assets.Profile{TalosVersion: version, Arch: metal.Arch(arch), Extensions: []string{ext}})
		require.Error(t, err) // the directory is empty: nothing resolves, nothing panics
	})
}
