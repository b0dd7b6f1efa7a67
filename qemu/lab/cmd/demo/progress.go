package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progressEvery is how often a long build says it is still running.
const progressEvery = 20 * time.Second

// timed runs fn, a long build named by what ("building the machine images"), saying on w when it starts, every
// progressEvery while it runs ("still building the machine images (40s)") and when it ends, with how long it
// took or that it failed.
func timed[T any](w io.Writer, what string, fn func() (T, error)) (T, error) {
	return timedEvery(w, what, progressEvery, fn)
}

func timedEvery[T any](w io.Writer, what string, every time.Duration, fn func() (T, error)) (T, error) {
	var mu sync.Mutex // the ticker's lines and the last line never interleave

	printf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()

		fmt.Fprintf(w, format, args...) //nolint:errcheck
	}

	start := time.Now()
	elapsed := func() time.Duration { return time.Since(start).Round(time.Second) }

	printf("==> %s\n", what)

	done := make(chan struct{})
	ticked := make(chan struct{})

	go func() {
		defer close(ticked)

		t := time.NewTicker(every)
		defer t.Stop()

		for {
			select {
			case <-done:
				return
			case <-t.C:
				printf("    still %s (%s)\n", what, elapsed())
			}
		}
	}()

	v, err := fn()

	close(done)
	<-ticked

	if err != nil {
		printf("==> failed %s after %s\n", what, elapsed())
	} else {
		printf("==> done %s (%s)\n", what, elapsed())
	}

	return v, err
}
