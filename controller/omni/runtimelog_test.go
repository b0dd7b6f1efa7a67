package omni

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The runtime's line per reconcile is dropped; the controllers' own lines and the runtime's failures are kept,
// also through a logger with fields (as the runtime makes one per controller).
func TestRuntimeLoggerDropsReconcileLines(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zap.DebugLevel)
	log := runtimeLogger(zap.New(core)).With(zap.String("controller", "lifecycle.PowerController"))

	log.Info("reconcile succeeded")
	log.Debug("reconcile skipped")
	log.Info("powered on")
	log.Error("reconcile failed")

	var msgs []string
	for _, e := range logs.All() {
		msgs = append(msgs, e.Message)
	}

	require.Equal(t, []string{"powered on", "reconcile failed"}, msgs)
}
