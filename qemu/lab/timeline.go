package lab

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Timeline collects the duration of each step of a run and writes them as a Markdown table.
type Timeline struct {
	Path string

	mu    sync.Mutex
	start time.Time
	rows  []timelineRow
}

type timelineRow struct {
	at                    time.Duration
	step, machine, status string
	took                  time.Duration
	skipped               bool
}

// NewTimeline returns a timeline written to path.
func NewTimeline(path string) *Timeline {
	return &Timeline{Path: path, start: time.Now()}
}

// Step records a step that started at start and ended now, and rewrites the file (so it survives a failure).
func (t *Timeline) Step(step, machine string, start time.Time, err error) {
	status := "ok"
	if err != nil {
		status = "FAILED: " + strings.SplitN(err.Error(), "\n", 2)[0]
	}

	t.mu.Lock()
	t.rows = append(t.rows, timelineRow{at: start.Sub(t.start), step: step, machine: machine, status: status, took: time.Since(start)})
	t.mu.Unlock()

	t.Write() //nolint:errcheck // best effort; Write's error is reported at the end of the run
}

// Skip records a step this run does not take, with the reason (the result column says "not in this run").
func (t *Timeline) Skip(step, why string) {
	t.mu.Lock()
	t.rows = append(t.rows, timelineRow{at: time.Since(t.start), step: step, status: "not in this run: " + why, skipped: true})
	t.mu.Unlock()

	t.Write() //nolint:errcheck // best effort, as in Step
}

// Write writes the table.
func (t *Timeline) Write() error {
	t.mu.Lock()
	defer t.mu.Unlock()

	var b strings.Builder

	fmt.Fprintf(&b, "# Lab timeline (%s)\n\n", t.start.UTC().Format(time.RFC3339))
	b.WriteString("| at | step | machine | took | result |\n|---:|---|---|---:|---|\n")

	for _, r := range t.rows {
		took := r.took.Round(100 * time.Millisecond).String()
		if r.skipped {
			took = "-"
		}

		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.at.Round(100*time.Millisecond), r.step, r.machine,
			took, strings.ReplaceAll(r.status, "|", "/"))
	}

	return os.WriteFile(t.Path, []byte(b.String()), 0o644)
}
