package app_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	pintftp "github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/nettest"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// TestContractAdvertisedIsServed binds what the ProxyDHCP advertises to what the edge, built and run as the
// binary runs it, serves over TFTP and HTTP:
// for every firmware class and client kind, the boot file in the reply is fetched the way the client
// would fetch it and compared with the bytes on disk; the iPXE script chain is followed to the kernel and initrd.
func TestContractAdvertisedIsServed(t *testing.T) {
	t.Parallel()

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))

	binDir := bootfiles.DefaultDir
	if _, err := os.Stat(filepath.Join(binDir, "ipxe.efi")); err != nil {
		binDir = t.TempDir()
		for _, n := range dhcp.DefaultBootFiles().Names() {
			require.NoError(t, os.WriteFile(filepath.Join(binDir, n), []byte("binary "+n), 0o644))
		}
	}

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.IPXEDir = binDir
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.APIListen = "127.0.0.1:0"
	cfg.TFTP.Listen = "127.0.0.1:0"
	// No controller: the edge keeps trying to enrol in the background, and serves the site meanwhile.
	cfg.Uplink.ControllerAddress = nettest.RefusingAddr(t)
	cfg.Uplink.JoinToken = uplink.JoinToken{SiteID: "lab", Secret: make([]byte, uplink.SecretLen)}.String()

	// Plain files the edge serves under /assets/ (<state>/files): the agent's kernel and initrd.
	for _, p := range []string{"agent/x86_64/vmlinuz", "agent/x86_64/initramfs.xz"} {
		f := filepath.Join(cfg.StateDir, "files", p)
		require.NoError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		require.NoError(t, os.WriteFile(f, []byte("asset "+p), 0o644))
	}

	edge, err := app.Build(t.Context(), cfg, log, app.Options{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)

	go func() { ran <- edge.Run(ctx) }()

	defer func() {
		cancel()
		require.NoError(t, <-ran)
	}()

	files := dhcp.DefaultBootFiles()
	catalog, err := bootfiles.LoadCatalog(binDir, files.Names())
	require.NoError(t, err)

	// The ProxyDHCP as wired: the catalog decides what is bootable.
	dcfg := dhcp.Default()
	dcfg.ServerIP = "127.0.0.1"
	dcfg.HTTPPort = edge.Addrs().HTTP.(*net.TCPAddr).Port
	dsrv, err := dhcp.New(dcfg, log, dhcp.Deps{Bootable: catalog.Has, Prefs: snpPrefs{"52:54:00:00:00:05": true}})
	require.NoError(t, err)

	params := dsrv.Params()

	advertised := 0

	for _, code := range []uint16{0, 6, 7, 9, 11, 22, 15, 16, 19, 24} {
		for _, kind := range []string{"firmware", "ipxe", "snp-only"} {
			mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
			mods := []dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), archOpt(code)}

			switch kind {
			case "ipxe":
				mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
			case "snp-only":
				mac = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 5}
			}

			pkt, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac)}, mods...)...)
			require.NoError(t, err)

			d := dhcp.Decide(params, dhcp.RoleDHCP, netip.AddrPort{}, pkt.ToBytes())
			name := strconv.Itoa(int(code)) + "/" + kind

			if d.Reply == nil {
				require.Equal(t, dhcp.DropNotBootable, d.Drop, name)
				require.False(t, catalog.Has(files.File(d.Firmware, kind == "snp-only")), "%s: a served file was not advertised", name)

				continue
			}

			advertised++

			// The header and option 67 agree; siaddr is the server.
			require.Equal(t, d.Reply.BootFileName, d.Reply.BootFileNameOption(), name)
			require.True(t, d.Reply.ServerIPAddr.Equal(net.IPv4(127, 0, 0, 1)), name)

			if strings.HasPrefix(d.BootFile, "http://") {
				checkHTTPChain(t, name, d.BootFile, catalog)

				continue
			}

			want, err := catalog.Lookup(d.BootFile)
			require.NoError(t, err, name)
			require.Equal(t, want.Data, tftpFetch(t, edge.Addrs().TFTP.String(), d.BootFile), "%s: TFTP bytes", name)
		}
	}

	require.GreaterOrEqual(t, advertised, 12, "BIOS, UEFI x86 and HTTP x86 at least, each as firmware, iPXE and SNP-only")
}

var urlRE = regexp.MustCompile(`http://[^\s]+`)

func checkHTTPChain(t *testing.T, name, url string, catalog *bootfiles.Catalog) {
	t.Helper()

	body := httpGet(t, url)

	switch {
	case strings.Contains(url, "/tftp/"):
		want, err := catalog.Lookup(url[strings.Index(url, "/tftp/")+len("/tftp/"):])
		require.NoError(t, err, name)
		require.Equal(t, want.Data, body, "%s: HTTP boot bytes", name)
	case strings.HasSuffix(url, "/ipxe/init.ipxe"):
		require.True(t, bytes.HasPrefix(body, []byte("#!ipxe\n")), name)

		// Follow every URL the script names, with iPXE's variables filled in as iPXE would.
		for _, u := range urlRE.FindAllString(string(body), -1) {
			u = strings.NewReplacer("${uuid}", "11111111-2222-3333-4444-555555555555", "${net${idx}/mac:hexhyp}", "52-54-00-00-00-01",
				"${buildarch}", "x86_64", "${platform}", "pcbios").Replace(u)
			script := httpGet(t, u)
			require.True(t, bytes.HasPrefix(script, []byte("#!ipxe\n")), "%s: %s", name, u)

			for _, asset := range urlRE.FindAllString(string(script), -1) {
				if strings.Contains(asset, "/assets/") {
					require.Equal(t, "asset "+asset[strings.Index(asset, "/assets/")+len("/assets/"):], string(httpGet(t, asset)), "%s: %s", name, asset)
				}
			}
		}
	default:
		t.Fatalf("%s: advertised URL %s is not one the edge serves", name, url)
	}
}

func httpGet(t *testing.T, url string) []byte {
	t.Helper()

	resp, err := http.Get(url)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	require.Equal(t, http.StatusOK, resp.StatusCode, url)

	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return b
}

func tftpFetch(t *testing.T, addr, name string) []byte {
	t.Helper()

	c, err := pintftp.NewClient(addr)
	require.NoError(t, err)
	c.SetTimeout(2 * time.Second)
	c.SetBlockSize(1468)

	wt, err := c.Receive(name, "octet")
	require.NoError(t, err)

	var buf bytes.Buffer
	_, err = wt.WriteTo(&buf)
	require.NoError(t, err)

	return buf.Bytes()
}

func archOpt(code uint16) dhcpv4.Modifier {
	v := make([]byte, 2)
	binary.BigEndian.PutUint16(v, code)

	return dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, v)
}

type snpPrefs map[string]bool

func (p snpPrefs) SNPOnly(mac net.HardwareAddr, _ string) bool { return p[mac.String()] }

func (p snpPrefs) Known(mac net.HardwareAddr, _ string) bool { _, ok := p[mac.String()]; return ok }

func (snpPrefs) Discovery() string { return "" }

func (snpPrefs) DiskPlan(net.HardwareAddr, string) bool { return false }

func (snpPrefs) SecureBoot(net.HardwareAddr, string) (bool, bool) { return false, false }

func (snpPrefs) SignedImage(net.HardwareAddr, string, metal.Arch) *bootpb.SignedImage { return nil }
