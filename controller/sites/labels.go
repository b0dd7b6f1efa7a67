package sites

import (
	"context"
	"time"
)

// siteLabelsTimeout bounds a read of the local site store for a machine's labels.
const siteLabelsTimeout = 2 * time.Second

// SiteLabels returns the labels an operator set on a site (`controller site label`), for the lifecycle to
// publish on each of its machines; none when the site is unknown or the store cannot be read in time.
// It fits lifecycle.SiteLabels, whose callers hold no context: the store is local, so a short bound suffices.
func (r *Registry) SiteLabels(siteID string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), siteLabelsTimeout)
	defer cancel()

	site, err := r.Get(ctx, siteID)
	if err != nil {
		return nil
	}

	return site.TypedSpec().Value.GetLabels()
}
