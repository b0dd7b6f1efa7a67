package httpd_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/httpd"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// names is a set of /assets/ names the edge serves.
type names map[string]bool

func (n names) Has(name string) bool { return n[name] }

// fetching is an edge fetching these asset names now.
type fetching map[string]bool

func (f fetching) Coming(name string) bool { return f[name] }

func TestDecide(t *testing.T) {
	t.Parallel()

	const (
		host = "10.0.0.2"
		base = "http://" + host
		uuid = "11111111-2222-3333-4444-000000000001"
	)

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	agentAssets := names{"agent/x86_64/vmlinuz": true, "agent/x86_64/initramfs.xz": true}
	install := &bootpb.Kernel{KernelUrl: "/assets/talos/vmlinuz", InitrdUrl: "https://factory.example/initramfs.xz", Args: []string{"talos.platform=metal"}}
	query := httpd.BootQuery{UUID: uuid, Build: bootpb.IPXEArch_IPXE_ARCH_X86_64, Platform: bootpb.IPXEPlatform_IPXE_PLATFORM_EFI}

	cfg := httpd.Default()

	for _, tc := range []struct {
		name   string
		cfg    func(*httpd.Config)
		query  httpd.BootQuery
		host   string
		plan   boot.Entry
		assets httpd.AssetIndex
		coming httpd.ComingIndex
		last   time.Time
		want   httpd.Answer
	}{
		{
			name: "unknown machine boots agent mode with the edge's defaults", plan: boot.Entry{UUID: uuid}, assets: agentAssets,
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: base + "/assets/agent/x86_64/vmlinuz", InitrdUrl: base + "/assets/agent/x86_64/initramfs.xz"},
				Args:   []string{"metal.provider.address=10.0.0.2:50042", "talos.config=" + base + "/config?u=${uuid}", "console=tty0", "console=ttyS0"},
			},
		},
		{
			name: "agent mode from the table's kernel, table args and the machine's own, the plan's address kept",
			plan: boot.Entry{
				UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_AGENT, KernelArgs: []string{"console=ttyS0"}, ExtraArgs: []string{"console=ttyS0", "x=1"},
				Agent: &bootpb.Kernel{KernelUrl: "https://factory.example/k", InitrdUrl: "https://factory.example/i", Args: []string{"metal.provider.address=ctl:1"}},
			},
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: "https://factory.example/k", InitrdUrl: "https://factory.example/i", Args: []string{"metal.provider.address=ctl:1"}},
				Args:   []string{"talos.config=" + base + "/config?u=${uuid}", "metal.provider.address=ctl:1", "console=ttyS0", "x=1"},
			},
		},
		{
			name: "a BIOS machine's i386 iPXE gets the x86_64 kernel", query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_I386}, plan: boot.Entry{}, assets: agentAssets,
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: base + "/assets/agent/x86_64/vmlinuz", InitrdUrl: base + "/assets/agent/x86_64/initramfs.xz"},
				Args:   []string{"metal.provider.address=10.0.0.2:50042", "talos.config=" + base + "/config?u=${uuid}", "console=tty0", "console=ttyS0"},
			},
		},
		{
			name: "an arm64 machine gets the arm64 kernel and the arm64 console", query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}, plan: boot.Entry{},
			assets: names{"agent/arm64/vmlinuz": true, "agent/arm64/initramfs.xz": true},
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: base + "/assets/agent/arm64/vmlinuz", InitrdUrl: base + "/assets/agent/arm64/initramfs.xz"},
				Args:   []string{"metal.provider.address=10.0.0.2:50042", "talos.config=" + base + "/config?u=${uuid}", "console=tty0", "console=ttyAMA0"},
			},
		},
		{
			name:  "an arm64 machine at a site with x86_64 agent assets only is refused, never given x86_64's",
			query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}, plan: boot.Entry{}, assets: agentAssets,
			want: httpd.Answer{Kind: httpd.KindRefuse, Reason: httpd.ReasonNoArchAssets, Status: http.StatusNotFound},
		},
		{
			name:  "an arm64 machine at a site with x86_64 agent assets waits while its own are on their way",
			query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}, plan: boot.Entry{}, assets: agentAssets,
			coming: fetching{"agent/arm64/initramfs.xz": true},
			want: httpd.Answer{
				Kind: httpd.KindWait, Mode: "wait", Report: true, Waiting: "agent", Missing: []string{"agent/arm64/vmlinuz", "agent/arm64/initramfs.xz"},
				Again: base + "/ipxe/boot.ipxe?" + httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}.Encode(), WaitSeconds: 30,
			},
		},
		{
			name:  "an arm64 machine is refused when only another arch's assets are on their way",
			query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}, plan: boot.Entry{}, assets: agentAssets,
			coming: fetching{"talos/vmlinuz": true, "agent/x86_64/vmlinuz": true},
			want:   httpd.Answer{Kind: httpd.KindRefuse, Reason: httpd.ReasonNoArchAssets, Status: http.StatusNotFound},
		},
		{
			name: "an x86_64 machine at a site with arm64 agent assets only is refused", plan: boot.Entry{},
			assets: names{"agent/arm64/vmlinuz": true, "agent/arm64/initramfs.xz": true},
			want:   httpd.Answer{Kind: httpd.KindRefuse, Reason: httpd.ReasonNoArchAssets, Status: http.StatusNotFound},
		},
		{
			name:  "an arm64 machine whose table names its agent kernel boots it, whatever the edge holds",
			query: httpd.BootQuery{Build: bootpb.IPXEArch_IPXE_ARCH_ARM64}, assets: agentAssets,
			plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_AGENT,
				Agent: &bootpb.Kernel{KernelUrl: "https://factory.example/k", InitrdUrl: "https://factory.example/i"}},
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: "https://factory.example/k", InitrdUrl: "https://factory.example/i"},
				Args:   []string{"metal.provider.address=10.0.0.2:50042", "talos.config=" + base + "/config?u=${uuid}", "console=tty0", "console=ttyAMA0"},
			},
		},
		{
			name: "advertised host and agent address win over the Host header", host: "attacker.example",
			cfg:  func(c *httpd.Config) { c.AdvertiseHost, c.AgentAddress = "edge.site:8080", "edge.site:9" },
			plan: boot.Entry{}, assets: names{"agent/x86_64/vmlinuz": true, "agent/x86_64/initramfs.xz": true},
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "agent", Report: true, Comment: "agent mode", Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: "http://edge.site:8080/assets/agent/x86_64/vmlinuz", InitrdUrl: "http://edge.site:8080/assets/agent/x86_64/initramfs.xz"},
				Args:   []string{"metal.provider.address=edge.site:9", "talos.config=http://edge.site:8080/config?u=${uuid}", "console=tty0", "console=ttyS0"},
			},
		},
		{
			name: "install", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_INSTALL, Install: install}, assets: names{"talos/vmlinuz": true},
			want: httpd.Answer{
				Kind: httpd.KindKernel, Mode: "install", Report: true, Comment: "install " + uuid, Retries: 5,
				Kernel: &bootpb.Kernel{KernelUrl: base + "/assets/talos/vmlinuz", InitrdUrl: "https://factory.example/initramfs.xz", Args: []string{"talos.platform=metal"}},
				Args:   []string{"talos.config=" + base + "/config?u=${uuid}", "talos.platform=metal", "console=tty0", "console=ttyS0"},
			},
		},
		{
			name: "install whose kernel has not reached the site waits, and is reported the first time",
			plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_INSTALL, Install: install}, assets: names{},
			want: httpd.Answer{
				Kind: httpd.KindWait, Mode: "wait", Report: true, Waiting: "install", Missing: []string{"talos/vmlinuz"},
				Again: base + "/ipxe/boot.ipxe?" + query.Encode(), WaitSeconds: 30,
			},
		},
		{
			name: "a machine still waiting within the report interval is not reported again",
			plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_INSTALL, Install: install}, last: now.Add(-httpd.WaitReportEvery + time.Second),
			want: httpd.Answer{
				Kind: httpd.KindWait, Mode: "wait", Waiting: "install", Missing: []string{"talos/vmlinuz"},
				Again: base + "/ipxe/boot.ipxe?" + query.Encode(), WaitSeconds: 30,
			},
		},
		{
			name: "a machine waiting for longer than the report interval is reported again",
			plan: boot.Entry{UUID: uuid}, last: now.Add(-httpd.WaitReportEvery),
			want: httpd.Answer{
				Kind: httpd.KindWait, Mode: "wait", Report: true, Waiting: "agent", Missing: []string{"agent/x86_64/vmlinuz", "agent/x86_64/initramfs.xz"},
				Again: base + "/ipxe/boot.ipxe?" + query.Encode(), WaitSeconds: 30,
			},
		},
		{
			name: "a stale plan (an old table version, the uplink down) is answered as held",
			plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_DISK, Version: 1},
			want: httpd.Answer{Kind: httpd.KindExit, Mode: "disk", Report: true},
		},
		{
			name: "disk by sanboot", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_DISK, DiskMethod: bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT},
			want: httpd.Answer{Kind: httpd.KindSanboot, Mode: "disk", Report: true},
		},
		{
			name: "disk by HTTP 404", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_DISK, DiskMethod: bootpb.DiskMethod_DISK_METHOD_HTTP_404},
			want: httpd.Answer{Kind: httpd.KindRefuse, Mode: "disk", Reason: httpd.ReasonDiskByHTTP404, Status: http.StatusNotFound, Report: true},
		},
		{
			name: "deny", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_DENY},
			want: httpd.Answer{Kind: httpd.KindRefuse, Mode: "deny", Reason: httpd.ReasonDenied, Status: http.StatusNotFound, Report: true},
		},
		{
			name: "a Host header that would break out of the script", host: "evil\nchain http://x/", plan: boot.Entry{},
			want: httpd.Answer{Kind: httpd.KindRefuse, Reason: httpd.ReasonBadHost, Status: http.StatusBadRequest},
		},
		{
			name: "an empty Host header", host: "-", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_DISK},
			want: httpd.Answer{Kind: httpd.KindExit, Mode: "disk", Report: true},
		},
		{
			name: "a plan argument that would add a script line is not rendered",
			plan: boot.Entry{UUID: uuid, ExtraArgs: []string{"quiet\nshell"}}, assets: agentAssets,
			want: httpd.Answer{Kind: httpd.KindRefuse, Mode: "agent", Reason: httpd.ReasonUnsafePlan, Status: http.StatusNotFound},
		},
		{
			name: "a plan URL with an iPXE expansion is not rendered",
			plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{KernelUrl: "http://x/${net0/ip}", InitrdUrl: "http://x/i"}},
			want: httpd.Answer{Kind: httpd.KindRefuse, Mode: "install", Reason: httpd.ReasonUnsafePlan, Status: http.StatusNotFound},
		},
		{
			name: "an install plan without a kernel", plan: boot.Entry{UUID: uuid, Known: true, Mode: bootpb.Mode_MODE_INSTALL},
			want: httpd.Answer{Kind: httpd.KindRefuse, Mode: "install", Reason: httpd.ReasonNoInstallKernel, Status: http.StatusNotFound},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			c := cfg
			if tc.cfg != nil {
				tc.cfg(&c)
			}

			req := httpd.Request{Query: tc.query, Host: tc.host, Plan: tc.plan, Assets: tc.assets, Coming: tc.coming, LastReported: tc.last, Now: now}
			if req.Query.Build == bootpb.IPXEArch_IPXE_ARCH_UNSPECIFIED {
				req.Query = query
			}

			switch tc.host {
			case "":
				req.Host = host
			case "-":
				req.Host = ""
				c.AdvertiseHost = host
			}

			require.Equal(t, tc.want, httpd.Decide(c, req))
		})
	}
}

// Hostile query values never reach Decide: ParseBootQuery refuses them.
func TestDecideHostileQueries(t *testing.T) {
	t.Parallel()

	for _, raw := range []string{
		"uuid=../../etc", "uuid=11111111-2222-3333-4444-000000000001%0Achain", "mac=52-54-00-00-00-01-02", "arch=x86_64%20&&%20shell",
		"platform=efi${x}", "arch=x86_64&arch=arm64", strings.Repeat("a", 600), "uuid=%zz",
	} {
		_, err := httpd.ParseBootQuery(raw)
		require.ErrorIs(t, err, httpd.ErrBadQuery, raw)
	}
}

// Every answer that is a script renders as one; refusals render nothing.
func TestAnswerScript(t *testing.T) {
	t.Parallel()

	for _, a := range []httpd.Answer{
		{Kind: httpd.KindKernel, Comment: "agent mode", Kernel: &bootpb.Kernel{KernelUrl: "http://e/k", InitrdUrl: "http://e/i"}, Args: []string{"a=1"}, Retries: 3},
		{Kind: httpd.KindWait, Waiting: "agent", Missing: []string{"k"}, Again: "http://e/ipxe/boot.ipxe?arch=x86_64", WaitSeconds: 30},
		{Kind: httpd.KindExit},
		{Kind: httpd.KindSanboot},
	} {
		require.True(t, strings.HasPrefix(string(a.Script()), "#!ipxe\n"), "%+v", a)
	}

	require.Nil(t, httpd.Answer{Kind: httpd.KindRefuse}.Script())
	require.Contains(t, string(httpd.Answer{Kind: httpd.KindKernel, Kernel: &bootpb.Kernel{KernelUrl: "http://e/k", InitrdUrl: "http://e/i"}, Args: []string{"a=1", "b"}, Retries: 3}.Script()),
		"kernel http://e/k initrd=initrd a=1 b && goto initrd ||")
}

// FuzzDecide: whatever the Host header and query, an answer's script has the shape of its template (no
// value adds a line to it).
func FuzzDecide(f *testing.F) {
	for _, s := range [][2]string{
		{"10.0.0.2", "uuid=11111111-2222-3333-4444-000000000001&arch=x86_64"}, {"[fd00::2]:8080", "mac=52-54-00-00-00-01"},
		{"a\nb", ""}, {"", "arch=arm64&platform=efi"},
	} {
		f.Add(s[0], s[1])
	}

	lines := map[httpd.Kind]int{}

	for _, a := range []httpd.Answer{
		{Kind: httpd.KindKernel, Kernel: &bootpb.Kernel{KernelUrl: "k", InitrdUrl: "i"}, Retries: 1},
		{Kind: httpd.KindWait, Waiting: "agent", Again: "a"},
	} {
		lines[a.Kind] = strings.Count(string(a.Script()), "\n")
	}

	f.Fuzz(func(t *testing.T, host, raw string) {
		q, err := httpd.ParseBootQuery(raw)
		if err != nil {
			return
		}

		for _, plan := range []boot.Entry{{}, {Known: true, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{KernelUrl: "/assets/k", InitrdUrl: "/assets/i"}}} {
			for _, have := range []httpd.AssetIndex{names{}, names{"k": true, "i": true, "agent/x86_64/vmlinuz": true, "agent/x86_64/initramfs.xz": true}} {
				a := httpd.Decide(httpd.Default(), httpd.Request{Query: q, Host: host, Plan: plan, Assets: have, Now: time.Unix(0, 0)})
				if want, ok := lines[a.Kind]; ok && strings.Count(string(a.Script()), "\n") != want {
					t.Fatalf("host %q query %q: script of %d lines, want %d:\n%s", host, raw, strings.Count(string(a.Script()), "\n"), want, a.Script())
				}
			}
		}
	})
}
