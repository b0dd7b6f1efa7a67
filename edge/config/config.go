// Package config is the edge's configuration: data with defaults and validation.
// Flags and environment variables that fill it live in the edge's main package only.
package config

import (
	"errors"
	"fmt"
	"net"

	"github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/shared/logging"
)

// Config is everything the edge process needs.
type Config struct {
	// StateDir holds the edge's identity and everything it must keep across restarts.
	StateDir string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// HTTPListen serves iPXE scripts, assets, /config, /metrics and /healthz.
	HTTPListen string
	// Uplink is the connection to the controller.
	Uplink uplink.Config
}

// Default returns the default configuration.
func Default() Config {
	return Config{
		StateDir:   "/var/lib/outpost-edge",
		LogLevel:   "info",
		HTTPListen: ":8080",
		Uplink:     uplink.Default(),
	}
}

// Validate checks the configuration and says what is wrong with it.
func (c Config) Validate() error {
	var errs []error

	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}

	if err := logging.ValidLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}

	if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
		errs = append(errs, fmt.Errorf("http listen address %q: %w", c.HTTPListen, err))
	}

	uc := c.Uplink
	uc.StateDir = c.StateDir

	if err := uc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("uplink: %w", err))
	}

	return errors.Join(errs...)
}
