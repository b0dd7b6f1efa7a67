package timeline_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/timeline"
)

// Each step of a network boot that did not follow the one before within its grace is named; a boot that got
// as far as it should, or is still within a grace, has no diagnosis.
func TestDiagnose(t *testing.T) {
	t.Parallel()

	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	on := timeline.Entry{At: t0, Kind: timeline.KindPower, Text: "powered on into agent mode"}

	for _, tc := range []struct {
		name    string
		entries []timeline.Entry
		now     time.Time
		want    string
	}{
		{"powered on by hand: DHCP only, within grace", []timeline.Entry{{At: t0, Kind: timeline.KindDHCP, Text: "DHCP"}}, at(2), ""},
		{"powered on by hand: DHCP only", []timeline.Entry{{At: t0, Kind: timeline.KindDHCP, Text: "DHCP"}}, at(60), "its DHCP request was seen at 10:00:00 but no boot file"},
		{"powered on by hand: no agent", []timeline.Entry{{At: t0, Kind: timeline.KindDHCP}, {At: at(1), Kind: timeline.KindBootServed}}, at(5), "served at 10:01:00 but no agent tunnel opened since"},
		{"by hand after a finished boot: no agent", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindAgentUp}, {At: at(10), Kind: timeline.KindAgentDown},
			{At: at(11), Kind: timeline.KindDHCP}, {At: at(11), Kind: timeline.KindBootServed},
		}, at(15), "served at 10:11:00 but no agent tunnel opened since"},
		{"nothing since the agent went", []timeline.Entry{on, {At: at(1), Kind: timeline.KindAgentUp}, {At: at(10), Kind: timeline.KindAgentDown}}, at(60), ""},
		{"nothing at all", nil, at(60), ""},
		{"no DHCP yet, within grace", []timeline.Entry{on}, at(4), ""},
		{"no DHCP", []timeline.Entry{on}, at(6), "powered on at 10:00:00 and no DHCP request"},
		{"DHCP, no boot file", []timeline.Entry{on, {At: at(1), Kind: timeline.KindDHCP}}, at(5), "its DHCP request was seen at 10:01:00 but no boot file"},
		{"DHCP in a loop", []timeline.Entry{on, {At: at(1), Kind: timeline.KindDHCP, Repeats: 5}}, at(1), "its DHCP requests keep coming (6 in a row, the last at 10:01:00)"},
		{"DHCP twice is a normal boot", []timeline.Entry{on, {At: at(1), Kind: timeline.KindDHCP, Repeats: 1}}, at(2), ""},
		{"boot file failed", []timeline.Entry{on, {At: at(1), Kind: timeline.KindDHCP}, {At: at(1), Kind: timeline.KindPXE, Error: true, Text: "fetch of undionly.kpxe over tftp failed: timeout"}}, at(2), "download failed at 10:01:00: fetch of undionly.kpxe"},
		{"iPXE never asked", []timeline.Entry{on, {At: at(1), Kind: timeline.KindPXE}}, at(5), "iPXE never asked for its boot script"},
		{"no agent", []timeline.Entry{on, {At: at(1), Kind: timeline.KindBootServed}}, at(5), "no agent tunnel opened since"},
		{"kernel download failing", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindBootServed},
			{At: at(1), Kind: timeline.KindAssetFetch, Error: true, Text: "download of agent/x86_64/vmlinuz stopped after 1.0 MiB of 14.0 MiB: reset"},
			{At: at(2), Kind: timeline.KindAssetFetch, Error: true, Text: "download of agent/x86_64/vmlinuz stopped after 1.0 MiB of 14.0 MiB: broken pipe"},
		}, at(5), "iPXE fetched its agent-mode boot script at 10:01:00, then a download failed twice (the last at 10:02:00): download of agent/x86_64/vmlinuz stopped"},
		{"one failed download, within grace", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindBootServed}, {At: at(1), Kind: timeline.KindAssetFetch, Error: true, Text: "x"},
		}, at(3), ""},
		{"failed downloads across the script's retries, at once", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindBootServed}, {At: at(1), Kind: timeline.KindAssetFetch, Error: true, Text: "x"},
			{At: at(2), Kind: timeline.KindBootServed}, {At: at(2), Kind: timeline.KindAssetFetch, Error: true, Text: "y"},
		}, at(2), "iPXE fetched its agent-mode boot script at 10:02:00, then a download failed twice (the last at 10:02:00): y"},
		{"a whole download clears the failures before it", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindBootServed}, {At: at(1), Kind: timeline.KindAssetFetch, Error: true, Text: "x"},
			{At: at(1), Kind: timeline.KindAssetFetch, Text: "downloaded"},
		}, at(5), "no agent tunnel opened since"},
		{"install download failing", []timeline.Entry{
			on, {At: at(1), Kind: timeline.KindInstallPlan}, {At: at(1), Kind: timeline.KindAssetFetch, Error: true, Text: "download of talos/initramfs.xz stopped", Repeats: 2},
		}, at(5), "its install plan was served at 10:01:00, then an asset download failed 3 times"},
		{"agent up", []timeline.Entry{on, {At: at(1), Kind: timeline.KindBootServed}, {At: at(2), Kind: timeline.KindAgentUp}}, at(50), ""},
		{"assets", []timeline.Entry{on, {At: at(1), Kind: timeline.KindAssetWait, Error: true}}, at(2), "waited since 10:01:00 for boot assets"},
		{"refused", []timeline.Entry{on, {At: at(1), Kind: timeline.KindBootServed}, {At: at(2), Kind: timeline.KindError, Error: true, Text: "agent tunnel from 10.0.0.9 refused: no boot evidence"}}, at(3), "tunnel was refused at 10:02:00"},
		{"install pending", []timeline.Entry{on, {At: at(1), Kind: timeline.KindInstallPlan}}, at(10), ""},
		{"install stuck", []timeline.Entry{on, {At: at(1), Kind: timeline.KindInstallPlan}}, at(20), "no install was reported since"},
		{"disk boot", []timeline.Entry{on, {At: at(1), Kind: timeline.KindDiskBoot}}, at(60), ""},
		{"a later reboot starts afresh", []timeline.Entry{on, {At: at(1), Kind: timeline.KindAgentUp}, {At: at(10), Kind: timeline.KindPower, Text: "rebooted into install mode: wrong-mode"}}, at(16), "powered on at 10:10:00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got := timeline.Diagnose(timeline.Record{Entries: tc.entries}, tc.now)
			if tc.want == "" {
				require.Empty(t, got)
			} else {
				require.Contains(t, got, tc.want)
			}
		})
	}
}

func TestCurrentBoot(t *testing.T) {
	t.Parallel()

	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	on := timeline.Entry{At: t0, Kind: timeline.KindPower, Text: "powered on into agent mode"}
	dhcp := timeline.Entry{At: t0, Kind: timeline.KindDHCP}
	up := timeline.Entry{At: t0, Kind: timeline.KindAgentUp}
	bmc := timeline.Entry{At: t0, Kind: timeline.KindPower, Text: "BMC reports power on"}

	for _, tc := range []struct {
		name    string
		entries []timeline.Entry
		want    int
	}{
		{"nothing", nil, 0},
		{"by hand, never finished", []timeline.Entry{dhcp, dhcp}, 0},
		{"powered on by the controller", []timeline.Entry{dhcp, up, on, dhcp}, 2},
		{"finished after the power-on", []timeline.Entry{on, dhcp, up}, 3},
		{"by hand after a finished boot", []timeline.Entry{on, up, dhcp}, 2},
		{"a BMC report is not a power-on", []timeline.Entry{up, bmc}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, timeline.CurrentBoot(timeline.Record{Entries: tc.entries}))
		})
	}
}
