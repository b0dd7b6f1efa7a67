package status

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// ErrBadQuery means a status page or API request asked for something that cannot be.
var ErrBadQuery = errors.New("bad query")

// ParseFilter checks a site and phase selection: a site ID as sites are named, a phase the lifecycle has
// (timeline.UnknownPhase selects machines the lifecycle has not looked at).
func ParseFilter(site, phase string) (timeline.Filter, error) {
	if site != "" {
		if err := uplink.ValidateSiteID(site); err != nil {
			return timeline.Filter{}, fmt.Errorf("%w: site: %w", ErrBadQuery, err)
		}
	}

	if phase != "" && phase != timeline.UnknownPhase && !slices.Contains(lifecycle.Phases(), phase) {
		return timeline.Filter{}, fmt.Errorf("%w: phase %q is none of %v", ErrBadQuery, clipID(phase), append(lifecycle.Phases(), timeline.UnknownPhase))
	}

	return timeline.Filter{Site: site, Phase: phase}, nil
}

// PageQuery is a status page's request: which machines, which page.
type PageQuery struct {
	Filter timeline.Filter
	// Page counts from 1.
	Page int
}

// maxPageNumber bounds the page asked for (20,000 machines are 200 pages of 100).
const maxPageNumber = 1 << 20

// ParseQuery reads a page's query parameters (site, phase, page): they come from any client, so each is
// checked and bounded.
func ParseQuery(q url.Values) (PageQuery, error) {
	f, err := ParseFilter(q.Get("site"), q.Get("phase"))
	if err != nil {
		return PageQuery{}, err
	}

	page := 1

	if p := q.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > maxPageNumber {
			return PageQuery{}, fmt.Errorf("%w: page %q", ErrBadQuery, clipID(p))
		}

		page = n
	}

	return PageQuery{Filter: f, Page: page}, nil
}
