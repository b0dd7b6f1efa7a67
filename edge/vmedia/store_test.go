package vmedia_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-metal/outpost/edge/vmedia"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// plans is a vmedia.Planner over a fixed answer per machine; a machine it does not name boots agent mode.
type plans map[string]vmedia.Boot

func (p plans) Boot(uuid string, _ net.HardwareAddr) (vmedia.Boot, error) {
	if b, ok := p[uuid]; ok {
		if b.Mode == "disk" {
			return vmedia.Boot{}, errors.New("the machine's plan boots its disk")
		}

		return b, nil
	}

	return vmedia.Boot{Mode: "agent", Kernel: "agent/vmlinuz", Initrd: "agent/initrd", Args: []string{"talos.config=http://10.9.0.1/config?u=${uuid}"}}, nil
}

// files is vmedia.Assets over a directory.
type files string

func (f files) Open(name string) (*os.File, error) { return os.Open(filepath.Join(string(f), name)) }

const machineMAC = "52:54:00:00:00:07"

func newStore(t *testing.T, p vmedia.Planner) (*vmedia.Store, string) {
	t.Helper()

	dir := t.TempDir()
	assets := filepath.Join(dir, "assets")

	for name, body := range map[string]string{"agent/vmlinuz": "kernel", "agent/initrd": "initrd", "install/vmlinuz": "ik", "install/initrd": "ii"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(assets, name)), 0o755); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(filepath.Join(assets, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	loader := filepath.Join(dir, "loader.efi")
	if err := os.WriteFile(loader, []byte("MZ loader"), 0o644); err != nil {
		t.Fatal(err)
	}

	dhcp := &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_OFF, Subnet: "10.9.0.0/24", Gateway: "10.9.0.1", Dns: []string{"10.9.0.2"},
		Reservations: []*bootpb.DHCPReservation{{Mac: machineMAC, Ip: "10.9.0.7"}},
	}

	s, err := vmedia.NewStore(vmedia.Config{Dir: filepath.Join(dir, "state"), Loader: loader, BaseURL: "http://10.9.0.1"},
		p, files(assets), func() *bootpb.DHCP { return dhcp })
	if err != nil {
		t.Fatal(err)
	}

	return s, filepath.Join(dir, "state")
}

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()

	hw, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}

	return hw
}

func TestImageOfAMachineWithItsReservedAddress(t *testing.T) {
	s, _ := newStore(t, plans{})
	ctx := context.Background()

	first, err := s.Image(ctx, "", mustMAC(t, machineMAC))
	if err != nil {
		t.Fatal(err)
	}

	if first.Mode != "agent" || first.Static.Address.String() != "10.9.0.7/24" || !strings.HasPrefix(first.URL, "http://10.9.0.1/vmedia/") {
		t.Fatalf("image %+v", first)
	}

	// A machine known by UUID (remembered from its first boot) gets its UUID filled in: another image.
	const id = "0e5a1ab0-0000-4000-8000-000000000007"
	if err := s.Remember(id, mustMAC(t, machineMAC)); err != nil {
		t.Fatal(err)
	}

	known, err := s.Image(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}

	if known.Name == first.Name {
		t.Fatal("an image with the UUID filled in has the name of the one without")
	}

	again, err := s.Image(ctx, id, nil)
	if err != nil || again.Name != known.Name {
		t.Fatalf("the same plan built another image: %s vs %s (%v)", again.Name, known.Name, err)
	}
}

func TestImageRefusals(t *testing.T) {
	const id = "0e5a1ab0-0000-4000-8000-000000000009"

	s, _ := newStore(t, plans{id: {Mode: "disk"}})
	ctx := context.Background()

	if _, err := s.Image(ctx, id, nil); !errors.Is(err, vmedia.ErrUnknownMAC) {
		t.Errorf("a machine never booted from an image, no MAC: got %v, want ErrUnknownMAC", err)
	}

	if _, err := s.Image(ctx, "", mustMAC(t, "52:54:00:00:00:99")); !errors.Is(err, vmedia.ErrNoReservation) {
		t.Errorf("a MAC without a reservation: got %v, want ErrNoReservation", err)
	}

	if _, err := s.Image(ctx, id, mustMAC(t, machineMAC)); err == nil || !strings.Contains(err.Error(), "disk") {
		t.Errorf("a machine whose plan boots its disk: got %v", err)
	}
}

func TestRememberedMACsSurviveARestart(t *testing.T) {
	s, state := newStore(t, plans{})

	const id = "0e5a1ab0-0000-4000-8000-000000000007"
	if err := s.Remember(strings.ToUpper(id), mustMAC(t, machineMAC)); err != nil {
		t.Fatal(err)
	}

	again, err := vmedia.NewStore(vmedia.Config{Dir: state}, plans{}, files(t.TempDir()), func() *bootpb.DHCP { return nil })
	if err != nil {
		t.Fatal(err)
	}

	if mac, ok := again.MACOf(id); !ok || mac.String() != machineMAC {
		t.Fatalf("after a restart: %v %v", mac, ok)
	}
}

func TestServeImageWithRanges(t *testing.T) {
	s, _ := newStore(t, plans{})

	img, err := s.Image(context.Background(), "", mustMAC(t, machineMAC))
	if err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(s)
	defer srv.Close()

	get := func(path, rng string) (*http.Response, []byte) {
		t.Helper()

		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}

		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()

		body, _ := io.ReadAll(resp.Body)

		return resp, body
	}

	whole, body := get(vmedia.Prefix+img.Name, "")
	if whole.StatusCode != http.StatusOK || int64(len(body)) != whole.ContentLength || len(body)%2048 != 0 {
		t.Fatalf("whole image: %d, %d bytes", whole.StatusCode, len(body))
	}

	part, chunk := get(vmedia.Prefix+img.Name, "bytes=32768-34815")
	if part.StatusCode != http.StatusPartialContent || string(chunk) != string(body[32768:34816]) {
		t.Fatalf("a range (the volume descriptor): %d, %d bytes", part.StatusCode, len(chunk))
	}

	// Hostile ranges: beyond the end, inverted, a thousand overlapping ones.
	if r, _ := get(vmedia.Prefix+img.Name, fmt.Sprintf("bytes=%d-", len(body)+10)); r.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("a range past the end: %d", r.StatusCode)
	}

	if r, _ := get(vmedia.Prefix+img.Name, "bytes=50-10"); r.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("an inverted range: %d", r.StatusCode)
	}

	many := "bytes=" + strings.TrimSuffix(strings.Repeat("0-1048575,", 1000), ",")
	if r, b := get(vmedia.Prefix+img.Name, many); r.StatusCode == http.StatusPartialContent && len(b) > 2*len(body) {
		t.Errorf("a thousand overlapping ranges were answered with %d bytes for an image of %d", len(b), len(body))
	}

	for _, path := range []string{vmedia.Prefix + "../macs.json", vmedia.Prefix + strings.Repeat("a", 64) + ".iso", vmedia.Prefix + "x.iso", vmedia.Prefix + img.Name + ".part"} {
		if r, _ := get(path, ""); r.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, r.StatusCode)
		}
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{vmedia.Prefix + strings.Repeat("0", 64) + ".iso", vmedia.Prefix + "../x", "/vmedia/", vmedia.Prefix + strings.Repeat("A", 64) + ".iso"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, path string) {
		name, ok := vmedia.ParseName(path)
		if !ok {
			return
		}

		if len(name) != 68 || strings.ContainsAny(name, "/\\.") && !strings.HasSuffix(name, ".iso") || strings.Count(name, ".") != 1 {
			t.Fatalf("%q accepted as %q", path, name)
		}
	})
}
