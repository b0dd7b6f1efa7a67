// Command demo is `make demo`: it builds everything (a line when each long build starts, "still building"
// lines while it runs, one when it is done), brings up Omni (a real Omni v1.9.3 by default, OMNI=standin for
// the stand-in), the controller and two emulated sites with two machines each (one BIOS, one UEFI), forwards
// a port on the host's loopback to the controller's status page in the lab's core namespace and prints its
// address, and shows a live table (site, machine, power, phase in the status page's words, last event) while
// it accepts every machine, allocates one per site, cuts a site's WAN for a minute and releases the allocated
// machines. When its output is not a terminal it prints one plain line per change instead of the table.
//
// Run from a terminal it keeps the lab up after the scenario until Ctrl-C, also when a step failed (the
// failure is then its exit status; -keep=false: it tears down at the end); elsewhere it tears down at the end
// (-keep: it stays up until interrupted). Ctrl-C tears the lab down
// at any time. Against the real Omni, what only a real Talos gives it (information collection, hence
// power-off after the cooldown; install events) does not happen and the timeline says why. When a real Omni
// cannot be built or run here and OMNI is unset, it says why and uses the stand-in.
//
// Each run keeps its log (demo.log), the lab's process logs and the timeline in its own directory,
// _out/demo/runs/<start time>; the last few runs are kept. It needs root, QEMU and the Debian packages of
// `make deps`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// config is the demo's settings (flags, each with an environment variable).
type config struct {
	// Out holds the build cache (bin, images) and one directory per run under runs/.
	Out string
	// Keep keeps the lab up after the scenario until Ctrl-C.
	Keep bool
	// StatusListen is the host address the status page is forwarded to (taken when free; else any port).
	StatusListen string
}

func main() {
	tty := isTerminal(os.Stdout)
	cfg := config{Out: envOr("DEMO_OUT", "_out/demo"), Keep: tty, StatusListen: envOr("DEMO_STATUS_LISTEN", "127.0.0.1:9464")}

	if v, ok := os.LookupEnv("DEMO_KEEP"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: DEMO_KEEP=%q: not a boolean\n", v)
			os.Exit(2)
		}

		cfg.Keep = b
	}

	flag.StringVar(&cfg.Out, "out", cfg.Out, "directory for the build cache and each run's logs, state and timeline "+
		"(runs/<start time>) ($DEMO_OUT)")
	flag.BoolVar(&cfg.Keep, "keep", cfg.Keep, "keep the lab running after the scenario until Ctrl-C; default: true "+
		"when stdout is a terminal, false otherwise (then it tears down when the scenario ends) ($DEMO_KEEP)")
	flag.StringVar(&cfg.StatusListen, "status-listen", cfg.StatusListen, "host loopback address the controller's "+
		"status page is forwarded to; any free port when taken ($DEMO_STATUS_LISTEN)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := run(ctx, cfg, tty); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}

	return def
}

func run(ctx context.Context, cfg config, tty bool) error {
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

	out, err := filepath.Abs(cfg.Out)
	if err != nil {
		return err
	}

	runs := filepath.Join(out, "runs")

	// A run killed without its teardown left namespaces behind: they go before this run starts.
	for _, ns := range sweepStale(append([]string{out}, runDirs(runs)...)) {
		say("deleted namespace " + ns + ", left by a demo that did not tear down")
	}

	for _, d := range prune(runs, keepRuns-1) {
		os.RemoveAll(d) //nolint:errcheck // an old run's logs; a leftover is harmless
	}

	dir := filepath.Join(runs, time.Now().UTC().Format("20060102-150405"))

	// The lab clears its directory when it starts: the log file is opened in it afterwards, and what the lab
	// logs before then is not lost (it logs nothing before).
	logTo := &lateWriter{}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), logTo, zap.InfoLevel))

	l, err := lab.New(dir, log)
	if err != nil {
		return err
	}

	defer func() {
		fmt.Println("==> tearing the lab down (stopping QEMU machines, deleting namespaces)")
		l.Close()
		logTo.close()
		fmt.Println("==> lab torn down; logs, state and the timeline of this run: " + dir)
	}()

	logFile, err := os.Create(filepath.Join(dir, "demo.log"))
	if err != nil {
		return err
	}
	logTo.set(logFile)

	say("this run's log, process logs and timeline: " + dir)

	var omniBins realomni.Binaries

	if mode == lab.RealOmni {
		say("a real Omni " + realomni.Version + ": taken from _out/omni when built before, otherwise built now " +
			"(about 13 minutes on two cores the first time; OMNI=standin uses the stand-in instead)")

		omniBins, err = timed(os.Stdout, "building a real Omni", func() (realomni.Binaries, error) {
			return realOmni(ctx, root, log)
		})

		switch {
		case err != nil && (explicit || ctx.Err() != nil):
			return err
		case err != nil:
			say(fmt.Sprintf("cannot run a real Omni here: %v\n    falling back to the Omni stand-in (OMNI=real makes this an error)", err))

			mode = lab.StandInOmni
		}
	}

	bins, err := timed(os.Stdout, "building the controller, the edge and the Omni stand-in", func() (lab.Binaries, error) {
		return lab.BuildBinaries(ctx, root, filepath.Join(out, "bin"))
	})
	if err != nil {
		return err
	}

	bins.RealOmni = omniBins

	if ok, reason := lab.ControllerSupportsOmni(ctx, bins.Controller); !ok {
		return errors.New(reason)
	}

	images, err := timed(os.Stdout, "building the machine images", func() (lab.Images, error) {
		return lab.BuildImages(ctx, root, filepath.Join(out, "images"))
	})
	if errors.Is(err, bootlab.ErrNoKernel) {
		return fmt.Errorf("%w (the guest kernel comes from `apt-get download`; run make deps)", err)
	}

	if err != nil {
		return err
	}

	if mode == lab.RealOmni {
		say("starting a real Omni in the lab's core namespace, the controller and two sites")
	} else {
		say("starting the Omni stand-in, the controller and two sites")
	}

	env, err := lab.Setup(ctx, l, bins, images, lab.Options{Omni: mode})
	if err != nil {
		return err
	}

	status, err := forwardStatusPage(ctx, env.Core.NS, cfg.StatusListen)
	if err != nil {
		return err
	}

	open := howToOpen(status, env.Core.NS)
	say(open[0])

	for _, line := range open[1:] {
		fmt.Println(line)
	}

	switch {
	case cfg.Keep:
		say("the lab stays up after the scenario until Ctrl-C; Ctrl-C at any time tears it down")
	default:
		say("the lab is torn down when the scenario ends (-keep keeps it up until Ctrl-C); Ctrl-C tears it down earlier")
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

	header := header{omni: omniName(env), logs: dir, open: open, keep: cfg.Keep}
	plain := &plainLines{w: os.Stdout, now: time.Now, shown: map[string]string{}}

	lastPhases := map[string]lab.PageMachine{}

	show := func(step string) {
		rows := tableRows(ctx, env, lastPhases)
		if tty {
			draw(os.Stdout, header, step, rows, time.Now())
		} else {
			plain.print(step, rows)
		}
	}

	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			say("interrupted")

			return ctx.Err()
		case err := <-done:
			show("scenario finished")

			if b, rerr := os.ReadFile(env.Timeline.Path); rerr == nil {
				// A failed step quotes a serial console, with the firmware's terminal codes.
				fmt.Printf("\n%s\n", cleanText(string(b)))
			}

			if !cfg.Keep {
				return err
			}

			// A failed step is worth a look at the running lab too: it stays up either way, and the failure is
			// the exit status once it is torn down.
			if err != nil {
				say("the scenario FAILED: " + clean(err.Error()))
			}

			say("scenario finished; the lab stays up (status page: " + status + "); Ctrl-C tears it down")
			<-ctx.Done()

			return err
		case <-tick.C:
			show(current.Load().(string)) // only strings are stored
		}
	}
}

func say(s string) { fmt.Printf("==> %s\n", s) }

func omniName(env *lab.Env) string {
	if env.Omni.Mode == lab.RealOmni {
		return "a real Omni " + realomni.Version
	}

	return "the Omni stand-in"
}

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

// howToOpen says where the status page is and how to reach it: from a browser on this machine, from another
// machine through SSH, and from a shell inside the lab's core namespace.
func howToOpen(status, coreNS string) []string {
	port := status[strings.LastIndex(status, ":")+1:]
	port = strings.TrimSuffix(port, "/status/")

	return []string{
		"the controller's status page: open " + status + " in a browser on this machine " +
			"(a forward on the host's loopback into the lab's core namespace, up while the lab is)",
		"    from another machine: ssh -L " + port + ":127.0.0.1:" + port + " root@<this machine>, then open " + status,
		fmt.Sprintf("    from a shell here, without the forward: ip netns exec %s curl -s http://127.0.0.1:%d/status/",
			coreNS, lab.ControllerHTTPPort),
	}
}

// row is one machine in the table.
type row struct {
	Site, Machine, Power, Phase, LastEvent string
}

// tableRows is the lab's machines with their phase as the controller gives it (`controller machine list`,
// the status page's own words: lifecycle phases, timeline.UnknownPhase for a machine not looked at yet), "-"
// for machines it does not know (the bare comparison machines, or before it has seen them). While the
// controller does not answer (the scenario restarts it), last's phases (the last answer) are shown.
func tableRows(ctx context.Context, env *lab.Env, last map[string]lab.PageMachine) []row {
	phases, err := env.Controller.MachinePhases(ctx)
	if err != nil {
		phases = last
	} else {
		clear(last)
		maps.Copy(last, phases)
	}
	statuses := env.Statuses(ctx)
	machines := append(append([]*lab.Machine(nil), env.Machines...), env.Bare...)

	rows := make([]row, 0, len(statuses))

	for i, s := range statuses {
		r := row{Site: s.Site, Machine: s.Machine, Power: s.Power, Phase: "-", LastEvent: s.LastEvent}

		if i < len(machines) {
			if m, ok := phases[strings.ToLower(machines[i].Spec.UUID)]; ok {
				r.Phase = m.Phase
				if r.Phase == "" {
					r.Phase = timeline.UnknownPhase
				}
			}
		}

		rows = append(rows, r)
	}

	return rows
}

// plainLines prints, for output that is not a terminal, the step when it changes and a machine's row when it
// changes: one line per change, no terminal codes.
type plainLines struct {
	w     io.Writer
	now   func() time.Time
	step  string
	shown map[string]string
}

func (p *plainLines) print(step string, rows []row) {
	now := p.now().Format("15:04:05")

	if p.step != step {
		p.step = step
		fmt.Fprintf(p.w, "%s step: %s\n", now, clean(step)) //nolint:errcheck
	}

	for _, r := range rows {
		line := fmt.Sprintf("power=%s phase=%s last=%q", clean(r.Power), clean(r.Phase), clean(r.LastEvent))
		key := clean(r.Site) + "/" + clean(r.Machine)

		if p.shown[key] != line {
			p.shown[key] = line
			fmt.Fprintf(p.w, "%s %s %s\n", now, key, line) //nolint:errcheck
		}
	}
}

// escapes are the terminal codes firmware writes to a serial console (CSI sequences such as "\x1b[2J",
// "\x1b[01;01H", "\x1b[=3h"; two-character escapes such as "\x1bc").
var escapes = regexp.MustCompile(`\x1b(\[[0-9;=?<>]*[ -/]*[@-~]|[^\[])`)

// clean drops terminal codes and control characters (a serial console's) from what goes into a line.
func clean(s string) string { return strings.Map(dropControl(""), escapes.ReplaceAllString(s, "")) }

// cleanText is clean for text of several lines: line breaks and tabs stay.
func cleanText(s string) string {
	return strings.Map(dropControl("\n\t"), escapes.ReplaceAllString(s, ""))
}

func dropControl(keep string) func(rune) rune {
	return func(r rune) rune {
		if (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)) && !strings.ContainsRune(keep, r) {
			return -1
		}

		return r
	}
}

// header is the live table's heading.
type header struct {
	omni, logs string
	// keep: the lab stays up after the scenario.
	keep bool
	open []string
}

// draw repaints the live table (terminal only).
func draw(w io.Writer, h header, step string, rows []row, now time.Time) {
	var b strings.Builder

	b.WriteString("\033[H\033[2J")

	after := "it is torn down when the scenario ends"
	if h.keep {
		after = "it stays up after the scenario until Ctrl-C"
	}

	fmt.Fprintf(&b, "Outpost lab against %s  %s  (this run: %s)\nCtrl-C tears the lab down; %s\n",
		h.omni, now.Format("15:04:05"), h.logs, after)

	for _, l := range h.open {
		b.WriteString(l + "\n")
	}

	fmt.Fprintf(&b, "step: %s\n\n", clean(step))

	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tMACHINE\tPOWER\tPHASE\tLAST EVENT") //nolint:errcheck

	for _, r := range rows {
		ev := clean(r.LastEvent)
		if len(ev) > 70 {
			ev = ev[:70] + "..."
		}

		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Site, r.Machine, r.Power, r.Phase, ev) //nolint:errcheck
	}

	tw.Flush()                    //nolint:errcheck
	io.WriteString(w, b.String()) //nolint:errcheck
}

// lateWriter is a log destination set after the logger is made; what is written before is dropped.
type lateWriter struct {
	w atomic.Pointer[os.File]
}

func (l *lateWriter) set(f *os.File) { l.w.Store(f) }

func (l *lateWriter) Write(p []byte) (int, error) {
	if f := l.w.Load(); f != nil {
		return f.Write(p)
	}

	return len(p), nil
}

// close closes the file once the last line is written (after the lab's teardown).
func (l *lateWriter) close() {
	if f := l.w.Swap(nil); f != nil {
		f.Close() //nolint:errcheck
	}
}

func (l *lateWriter) Sync() error {
	if f := l.w.Load(); f != nil {
		return f.Sync()
	}

	return nil
}
