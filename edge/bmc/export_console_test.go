package bmc

import "io"

// ConsoleQueue is a console session's output queue as the SOL stream writes it; Frames drains it, returning the
// bytes queued and those dropped since the last call.
type ConsoleQueue struct{ s *consoleSession }

// NewConsoleQueue returns an empty queue.
func NewConsoleQueue() ConsoleQueue {
	return ConsoleQueue{s: &consoleSession{frames: make(chan []byte, consoleOutputFrames), wake: make(chan struct{}, 1)}}
}

// Writer is what the SOL stream writes to.
func (q ConsoleQueue) Writer() io.Writer { return q.s }

// Drain empties the queue.
func (q ConsoleQueue) Drain() (queued int, dropped int64) {
	for {
		select {
		case b := <-q.s.frames:
			queued += len(b)
		default:
			return queued, q.s.takeDropped()
		}
	}
}

// OperatorName is operatorName, for its tests.
var OperatorName = operatorName
