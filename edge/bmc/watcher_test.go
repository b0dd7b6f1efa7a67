package bmc_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bmc/internal/fakebmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

type powerEvents struct {
	mu  sync.Mutex
	log []string
}

func (p *powerEvents) PowerChanged(id string, state bmcpb.PowerState, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.log = append(p.log, id+" "+state.Name())
}

func (p *powerEvents) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()

	return append([]string(nil), p.log...)
}

// The edge watches its BMCs itself and reports each change once, in order; a BMC that does not answer is
// reported unknown without holding up the others.
func TestWatcherReportsChanges(t *testing.T) {
	t.Parallel()

	good := fakebmc.Start(t, fakebmc.Options{User: creds.Username, Password: creds.Password})

	// a BMC address nothing answers at
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() }) //nolint:errcheck

	cfg := bmc.Default()
	cfg.CallTimeout, cfg.ProbeTimeout, cfg.IPMIExchangeTimeout, cfg.RatePerSecond, cfg.Burst = 2*time.Second, time.Second, 300*time.Millisecond, 100, 10

	m, err := bmc.New(cfg, zaptest.NewLogger(t), nil)
	require.NoError(t, err)
	t.Cleanup(m.Close)

	events := &powerEvents{}
	w := bmc.NewWatcher(m, events, bmc.WatcherConfig{Interval: 200 * time.Millisecond, Concurrency: 4, MaxTargets: 10}, zaptest.NewLogger(t), time.Now)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- w.Run(ctx) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.Equal(t, 2, w.Set([]bmc.WatchTarget{
		{MachineID: "m-good", Target: bmc.Target{Host: "127.0.0.1", IPMIPort: good.Port, Protocol: bmc.ProtocolIPMI}, Credentials: creds},
		{MachineID: "m-silent", Target: bmc.Target{Host: "127.0.0.1", IPMIPort: silent.LocalAddr().(*net.UDPAddr).Port, Protocol: bmc.ProtocolIPMI}, Credentials: creds},
	}))

	require.Eventually(t, func() bool {
		return slices.Contains(events.all(), "m-good off") && slices.Contains(events.all(), "m-silent unknown")
	},
		10*time.Second, 10*time.Millisecond, "first states reported: %v", events.all())

	_, err = m.PowerStatus(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: good.Port, Protocol: bmc.ProtocolIPMI}, creds)
	require.NoError(t, err)
	require.NoError(t, m.PowerOn(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: good.Port, Protocol: bmc.ProtocolIPMI}, creds))

	require.Eventually(t, func() bool { return slices.Contains(events.all(), "m-good on") }, 10*time.Second, 10*time.Millisecond)

	// each change once: off, then on (polls in between repeat nothing)
	var goodEvents []string

	for _, e := range events.all() {
		if e == "m-good off" || e == "m-good on" {
			goodEvents = append(goodEvents, e)
		}
	}

	require.Equal(t, []string{"m-good off", "m-good on"}, goodEvents)

	// a shorter list stops watching the rest; MaxTargets bounds what is taken
	require.Equal(t, 1, w.Set([]bmc.WatchTarget{{MachineID: "m-good", Target: bmc.Target{Host: "127.0.0.1", IPMIPort: good.Port, Protocol: bmc.ProtocolIPMI}, Credentials: creds}}))

	many := make([]bmc.WatchTarget, 20)
	for i := range many {
		many[i] = bmc.WatchTarget{MachineID: string(rune('a' + i)), Target: bmc.Target{Host: "127.0.0.1", IPMIPort: good.Port}}
	}

	require.Equal(t, 10, w.Set(many))
}
