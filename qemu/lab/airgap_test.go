package lab_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// TestAirGappedSiteInstalls: Talos installs at sites that cannot reach the image factory. The controller is
// given the lab's fake factory (--image-factory-url on an address of the core namespace, no
// --install-assets-dir); every site's namespace routes nothing but the core's service address (the
// controller's uplink, and Omni), so only the controller reaches the factory, fetches each install asset
// and the installer image once and relays them.
//
//   - site1, policy cache: two BIOS machines are discovered and accepted; the first, allocated in Omni
//     through a cluster, PXE-boots its install plan with the kernel and initramfs from its edge
//     (/assets/talos/<version>/<schematic>/amd64/...), the installer image is pulled from the edge's registry
//     with Debian's skopeo inside the site and its digest is the factory's, and the machine boots its disk;
//     the second installs the same profile for zero new requests to the factory and zero new relayed bytes;
//   - site2, policy offline, nothing staged: its machine waits, its timeline names the missing asset, and
//     after `controller assets stage` it installs.
//
// OMNI chooses the Omni as for TestE2E (real by default). Root, QEMU (TCG), skopeo; at most two VMs run at
// once; it takes most of an hour, so run it alone with a long timeout:
//
//	go test -timeout 120m -run TestAirGappedSiteInstalls ./qemu/lab/
//
// Logs and timeline.md stay under _out/airgap/<real|standin>.
func TestAirGappedSiteInstalls(t *testing.T) {
	if _, err := exec.LookPath("skopeo"); err != nil {
		t.Skip("lab test: needs Debian's skopeo to pull from the edge's registry (hack/deps.sh installs it)")
	}

	ctx, a, _, images := airGapLab(t, "airgap", 90*time.Minute, "cache", "offline")

	g := &airGapRun{steps: steps{t, a}, t: t, ctx: ctx, a: a, cache: a.Sites[0], offline: a.Sites[1], images: images}
	g.profile()

	g.step("sites route nothing but the core's service address: the factory unreachable from them, the uplink reachable", g.checkRoutes)
	g.step("edges enrolled, agent images relayed to both sites", g.waitAgentImages)

	m1, err := a.AddMachine(ctx, g.cache, "cache-1", "0e5a1ab0-0000-4000-8000-0000000a0101", "52:54:00:0e:a1:01")
	g.must(err)
	m2, err := a.AddMachine(ctx, g.cache, "cache-2", "0e5a1ab0-0000-4000-8000-0000000a0102", "52:54:00:0e:a1:02")
	g.must(err)

	g.step("discover and accept two machines at the cache site", func() error { return a.Discover(ctx, m1, m2) })
	g.step("first machine at the cache site: installs from its edge, which got its assets by relay; the controller "+
		"fetched each once from the factory", func() error { return g.firstInstall(m1) })
	g.check("installer image pulled from the cache site's edge registry with skopeo inside the site: the factory's digest",
		func() error { return g.checkInstaller(g.cache) })
	g.step("second machine, same profile, same site: installs for zero factory requests and zero relayed bytes",
		func() error { return g.secondInstall(m2) })

	// At most two VMs at once: the installed machines go off and stay off (their BMCs silent, so the
	// controller cannot power them on again).
	for _, m := range []*lab.Machine{m1, m2} {
		g.must(m.SetBMCAnswering(false))
		m.PowerOffNow()
	}

	m3, err := a.AddMachine(ctx, g.offline, "offline-1", "0e5a1ab0-0000-4000-8000-0000000a0201", "52:54:00:0e:a2:01")
	g.must(err)

	g.step("discover and accept a machine at the offline site", func() error { return a.Discover(ctx, m3) })
	g.step("offline site, nothing staged: the allocated machine waits and its timeline names the missing asset; "+
		"staged with controller assets stage, it installs", func() error { return g.offlineInstall(m3) })
	g.check("installer image pulled from the offline site's edge registry with skopeo: the factory's digest",
		func() error { return g.checkInstaller(g.offline) })
}

// airGapRun is one run of TestAirGappedSiteInstalls.
type airGapRun struct {
	steps

	t              *testing.T
	ctx            context.Context
	a              *lab.AirGap
	cache, offline *lab.Site

	images lab.Images

	// version, schematic: the install profile the lab's clusters give (Talos LabTalosVersion, no extensions);
	// kernel, initrd: its edge-local asset names.
	version, schematic, kernel, initrd string
}

func (g *airGapRun) profile() {
	var err error

	g.version, err = assets.CanonicalTalosVersion(lab.LabTalosVersion)
	g.must(err)

	g.schematic, err = assets.SchematicID(assets.Profile{TalosVersion: lab.LabTalosVersion})
	g.must(err)

	g.kernel = assets.InstallAssetName(g.version, g.schematic, "amd64", "kernel")
	g.initrd = assets.InstallAssetName(g.version, g.schematic, "amd64", "initramfs.xz")
}

func (g *airGapRun) must(err error) {
	g.t.Helper()

	if err != nil {
		g.t.Fatalf("%v (logs under %s)", err, g.a.Lab.Dir)
	}
}

// check runs a step whose failure does not stop the ones after it (they do not depend on it): the test fails
// at its end.
func (g *airGapRun) check(name string, fn func() error) {
	g.t.Helper()

	start := time.Now()
	err := fn()
	g.a.Timeline.Step(name, "", start, err)

	if err != nil {
		g.t.Errorf("step FAILED (going on): %s: %v", name, err)

		return
	}

	g.t.Logf("step ok: %s (%s)", name, time.Since(start).Round(time.Second))
}

// checkRoutes: no site has a default route; a TCP connection from a site's namespace to the factory fails
// for want of a route, while the same connection from the core succeeds and the site reaches the uplink.
func (g *airGapRun) checkRoutes() error {
	if err := lab.DialFrom(g.ctx, g.a.Core.NS, g.a.FactoryHost, 5*time.Second); err != nil {
		return fmt.Errorf("the factory from the core (the controller's namespace): %w", err)
	}

	for _, s := range g.a.Sites {
		routes, err := s.Routes()
		if err != nil {
			return err
		}

		g.t.Logf("%s routes:\n%s", s.Name, routes)

		if strings.Contains(routes, "default") {
			return fmt.Errorf("%s has a default route:\n%s", s.Name, routes)
		}

		err = lab.DialFrom(g.ctx, s.NS, g.a.FactoryHost, 5*time.Second)
		if err == nil {
			return fmt.Errorf("%s reached the factory at %s", s.Name, g.a.FactoryHost)
		}

		if !errors.Is(err, syscall.ENETUNREACH) {
			return fmt.Errorf("%s to the factory: want no route (ENETUNREACH), got %w", s.Name, err)
		}

		if err := lab.DialFrom(g.ctx, s.NS, fmt.Sprintf("%s:%d", lab.CoreAddr, lab.ControllerPort), 5*time.Second); err != nil {
			return fmt.Errorf("%s to the controller's uplink: %w", s.Name, err)
		}
	}

	return nil
}

// waitAgentImages waits until both sites report the agent images cached (relayed: they reach nothing else).
func (g *airGapRun) waitAgentImages() error {
	for _, s := range g.a.Sites {
		if err := g.waitShow(s, 3*time.Minute, "agent images cached",
			cachedRE("agent/x86_64/vmlinuz"), cachedRE("agent/x86_64/initramfs.xz")); err != nil {
			return err
		}
	}

	return nil
}

// firstInstall allocates m, the first machine of its profile at the cache site, and checks where its
// install came from.
func (g *airGapRun) firstInstall(m *lab.Machine) error {
	a := g.a
	before := a.Factory.RequestsOn(a.FactoryHost)

	served, err := g.edgeAssetAnswers(g.cache)
	if err != nil {
		return err
	}

	relayedBefore, err := g.cache.EdgeMetric(g.ctx, "outpost_edge_asset_fetched_bytes_total", "source", "relay")
	if err != nil {
		return err
	}

	from := m.Serial.Size()

	if err := a.Allocate(g.ctx, m, "airgap-"+m.Spec.Name); err != nil {
		return err
	}

	if err := a.WaitInstalled(g.ctx, m, from); err != nil {
		return err
	}

	// The kernel and initramfs came from the edge: it serves the factory's bytes under their install names,
	// it answered the boot's requests under /assets/, and got them by relay (the site reaches nothing else).
	if err := g.edgeServesInstallAssets(g.cache); err != nil {
		return err
	}

	after, err := g.edgeAssetAnswers(g.cache)
	if err != nil {
		return err
	}

	if after-served < 2 {
		return fmt.Errorf("the edge answered %v requests under /assets/ during the install boot, want the kernel and the initramfs", after-served)
	}

	relayed, err := g.cache.EdgeMetric(g.ctx, "outpost_edge_asset_fetched_bytes_total", "source", "relay")
	if err != nil {
		return err
	}

	// The kernel is the agent image's (held already, by digest); the factory's initramfs is not.
	if want := fileSize(a.InstallInitramfs); relayed-relayedBefore < float64(want) {
		return fmt.Errorf("the edge got %v bytes by relay during the install, want at least the factory's initramfs (%d)",
			relayed-relayedBefore, want)
	}

	fetched, err := g.cache.EdgeMetric(g.ctx, "outpost_edge_asset_fetched_bytes_total", "source", "http")
	if err != nil {
		return fmt.Errorf("reading the edge's fetched bytes: %w", err)
	}

	if fetched != 0 {
		return fmt.Errorf("the edge fetched %v bytes over HTTP itself, want everything by relay: it reaches nothing else", fetched)
	}

	timeline, err := a.Controller.Command(g.ctx, 30*time.Second, "machine", "show", m.Spec.UUID)
	if err != nil {
		return err
	}

	if !strings.Contains(timeline, "install plan served") {
		return fmt.Errorf("the machine's timeline has no install plan served by its edge:\n%s", timeline)
	}

	// The controller fetched each install asset from the factory once, and pulled the installer image.
	log := factoryLog(a)
	for _, file := range []string{"kernel-amd64", "initramfs-amd64.xz"} {
		path := "/image/" + g.schematic + "/" + g.version + "/" + file
		if n := countOK(log, a.FactoryHost, path); n != 1 {
			return fmt.Errorf("the controller fetched %s from the factory %d times, want once; factory log:\n%s", path, n, formatLog(log))
		}
	}

	now := a.Factory.RequestsOn(a.FactoryHost)
	for _, kind := range []realomni.RequestKind{realomni.KindRegistryManifest, realomni.KindRegistryBlob} {
		if now[kind].Requests <= before[kind].Requests {
			return fmt.Errorf("the controller made no %s request to the factory's registry; factory log:\n%s", kind, formatLog(log))
		}
	}

	for _, r := range log {
		if !fromCore(r.Remote) {
			return fmt.Errorf("a request to the factory came from %s, outside the core: %+v", r.Remote, r)
		}
	}

	g.t.Logf("factory requests on the controller's address after the first install: %v", now)

	return nil
}

// secondInstall allocates m, the second machine of the same profile at the cache site: nothing new from the
// factory, nothing new relayed.
func (g *airGapRun) secondInstall(m *lab.Machine) error {
	a := g.a
	beforeOn, beforeAll := a.Factory.RequestsOn(a.FactoryHost), a.Factory.Requests()

	relayedBefore, relaysBefore, err := a.Controller.RelayedBytes(g.ctx, g.cache.Name)
	if err != nil {
		return err
	}

	edgeRelayedBefore, err := g.cache.EdgeMetric(g.ctx, "outpost_edge_asset_fetched_bytes_total", "source", "relay")
	if err != nil {
		return err
	}

	served, err := g.edgeAssetAnswers(g.cache)
	if err != nil {
		return err
	}

	from := m.Serial.Size()

	if err := a.Allocate(g.ctx, m, "airgap-"+m.Spec.Name); err != nil {
		return err
	}

	if err := a.WaitInstalled(g.ctx, m, from); err != nil {
		return err
	}

	after, err := g.edgeAssetAnswers(g.cache)
	if err != nil {
		return err
	}

	if after-served < 2 {
		return fmt.Errorf("the edge answered %v requests under /assets/ during the second install boot, want the kernel and the initramfs", after-served)
	}

	if afterOn := a.Factory.RequestsOn(a.FactoryHost); !equalCounts(beforeOn, afterOn) {
		return fmt.Errorf("the second install cost factory requests: before %v, after %v", beforeOn, afterOn)
	}

	// Whoever asked (Omni looks up schematics for its clusters), no image or registry download.
	afterAll := a.Factory.Requests()
	for _, kind := range []realomni.RequestKind{
		realomni.KindImageKernel, realomni.KindImageInitramfs, realomni.KindRegistryManifest, realomni.KindRegistryBlob,
	} {
		if afterAll[kind] != beforeAll[kind] {
			return fmt.Errorf("the second install cost %s downloads from the factory: before %v, after %v", kind, beforeAll[kind], afterAll[kind])
		}
	}

	relayedAfter, relaysAfter, err := a.Controller.RelayedBytes(g.ctx, g.cache.Name)
	if err != nil {
		return err
	}

	if relayedAfter != relayedBefore || relaysAfter != relaysBefore {
		return fmt.Errorf("the second install relayed %d bytes in %d relays, want none", relayedAfter-relayedBefore, relaysAfter-relaysBefore)
	}

	edgeRelayedAfter, err := g.cache.EdgeMetric(g.ctx, "outpost_edge_asset_fetched_bytes_total", "source", "relay")
	if err != nil {
		return err
	}

	if edgeRelayedAfter != edgeRelayedBefore {
		return fmt.Errorf("the edge received %v bytes by relay during the second install, want none", edgeRelayedAfter-edgeRelayedBefore)
	}

	return nil
}

// offlineInstall allocates m at the offline site, where nothing is staged: it must wait, named in its
// timeline; `controller assets stage` then brings its assets and it installs.
func (g *airGapRun) offlineInstall(m *lab.Machine) error {
	a := g.a
	before := a.Factory.Requests()
	from := m.Serial.Size()

	if err := a.Allocate(g.ctx, m, "airgap-"+m.Spec.Name); err != nil {
		return err
	}

	waitStart := time.Now()

	var timeline string

	deadline := time.Now().Add(5 * time.Minute)

	for {
		if lab.InstallBooted(m, from) {
			return fmt.Errorf("the machine booted its install plan at an offline site where nothing was staged")
		}

		// JSON: the table view clips long entries.
		out, err := a.Controller.Command(g.ctx, 30*time.Second, "machine", "show", "-o", "json", m.Spec.UUID)
		if err != nil {
			return err
		}

		timeline = out

		if strings.Contains(out, g.kernel) || strings.Contains(out, g.initrd) {
			break
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("the machine's timeline never named %s or %s as missing:\n%s", g.kernel, g.initrd, timeline)
		}

		if err := sleepCtx(g.ctx, 2*time.Second); err != nil {
			return err
		}
	}

	a.Timeline.Step("offline: allocation to the timeline naming the missing asset", m.Spec.Name, waitStart, nil)
	g.t.Logf("controller machine show %s while waiting:\n%s", m.Spec.UUID, timeline)

	if lab.InstallBooted(m, from) {
		return fmt.Errorf("the machine booted its install plan before anything was staged")
	}

	stageStart := time.Now()

	out, err := a.Controller.Command(g.ctx, 10*time.Minute, "assets", "stage", "--site", g.offline.Name,
		"--schematic", g.schematic, "--talos-version", lab.LabTalosVersion, "--arch", "amd64")
	a.Timeline.Step("controller assets stage (returns once the site holds the profile)", g.offline.Name, stageStart, err)

	if err != nil {
		return err
	}

	g.t.Logf("controller assets stage:\n%s", out)

	// It returned once the site holds the profile: its listing and the site's state say so at once.
	list, err := a.Controller.Command(g.ctx, 30*time.Second, "assets", "list", "--site", g.offline.Name)
	if err != nil {
		return err
	}

	g.t.Logf("controller assets list --site %s:\n%s", g.offline.Name, list)

	if !strings.Contains(list, g.schematic) {
		return fmt.Errorf("controller assets list --site %s does not name schematic %s:\n%s", g.offline.Name, g.schematic, list)
	}

	if err := g.edgeServesInstallAssets(g.offline); err != nil {
		return fmt.Errorf("stage returned: %w", err)
	}

	if err := a.WaitInstalled(g.ctx, m, from); err != nil {
		return err
	}

	// The controller already held the profile: staging it relayed, it did not download again.
	after := a.Factory.Requests()
	for _, kind := range []realomni.RequestKind{realomni.KindImageKernel, realomni.KindImageInitramfs} {
		if after[kind] != before[kind] {
			return fmt.Errorf("staging a profile the controller held cost %s downloads from the factory: before %v, after %v", kind, before[kind], after[kind])
		}
	}

	return nil
}

// checkInstaller pulls the installer image's manifest from the site's edge registry with skopeo inside the
// site (polling until the edge holds it): its raw manifest hashes to the digest the factory serves, and it
// resolves to a complete amd64 image (skopeo reads its config).
func (g *airGapRun) checkInstaller(s *lab.Site) error {
	want, err := g.a.Factory.InstallerDigest(g.schematic, g.version)
	if err != nil {
		return err
	}

	ref := fmt.Sprintf("docker://%s:80/%s:%s", s.EdgeIP(), realomni.InstallerRepository(g.schematic), g.version)

	var raw []byte

	deadline := time.Now().Add(3 * time.Minute)

	for {
		raw, err = skopeo(g.ctx, s.NS, "inspect", "--raw", "--tls-verify=false", ref)
		if err == nil {
			break
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("skopeo in %s: %w", s.Name, err)
		}

		if err := sleepCtx(g.ctx, 3*time.Second); err != nil {
			return err
		}
	}

	sum := sha256.Sum256(raw)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("the edge of %s serves %s with digest %s, the factory %s; manifest:\n%s", s.Name, ref, got, want, raw)
	}

	out, err := skopeo(g.ctx, s.NS, "inspect", "--tls-verify=false", "--override-arch", "amd64", "--override-os", "linux", ref)
	if err != nil {
		return fmt.Errorf("skopeo inspect (the amd64 image) in %s: %w", s.Name, err)
	}

	var info struct {
		Architecture string
		Layers       []string
	}

	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("skopeo inspect output: %w: %s", err, out)
	}

	if info.Architecture != "amd64" || len(info.Layers) == 0 {
		return fmt.Errorf("the edge's installer image resolves to %+v, want an amd64 image with layers", info)
	}

	g.t.Logf("%s: skopeo pulled %s from the edge, digest %s as the factory's", s.Name, ref, want)

	return nil
}

// edgeServesInstallAssets asks the site's edge, from inside the site, for the install kernel and initramfs
// by their edge-local names (HEAD /assets/<name>): each must be there with the digest of the file the factory
// serves. (`controller site show` lists one name per digest: the kernel is the agent image's, held under
// agent/x86_64/vmlinuz already.)
func (g *airGapRun) edgeServesInstallAssets(s *lab.Site) error {
	c := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return lab.DialerIn(s.NS)(ctx, addr)
		}, DisableKeepAlives: true},
		Timeout: 10 * time.Second,
	}

	for _, asset := range []struct{ name, file string }{{g.kernel, g.images.Kernel}, {g.initrd, g.a.InstallInitramfs}} {
		b, err := os.ReadFile(asset.file)
		if err != nil {
			return err
		}

		sum := sha256.Sum256(b)
		want := `"sha256:` + hex.EncodeToString(sum[:]) + `"`

		req, err := http.NewRequestWithContext(g.ctx, http.MethodHead, "http://"+s.EdgeIP()+"/assets/"+asset.name, nil)
		if err != nil {
			return err
		}

		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("HEAD /assets/%s at the edge of %s: %w", asset.name, s.Name, err)
		}

		resp.Body.Close() //nolint:errcheck

		if resp.StatusCode != http.StatusOK || resp.Header.Get("ETag") != want {
			return fmt.Errorf("the edge of %s answers /assets/%s with %s, ETag %s; want 200 and the factory's %s",
				s.Name, asset.name, resp.Status, resp.Header.Get("ETag"), want)
		}
	}

	return nil
}

// waitShow polls `controller site show` until every pattern matches.
func (g *airGapRun) waitShow(s *lab.Site, timeout time.Duration, what string, patterns ...*regexp.Regexp) error {
	deadline := time.Now().Add(timeout)

	var show string

	for {
		out, err := g.a.Controller.SiteShow(g.ctx, s.Name)
		if err == nil {
			show = out

			all := true

			for _, p := range patterns {
				all = all && p.MatchString(show)
			}

			if all {
				return nil
			}
		}

		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s: %s not within %s: %w", s.Name, what, timeout, err)
			}

			return fmt.Errorf("%s: %s not within %s; controller site show:\n%s", s.Name, what, timeout, show)
		}

		if err := sleepCtx(g.ctx, time.Second); err != nil {
			return err
		}
	}
}

// edgeAssetAnswers is how many requests the site's edge answered under /assets/ with a body (200, 206).
func (g *airGapRun) edgeAssetAnswers(s *lab.Site) (float64, error) {
	var sum float64

	for _, code := range []string{"200", "206"} {
		v, err := s.EdgeMetric(g.ctx, "outpost_http_requests_total", "handler", "assets", "code", code)
		if err != nil {
			return 0, err
		}

		sum += v
	}

	return sum, nil
}

func cachedRE(name string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^cached\s+` + regexp.QuoteMeta(name) + `\s`)
}

func factoryLog(a *lab.AirGap) []realomni.Request { return a.Factory.RequestLog() }

// countOK counts the successful GETs of path that came in on the listener local.
func countOK(log []realomni.Request, local, path string) int {
	n := 0

	for _, r := range log {
		if r.Local == local && r.Method == "GET" && r.Path == path && r.Status < 300 {
			n++
		}
	}

	return n
}

func formatLog(log []realomni.Request) string {
	var b strings.Builder

	for _, r := range log {
		fmt.Fprintf(&b, "  %s %s on %s from %s: %d, %d bytes\n", r.Method, r.Path, r.Local, r.Remote, r.Status, r.Bytes)
	}

	return b.String()
}

// fromCore tells whether a client address is one of the core namespace's (the controller and Omni).
func fromCore(ip string) bool {
	return ip == lab.CoreAddr || ip == lab.FactoryAddr || ip == "127.0.0.1"
}

func equalCounts(a, b map[realomni.RequestKind]realomni.Counter) bool {
	if len(a) != len(b) {
		return false
	}

	for k, v := range a {
		if b[k] != v {
			return false
		}
	}

	return true
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}

	return st.Size()
}

// skopeo runs Debian's skopeo inside a namespace and returns its standard output.
func skopeo(ctx context.Context, ns string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, "skopeo"}, args...)...)

	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("skopeo %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}

		return nil, fmt.Errorf("skopeo %s: %w", strings.Join(args, " "), err)
	}

	return out, nil
}

// sleepCtx waits d between two polls (not for a state: the caller checks the state again).
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// controllerErrors returns the controller's last error lines, for a failing step's report.
func controllerErrors(c *lab.Controller) string {
	var out []string

	for _, line := range strings.Split(c.Proc.Log.Tail(1<<20), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`) {
			if len(line) > 500 {
				line = line[:500]
			}

			out = append(out, "  "+line)
		}
	}

	if len(out) > 12 {
		out = out[len(out)-12:]
	}

	return strings.Join(out, "\n")
}
