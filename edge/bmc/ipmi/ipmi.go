// Package ipmi drives a BMC over IPMI v2.0 LAN (RMCP+, "lanplus") with bougou/go-ipmi.
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"
)

// DefaultPort is the RMCP port (IPMI v2.0 §13.1).
const DefaultPort = 623

// DefaultCipherSuites are tried in order: 17 (HMAC-SHA256, AES-CBC-128), then 3 (HMAC-SHA1, AES-CBC-128)
// for older BMCs (IPMI v2.0 §22.15.2).
var DefaultCipherSuites = []uint8{17, 3}

// ErrNoAnswer is returned when the BMC did not answer an exchange (after the retries).
var ErrNoAnswer = errors.New("no answer from the bmc")

// ErrReadBack is returned when the boot flags read back differ from what was set.
var ErrReadBack = errors.New("boot flags read back differ from what was set")

// Config says how to reach one BMC.
type Config struct {
	Host     string
	Port     int
	Username string
	Password string
	// CipherSuites are tried in order (default DefaultCipherSuites).
	CipherSuites []uint8
	// Timeout bounds each UDP exchange (default 2s); Retries is how often it is repeated (default 1).
	Timeout time.Duration
	Retries int
}

// Client is an open RMCP+ session. It is not safe for concurrent use.
type Client struct {
	c *client.Client
}

// Dial opens a session. Errors never contain the credentials.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}

	if len(cfg.CipherSuites) == 0 {
		cfg.CipherSuites = DefaultCipherSuites
	}

	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}

	if cfg.Retries <= 0 {
		cfg.Retries = 1
	}

	c, err := client.NewClient(cfg.Host, cfg.Port, cfg.Username, cfg.Password)
	if err != nil {
		return nil, errors.New("invalid ipmi credentials: user name too long") // the library's message names the user
	}

	suites := make([]types.CipherSuiteID, 0, len(cfg.CipherSuites))
	for _, s := range cfg.CipherSuites {
		suites = append(suites, types.CipherSuiteID(s))
	}

	if len(suites) == 1 {
		// One suite goes through the single-suite path of the library.
		c.WithCipherSuiteID(suites[0])
	} else {
		c.WithCipherSuiteID(suites...)
	}

	c.WithTimeout(cfg.Timeout).WithRetry(cfg.Retries).WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)

	if err := c.Connect(ctx); err != nil {
		// Release the socket without waiting for a BMC that may not answer.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		c.Close(done) //nolint:errcheck

		return nil, fmt.Errorf("open ipmi session: %w", classify(err))
	}

	return &Client{c: c}, nil
}

// Close ends the session.
func (c *Client) Close(ctx context.Context) error {
	if err := c.c.Close(ctx); err != nil {
		return fmt.Errorf("close ipmi session: %w", err)
	}

	return nil
}

// PowerStatus reports whether the machine is on (Get Chassis Status, §28.2).
func (c *Client) PowerStatus(ctx context.Context) (bool, error) {
	st, err := c.c.GetChassisStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("get chassis status: %w", classify(err))
	}

	return st.PowerIsOn, nil
}

func (c *Client) control(ctx context.Context, what chassis.ChassisControl) error {
	if _, err := c.c.ChassisControl(ctx, what); err != nil {
		return fmt.Errorf("chassis control %d: %w", what, classify(err))
	}

	return nil
}

// PowerOn powers the machine up (Chassis Control, §28.3).
func (c *Client) PowerOn(ctx context.Context) error {
	return c.control(ctx, chassis.ChassisControlPowerUp)
}

// PowerOff powers the machine down hard.
func (c *Client) PowerOff(ctx context.Context) error {
	return c.control(ctx, chassis.ChassisControlPowerDown)
}

// PowerCycle power-cycles a running machine and powers up one that is off (a cycle of an off
// machine is a no-op on many BMCs).
func (c *Client) PowerCycle(ctx context.Context) error {
	on, err := c.PowerStatus(ctx)
	if err != nil {
		return err
	}

	if !on {
		return c.PowerOn(ctx)
	}

	return c.control(ctx, chassis.ChassisControlPowerCycle)
}

// SetPXEOnce sets a one-time network boot in BIOS or UEFI mode and reads it back
// (Set/Get System Boot Options, boot flags parameter 5, §28.12-28.13).
func (c *Client) SetPXEOnce(ctx context.Context, uefi bool) error {
	want := &types.BootOptionParam_BootFlags{
		BootFlagsValid:     true,
		Persist:            false,
		BIOSBootType:       types.BIOSBootType(uefi),
		BootDeviceSelector: types.BootDeviceSelectorForcePXE,
	}

	// Like ipmitool's "chassis bootdev", set parameter 5 alone: not every BMC implements the
	// set-in-progress parameter (0).
	if err := c.c.SetSystemBootOptionsParamFor(ctx, want); err != nil {
		return fmt.Errorf("set boot flags: %w", classify(err))
	}

	got, err := c.bootFlags(ctx)
	if err != nil {
		return err
	}

	if !got.BootFlagsValid || got.BootDeviceSelector != want.BootDeviceSelector || got.BIOSBootType != want.BIOSBootType || got.Persist {
		return fmt.Errorf("set one-time pxe boot: %w (device %v, efi %t, valid %t)",
			ErrReadBack, got.BootDeviceSelector, bool(got.BIOSBootType), got.BootFlagsValid)
	}

	return nil
}

// ClearOverride removes any boot override.
func (c *Client) ClearOverride(ctx context.Context) error {
	if err := c.c.SetSystemBootOptionsParamFor(ctx, &types.BootOptionParam_BootFlags{}); err != nil {
		return fmt.Errorf("clear boot flags: %w", classify(err))
	}

	return nil
}

// BootOverride returns the current override: whether one is set, whether it is PXE, and UEFI mode.
func (c *Client) BootOverride(ctx context.Context) (set, pxe, uefi bool, err error) {
	f, err := c.bootFlags(ctx)
	if err != nil {
		return false, false, false, err
	}

	return f.BootFlagsValid && f.BootDeviceSelector != types.BootDeviceSelectorNoOverride,
		f.BootDeviceSelector == types.BootDeviceSelectorForcePXE, bool(f.BIOSBootType), nil
}

func (c *Client) bootFlags(ctx context.Context) (*types.BootOptionParam_BootFlags, error) {
	f := &types.BootOptionParam_BootFlags{}
	if err := c.c.GetSystemBootOptionsParamFor(ctx, f); err != nil {
		return nil, fmt.Errorf("get boot flags: %w", classify(err))
	}

	return f, nil
}

// classify marks a missing answer with ErrNoAnswer. go-ipmi reports it with an unexported error,
// so its text is matched (pinned library version, v0.9.1).
func classify(err error) error {
	if err != nil && strings.Contains(err.Error(), "no datagram matched before deadline") {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}

	return err
}
