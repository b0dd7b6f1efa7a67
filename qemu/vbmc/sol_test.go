package vbmc_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool, seen ...fmt.Stringer) {
	t.Helper()

	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; seen: %v", what, seen)
		}

		time.Sleep(20 * time.Millisecond)
	}
}

// echoGuest is a machine's side of the serial line: it answers each line typed at it with "ECHO line". It
// returns the guest's end, for output of its own.
func echoGuest(t *testing.T, c *vbmc.Console) net.Conn {
	t.Helper()

	bmcEnd, guest := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- c.Serve(ctx, bmcEnd) }()

	go func() {
		sc := bufio.NewScanner(guest)
		for sc.Scan() {
			if _, err := fmt.Fprintf(guest, "ECHO %s\r\n", strings.TrimSpace(sc.Text())); err != nil {
				return
			}
		}
	}()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		guest.Close() //nolint:errcheck
	})

	return guest
}

func solCommand(port int) string {
	return "ipmitool -I lanplus -H 127.0.0.1 -p " + strconv.Itoa(port) + " -U " + user + " -E -C 17 -N 1 -R 3 sol activate"
}

func solActivate(t *testing.T, port int) (io.Writer, *lockedBuffer) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedBuffer{}
	// ipmitool's sol activate wants a terminal: util-linux's script gives it one.
	cmd := exec.CommandContext(ctx, "script", "-q", "-e", "-f", "-c", solCommand(port), "/dev/null")
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second

	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	t.Cleanup(func() {
		stdin.Close() //nolint:errcheck
		cancel()
		cmd.Wait() //nolint:errcheck
	})

	return stdin, out
}

// TestSOLWithIpmitool judges the vBMC's SOL with Debian's ipmitool: typed input reaches the serial line, the
// line's answer comes back, and a second activation is refused while the first holds the console.
func TestSOLWithIpmitool(t *testing.T) {
	for _, tool := range []string{"ipmitool", "script"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (Debian packages ipmitool, bsdutils)", tool)
		}
	}

	ch := vbmc.NewChassis()
	b, port := startIPMIBMC(t, ch)
	c := vbmc.NewConsole()
	b.SetConsole(c)
	echoGuest(t, c)

	inW, out := solActivate(t, port)
	waitFor(t, "sol session operational", func() bool { return strings.Contains(out.String(), "SOL Session operational") }, out)

	_, err := io.WriteString(inW, "hello-sol\n")
	require.NoError(t, err)
	waitFor(t, "the guest's echo through sol", func() bool { return strings.Contains(out.String(), "ECHO hello-sol") }, out)

	second := exec.CommandContext(t.Context(), "script", "-q", "-e", "-f", "-c", solCommand(port), "/dev/null")
	second.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
	second.Stdin = bytes.NewReader(nil)
	got, err := second.CombinedOutput()
	require.Error(t, err, "a second activation must be refused: %s", got)
	require.Contains(t, strings.ToLower(string(got)), "already active", "ipmitool's word for the refusal: %s", got)
}

// TestConsoleFloodIsBounded: a guest printing while the remote console does not collect keeps at most
// ConsoleBuffer bytes, the newest, and counts the rest as dropped.
func TestConsoleFloodIsBounded(t *testing.T) {
	t.Parallel()

	c := vbmc.NewConsole()
	conn, err := c.Open(t.Context())
	require.NoError(t, err)

	_, err = c.Open(t.Context())
	require.ErrorIs(t, err, vbmc.ErrConsoleBusy)

	bmcEnd, guest := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- c.Serve(ctx, bmcEnd) }()

	const total = 1 << 20

	chunk := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < total/len(chunk)-1; i++ {
		_, err := guest.Write(chunk)
		require.NoError(t, err)
	}

	_, err = guest.Write(append(bytes.Repeat([]byte("y"), 4096-4), "LAST"...))
	require.NoError(t, err)

	waitFor(t, "the flood delivered", func() bool { return c.Dropped() == total-vbmc.ConsoleBuffer })

	buf := make([]byte, 2*vbmc.ConsoleBuffer)
	n, err := conn.ReadAvailable(buf)
	require.NoError(t, err)
	require.Equal(t, vbmc.ConsoleBuffer, n)
	require.True(t, bytes.HasSuffix(buf[:n], []byte("LAST")), "the newest bytes are kept")

	n, err = conn.ReadAvailable(buf)
	require.NoError(t, err)
	require.Zero(t, n, "ReadAvailable does not block and has nothing more")

	require.NoError(t, conn.Close())

	again, err := c.Open(t.Context())
	require.NoError(t, err, "a closed activation frees the console")
	require.NoError(t, again.Close())

	cancel()
	require.NoError(t, <-done)
	guest.Close() //nolint:errcheck
}
