package image_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/image"
)

// buildController builds the real controller static (CGO_ENABLED=0), as make build does.
func buildController(t *testing.T) string {
	t.Helper()

	out := filepath.Join(t.TempDir(), "controller")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./controller")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "build the controller: %s", b)

	return out
}

// layerEntry is one entry of the image's layer.
type layerEntry struct {
	hdr  *tar.Header
	data []byte
}

// readLayers returns every entry of the image's layers by name (without a trailing slash).
func readLayers(t *testing.T, img v1.Image) map[string]layerEntry {
	t.Helper()

	layers, err := img.Layers()
	require.NoError(t, err)

	entries := map[string]layerEntry{}

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

			data, err := io.ReadAll(tr)
			require.NoError(t, err)

			entries[strings.TrimSuffix(hdr.Name, "/")] = layerEntry{hdr: hdr, data: data}
		}

		require.NoError(t, rc.Close())
	}

	return entries
}

// controllerHelp is what the controller's --help says about its flags: the variables each reads and its
// default, by flag name.
type controllerHelp struct {
	vars     map[string][]string
	defaults map[string]string
}

var helpFlag = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?: \w+)?\s+.*?\[([A-Z0-9_, ]+)\](?: \(default "?([^")]*)"?\))?\s*$`)

func readHelp(t *testing.T, bin string) controllerHelp {
	t.Helper()

	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)

	h := controllerHelp{vars: map[string][]string{}, defaults: map[string]string{}}

	for line := range strings.Lines(string(out)) {
		m := helpFlag.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}

		for v := range strings.SplitSeq(m[2], ",") {
			h.vars[m[1]] = append(h.vars[m[1]], strings.TrimSpace(v))
		}

		h.defaults[m[1]] = m[3]
	}

	require.NotEmpty(t, h.vars, "no flag with a variable in --help:\n%s", out)

	return h
}

func (h controllerHelp) readsVar(name string) bool {
	for _, vs := range h.vars {
		if slices.Contains(vs, name) {
			return true
		}
	}

	return false
}

func port(t *testing.T, hostport string) int {
	t.Helper()

	_, p, err := net.SplitHostPort(hostport)
	require.NoError(t, err, hostport)

	n, err := strconv.Atoi(p)
	require.NoError(t, err, hostport)

	return n
}

func envMap(env []string) map[string]string {
	m := map[string]string{}

	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}

	return m
}

func TestControllerImage(t *testing.T) {
	t.Parallel()

	if testing.Short() {
		t.Skip("builds the controller; skipped under -short")
	}

	bin := buildController(t)

	cfg := image.DefaultController()
	cfg.Version = "v0.0.0-test"
	cfg.Arch = runtime.GOARCH
	cfg.Binary = bin

	if _, err := os.Stat(cfg.CABundle); err != nil {
		t.Skipf("no CA bundle to bake in (Debian's ca-certificates package): %v", err)
	}

	out := t.TempDir()
	res, err := image.BuildController(cfg, "", out)
	require.NoError(t, err)

	idx, err := layout.ImageIndexFromPath(res.OCILayout)
	require.NoError(t, err)

	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	require.Equal(t, "outpost-controller:v0.0.0-test", im.Manifests[0].Annotations[image.RefNameAnnotation])

	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	require.Equal(t, runtime.GOARCH, cf.Architecture)
	require.Equal(t, []string{image.ControllerBinary}, cf.Config.Entrypoint)
	require.Empty(t, cf.Config.Cmd)

	// a numeric, non-root user and group
	uid, gid, ok := strings.Cut(cf.Config.User, ":")
	require.True(t, ok, "user %q has no group", cf.Config.User)
	require.NotEqual(t, "0", uid)
	require.NotEqual(t, "0", gid)
	require.Equal(t, strconv.Itoa(image.ControllerUID), uid)

	// the environment is what the README and the manifest say it is
	env := envMap(cf.Config.Env)
	require.Equal(t, map[string]string{
		"PATH":                  path.Dir(image.ControllerBinary),
		"OUTPOST_STATE_DIR":     "/var/lib/outpost-controller",
		"OUTPOST_UPLINK_LISTEN": ":8443",
		"OUTPOST_HTTP_LISTEN":   ":9464",
	}, env)
	require.Contains(t, cf.Config.Volumes, image.ControllerStateDir)
	require.Contains(t, cf.Config.ExposedPorts, "8443/tcp")
	require.Contains(t, cf.Config.ExposedPorts, "9464/tcp")
	require.Equal(t, "v0.0.0-test", cf.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, image.DefaultSource, cf.Config.Labels["org.opencontainers.image.source"])

	entries := readLayers(t, img)
	binEntry, ok := entries[strings.TrimPrefix(image.ControllerBinary, "/")]
	require.True(t, ok, "no binary at the entrypoint %s", image.ControllerBinary)
	require.Equal(t, byte(tar.TypeReg), binEntry.hdr.Typeflag)
	require.EqualValues(t, 0o755, binEntry.hdr.Mode, "binary mode")
	require.Equal(t, fileSum(t, bin), sum(binEntry.data), "the binary in the image is not the one built")

	ef, err := elf.NewFile(bytes.NewReader(binEntry.data))
	require.NoError(t, err)

	for _, p := range ef.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary needs a dynamic loader")
	}

	libs, err := ef.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "the binary needs shared libraries (DT_NEEDED)")
	require.Equal(t, map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH], ef.Machine)

	state := entries[strings.TrimPrefix(image.ControllerStateDir, "/")]
	require.NotNil(t, state.hdr, "no state directory")
	require.Equal(t, byte(tar.TypeDir), state.hdr.Typeflag)
	require.Equal(t, image.ControllerUID, state.hdr.Uid)
	require.EqualValues(t, 0o700, state.hdr.Mode)

	require.Contains(t, string(entries["etc/passwd"].data), "outpost:x:65532:65532:")
	require.Equal(t, fileSum(t, cfg.CABundle), sum(entries["etc/ssl/certs/ca-certificates.crt"].data))

	for name, e := range entries {
		if name != strings.TrimPrefix(image.ControllerStateDir, "/") {
			require.Zero(t, e.hdr.Uid, "%s is not root's", name)
		}
	}

	// the archive is the layout, packed
	archive, err := os.Open(res.OCIArchive)
	require.NoError(t, err)
	t.Cleanup(func() { archive.Close() }) //nolint:errcheck

	var names []string

	for tr := tar.NewReader(archive); ; {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}

		require.NoError(t, err)

		names = append(names, hdr.Name)
	}

	require.Contains(t, names, "index.json")
	require.Contains(t, names, "oci-layout")

	unit, err := os.ReadFile(res.Unit)
	require.NoError(t, err)
	require.Equal(t, image.ControllerUnit(), unit)

	manifest, err := os.ReadFile(res.Manifest)
	require.NoError(t, err)

	objs, err := decodeManifest(manifest)
	require.NoError(t, err)
	require.Equal(t, "outpost-controller:v0.0.0-test", objs.deployments[0].Spec.Template.Spec.Containers[0].Image)

	t.Run("flags", func(t *testing.T) {
		// what the image, the unit and the manifest set are variables the controller reads, with its defaults
		help := readHelp(t, bin)

		require.Equal(t, image.ControllerStateDir, help.defaults["state-dir"])
		require.Equal(t, image.ControllerUplinkPort, port(t, help.defaults["uplink-listen"]))
		require.Equal(t, image.ControllerHTTPPort, port(t, help.defaults["http-listen"]))

		for _, v := range []string{image.EnvControllerStateDir, image.EnvControllerUplinkListen, image.EnvControllerHTTPListen, image.EnvOmniEndpoint} {
			require.True(t, help.readsVar(v), "the controller does not read %s", v)
		}

		set := slices.Collect(maps.Keys(env))
		set = append(set, slices.Collect(maps.Keys(unitEnvironment(t, unitOptions(t, unit)["Service"])))...)
		set = append(set, manifestEnvNames(objs)...)

		for _, v := range set {
			if v == "PATH" || v == image.EnvOmniServiceAccountKey {
				continue // PATH is for exec; the key has no flag, it is read from the environment only
			}

			require.True(t, help.readsVar(v), "%s is set for the controller but it reads no such variable", v)
		}

		// the key has no flag; the binary names the variable it reads it from
		require.True(t, bytes.Contains(binEntry.data, []byte(image.EnvOmniServiceAccountKey)))
	})

	t.Run("runs", func(t *testing.T) {
		// the binary from the image, with the image's environment (state and listeners moved to the test's)
		dir := t.TempDir()
		exe := filepath.Join(dir, "outpost-controller")
		require.NoError(t, os.WriteFile(exe, binEntry.data, 0o755))

		httpAddr := freeAddr(t)
		runEnv := overrideEnv(cf.Config.Env, map[string]string{
			image.EnvControllerStateDir:     filepath.Join(dir, "state"),
			image.EnvControllerUplinkListen: freeAddr(t),
			image.EnvControllerHTTPListen:   httpAddr,
		})

		runController(t, httpAddr, func(args ...string) *exec.Cmd {
			cmd := exec.Command(exe, args...)
			cmd.Env = runEnv

			return cmd
		})
	})

	t.Run("runs as its user in its own file system", func(t *testing.T) {
		// the layer unpacked as a container runtime would, the controller chrooted into it as 65532: it needs
		// nothing from the host and can write its state directory
		if os.Getuid() != 0 {
			t.Skip("chroot and a change of user need root")
		}

		root := t.TempDir()
		unpack(t, entries, root)

		uidN, err := strconv.Atoi(uid)
		require.NoError(t, err)
		gidN, err := strconv.Atoi(gid)
		require.NoError(t, err)

		httpAddr := freeAddr(t)
		runEnv := overrideEnv(cf.Config.Env, map[string]string{
			image.EnvControllerUplinkListen: freeAddr(t),
			image.EnvControllerHTTPListen:   httpAddr,
		})

		runController(t, httpAddr, func(args ...string) *exec.Cmd {
			cmd := exec.Command(cf.Config.Entrypoint[0], args...)
			cmd.Env, cmd.Dir = runEnv, cf.Config.WorkingDir
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Chroot:     root,
				Credential: &syscall.Credential{Uid: uint32(uidN), Gid: uint32(gidN), Groups: []uint32{}},
			}

			return cmd
		})

		db, err := os.Stat(filepath.Join(root, image.ControllerStateDir, "outpost.db"))
		require.NoError(t, err, "no site store in the image's state directory")
		require.EqualValues(t, uidN, db.Sys().(*syscall.Stat_t).Uid)
	})
}

// overrideEnv returns env with the values of the variables in set replaced.
func overrideEnv(env []string, set map[string]string) []string {
	out := make([]string, 0, len(env))

	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := set[k]; ok {
			kv = k + "=" + v
		}

		out = append(out, kv)
	}

	return out
}

// runController starts the controller (cmdFor makes its command lines), waits until /healthz on httpAddr
// answers, lists sites over the admin socket and stops it with SIGTERM, which it must exit 0 on.
func runController(t *testing.T, httpAddr string, cmdFor func(args ...string) *exec.Cmd) {
	t.Helper()

	var logs bytes.Buffer

	cmd := cmdFor()
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() //nolint:errcheck
			<-waited
		}
	})

	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)

	for {
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close() //nolint:errcheck

			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)

			break
		}

		select {
		case err := <-waited:
			waited <- err
			t.Fatalf("controller exited before serving /healthz: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}

		require.True(t, time.Now().Before(deadline), "no /healthz within a minute: %v\n%s", err, logs.String())
	}

	b, err := cmdFor("site", "list").CombinedOutput()
	require.NoError(t, err, "site list over the admin socket: %s", b)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))

	select {
	case err := <-waited:
		require.NoError(t, err, "the controller did not exit cleanly on SIGTERM:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the controller did not stop within 30 s of SIGTERM:\n%s", logs.String())
	}
}

// unpack writes the layer's entries under root with their modes and owners, parents first.
func unpack(t *testing.T, entries map[string]layerEntry, root string) {
	t.Helper()

	require.NoError(t, os.Chmod(root, 0o755)) // the image's / (t.TempDir makes it 0700)

	for _, name := range slices.Sorted(maps.Keys(entries)) {
		e := entries[name]
		p := filepath.Join(root, name)
		mode := e.hdr.FileInfo().Mode() & (os.ModePerm | os.ModeSticky)

		switch e.hdr.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, 0o755))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, e.data, 0o600))
		default:
			t.Fatalf("%s: unexpected entry type %c", name, e.hdr.Typeflag)
		}

		require.NoError(t, os.Chown(p, e.hdr.Uid, e.hdr.Gid))
		require.NoError(t, os.Chmod(p, mode))
	}
}

func sum(b []byte) string {
	s := sha256.Sum256(b)

	return hex.EncodeToString(s[:])
}

// freeAddr returns a loopback address with a port nobody listened on a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	return addr
}
