package omni

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// runtimeLogger is logger for the COSI runtime: without the runtime's line for every successful or skipped
// reconcile (at info: at 20,000 machines over 300,000 lines in five minutes, most of the controller's log and a
// share of its CPU). What the lifecycle's controllers log through the runtime is kept, and so are the runtime's
// warnings and errors; the reconcile durations are metrics (outpost_lifecycle_reconcile_duration_seconds).
func runtimeLogger(logger *zap.Logger) *zap.Logger {
	return logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quietReconciles{c} }))
}

// quietReconciles drops the runtime's per-reconcile lines below warning level.
type quietReconciles struct{ zapcore.Core }

func (q quietReconciles) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level < zapcore.WarnLevel && (e.Message == "reconcile succeeded" || e.Message == "reconcile skipped") {
		return ce
	}

	return q.Core.Check(e, ce)
}

func (q quietReconciles) With(fields []zapcore.Field) zapcore.Core {
	return quietReconciles{q.Core.With(fields)}
}
