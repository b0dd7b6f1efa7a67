package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// keepRuns is how many runs' directories (logs, state, timeline) are kept, this one included.
const keepRuns = 5

// runDirs lists the run directories under runs, oldest first (their names are start times).
func runDirs(runs string) []string {
	entries, err := os.ReadDir(runs)
	if err != nil {
		return nil
	}

	var out []string

	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(runs, e.Name()))
		}
	}

	sort.Strings(out)

	return out
}

// prune returns the run directories under runs beyond the newest keep ones, to delete.
func prune(runs string, keep int) []string {
	dirs := runDirs(runs)
	if len(dirs) <= keep {
		return nil
	}

	return dirs[:len(dirs)-keep]
}

// sweepStale deletes the namespaces (and kills what runs in them) that a lab in one of dirs recorded and
// never deleted because its process was killed; a lab whose process still runs is left alone. It returns
// the namespaces deleted. The run's logs stay.
func sweepStale(dirs []string) []string {
	var deleted []string

	for _, dir := range dirs {
		list, err := os.ReadFile(filepath.Join(dir, "namespaces"))
		if err != nil {
			continue
		}

		if alive(filepath.Join(dir, "lab.pid")) {
			continue
		}

		for _, ns := range strings.Fields(string(list)) {
			if !strings.HasPrefix(ns, lab.Prefix) || !netnsExists(ns) {
				continue
			}

			killNetnsPids(ns)

			if exec.Command("ip", "netns", "del", ns).Run() == nil {
				deleted = append(deleted, ns)
			}
		}

		os.Remove(filepath.Join(dir, "namespaces")) //nolint:errcheck
	}

	return deleted
}

// alive reports whether the process a pid file names still runs (or the pid was reused: then it is left
// alone too).
func alive(pidFile string) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}

	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}

	_, err = os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))

	return err == nil
}

func netnsExists(ns string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", ns))

	return err == nil
}

func killNetnsPids(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}

	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
		}
	}
}
