package status

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
)

// HistoryHours is how many hours of boots and failures the fleet view keeps.
const HistoryHours = 48

// Boot kinds counted by the fleet view: the boot scripts the edges served, by what they told the machine.
const (
	BootInstall = "install"
	BootDisk    = "disk"
	BootAgent   = "agent"
)

// BootKinds lists the boot kinds in the order the fleet view stacks them.
func BootKinds() []string { return []string{BootInstall, BootAgent, BootDisk} }

// HistoryOptions bound the fleet history.
type HistoryOptions struct {
	// SampleEvery is how often machines by phase and sites online are sampled (default a minute).
	SampleEvery time.Duration
	// MaxSamples bounds the samples kept (default 48 hours' worth).
	MaxSamples int
}

// Sample is the fleet at one moment: machines by phase (in the order of Phases) and sites online.
type Sample struct {
	At          time.Time
	Phases      []int
	SitesOnline int
	Sites       int
}

// Hour is one hour of boots and failures.
type Hour struct {
	Start time.Time
	// Boots counts the boots of each kind.
	Boots map[string]int
	// Failures counts the machines that failed for each reason (a machine once per reason: a BMC silent for
	// the hour is one failure, not one per retry).
	Failures map[string]int
}

// maxFailedPerHour bounds the machines an hour remembers as failed (beyond it every failure counts).
const maxFailedPerHour = 1 << 14

// History is the controller's own recent history of its fleet, in memory only: boots and failures per hour (by
// kind and by reason, from the machines' timelines) for HistoryHours, and samples of machines by phase and sites
// online (a bounded ring). A restart starts it afresh: Start says since when it counts. Safe for concurrent use.
type History struct {
	opts  HistoryOptions
	now   func() time.Time
	start time.Time

	mu    sync.Mutex
	hours [HistoryHours]Hour
	// failed are the machine and reason pairs counted in the current and the previous hour (older hours count
	// what comes late without them).
	failed  map[time.Time]map[string]struct{}
	samples []Sample
	next    int // where the next sample goes once the ring is full
}

// NewHistory returns an empty history that starts now.
func NewHistory(opts HistoryOptions, now func() time.Time) *History {
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = time.Minute
	}

	if opts.MaxSamples <= 0 {
		opts.MaxSamples = int(HistoryHours * time.Hour / opts.SampleEvery)
	}

	opts.MaxSamples = min(max(opts.MaxSamples, 2), 1<<16)

	return &History{opts: opts, now: now, start: now()}
}

// Start is when the history began (the controller's start: a restart loses what came before).
func (h *History) Start() time.Time { return h.start }

// Observe counts one timeline entry (timeline.Book.Observe): a boot script served is a boot, an error a failure
// of the machine by reason. Entries from before the history began (loaded from Omni, or an edge's journal catching
// up) or older than HistoryHours are not counted.
func (h *History) Observe(machineID, _ string, e timeline.Entry) {
	boot := bootKind(e)
	reason := ""

	if e.Error {
		reason = FailureReason(e)
	}

	if boot == "" && reason == "" {
		return
	}

	now := h.now()
	if e.At.Before(h.start) || e.At.After(now.Add(time.Minute)) || now.Sub(e.At) >= HistoryHours*time.Hour {
		return
	}

	hour := e.At.Truncate(time.Hour)

	h.mu.Lock()
	defer h.mu.Unlock()

	b := &h.hours[slot(hour)]
	if !b.Start.Equal(hour) {
		*b = Hour{Start: hour, Boots: map[string]int{}, Failures: map[string]int{}}
	}

	if boot != "" {
		b.Boots[boot]++
	}

	if reason != "" && h.firstFailure(hour, machineID+"/"+reason) {
		b.Failures[reason]++
	}
}

// firstFailure reports whether key (machine and reason) failed for the first time in hour; h.mu is held.
func (h *History) firstFailure(hour time.Time, key string) bool {
	if h.failed == nil {
		h.failed = map[time.Time]map[string]struct{}{}
	}

	seen, ok := h.failed[hour]
	if !ok {
		for t := range h.failed { // the current hour and the one before are kept
			if hour.Sub(t) > time.Hour {
				delete(h.failed, t)
			}
		}

		if len(h.failed) >= 2 {
			return true
		}

		seen = map[string]struct{}{}
		h.failed[hour] = seen
	}

	if _, dup := seen[key]; dup {
		return false
	}

	if len(seen) < maxFailedPerHour {
		seen[key] = struct{}{}
	}

	return true
}

// bootKind is the boot an entry says happened ("" none).
func bootKind(e timeline.Entry) string {
	switch e.Kind {
	case timeline.KindInstallPlan:
		return BootInstall
	case timeline.KindDiskBoot:
		return BootDisk
	case timeline.KindBootServed:
		if e.Error {
			return ""
		}

		return BootAgent
	}

	return ""
}

// Hours returns the last HistoryHours hours, oldest first, the current one last (hours with nothing counted
// included, with empty maps).
func (h *History) Hours() []Hour {
	cur := h.now().Truncate(time.Hour)

	h.mu.Lock()
	defer h.mu.Unlock()

	out := make([]Hour, 0, HistoryHours)

	for i := HistoryHours - 1; i >= 0; i-- {
		start := cur.Add(-time.Duration(i) * time.Hour)
		b := h.hours[slot(start)]

		if !b.Start.Equal(start) {
			b = Hour{Start: start}
		}

		out = append(out, Hour{Start: start, Boots: cloneCounts(b.Boots), Failures: cloneCounts(b.Failures)})
	}

	return out
}

// slot is where an hour's counts go in the ring.
func slot(hour time.Time) int64 {
	return (hour.Unix()/3600%HistoryHours + HistoryHours) % HistoryHours
}

func cloneCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}

	return out
}

// Record keeps a sample (the ring drops the oldest once full).
func (h *History) Record(s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()

	if len(h.samples) < h.opts.MaxSamples {
		h.samples = append(h.samples, s)

		return
	}

	h.samples[h.next] = s
	h.next = (h.next + 1) % len(h.samples)
}

// Samples returns the samples kept, oldest first.
func (h *History) Samples() []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()

	return append(slices.Clone(h.samples[h.next:]), h.samples[:h.next]...)
}

// sampleNow reads the fleet as it is: machines by phase from the timelines, sites online from the sites.
func sampleNow(ctx context.Context, sites Sites, machines Machines, at time.Time) (Sample, error) {
	list, err := sites.Sites(ctx)
	if err != nil {
		return Sample{}, err
	}

	return sampleOf(list, machines.Phases(), at), nil
}

// sampleOf is the fleet of sites with machines by site and phase.
func sampleOf(sites []Site, byPhase map[string]map[string]int, at time.Time) Sample {
	s := Sample{At: at, Phases: make([]int, len(fleetPhases())), Sites: len(sites)}

	for _, site := range sites {
		if site.State == "connected" {
			s.SitesOnline++
		}
	}

	for _, n := range byPhase {
		for i, ph := range fleetPhases() {
			s.Phases[i] += n[ph]
		}
	}

	return s
}

// fleetPhases are the phases the fleet view plots, in lifecycle order, machines no phase is known of last.
func fleetPhases() []string { return append(lifecycle.Phases(), timeline.UnknownPhase) }

// runSampler samples the fleet every SampleEvery until ctx is done (a failed reading is skipped).
func (h *History) runSampler(ctx context.Context, sites Sites, machines Machines) {
	t := time.NewTicker(h.opts.SampleEvery)
	defer t.Stop()

	for {
		if s, err := sampleNow(ctx, sites, machines, h.now()); err == nil {
			h.Record(s)
		}

		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
