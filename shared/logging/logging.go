// Package logging builds the zap loggers both binaries use: JSON lines, one logger per process,
// a component field per unit.
package logging

import (
	"fmt"
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a JSON logger writing to w at the given level ("debug", "info", "warn", "error").
func New(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}

	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	enc.EncodeDuration = zapcore.StringDurationEncoder

	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)

	return zap.New(core, zap.ErrorOutput(zapcore.AddSync(w))), nil
}

// ValidLevel reports whether level names a zap level.
func ValidLevel(level string) error {
	_, err := zapcore.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("log level %q: %w", level, err)
	}

	return nil
}
