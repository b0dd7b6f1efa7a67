package uplink

import (
	"context"
	"time"
)

// Backoff is the client's reconnect backoff, for tests.
type Backoff struct{ b *backoff }

// NewBackoff returns a backoff between lo and hi.
func NewBackoff(lo, hi time.Duration) *Backoff { return &Backoff{b: newBackoff(lo, hi)} }

// Next returns the next wait.
func (b *Backoff) Next() time.Duration { return b.b.next() }

// Reset starts again from the shortest waits.
func (b *Backoff) Reset() { b.b.reset() }

// HonourRetryAfter is honourRetryAfter.
func HonourRetryAfter(wait, retryAfter time.Duration) time.Duration {
	return honourRetryAfter(wait, retryAfter)
}

// DialController is the client's dial of its controller addresses: the address that connected.
func (c *Client) DialController(ctx context.Context) (string, error) {
	conn, addr, err := c.dial(ctx)
	if err != nil {
		return "", err
	}

	conn.Close() //nolint:errcheck

	return addr, nil
}

// Pacer is the client's choice of the wait before each session attempt, for tests.
type Pacer struct{ p *pacer }

// NewPacer returns a pacer over a backoff between lo and hi.
func NewPacer(lo, hi time.Duration) *Pacer { return &Pacer{p: &pacer{bo: newBackoff(lo, hi)}} }

// After is the wait after an attempt that began at began, whose session came up at up (zero: never), ended at now.
func (p *Pacer) After(began, up, now time.Time) time.Duration { return p.p.after(began, up, now) }

// StableSession and QuickRetryWindow are the pacer's thresholds.
const (
	StableSession    = stableSession
	QuickRetryWindow = quickRetryWindow
)
