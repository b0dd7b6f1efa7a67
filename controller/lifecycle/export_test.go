package lifecycle

import (
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
)

// Dues is the lifecycle's schedule of looks (due.go), for its tests.
type Dues = dues

// NewDues returns an empty schedule on the clock now.
func NewDues(now func() time.Time) *Dues { return newDues(now) }

// After makes machine due for controller in d unless it is due earlier.
func (s *dues) After(controller, machine string, d time.Duration) { s.after(controller, machine, d) }

// Cancel drops controller's pending look at machine.
func (s *dues) Cancel(controller, machine string) { s.cancel(controller, machine) }

// Take returns up to limit due looks as "controller/machine", or how long until the next.
func (s *dues) Take(limit int) ([]string, time.Duration) {
	due, wait := s.take(limit)

	out := make([]string, 0, len(due))
	for _, k := range due {
		out = append(out, k.controller+"/"+k.machine)
	}

	return out, wait
}

// Pending is how many looks are scheduled.
func (s *dues) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return len(s.heap)
}

// Woken reports whether a wake-up is pending (and takes it).
func (s *dues) Woken() bool {
	select {
	case <-s.wake:
		return true
	default:
		return false
	}
}

// Count returns the count of problems of reason.
func (m *Metrics) Count(reason string) float64 {
	return testutil.ToFloat64(m.problems.WithLabelValues(reason))
}

// NextLooks hands each result in turn to the lifecycle's requeue, as one step's reconciles of one machine
// return them, and says after each how long until the machine is due there again (-1: not scheduled).
func NextLooks(cfg Config, now func() time.Time, results ...error) []time.Duration {
	e := &env{cfg: cfg, due: newDues(now), failing: newFailingSet(now)}

	out := make([]time.Duration, 0, len(results))

	for _, err := range results {
		e.due.cancel("step", "m1")
		_ = e.requeue(zap.NewNop(), "step", "m1", 1, err)

		next := time.Duration(-1)
		if entry, ok := e.due.entries[dueKey{"step", "m1"}]; ok {
			next = entry.at.Sub(now())
		}

		out = append(out, next)
	}

	return out
}

// ErrorLine exposes errorLine.
var ErrorLine = errorLine

// Stated exposes stated.
var Stated = stated
