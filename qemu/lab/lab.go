package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Prefix starts the name of every namespace the lab creates, so parallel labs of other tests never collide.
const Prefix = "ol-"

// Lab owns everything one run creates; Close undoes it in reverse order.
type Lab struct {
	// Dir holds the logs (one per process, one serial log per machine), state directories and the timeline.
	Dir string

	log *zap.Logger
	sfx string

	mu       sync.Mutex
	cleanups []func()
	closed   bool
}

// New creates a lab writing under dir (emptied first, except for a cache subdirectory) and removes what a
// previous run that died without cleaning up left behind (namespaces listed in dir/namespaces).
func New(dir string, log *zap.Logger) (*Lab, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create lab directory: %w", err)
	}

	sweepStale(dir)

	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read lab directory: %w", err)
	}

	for _, e := range entries {
		if e.Name() != "cache" {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("clear lab directory: %w", err)
			}
		}
	}

	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("random suffix: %w", err)
	}

	l := &Lab{Dir: dir, log: log.With(zap.String("component", "lab")), sfx: hex.EncodeToString(b)}

	if err := os.WriteFile(filepath.Join(dir, "lab.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("write pid file: %w", err)
	}

	return l, nil
}

// sweepStale deletes the namespaces a previous lab in dir recorded, when that lab's process is gone.
func sweepStale(dir string) {
	pid, err := os.ReadFile(filepath.Join(dir, "lab.pid"))
	if err == nil {
		if _, err := os.Stat(filepath.Join("/proc", strings.TrimSpace(string(pid)))); err == nil {
			return // still running (or the pid was reused: then leave it alone)
		}
	}

	list, err := os.ReadFile(filepath.Join(dir, "namespaces"))
	if err != nil {
		return
	}

	for _, ns := range strings.Fields(string(list)) {
		if strings.HasPrefix(ns, Prefix) {
			killNetnsPids(ns)
			exec.Command("ip", "netns", "del", ns).Run() //nolint:errcheck
		}
	}
}

func killNetnsPids(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}

	for _, p := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(p, &pid); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
		}
	}
}

// Logger returns the lab's logger.
func (l *Lab) Logger() *zap.Logger { return l.log }

// Name returns a lab-unique name: the prefix, role and this run's random suffix ("ol-core-1a2b3c").
func (l *Lab) Name(role string) string { return Prefix + role + "-" + l.sfx }

// Defer registers f to run on Close (last registered, first run).
func (l *Lab) Defer(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.cleanups = append(l.cleanups, f)
}

// Close stops every process and removes every namespace the lab created. It is safe to call twice.
func (l *Lab) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()

		return
	}

	l.closed = true
	fns := l.cleanups
	l.cleanups = nil
	l.mu.Unlock()

	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}

	os.Remove(filepath.Join(l.Dir, "namespaces")) //nolint:errcheck
}

// IP runs the ip command.
func (l *Lab) IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}

	return nil
}

// AddNetns creates a network namespace with its loopback up; Close kills what runs in it and deletes it.
func (l *Lab) AddNetns(role string) (string, error) {
	ns := l.Name(role)

	f, err := os.OpenFile(filepath.Join(l.Dir, "namespaces"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("record namespace: %w", err)
	}

	fmt.Fprintln(f, ns) //nolint:errcheck
	f.Close()           //nolint:errcheck

	if err := l.IP("netns", "add", ns); err != nil {
		return "", err
	}

	l.Defer(func() {
		killNetnsPids(ns)
		exec.Command("ip", "netns", "del", ns).Run() //nolint:errcheck
	})

	if err := l.IP("-n", ns, "link", "set", "lo", "up"); err != nil {
		return "", err
	}

	return ns, nil
}

// InNetns runs fn on an OS thread switched into the named namespace (sockets fn opens stay there).
func InNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)

	go func() {
		// The thread is left locked on purpose when switching back fails: the runtime then discards it.
		runtime.LockOSThread()

		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("open own netns: %w", err)

			return
		}
		defer orig.Close() //nolint:errcheck

		target, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)

			return
		}
		defer target.Close() //nolint:errcheck

		if err := setns(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)

			return
		}

		ferr := fn()

		if err := setns(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", ns, err))

			return
		}

		runtime.UnlockOSThread()

		errc <- ferr
	}()

	return <-errc
}

func setns(f *os.File) error {
	_, _, errno := syscall.RawSyscall(sysSetns, f.Fd(), syscall.CLONE_NEWNET, 0)
	if errno != 0 {
		return errno
	}

	return nil
}

// Proc is a supervised process: output to <Dir>/<name>.log, killed (with its process group) on Close.
type Proc struct {
	Name string
	Log  *LogFile

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// ProcSpec describes a process to start.
type ProcSpec struct {
	Name string
	// NS runs it in that network namespace (ip netns exec) when set.
	NS   string
	Cmd  string
	Args []string
	Env  []string
	// Append keeps an existing log (a restarted process).
	Append bool
}

// Start starts a supervised process.
func (l *Lab) Start(spec ProcSpec) (*Proc, error) {
	path := filepath.Join(l.Dir, spec.Name+".log")

	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if spec.Append {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}

	logf, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", spec.Name, err)
	}

	name, args := spec.Cmd, spec.Args
	if spec.NS != "" {
		name, args = "ip", append([]string{"netns", "exec", spec.NS, spec.Cmd}, spec.Args...)
	}

	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), spec.Env...)
	// Its own process group (killed as a whole), and killed with the lab process if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	if err := cmd.Start(); err != nil {
		logf.Close() //nolint:errcheck

		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}

	p := &Proc{Name: spec.Name, Log: &LogFile{Path: path}, cmd: cmd, done: make(chan struct{})}

	go func() {
		p.err = cmd.Wait()
		logf.Close() //nolint:errcheck
		close(p.done)
	}()

	l.Defer(p.Stop)
	l.log.Debug("started", zap.String("process", spec.Name), zap.Int("pid", cmd.Process.Pid))

	return p, nil
}

// Stop kills the process group and waits for the process (bounded).
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}

	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck

	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		<-p.done
	}
}

// Kill kills the process group at once (a crash) and waits for it.
func (p *Proc) Kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
	<-p.done
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error, once Done is closed.
func (p *Proc) Err() error { return p.err }

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// WaitFor waits until the process's log holds needle after offset 0, failing when the process exits first.
func (p *Proc) WaitFor(ctx context.Context, needle string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	for {
		if p.Log.Contains(0, needle) {
			return nil
		}

		select {
		case <-p.done:
			if p.Log.Contains(0, needle) {
				return nil
			}

			return fmt.Errorf("%s exited (%w) before logging %q; log tail:\n%s", p.Name, p.err, needle, p.Log.Tail(2048))
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q within %s; log tail:\n%s", p.Name, needle, timeout, p.Log.Tail(2048))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sysSetns is setns(2) on linux/amd64 (the syscall package lacks the constant).
const sysSetns = 308

// CloseOnSignal closes the lab and exits when the process gets SIGINT or SIGTERM (a test binary killed by
// its runner does not run its cleanups; the lab's namespaces must go anyway). The returned func stops it.
func (l *Lab) CloseOnSignal() func() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)

	done := make(chan struct{})

	go func() {
		select {
		case s := <-sig:
			l.log.Warn("signal: tearing the lab down", zap.Stringer("signal", s))
			l.Close()
			os.Exit(1)
		case <-done:
		}
	}()

	return func() {
		signal.Stop(sig)
		close(done)
	}
}
