package vbmc_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// mediaBMC is a Redfish vBMC with a virtual CD (no backend) on loopback.
func mediaBMC(t *testing.T) (*vbmc.Chassis, *vbmc.Media, *vbmc.Redfish, string) {
	t.Helper()

	ch := vbmc.NewChassis()
	media := vbmc.NewMedia(nil)
	rf := vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password, Media: media})
	srv := httptest.NewServer(rf)
	t.Cleanup(srv.Close)

	return ch, media, rf, srv.URL
}

func sushycli(t *testing.T, endpoint string, args ...string) (string, error) {
	t.Helper()

	all := append(args, "--service-endpoint", endpoint, "--username", user, "--password", password)

	out, err := exec.CommandContext(t.Context(), "sushycli", all...).CombinedOutput()

	return string(out), err
}

func TestVirtualMediaWithSushycli(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("sushycli"); err != nil {
		t.Skip("sushycli not installed (Debian package python3-sushy-cli)")
	}

	ch, media, rf, endpoint := mediaBMC(t)
	image := "http://10.0.0.1:8080/vmedia/52-54-00-00-00-01.iso"

	out, err := sushycli(t, endpoint, "manager", "vmedia", "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "CD1")

	out, err = sushycli(t, endpoint, "manager", "vmedia", "insert", "--image", image, "--device-id", "/redfish/v1/Managers/1/VirtualMedia/CD1")
	require.NoError(t, err, out)
	require.Equal(t, vbmc.MediaState{Image: image, Inserted: true, Inserts: 1}, media.State())
	require.Equal(t, image, media.Image())

	// sushycli 0.4's "system boot set" hands sushy 4.3 a string where it wants an enum: the library itself sets it.
	script := `import sys, sushy
s = sushy.Sushy(sys.argv[1], username=sys.argv[2], password=sys.argv[3])
s.get_system("/redfish/v1/Systems/1").set_system_boot_options(sushy.BootSource.CD,
    enabled=sushy.BootSourceOverrideEnabled.ONCE, mode=sushy.BootSourceOverrideMode.UEFI)
`
	py, err := exec.CommandContext(t.Context(), "/usr/bin/python3", "-c", script, endpoint+"/redfish/v1", user, password).CombinedOutput()
	require.NoError(t, err, "%s", py)
	require.Equal(t, vbmc.Override{Device: vbmc.BootCD, Mode: metal.UEFI}, ch.Override())

	out, err = sushycli(t, endpoint, "system", "power", "on")
	require.NoError(t, err, out)
	require.NoError(t, ch.Reset(t.Context()))
	require.Equal(t, []vbmc.Override{{Device: vbmc.BootCD, Mode: metal.UEFI}, {}}, ch.Boots(), "the CD booted once, then the firmware's own order")

	out, err = sushycli(t, endpoint, "manager", "vmedia", "eject", "--device-id", "/redfish/v1/Managers/1/VirtualMedia/CD1")
	require.NoError(t, err, out)
	require.Equal(t, vbmc.MediaState{Inserts: 1, Ejects: 1}, media.State())
	require.Zero(t, rf.Sessions(), "sushy logged out")
}

func TestVirtualMediaWithRedfishtool(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("redfishtool"); err != nil {
		t.Skip("redfishtool not installed (Debian package redfishtool)")
	}

	ch, media, _, endpoint := mediaBMC(t)
	addr := strings.TrimPrefix(endpoint, "http://")

	var mgr struct {
		ManagerType  string
		VirtualMedia map[string]string
	}

	require.NoError(t, json.Unmarshal([]byte(redfishtool(t, addr, "Managers", "-1", "get")), &mgr))
	require.Equal(t, "BMC", mgr.ManagerType)
	require.Equal(t, "/redfish/v1/Managers/1/VirtualMedia", mgr.VirtualMedia["@odata.id"])

	cd := "/redfish/v1/Managers/1/VirtualMedia/CD1"
	image := "https://edge.example.test/vmedia/a.iso"

	redfishtool(t, addr, "raw", "POST", cd+"/Actions/VirtualMedia.InsertMedia", "-d", `{"Image":"`+image+`","Inserted":true,"WriteProtected":true}`)

	var got struct {
		Image                string
		ImageName            string
		Inserted             bool
		ConnectedVia         string
		TransferProtocolType string
	}

	require.NoError(t, json.Unmarshal([]byte(redfishtool(t, addr, "raw", "GET", cd)), &got))
	require.Equal(t, image, got.Image)
	require.Equal(t, "a.iso", got.ImageName)
	require.True(t, got.Inserted)
	require.Equal(t, "URI", got.ConnectedVia)
	require.Equal(t, "HTTPS", got.TransferProtocolType)

	redfishtool(t, addr, "Systems", "-1", "setBootOverride", "Once", "Cd")
	require.Equal(t, vbmc.BootCD, ch.Override().Device)

	redfishtool(t, addr, "raw", "POST", cd+"/Actions/VirtualMedia.EjectMedia", "-d", `{}`)
	require.Equal(t, vbmc.MediaState{Inserts: 1, Ejects: 1}, media.State())
}

// post sends a JSON body with basic authentication and returns the status and the Redfish message id.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.SetBasicAuth(user, password)

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close()

	var e struct {
		Error struct{ Code string } `json:"error"`
	}

	_ = json.NewDecoder(resp.Body).Decode(&e) //nolint:errcheck // a success has no body

	return resp.StatusCode, e.Error.Code
}

func TestVirtualMediaHostileInput(t *testing.T) {
	t.Parallel()

	insert := "/redfish/v1/Managers/1/VirtualMedia/CD1/Actions/VirtualMedia.InsertMedia"

	for _, tc := range []struct {
		name   string
		body   string
		fault  vbmc.MediaFault
		status int
		code   string
	}{
		{name: "not json", body: `{"Image":`, status: 400, code: "Base.1.8.MalformedJSON"},
		{name: "no image", body: `{}`, status: 400, code: "Base.1.8.ActionParameterMissing"},
		{name: "file url", body: `{"Image":"file:///etc/shadow"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "nfs url", body: `{"Image":"nfs://10.0.0.1/a.iso"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "user in url", body: `{"Image":"http://u:p@10.0.0.1/a.iso"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "control character", body: `{"Image":"http://10.0.0.1/a\u0000.iso"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "relative", body: `{"Image":"/vmedia/a.iso"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "too long", body: `{"Image":"http://10.0.0.1/` + strings.Repeat("a", vbmc.MaxImageURL) + `"}`, status: 400, code: "Base.1.8.ActionParameterValueFormatError"},
		{name: "writable", body: `{"Image":"http://10.0.0.1/a.iso","WriteProtected":false}`, status: 400, code: "Base.1.8.ActionParameterNotSupported"},
		{name: "refusing bmc", body: `{"Image":"http://10.0.0.1/a.iso"}`, fault: vbmc.MediaRefuse, status: 500, code: "Base.1.8.InternalError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			_, media, _, endpoint := mediaBMC(t)
			media.SetFault(tc.fault)

			status, code := post(t, endpoint+insert, tc.body)
			require.Equal(t, tc.status, status)
			require.Equal(t, tc.code, code)
			require.Equal(t, vbmc.MediaState{}, media.State(), "nothing mounted")
		})
	}

	t.Run("second image", func(t *testing.T) {
		t.Parallel()

		_, media, _, endpoint := mediaBMC(t)

		status, _ := post(t, endpoint+insert, `{"Image":"http://10.0.0.1/a.iso"}`)
		require.Equal(t, http.StatusNoContent, status)

		status, code := post(t, endpoint+insert, `{"Image":"http://10.0.0.1/b.iso"}`)
		require.Equal(t, http.StatusConflict, status)
		require.Equal(t, "Base.1.8.ResourceInUse", code)
		require.Equal(t, "http://10.0.0.1/a.iso", media.Image())
	})

	t.Run("half mount", func(t *testing.T) {
		t.Parallel()

		_, media, _, endpoint := mediaBMC(t)
		media.SetFault(vbmc.MediaHalfMount)

		status, _ := post(t, endpoint+insert, `{"Image":"http://10.0.0.1/a.iso"}`)
		require.Equal(t, http.StatusNoContent, status, "a half-mounting bmc answers success")
		require.Equal(t, vbmc.MediaState{Image: "http://10.0.0.1/a.iso"}, media.State(), "the image is recorded, not inserted")
		require.Empty(t, media.Image(), "the host does not see it")
	})

	t.Run("cd without media", func(t *testing.T) {
		t.Parallel()

		ch := vbmc.NewChassis()
		srv := httptest.NewServer(vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password}))
		t.Cleanup(srv.Close)

		req, err := http.NewRequestWithContext(t.Context(), http.MethodPatch, srv.URL+"/redfish/v1/Systems/1",
			strings.NewReader(`{"Boot":{"BootSourceOverrideTarget":"Cd","BootSourceOverrideEnabled":"Once"}}`))
		require.NoError(t, err)
		req.SetBasicAuth(user, password)

		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, vbmc.BootNone, ch.Override().Device)

		status, _ := post(t, srv.URL+insert, `{"Image":"http://10.0.0.1/a.iso"}`)
		require.Equal(t, http.StatusNotFound, status, "no virtual media on this bmc")
	})
}

// qemuCD starts a paused QEMU (no firmware runs) with an empty CD-ROM drive and its QMP socket.
func qemuCD(t *testing.T) vbmc.QMP {
	t.Helper()

	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed (Debian package qemu-system-x86)")
	}

	sock := filepath.Join(t.TempDir(), "qmp.sock")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-S", "-machine", "q35,accel=tcg", "-nodefaults", "-display", "none",
		"-qmp", "unix:"+sock+",server=on,wait=off",
		"-drive", "if=none,id=cd0,media=cdrom,readonly=on", "-device", "ide-cd,drive=cd0,id=cdrom0")

	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log

	require.NoError(t, cmd.Start())

	done := make(chan struct{})

	go func() { cmd.Wait(); close(done) }() //nolint:errcheck

	t.Cleanup(func() { cancel(); <-done })

	q := vbmc.QMP{Socket: sock, Device: "cdrom0", Timeout: 20 * time.Second}

	require.Eventually(t, func() bool {
		return q.Execute(t.Context(), "query-status", nil, nil) == nil
	}, 30*time.Second, 50*time.Millisecond, "qemu's qmp socket: %s", &log)

	return q
}

// inserted returns the file QEMU's CD-ROM drive holds ("" when empty).
func inserted(t *testing.T, q vbmc.QMP) string {
	t.Helper()

	var blocks []struct {
		Qdev     string
		Inserted *struct{ File string }
	}

	require.NoError(t, q.Execute(t.Context(), "query-block", nil, &blocks))

	for _, b := range blocks {
		if strings.Contains(b.Qdev, "cdrom0") {
			if b.Inserted == nil {
				return ""
			}

			return b.Inserted.File
		}
	}

	t.Fatalf("no cdrom0 in query-block: %+v", blocks)

	return ""
}

func TestQMPChangesQEMUsCD(t *testing.T) {
	t.Parallel()

	q := qemuCD(t)
	ctx := t.Context()

	iso := filepath.Join(t.TempDir(), "a.iso")
	require.NoError(t, os.WriteFile(iso, make([]byte, 64<<10), 0o644))

	require.NoError(t, q.Insert(ctx, iso))
	require.Equal(t, iso, inserted(t, q))

	require.NoError(t, q.Eject(ctx))
	require.Empty(t, inserted(t, q))

	var qerr *vbmc.QMPError

	require.ErrorAs(t, q.Insert(ctx, filepath.Join(t.TempDir(), "missing.iso")), &qerr, "qemu's own refusal, named")
	require.Empty(t, inserted(t, q))

	off := vbmc.QMP{Socket: filepath.Join(t.TempDir(), "none.sock"), Device: "cdrom0"}
	require.ErrorIs(t, off.Insert(ctx, iso), vbmc.ErrNotRunning)

	// Through a BMC's virtual CD: QEMU's curl driver reads the image over HTTP by byte ranges.
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/qemu/block-curl.so"); err != nil {
		t.Log("qemu's curl block driver is not installed (Debian package qemu-block-extra): http images not tried")

		return
	}

	ranges := make(chan string, 1000)
	img := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case ranges <- r.Method + " " + r.Header.Get("Range"):
		default:
		}

		http.ServeFile(w, r, iso)
	}))
	t.Cleanup(img.Close)

	media := vbmc.NewMedia(q)
	require.NoError(t, media.Insert(ctx, img.URL+"/a.iso"))
	require.Equal(t, img.URL+"/a.iso", inserted(t, q))

	// the firmware reading the CD: a range of the image
	require.NoError(t, q.Execute(ctx, "human-monitor-command", map[string]any{"command-line": `qemu-io -d cdrom0 "read 0 4k"`}, nil))

	var reqs []string

	for len(ranges) > 0 {
		reqs = append(reqs, <-ranges)
	}

	require.Contains(t, strings.Join(reqs, "|"), "GET bytes=", "qemu read the image by ranges: %v", reqs)

	require.NoError(t, media.Eject(ctx))
	require.Empty(t, inserted(t, q))
}
