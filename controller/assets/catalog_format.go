package assets

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Proto converts a site's asset state for the admin API.
func (s SiteAssets) Proto() *assetsapi.SiteAssetState {
	out := &assetsapi.SiteAssetState{
		SiteId: s.SiteID, Policy: s.Policy, Cached: s.Cached, Missing: s.Missing, Failed: s.Failed,
		BytesUsed: s.BytesUsed, BytesCap: s.BytesCap, BytesRelayed: s.BytesRelayed, Relays: s.Relays,
		PushError: s.PushError,
	}

	if !s.ReportedAt.IsZero() {
		out.ReportedAt = timestamppb.New(s.ReportedAt)
	}

	return out
}

// WriteSiteAssets prints a site's asset state for operators (`controller site show`): policy, cache use, bytes
// relayed, then one line per cached, missing and failed asset.
func WriteSiteAssets(w io.Writer, st *assetsapi.SiteAssetState) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)

	reported := "never"
	if st.GetReportedAt() != nil {
		reported = st.GetReportedAt().AsTime().UTC().Format(time.RFC3339)
	}

	fmt.Fprintf(tw, "site:\t%s\n", st.GetSiteId())                                                       //nolint:errcheck
	fmt.Fprintf(tw, "asset policy:\t%s\n", PolicyName(st.GetPolicy()))                                   //nolint:errcheck
	fmt.Fprintf(tw, "cache:\t%d of %d bytes\n", st.GetBytesUsed(), st.GetBytesCap())                     //nolint:errcheck
	fmt.Fprintf(tw, "relayed:\t%d bytes in %d completed relays\n", st.GetBytesRelayed(), st.GetRelays()) //nolint:errcheck
	fmt.Fprintf(tw, "last report:\t%s\n", reported)                                                      //nolint:errcheck

	if need := NeededBytes(st); st.GetBytesCap() > 0 && need > st.GetBytesCap() {
		fmt.Fprintf(tw, "cache too small:\tthe site needs %d bytes, its edge's cache holds at most %d (raise the edge's --assets-max-bytes)\n", //nolint:errcheck
			need, st.GetBytesCap())
	}

	if st.GetPushError() != "" {
		fmt.Fprintf(tw, "push error:\t%s\n", st.GetPushError()) //nolint:errcheck
	}

	fmt.Fprintln(tw, "\nSTATE\tNAME\tSHA256\tSIZE\tNEEDED") //nolint:errcheck

	for _, a := range st.GetCached() {
		fmt.Fprintf(tw, "cached\t%s\t%s\t%d\t%t\n", a.GetRef().GetName(), short(a.GetRef().GetSha256()), a.GetRef().GetSize(), a.GetNeeded()) //nolint:errcheck
	}

	for _, r := range st.GetMissing() {
		fmt.Fprintf(tw, "missing\t%s\t%s\t%d\ttrue\n", r.GetName(), short(r.GetSha256()), r.GetSize()) //nolint:errcheck
	}

	for d, e := range st.GetFailed() {
		fmt.Fprintf(tw, "failed\terror: %s\t%s\t\t\n", e, short(d)) //nolint:errcheck
	}

	for _, u := range st.GetUpstream() {
		state := fmt.Sprintf("controller fetching (%d of %d bytes)", u.GetBytesDone(), u.GetBytesTotal())
		if u.GetError() != "" {
			state = "controller: " + u.GetError()
		}

		fmt.Fprintf(tw, "upstream\t%s\t%s\t%d\ttrue\n", u.GetKey(), state, u.GetBytesTotal()) //nolint:errcheck
	}

	return tw.Flush()
}

func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}

	return digest
}

// NeededBytes is the size of everything a site needs: what its edge holds that a plan needs, and what it lacks.
func NeededBytes(st *assetsapi.SiteAssetState) int64 {
	var n int64

	for _, a := range st.GetCached() {
		if a.GetNeeded() {
			n += a.GetRef().GetSize()
		}
	}

	for _, r := range st.GetMissing() {
		n += r.GetSize()
	}

	return n
}
