package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// AddBareSite creates a comparison site without an edge: its dnsmasq does the whole network boot itself
// (DHCP with boot files, TFTP for the iPXE binaries) and a static HTTP server in the DHCP namespace serves
// an iPXE script with the agent-mode kernel and initramfs, the classic dnsmasq + static files setup. It has
// no WAN link; the machine's agent then has nothing to dial, so the comparison ends when its /init starts
// the agent (OUTPOST-AGENT-START on the serial console).
func (l *Lab) AddBareSite(ctx context.Context, index int, images Images) (*Site, error) {
	root := filepath.Join(l.Dir, fmt.Sprintf("bare%d-files", index))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}

	ipxeDir, err := IPXEDir()
	if err != nil {
		return nil, err
	}

	for _, f := range []string{"undionly.kpxe", "ipxe.efi"} {
		if err := copyFile(filepath.Join(ipxeDir, f), filepath.Join(root, f)); err != nil {
			return nil, err
		}
	}

	if err := copyFile(images.Kernel, filepath.Join(root, "vmlinuz")); err != nil {
		return nil, err
	}

	if err := copyFile(images.Initramfs, filepath.Join(root, "initramfs.xz")); err != nil {
		return nil, err
	}

	server := fmt.Sprintf("10.77.%d.1", index)
	script := fmt.Sprintf(`#!ipxe
kernel http://%[1]s/vmlinuz initrd=initrd console=ttyS0 metal.provider.address=%[1]s:1 talos.config=http://%[1]s/config?u=${uuid}
initrd --name initrd http://%[1]s/initramfs.xz
boot
`, server)

	if err := os.WriteFile(filepath.Join(root, "boot.ipxe"), []byte(script), 0o644); err != nil {
		return nil, err
	}

	s, err := l.addSite(nil, index, []string{
		"--enable-tftp", "--tftp-root=" + root,
		"--dhcp-match=set:ipxe,175",
		"--dhcp-vendorclass=set:efi,PXEClient:Arch:00007",
		"--dhcp-boot=tag:ipxe,http://" + server + "/boot.ipxe",
		"--dhcp-boot=tag:!ipxe,tag:efi,ipxe.efi",
		"--dhcp-boot=tag:!ipxe,tag:!efi,undionly.kpxe",
	})
	if err != nil {
		return nil, err
	}

	var ln net.Listener

	if err := InNetns(s.DHCPNS, func() error {
		var err error
		ln, err = net.Listen("tcp", server+":80")

		return err
	}); err != nil {
		return nil, fmt.Errorf("listen static http: %w", err)
	}

	srv := &http.Server{Handler: http.FileServer(http.Dir(root)), ReadHeaderTimeout: 10 * time.Second}

	go srv.Serve(ln) //nolint:errcheck

	l.Defer(func() { srv.Close() }) //nolint:errcheck

	return s, nil
}
