package lifecycle_test

import (
	"fmt"
	"testing"

	"github.com/outpost-metal/outpost/controller/lifecycle"
)

// A long wipe does not hold one of the wipe controller's workers: with a single worker and every wipe still
// running, every machine's wipe has started; once they end, each is recorded. (Before, the worker waited for
// the wipe, and the second machine's waited for the first.)
func TestLongWipesDoNotHoldOthersUp(t *testing.T) {
	t.Parallel()

	h := newHarness(t, func(c *lifecycle.Config) { c.Concurrency = 1 })

	release := make(chan struct{})
	h.edge.HoldWipes(release)

	ids := []string{"m1", "m2", "m3"}
	for _, id := range ids {
		h.edge.Add(id, "site-a")
		h.omni(id, accepted)
	}

	for _, id := range ids {
		h.eventually(fmt.Sprintf("%s's wipe started while the others run", id), func() bool { return h.edge.Count(id, "WipeDisks") == 1 })
	}

	h.edge.HoldWipes(nil)
	close(release)

	for _, id := range ids {
		h.eventually(id+" ready once its wipe ended", func() bool { s := h.status(id); return s != nil && s.ReadyToUse })
		h.never(id+" wiped once", func() bool { return h.edge.Count(id, "WipeDisks") != 1 })
	}
}
