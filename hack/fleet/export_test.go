package fleet

import (
	"context"
	"time"

	"github.com/outpost-metal/outpost/edge/bmc"
)

// NewTestBMCService returns a BMC service with one BMC per host (machines that are never started).
func NewTestBMCService(behave BMCBehaviour, callTimeout time.Duration, dead map[string]bool, hosts ...string) *BMCService {
	cfg := bmc.Default()
	cfg.CallTimeout = callTimeout

	s := newBMCService(cfg, &behave, 1)

	for i, h := range hosts {
		m := &machine{id: machineID(i)}
		m.bmc = newSimBMC(h, m, dead[h], &behave, cfg)
		m.bmc.setUser("outpost", "secret")
		s.bmcs[m.bmc.key()] = m.bmc
	}

	return s
}

// Distribution is distOf.
func Distribution(v []float64) Dist { return distOf(v) }

// SiderolinkAPI is siderolinkAPI.
var SiderolinkAPI = siderolinkAPI

// ProcCPU is procCPU.
var ProcCPU = procCPU

// WatchPoll asks the service for a BMC's power as the edge's watcher does.
func (s *BMCService) WatchPoll(ctx context.Context, t bmc.Target, c bmc.Credentials) (bool, error) {
	return watchPoller{s}.PowerStatus(ctx, t, c)
}

// WriteSeriesRates is writeSeriesRates.
var WriteSeriesRates = writeSeriesRates

// ParseSeries is parseSeries.
var ParseSeries = parseSeries
