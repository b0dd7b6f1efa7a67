package machines_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/machines"
)

// A site's labels are kept in memory with its policy (the observation reads them for every machine at every
// poll): a copy of what was set, replaced as a whole, gone when cleared.
func TestSitePoliciesKeepLabels(t *testing.T) {
	t.Parallel()

	p := machines.NewSitePolicies()
	set := map[string]string{"rack": "r7"}
	p.SetLabels("site-a", set)
	set["rack"] = "changed by the caller"

	require.Equal(t, map[string]string{"rack": "r7"}, p.SiteLabels("site-a"))
	require.Nil(t, p.SiteLabels("site-b"))

	p.SetLabels("site-a", map[string]string{"row": "3"})
	require.Equal(t, map[string]string{"row": "3"}, p.SiteLabels("site-a"), "replaced as a whole")

	p.SetLabels("site-a", nil)
	require.Nil(t, p.SiteLabels("site-a"))

	var none *machines.SitePolicies
	require.Nil(t, none.SiteLabels("site-a"))
}
