package httpd

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	agentconfig "github.com/siderolabs/talos-metal-agent/pkg/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/outpost-metal/outpost/edge/boot"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Request is everything a boot.ipxe answer depends on. The handler gathers it (the query parsed, the
// machine's entry looked up, the assets the edge can serve, when this machine's wait was last reported, the
// clock read) so that Decide is a function of its arguments alone, as dhcp.Decide is for the ProxyDHCP.
type Request struct {
	// Query is the request's parsed query (ParseBootQuery).
	Query BootQuery
	// Host is the request's Host header, used for the URLs in the script unless the configuration names
	// the advertised host.
	Host string
	// Plan is the machine's entry in the boot table (Known false for a machine the table does not name).
	Plan boot.Entry
	// Assets tells which /assets/ names the edge serves now (its cache or its files directory); nil: none.
	Assets AssetIndex
	// Coming tells which /assets/ names the edge is fetching now; nil: none.
	Coming ComingIndex
	// Upstream is how the site's machines may reach upstream install assets (the site's asset policy).
	Upstream UpstreamRule
	// LastReported is when this machine's wait for assets was last reported; zero if never.
	LastReported time.Time
	// Now is the time of the request.
	Now time.Time
}

// UpstreamRule is how a site's machines may reach upstream install assets: the site's asset policy as the
// boot scripts and /config see it.
type UpstreamRule int

// The rules.
const (
	// UpstreamAllowed (passthrough): a machine boots an install kernel the edge does not hold from upstream.
	UpstreamAllowed UpstreamRule = iota
	// UpstreamViaEdge (cache): machines boot only what the edge holds, waiting for it meanwhile, and pull the
	// installer image through the edge's registry (which the machine may pass by when it lacks the image).
	UpstreamViaEdge
	// UpstreamNever (offline): nothing a machine fetches leaves the site, the installer image included.
	UpstreamNever
)

// Kind is the kind of answer Decide gives.
type Kind int

// The kinds of answer.
const (
	// KindRefuse is no script: an HTTP error (Answer.Status). The chain in init.ipxe fails and the machine is
	// left to its firmware's next boot entry.
	KindRefuse Kind = iota
	// KindKernel boots Answer.Kernel with Answer.Args.
	KindKernel
	// KindWait keeps the machine in iPXE until the assets named in Answer.Missing reach the site.
	KindWait
	// KindExit leaves iPXE so that the firmware boots from disk.
	KindExit
	// KindSanboot boots the first disk from iPXE.
	KindSanboot
)

// Mode is the mode of a served boot as it is journaled and counted (the label of outpost_ipxe_boot_served_total).
type Mode string

// The modes of a served boot.
const (
	// ModeAgent boots the metal agent.
	ModeAgent Mode = "agent"
	// ModeInstall boots the Talos installer.
	ModeInstall Mode = "install"
	// ModeWait keeps the machine in iPXE until its assets reach the site (Answer.Waiting says for which mode).
	ModeWait Mode = "wait"
	// ModeDisk boots the machine's disk.
	ModeDisk Mode = "disk"
	// ModeDeny refuses the machine any boot.
	ModeDeny Mode = "deny"
)

// Reason is why the server refuses a request (Answer.Reason for boot.ipxe), also the label of
// outpost_http_rejected_total.
type Reason string

// The reasons for a refusal.
const (
	// ReasonDenied: the plan denies the machine any boot.
	ReasonDenied Reason = "denied"
	// ReasonDiskByHTTP404: the plan boots from disk by failing the chain (DISK_METHOD_HTTP_404).
	ReasonDiskByHTTP404 Reason = "disk_http_404"
	// ReasonBadHost: the Host header cannot be put in a script line, and no advertised host is configured.
	ReasonBadHost Reason = "bad_host"
	// ReasonUnsafePlan: the plan names a URL or argument that would break out of its script line.
	ReasonUnsafePlan Reason = "unsafe_plan"
	// ReasonNoInstallKernel: an install plan without a kernel (the boot table refuses those; not rendered
	// as a script that cannot boot).
	ReasonNoInstallKernel Reason = "no_install_kernel"
	// ReasonNoArchAssets: agent mode for a machine whose kernel arch the site has no agent assets for, while
	// it has those of another arch and is not fetching this arch's (the site's agent assets are here, this
	// arch's are neither among them nor on their way: waiting would not end, and another arch's kernel must
	// never be booted). While they are on their way, the machine waits for them.
	ReasonNoArchAssets Reason = "no_agent_assets_for_arch"
	// ReasonBadQuery: a boot.ipxe or /config query that does not parse or is too long.
	ReasonBadQuery Reason = "bad_query"
	// ReasonNotFound: a boot binary the edge does not serve.
	ReasonNotFound Reason = "not_found"
	// ReasonBadName: a boot binary name that is not one (bootfiles.ErrBadName).
	ReasonBadName Reason = "bad_name"
)

// Answer is the decided answer to one boot.ipxe request.
type Answer struct {
	Kind Kind
	// Mode is the boot mode journaled and counted: agent, install, wait, disk or deny; empty for a refusal
	// that is not a boot (bad input).
	Mode Mode
	// Reason says why the request is refused (KindRefuse); Status is the HTTP status to answer it with.
	Reason Reason
	Status int
	// Report is whether the boot is journaled: every one but the repeats of a machine that keeps waiting
	// for assets within WaitReportEvery.
	Report bool

	// Comment, Kernel (absolute URLs), Args and Retries make the script of KindKernel.
	Comment string
	Kernel  *bootpb.Kernel
	Args    []string
	Retries int

	// Waiting (agent or install), Missing, Again (the URL to ask again) and WaitSeconds make the script of
	// KindWait.
	Waiting     Mode
	Missing     []string
	Again       string
	WaitSeconds int
}

// WaitReportEvery is how often a machine that keeps waiting for assets is logged and reported.
const WaitReportEvery = 10 * time.Minute

// Decide answers a boot.ipxe request from the machine's plan.
func Decide(cfg Config, req Request) Answer {
	base, ok := baseURL(cfg, req.Host)
	if !ok {
		return Answer{Kind: KindRefuse, Reason: ReasonBadHost, Status: http.StatusBadRequest}
	}

	e, q := req.Plan, req.Query

	args := e.KernelArgs
	if len(args) == 0 {
		args = cfg.KernelArgs
		if a, ok := cfg.ArchKernelArgs[q.Arch()]; ok {
			args = a
		}
	}

	args = append(append([]string(nil), args...), e.ExtraArgs...)

	switch e.Mode {
	case bootpb.Mode_MODE_DENY:
		return Answer{Kind: KindRefuse, Mode: ModeDeny, Reason: ReasonDenied, Status: http.StatusNotFound, Report: true}
	case bootpb.Mode_MODE_DISK:
		switch e.DiskMethod {
		case bootpb.DiskMethod_DISK_METHOD_HTTP_404:
			return Answer{Kind: KindRefuse, Mode: ModeDisk, Reason: ReasonDiskByHTTP404, Status: http.StatusNotFound, Report: true}
		case bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT:
			return Answer{Kind: KindSanboot, Mode: ModeDisk, Report: true}
		default:
			return Answer{Kind: KindExit, Mode: ModeDisk, Report: true}
		}
	case bootpb.Mode_MODE_INSTALL:
		if e.Install.GetKernelUrl() == "" {
			return Answer{Kind: KindRefuse, Mode: ModeInstall, Reason: ReasonNoInstallKernel, Status: http.StatusNotFound}
		}

		// The installed Talos fetches its join config from this edge once, then reaches Omni over SideroLink.
		all := withDefaultArgs(append(append([]string(nil), e.Install.GetArgs()...), args...),
			constants.KernelParamConfig+"="+base+"/config?u=${uuid}")

		return kernelOrWait(cfg, req, base, ModeInstall, "install "+e.UUID.String(), e.Install, all)
	default:
		k := e.Agent
		if k.GetKernelUrl() == "" {
			arch := q.Arch()
			k = agentKernel(cfg, arch)

			if len(missingAssets(req.Assets, k)) == 2 && !coming(req.Coming, k) && otherArchAgent(cfg, req.Assets, arch) {
				return Answer{Kind: KindRefuse, Reason: ReasonNoArchAssets, Status: http.StatusNotFound}
			}
		}

		all := withDefaultArgs(append(append([]string(nil), k.GetArgs()...), args...),
			agentconfig.MetalProviderAddressKernelArg+"="+agentAddress(cfg, req.Host), constants.KernelParamConfig+"="+base+"/config?u=${uuid}")

		return kernelOrWait(cfg, req, base, ModeAgent, "agent mode", k, all)
	}
}

// agentKernel is the edge's default agent-mode kernel and initrd for a machine's arch ("{arch}" is iPXE's name
// for it: x86_64, arm64).
func agentKernel(cfg Config, arch metal.Arch) *bootpb.Kernel {
	return &bootpb.Kernel{
		KernelUrl: strings.ReplaceAll(cfg.AgentKernel, "{arch}", arch.IPXE()),
		InitrdUrl: strings.ReplaceAll(cfg.AgentInitrd, "{arch}", arch.IPXE()),
	}
}

// coming reports whether the edge is fetching k's edge-local kernel or initrd now.
func coming(c ComingIndex, k *bootpb.Kernel) bool {
	if c == nil {
		return false
	}

	for _, u := range []string{k.GetKernelUrl(), k.GetInitrdUrl()} {
		if name, ok := strings.CutPrefix(u, "/assets/"); ok && c.Coming(name) {
			return true
		}
	}

	return false
}

// otherArchAgent reports whether the edge serves the default agent kernel and initrd of an arch other than
// arch.
func otherArchAgent(cfg Config, have AssetIndex, arch metal.Arch) bool {
	for _, other := range []metal.Arch{metal.AMD64, metal.ARM64} {
		if other != arch && len(missingAssets(have, agentKernel(cfg, other))) == 0 {
			return true
		}
	}

	return false
}

// kernelOrWait boots k with args, or waits when its edge-local kernel or initrd is not at the site yet.
func kernelOrWait(cfg Config, req Request, base string, mode Mode, comment string, k *bootpb.Kernel, args []string) Answer {
	if !safeInScript(k.GetKernelUrl(), k.GetInitrdUrl()) || !safeInScript(args...) {
		return Answer{Kind: KindRefuse, Mode: mode, Reason: ReasonUnsafePlan, Status: http.StatusNotFound}
	}

	if missing := missingAssets(req.Assets, k); len(missing) > 0 {
		if up, ok := upstream(req.Upstream, k); ok {
			return kernelOrWait(cfg, Request{Query: req.Query, Upstream: UpstreamNever}, base, mode, comment, up, args)
		}

		return Answer{
			Kind: KindWait, Mode: ModeWait, Waiting: mode, Missing: missing,
			Again:       base + "/ipxe/boot.ipxe?" + req.Query.Encode(),
			WaitSeconds: int(cfg.AssetWait.Seconds()),
			Report:      req.LastReported.IsZero() || req.Now.Sub(req.LastReported) >= WaitReportEvery,
		}
	}

	return Answer{Kind: KindKernel, Mode: mode, Report: true, Comment: comment, Kernel: absolute(base, k), Args: args, Retries: cfg.Retries}
}

// safeInScript reports whether every value can stand in an iPXE script line as one word: no spaces, no
// control characters, nothing iPXE expands (${...}) beyond the ${uuid} the edge itself puts in.
func safeInScript(values ...string) bool {
	for _, v := range values {
		v = strings.ReplaceAll(v, "${uuid}", "")
		if strings.ContainsAny(v, " \t\r\n${}") || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return false
		}
	}

	return true
}

// baseURL returns "http://host[:port]" as machines reach this server: the advertised host, else the
// request's Host when it is safe to put in a script.
func baseURL(cfg Config, host string) (string, bool) {
	if cfg.AdvertiseHost != "" {
		return "http://" + cfg.AdvertiseHost, true
	}

	if !hostRE.MatchString(host) {
		return "", false
	}

	return "http://" + host, true
}

// Reach is how machines reach this server when they reach it at host (a Host header's host[:port]): its
// base URL and the agents' tunnel endpoint, as Decide puts them on iPXE's kernel command lines; false when
// neither the advertised host nor host is usable.
func (c Config) Reach(host string) (base, agent string, ok bool) {
	if base, ok = baseURL(c, host); !ok {
		return "", "", false
	}

	return base, agentAddress(c, host), true
}

// agentAddress is metal.provider.address for agent mode: the configured one, else the host machines reach
// this server at with the agent port.
func agentAddress(cfg Config, host string) string {
	if cfg.AgentAddress != "" {
		return cfg.AgentAddress
	}

	if cfg.AdvertiseHost != "" {
		host = cfg.AdvertiseHost
	}

	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}

	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(cfg.AgentPort))
}

// withDefaultArgs puts each key=value default in front of args unless args already set that key (the
// controller named an address of its own); an argument given twice (the edge's and the plan's console) is
// kept once.
func withDefaultArgs(args []string, defaults ...string) []string {
	var front []string

	for _, d := range defaults {
		key, _, _ := strings.Cut(d, "=")
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, key+"=") }) {
			front = append(front, d)
		}
	}

	out := make([]string, 0, len(front)+len(args))

	for _, a := range append(front, args...) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}

	return out
}

// missingAssets returns the edge-local (/assets/...) kernel and initrd of k that the edge cannot serve now.
// URLs elsewhere (the image factory) are not checked.
func missingAssets(have AssetIndex, k *bootpb.Kernel) []string {
	var out []string

	for _, u := range []string{k.GetKernelUrl(), k.GetInitrdUrl()} {
		name, ok := strings.CutPrefix(u, "/assets/")
		if !ok || name == "" {
			continue
		}

		if have != nil && have.Has(name) {
			continue
		}

		out = append(out, name)
	}

	return out
}

// upstream returns k's upstream kernel and initrd when the site lets machines fetch them there and k has them.
func upstream(rule UpstreamRule, k *bootpb.Kernel) (*bootpb.Kernel, bool) {
	if rule != UpstreamAllowed || k.GetUpstreamKernelUrl() == "" || k.GetUpstreamInitrdUrl() == "" {
		return nil, false
	}

	return &bootpb.Kernel{KernelUrl: k.GetUpstreamKernelUrl(), InitrdUrl: k.GetUpstreamInitrdUrl(), Args: k.GetArgs()}, true
}

// absolute makes edge-relative kernel and initrd paths absolute URLs.
func absolute(base string, k *bootpb.Kernel) *bootpb.Kernel {
	abs := func(u string) string {
		if strings.HasPrefix(u, "/") {
			return base + u
		}

		return u
	}

	return &bootpb.Kernel{KernelUrl: abs(k.GetKernelUrl()), InitrdUrl: abs(k.GetInitrdUrl()), Args: k.GetArgs()}
}
