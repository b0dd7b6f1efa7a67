package lifecycle

import (
	"container/heap"
	"sync"
	"time"
)

// dueKey is one controller's pending look at one machine.
type dueKey struct {
	controller string
	machine    string
}

type dueEntry struct {
	key   dueKey
	at    time.Time
	index int // in the heap
}

// dueHeap is a min-heap of entries by time (container/heap).
type dueHeap []*dueEntry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }

func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *dueHeap) Push(x any) {
	e := x.(*dueEntry) // only entries are pushed
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1

	return e
}

// dues is when each lifecycle controller must look at each machine again: one entry per (controller,
// machine), the earliest asked for winning, in a min-heap by time. Adding, moving and removing an entry cost
// O(log n); a machine that is not due costs nothing until it is.
//
// It exists because COSI's QController queue keeps items requeued with an interval (controller.RequeueError)
// in a sorted slice that every requeue scans and shifts (PriorityQueue.Push is O(n) in the items waiting):
// with the observation polling every machine each poll interval and the other steps waiting on sites and
// agents, 20,000 machines kept 20,000 items in each controller's queue and the scans took most of a core. The
// lifecycle therefore never hands COSI a requeue interval: machineController takes it here, and when it is due
// the schedule controller (schedule.go) touches the machine's due record, an input of that controller only,
// which puts the machine in its queue at once. COSI's queue holds only what is to run now.
//
// Power changes need no schedule: the edges watch their BMCs (bmcwatch.go) and Locations tells the
// observation of each change (Locations.OnChange). What stays periodic is what nothing announces: the agent's
// Hello, a BMC asked directly by an edge that does not watch, the retries while a site is offline or an agent
// away, a cooldown running out and InfraMachineStatus's second look; that is what the schedule holds.
type dues struct {
	now func() time.Time

	mu      sync.Mutex
	entries map[dueKey]*dueEntry
	heap    dueHeap
	wake    chan struct{} // one pending wake-up for the runner: an entry earlier than any before
}

func newDues(now func() time.Time) *dues {
	return &dues{now: now, entries: map[dueKey]*dueEntry{}, wake: make(chan struct{}, 1)}
}

// after makes machine due for controller in d (at once for d <= 0), unless it is due earlier already.
func (s *dues) after(controller, machine string, d time.Duration) {
	at := s.now().Add(max(d, 0))

	s.mu.Lock()
	defer s.mu.Unlock()

	key := dueKey{controller, machine}

	if e, ok := s.entries[key]; ok {
		if !at.Before(e.at) {
			return
		}

		e.at = at
		heap.Fix(&s.heap, e.index)
	} else {
		e = &dueEntry{key: key, at: at}
		s.entries[key] = e
		heap.Push(&s.heap, e)
	}

	if s.heap[0].key == key {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// cancel drops controller's pending look at machine (it is looking now; what it returns sets the next one).
func (s *dues) cancel(controller, machine string) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if e, ok := s.entries[dueKey{controller, machine}]; ok {
		heap.Remove(&s.heap, e.index)
		delete(s.entries, e.key)
	}
}

// take removes and returns up to limit entries due by now; when none is due, wait is how long until the
// next one (0: none pending).
func (s *dues) take(limit int) (due []dueKey, wait time.Duration) {
	now := s.now()

	s.mu.Lock()
	defer s.mu.Unlock()

	for len(s.heap) > 0 && len(due) < limit {
		top := s.heap[0]
		if top.at.After(now) {
			if len(due) == 0 {
				wait = top.at.Sub(now)
			}

			break
		}

		heap.Pop(&s.heap)
		delete(s.entries, top.key)
		due = append(due, top.key)
	}

	return due, wait
}
