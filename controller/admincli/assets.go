package admincli

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/assets"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Profile is a Talos install profile at a site, as an operator names it: a schematic, or extensions.
type Profile struct {
	Site         string
	SchematicID  string
	Extensions   []string
	TalosVersion string
	Arch         metal.Arch
}

func (p Profile) request() *adminpb.StageAssetsRequest {
	return &adminpb.StageAssetsRequest{
		SiteId: p.Site, SchematicId: p.SchematicID, Extensions: p.Extensions, TalosVersion: p.TalosVersion, Arch: p.Arch.String(),
	}
}

// StageAssets stages a profile at a site; with wait it prints the progress every interval until the site
// holds everything it needs (the staged profile among it) or ctx ends.
func (c *Client) StageAssets(ctx context.Context, p Profile, wait bool, interval time.Duration, out io.Writer) error {
	resp, err := c.api.StageAssets(ctx, p.request())
	if err != nil {
		return describe("stage assets", err)
	}

	fmt.Fprintf(out, "staged %s at %s\n", resp.GetProfile(), p.Site) //nolint:errcheck

	if !wait {
		return nil
	}

	t := time.NewTicker(interval)
	defer t.Stop()

	last := ""

	for {
		site, err := c.api.ShowSite(ctx, &adminpb.ShowSiteRequest{SiteId: p.Site})
		if err != nil {
			return describe("show site", err)
		}

		line, done := stageProgress(site.GetAssets(), site.GetSite().GetConnected())
		if line != last {
			fmt.Fprintln(out, line) //nolint:errcheck

			last = line
		}

		if done {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("stage assets at %s: not held yet (%s): %w", p.Site, line, ctx.Err())
		case <-t.C:
		}
	}
}

// stageProgress is one line of a stage's progress and whether the site holds everything it needs.
func stageProgress(st *assetspb.SiteAssetState, connected bool) (string, bool) {
	var done, total, failed int64

	for _, u := range st.GetUpstream() {
		done += u.GetBytesDone()
		total += u.GetBytesTotal()

		if u.GetError() != "" {
			failed++
		}
	}

	var missing int64
	for _, m := range st.GetMissing() {
		missing += m.GetSize()
	}

	controller := "controller: holds everything"
	if n := len(st.GetUpstream()); n > 0 {
		controller = fmt.Sprintf("controller: fetching %d (%s of %s)", n, mib(done), mib(total))
		if failed > 0 {
			controller += fmt.Sprintf(", %d failing: %s", failed, st.GetUpstream()[0].GetError())
		}
	}

	edge := fmt.Sprintf("site: holds %d, lacks %d (%s)", len(st.GetCached()), len(st.GetMissing()), mib(missing))
	if !connected {
		edge += ", edge not connected"
	}

	if need := assets.NeededBytes(st); st.GetBytesCap() > 0 && need > st.GetBytesCap() {
		edge += fmt.Sprintf(", cache too small: needs %s, holds at most %s", mib(need), mib(st.GetBytesCap()))
	}

	return controller + "; " + edge, len(st.GetUpstream()) == 0 && len(st.GetMissing()) == 0 && st.GetReportedAt() != nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// UnstageAssets takes a staged profile back.
func (c *Client) UnstageAssets(ctx context.Context, p Profile, out io.Writer) error {
	resp, err := c.api.UnstageAssets(ctx, p.request())
	if err != nil {
		return describe("unstage assets", err)
	}

	fmt.Fprintf(out, "unstaged %s at %s; staged there now: %d\n", resp.GetProfile(), p.Site, len(resp.GetStaged())) //nolint:errcheck

	return nil
}

// ListAssets prints a site's boot assets.
func (c *Client) ListAssets(ctx context.Context, siteID string, out io.Writer) error {
	resp, err := c.api.ShowSite(ctx, &adminpb.ShowSiteRequest{SiteId: siteID})
	if err != nil {
		return describe("list assets", err)
	}

	if c.Output == OutputJSON {
		return writeJSONObject(out, map[string]proto.Message{"assets": resp.GetAssets()})
	}

	if resp.GetAssets() == nil {
		return fmt.Errorf("list assets: the controller keeps no boot assets for site %s", siteID)
	}

	return assets.WriteSiteAssets(out, resp.GetAssets())
}

// BundleAssets writes a site's bundle into dir (absolute, on the controller's host) and says what it holds.
func (c *Client) BundleAssets(ctx context.Context, siteID, dir string, out io.Writer) error {
	resp, err := c.api.BundleAssets(ctx, &adminpb.BundleAssetsRequest{SiteId: siteID, Dir: dir})
	if err != nil {
		return describe("bundle assets", err)
	}

	fmt.Fprintf(out, "wrote %d assets (%s) for site %s into %s, made by the controller with CA sha256:%s\n", //nolint:errcheck
		resp.GetAssets(), mib(resp.GetBytes()), siteID, dir, resp.GetController())

	for _, k := range resp.GetNotHeld() {
		fmt.Fprintf(out, "not in the bundle (the controller does not hold it yet): %s\n", k) //nolint:errcheck
	}

	fmt.Fprintf(out, "at the site: edge assets import %s\n", dir) //nolint:errcheck

	return nil
}
