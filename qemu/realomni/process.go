package realomni

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long a stopped Omni gets to shut down (etcd included) before it is killed.
const stopGrace = 20 * time.Second

// process is a supervised child: its own process group, output appended to a log file, killed with its
// parent (Pdeathsig) and, by stop, with its whole group.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts argv in dir with env added to ours, appending its output to logPath after a header.
func startProcess(argv []string, dir string, env []string, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", logPath, err)
	}

	fmt.Fprintf(logf, "=== realomni: starting %s at %s\n", argv[0], time.Now().UTC().Format(time.RFC3339)) //nolint:errcheck

	cmd := exec.Command(argv[0], argv[1:]...) // argv is built by this package
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	if err := cmd.Start(); err != nil {
		logf.Close() //nolint:errcheck

		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}

	p := &process{cmd: cmd, done: make(chan struct{})}

	go func() {
		p.err = cmd.Wait()
		logf.Close() //nolint:errcheck
		close(p.done)
	}()

	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and waits for the process.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}

	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck

	t := time.NewTimer(grace)
	defer t.Stop()

	select {
	case <-p.done:
	case <-t.C:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		<-p.done
	}
}

// exited reports the process's exit error once it has exited.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// logTail is the end of the file at path (for error messages).
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close() //nolint:errcheck

	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart) //nolint:errcheck
	}

	b, _ := io.ReadAll(f) //nolint:errcheck

	return string(b)
}
