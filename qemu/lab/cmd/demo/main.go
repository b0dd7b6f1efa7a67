// Command demo is `make demo`: it builds everything (printing progress on the long builds), brings up Omni (a
// real Omni v1.9.3 by default, OMNI=standin for the stand-in), the controller and two emulated sites with two
// machines each (one BIOS, one UEFI), forwards the controller's status page to a port on the host's loopback
// and prints its address, and shows a live table (site, machine, power, phase, last event; plain lines when
// the output is not a terminal) while it accepts every machine, allocates one per site, cuts a site's WAN for
// a minute and releases the allocated machines. Run from a terminal it keeps the lab up after the scenario
// until Ctrl-C (-keep=false: it tears down at the end); elsewhere it tears down at the end. Against the real
// Omni, what only a real Talos gives it (information collection, hence power-off after the cooldown; install
// events) does not happen and the timeline says why. When a real Omni cannot be built or run here and OMNI is
// unset, it says why and uses the stand-in. Logs (demo.log), state and the timeline stay under _out/demo. It
// needs root, QEMU and the Debian packages of `make deps`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

func main() {
	out := flag.String("out", "_out/demo", "directory for logs, state and the timeline")
	keep := flag.Bool("keep", isTerminal(os.Stdout), "keep the lab running after the scenario until Ctrl-C "+
		"(default: when run from a terminal)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := run(ctx, *out, *keep); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string, keep bool) error {
	mode, err := lab.ParseOmniMode(os.Getenv(lab.OmniEnv))
	if err != nil {
		return err
	}

	explicit := os.Getenv(lab.OmniEnv) != ""

	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, taps, QEMU), with a real Omni and with the stand-in alike: run it as root")
	}

	root, err := os.Getwd()
	if err != nil {
		return err
	}

	dir, err := filepath.Abs(out)
	if err != nil {
		return err
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	logFile, err := os.Create(filepath.Join(dir, "demo.log"))
	if err != nil {
		return err
	}
	defer logFile.Close() //nolint:errcheck

	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), logFile, zap.InfoLevel))

	var omniBins realomni.Binaries

	if mode == lab.RealOmni {
		say("building a real Omni " + realomni.Version + " (cached under _out/omni; the first build takes about 13 minutes " +
			"on two cores; OMNI=standin uses the stand-in instead)")

		stopTicking := progress("building a real Omni")
		omniBins, err = realOmni(ctx, root, log)

		stopTicking()

		switch {
		case err != nil && (explicit || ctx.Err() != nil):
			return err
		case err != nil:
			say(fmt.Sprintf("cannot run a real Omni here: %v\n    falling back to the Omni stand-in (OMNI=real makes this an error)", err))

			mode = lab.StandInOmni
		}
	}

	l, err := lab.New(dir, log)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("tearing the lab down...")
		l.Close()
	}()

	say("building the controller, the edge, the Omni stand-in and the machine images")

	stopTicking := progress("building the binaries and images")
	defer stopTicking()

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(dir, "bin"))
	if err != nil {
		return err
	}

	bins.RealOmni = omniBins

	if ok, reason := lab.ControllerSupportsOmni(ctx, bins.Controller); !ok {
		return errors.New(reason)
	}

	images, err := lab.BuildImages(ctx, root, filepath.Join(dir, "images"))
	if errors.Is(err, bootlab.ErrNoKernel) {
		return fmt.Errorf("%w (the guest kernel comes from `apt-get download`; run make deps)", err)
	}

	if err != nil {
		return err
	}

	stopTicking()

	if mode == lab.RealOmni {
		say("starting a real Omni in the lab's core namespace, the controller and two sites")
	} else {
		say("starting the Omni stand-in, the controller and two sites")
	}

	env, err := lab.Setup(ctx, l, bins, images, lab.Options{Omni: mode})
	if err != nil {
		return err
	}

	status, err := forwardStatusPage(ctx, env.Core.NS)
	if err != nil {
		return err
	}

	say("the controller's status page: open " + status + " in a browser on this machine " +
		"(forwarded into the lab's core namespace)")

	if keep {
		say("the lab stays up after the scenario until Ctrl-C")
	}

	var current atomic.Value

	current.Store("running the scenario")

	done := make(chan error, 1)

	go func() {
		done <- env.Run(ctx, func(name string, err error) {
			if err != nil {
				current.Store("FAILED: " + name)
			} else {
				current.Store("done: " + name)
			}
		})
	}()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()

	tty := isTerminal(os.Stdout)
	shown := map[string]string{}

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			if tty {
				draw(ctx, env, "scenario finished", status)
			} else {
				lines(ctx, env, "scenario finished", shown)
			}

			if b, rerr := os.ReadFile(env.Timeline.Path); rerr == nil {
				fmt.Printf("\n%s\nlogs: %s\n", b, dir)
			}

			if err != nil || !keep {
				return err
			}

			fmt.Printf("lab kept running (status page: %s); Ctrl-C tears it down\n", status)
			<-ctx.Done()

			return nil
		case <-tick.C:
			if tty {
				draw(ctx, env, current.Load().(string), status) // only strings are stored
			} else {
				lines(ctx, env, current.Load().(string), shown)
			}
		}
	}
}

func say(s string) { fmt.Printf("==> %s\n", s) }

// realOmni builds a real Omni (or takes it from the cache), or says why it cannot run here.
func realOmni(ctx context.Context, root string, log *zap.Logger) (realomni.Binaries, error) {
	// It runs in a private mount namespace (its WireGuard socket directory is its own).
	if _, err := exec.LookPath("unshare"); err != nil {
		return realomni.Binaries{}, fmt.Errorf("a real Omni needs unshare (util-linux): %w", err)
	}

	return lab.BuildRealOmni(ctx, root, log)
}

// isTerminal reports whether f is a terminal (the live table repaints; elsewhere the demo prints plain lines).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)

	return err == nil
}

// progress prints a line every 30 seconds while long work runs, until the returned function is called.
func progress(what string) func() {
	done := make(chan struct{})
	start := time.Now()

	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()

		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Printf("    ... still %s (%s so far)\n", what, time.Since(start).Round(time.Second))
			}
		}
	}()

	var once sync.Once

	return func() { once.Do(func() { close(done) }) }
}

// forwardStatusPage forwards a port on the host's loopback to the controller's status page inside the core
// namespace, for as long as ctx lasts, and returns the page's address on the host.
func forwardStatusPage(ctx context.Context, coreNS string) (string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("status page forward: %w", err)
	}

	context.AfterFunc(ctx, func() { ln.Close() }) //nolint:errcheck

	dial := lab.DialerIn(coreNS)
	target := fmt.Sprintf("127.0.0.1:%d", lab.ControllerHTTPPort)

	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}

			go func() {
				defer c.Close() //nolint:errcheck

				dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				up, err := dial(dctx, target)

				cancel()

				if err != nil {
					return
				}
				defer up.Close() //nolint:errcheck

				go func() {
					io.Copy(up, c) //nolint:errcheck
					up.Close()     //nolint:errcheck
				}()

				io.Copy(c, up) //nolint:errcheck
			}()
		}
	}()

	return "http://" + ln.Addr().String() + "/status/", nil
}

// lines prints, when the output is not a terminal, the step when it changes and each machine's row when it
// changes: a log that reads without terminal codes.
func lines(ctx context.Context, env *lab.Env, step string, shown map[string]string) {
	now := time.Now().Format("15:04:05")

	if shown["\x00step"] != step {
		shown["\x00step"] = step
		fmt.Printf("%s step: %s\n", now, step)
	}

	for _, s := range env.Statuses(ctx) {
		row := fmt.Sprintf("power=%s phase=%s last=%q", s.Power, s.Phase, s.LastEvent)
		key := s.Site + "/" + s.Machine

		if shown[key] != row {
			shown[key] = row
			fmt.Printf("%s %s %s\n", now, key, row)
		}
	}
}

// draw repaints the live table.
func draw(ctx context.Context, env *lab.Env, step, status string) {
	var b strings.Builder

	b.WriteString("\033[H\033[2J")
	omni := "the Omni stand-in"
	if env.Omni.Mode == lab.RealOmni {
		omni = "a real Omni " + realomni.Version
	}

	fmt.Fprintf(&b, "Outpost lab against %s  %s  (logs: %s; Ctrl-C tears down)\nstatus page: %s\nstep: %s\n\n",
		omni, time.Now().Format("15:04:05"), env.Lab.Dir, status, step)

	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tMACHINE\tPOWER\tPHASE\tLAST EVENT") //nolint:errcheck

	for _, s := range env.Statuses(ctx) {
		ev := s.LastEvent
		if len(ev) > 70 {
			ev = ev[:70] + "..."
		}

		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Site, s.Machine, s.Power, s.Phase, ev) //nolint:errcheck
	}

	tw.Flush() //nolint:errcheck
	fmt.Print(b.String())
}
