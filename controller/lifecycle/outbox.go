package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"google.golang.org/protobuf/proto"
)

// outbox keeps the record of an action that was carried out (a disk wipe, a power cycle) until it is written to
// Omni. When Omni goes away between the action and the write, the lifecycle runtime is rebuilt on a new
// connection; the controllers, and this outbox with them, stay. The next reconcile writes the kept record first
// instead of acting again, so a wipe or a reboot is never repeated because its record was lost in transit.
type outbox struct {
	mu      sync.Mutex
	records map[string]proto.Message
}

func newOutbox() *outbox { return &outbox{records: map[string]proto.Message{}} }

func outboxKey(kind, machineID string) string { return kind + "/" + machineID }

// put keeps rec under key until done is called with it.
func (o *outbox) put(key string, rec proto.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()

	o.records[key] = rec
}

// get returns the record kept under key.
func (o *outbox) get(key string) (proto.Message, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()

	rec, ok := o.records[key]

	return rec, ok
}

// done drops rec once written (a newer record put meanwhile stays).
func (o *outbox) done(key string, rec proto.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()

	if o.records[key] == rec {
		delete(o.records, key)
	}
}

// jobs runs long actions (disk wipes) apart from the reconcile that started them: when the reconcile's context
// ends because the runtime is rebuilt, the action goes on under its own timeout, and the next reconcile joins
// it instead of starting another.
type jobs struct {
	mu      sync.Mutex
	running map[string]*job
}

// job is one running or finished action; done is closed when err is set.
type job struct {
	key  string
	tag  string
	done chan struct{}
	err  error
}

func newJobs() *jobs { return &jobs{running: map[string]*job{}} }

// start runs fn under key with the given timeout, detached from ctx's cancellation, and then (once the job is
// done) then with fn's error, unless a job with the same key and tag runs (or finished and was not collected): then that job
// is returned. A job under key with another tag (a newer wipe ID) is left to finish and replaced.
func (j *jobs) start(ctx context.Context, key, tag string, timeout time.Duration, fn func(context.Context) error, then func(error)) *job {
	j.mu.Lock()
	defer j.mu.Unlock()

	if cur, ok := j.running[key]; ok && cur.tag == tag {
		return cur
	}

	jb := &job{key: key, tag: tag, done: make(chan struct{})}
	j.running[key] = jb

	go func() {
		jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()

		err := fn(jctx)
		jb.err = err
		close(jb.done)
		then(err)
	}()

	return jb
}

// has reports whether a job under key with tag runs (or finished and was not collected).
func (j *jobs) has(key, tag string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()

	cur, ok := j.running[key]

	return ok && cur.tag == tag
}

// collect forgets a finished job, so the next start runs afresh.
func (j *jobs) collect(jb *job) {
	j.mu.Lock()
	defer j.mu.Unlock()

	if j.running[jb.key] == jb {
		delete(j.running, jb.key)
	}
}

// written holds the last record each step wrote for a machine, so the step's next reconcile reads its own
// write even before the runtime's watch-fed cache has it: a cached read of a wipe or a reboot just recorded
// would otherwise show it not done yet, and it would be done again. Each record has one writer in the process
// (its step), so the newest write is the truth until the machine is torn down.
type written struct {
	mu      sync.Mutex
	records map[writtenKey]proto.Message
}

type writtenKey struct {
	typ resource.Type
	id  string
}

func newWritten() *written { return &written{records: map[writtenKey]proto.Message{}} }

// swap puts rec and returns what was there (nil for nothing).
func (w *written) swap(typ resource.Type, machineID string, rec proto.Message) proto.Message {
	w.mu.Lock()
	defer w.mu.Unlock()

	key := writtenKey{typ, machineID}
	prev := w.records[key]
	w.records[key] = proto.Clone(rec)

	return prev
}

// restore puts back what swap returned (nil: nothing).
func (w *written) restore(typ resource.Type, machineID string, prev proto.Message) {
	w.mu.Lock()
	defer w.mu.Unlock()

	if prev == nil {
		delete(w.records, writtenKey{typ, machineID})

		return
	}

	w.records[writtenKey{typ, machineID}] = prev
}

func (w *written) get(typ resource.Type, machineID string) (proto.Message, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()

	rec, ok := w.records[writtenKey{typ, machineID}]
	if !ok {
		return nil, false
	}

	return proto.Clone(rec), true
}

// forget drops a machine's record of typ (the output is destroyed).
func (w *written) forget(typ resource.Type, machineID string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	delete(w.records, writtenKey{typ, machineID})
}

// writeOwn writes a step's record res (its spec rec, set by set) and makes it visible at once to this
// process's other steps, before the runtime's cache has it; the previous record comes back if the write fails.
// cur is the record as the step last knew it (its view: the cache, or this process's own newer write): when
// rec equals it nothing is written, so an unchanged record costs no round trip to Omni (a modify reads the
// resource from Omni before it writes).
func writeOwn[R resource.Resource](ctx context.Context, w *written, r controller.QRuntime, res R, cur, rec proto.Message, set func(R)) error {
	if cur != nil && proto.Equal(cur, rec) {
		return nil
	}

	md := res.Metadata()
	prev := w.swap(md.Type(), md.ID(), rec)

	if err := safe.WriterModify(ctx, r, res, func(x R) error { set(x); return nil }); err != nil {
		w.restore(md.Type(), md.ID(), prev)

		return err
	}

	return nil
}
