// Package bmc gives the edge one small interface to machines' BMCs: power status, on, off, cycle,
// one-time PXE boot (BIOS or UEFI) and clearing the override. It chooses Redfish when the BMC
// answers it (remembered per BMC with a TTL) and IPMI v2 lanplus otherwise, serializes and
// rate-limits the calls to each BMC, reuses sessions and bounds every call with a timeout. An IPMI
// cipher suite a BMC refuses is remembered per BMC like the protocol choice.
//
// Errors say whether retrying can help (IsPermanent: the BMC's completion code or HTTP status decides)
// and the gRPC service maps that onto codes the controller can branch on. Credentials arrive with each
// call and live only in memory; they are never logged and never appear in an error: the protocol
// packages scrub them, as whole words only, from the text their libraries write.
package bmc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/outpost-metal/outpost/shared/metal"
)

// Protocol is how a BMC is driven.
type Protocol string

// Protocols.
const (
	// ProtocolAuto probes Redfish and falls back to IPMI.
	ProtocolAuto    Protocol = ""
	ProtocolIPMI    Protocol = "ipmi"
	ProtocolRedfish Protocol = "redfish"
)

// Sentinel errors callers branch on.
var (
	// ErrTimeout means the BMC did not answer within the call's timeout.
	ErrTimeout = errors.New("bmc did not answer in time")
	// ErrInvalidTarget means the target or credentials are unusable.
	ErrInvalidTarget = errors.New("invalid bmc target")
)

// IsPermanent reports whether err is a refusal the BMC will repeat for the same request, so that retrying cannot
// help until someone changes the request, the credentials or the BMC: an invalid target, an IPMI completion code
// such as CCh "invalid data field in request" or D4h "insufficient privilege", a refused RMCP+ session (wrong
// password, no common cipher suite), a Redfish 4xx status other than 408, 412 and 429, or an HTML page where
// Redfish JSON was expected. Everything else (no answer, node busy, 5xx, a transport error, a read-back mismatch)
// is retryable. The tables are in ipmi.CompletionCodeError, ipmi.SessionError and redfish.StatusError.
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }

	return errors.Is(err, ErrInvalidTarget) || (errors.As(err, &p) && p.Permanent())
}

// Target names one BMC.
type Target struct {
	// Host is the BMC's address (IP or name).
	Host string
	// IPMIPort is the RMCP port (default 623).
	IPMIPort int
	// RedfishEndpoint is the Redfish base URL (default "https://<Host>").
	RedfishEndpoint string
	// Protocol forces a protocol; empty probes Redfish first.
	Protocol Protocol
}

// Validate checks the target.
func (t Target) Validate() error {
	switch {
	case t.Host == "":
		return fmt.Errorf("%w: host is required", ErrInvalidTarget)
	case t.IPMIPort < 0 || t.IPMIPort > 65535:
		return fmt.Errorf("%w: ipmi port %d", ErrInvalidTarget, t.IPMIPort)
	case t.Protocol != ProtocolAuto && t.Protocol != ProtocolIPMI && t.Protocol != ProtocolRedfish:
		return fmt.Errorf("%w: protocol %q", ErrInvalidTarget, t.Protocol)
	case t.RedfishEndpoint != "" && !strings.HasPrefix(t.RedfishEndpoint, "http://") && !strings.HasPrefix(t.RedfishEndpoint, "https://"):
		return fmt.Errorf("%w: redfish endpoint must be an http(s) URL", ErrInvalidTarget)
	}

	return nil
}

func (t Target) key() string {
	return net.JoinHostPort(t.Host, strconv.Itoa(t.ipmiPort())) + "|" + t.redfishEndpoint()
}

func (t Target) ipmiPort() int {
	if t.IPMIPort == 0 {
		return 623
	}

	return t.IPMIPort
}

func (t Target) redfishEndpoint() string {
	if t.RedfishEndpoint != "" {
		return strings.TrimSuffix(t.RedfishEndpoint, "/")
	}

	return "https://" + net.JoinHostPort(t.Host, "443")
}

// String names the BMC for logs and errors.
func (t Target) String() string { return t.Host }

// Credentials are a BMC user. As a whole value they format as "[redacted]" everywhere: fmt with any verb,
// zap (as a Stringer or by reflection), encoding/json and other text encoders. The fields themselves are plain
// strings: never log them.
type Credentials struct {
	Username string
	Password string
}

// redacted replaces a credential value.
const redacted = "[redacted]"

// String implements fmt.Stringer without revealing anything.
func (Credentials) String() string { return redacted }

// GoString implements fmt.GoStringer without revealing anything.
func (Credentials) GoString() string { return redacted }

// Format implements fmt.Formatter: every verb (%d, %x, %+v included) prints "[redacted]".
func (Credentials) Format(f fmt.State, _ rune) { fmt.Fprint(f, redacted) }

// MarshalText implements encoding.TextMarshaler without revealing anything (encoding/json, zap.Reflect).
func (Credentials) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Validate checks the credentials.
func (c Credentials) Validate() error {
	if c.Username == "" {
		return fmt.Errorf("%w: username is required", ErrInvalidTarget)
	}

	return nil
}

// PowerClient is the one small interface to a BMC (both protocols implement it).
type PowerClient interface {
	PowerStatus(ctx context.Context) (bool, error)
	PowerOn(ctx context.Context) error
	PowerOff(ctx context.Context) error
	// PowerCycle cycles a running machine (Manager.PowerCycle powers on one that is off).
	PowerCycle(ctx context.Context) error
	SetPXEOnce(ctx context.Context, fw metal.Firmware) error
	ClearOverride(ctx context.Context) error
	BootOverride(ctx context.Context) (set, pxe bool, fw metal.Firmware, err error)
	Close(ctx context.Context) error
}

// Config tunes the Manager.
type Config struct {
	// CallTimeout bounds a whole operation, including waiting for the BMC's turn.
	CallTimeout time.Duration
	// ProbeTimeout bounds the Redfish probe.
	ProbeTimeout time.Duration
	// ProbeTTL is how long a protocol choice, and an IPMI cipher suite a BMC fell back to, is remembered.
	ProbeTTL time.Duration
	// SessionIdle closes a session unused for this long.
	SessionIdle time.Duration
	// RatePerSecond and Burst limit the operations sent to one BMC.
	RatePerSecond float64
	Burst         int
	// IPMICipherSuites are tried in order; a suite a BMC fell back to is tried first for ProbeTTL.
	IPMICipherSuites []uint8
	// IPMIExchangeTimeout bounds one RMCP+ exchange.
	IPMIExchangeTimeout time.Duration
	// RedfishInsecure skips TLS verification of BMC certificates (they are almost always self-signed).
	RedfishInsecure bool
}

// Default returns the default configuration.
func Default() Config {
	return Config{
		CallTimeout:         30 * time.Second,
		ProbeTimeout:        3 * time.Second,
		ProbeTTL:            15 * time.Minute,
		SessionIdle:         2 * time.Minute,
		RatePerSecond:       2,
		Burst:               2,
		IPMICipherSuites:    []uint8{17, 3},
		IPMIExchangeTimeout: 2 * time.Second,
		RedfishInsecure:     true,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.CallTimeout <= 0:
		return errors.New("call timeout must be positive")
	case c.ProbeTimeout <= 0 || c.ProbeTimeout > c.CallTimeout:
		return errors.New("probe timeout must be positive and at most the call timeout")
	case c.ProbeTTL <= 0:
		return errors.New("probe ttl must be positive")
	case c.SessionIdle <= 0:
		return errors.New("session idle time must be positive")
	case c.RatePerSecond <= 0 || c.Burst < 1:
		return errors.New("rate and burst must be positive")
	case len(c.IPMICipherSuites) == 0:
		return errors.New("at least one ipmi cipher suite is required")
	case c.IPMIExchangeTimeout <= 0:
		return errors.New("ipmi exchange timeout must be positive")
	}

	return nil
}

func (c Config) limiter() *rate.Limiter {
	return rate.NewLimiter(rate.Limit(c.RatePerSecond), c.Burst)
}
