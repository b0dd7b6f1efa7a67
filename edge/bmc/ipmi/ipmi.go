// Package ipmi drives a BMC over IPMI v2.0 LAN (RMCP+, "lanplus") with bougou/go-ipmi.
//
// Its errors never wrap the library's error values: a refusal is a *CompletionCodeError or *SessionError (both say
// whether repeating the request can help), anything else is text scrubbed of the credentials (internal/scrub) that
// matches at most one of this package's sentinels. A credential a library put into a message cannot come back out
// through errors.Unwrap.
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/outpost-metal/outpost/edge/bmc/internal/scrub"
	"github.com/outpost-metal/outpost/shared/metal"
)

// DefaultPort is the RMCP port (IPMI v2.0 §13.1).
const DefaultPort = 623

// DefaultCipherSuites are tried in order: 17 (HMAC-SHA256, AES-CBC-128), then 3 (HMAC-SHA1, AES-CBC-128)
// for older BMCs (IPMI v2.0 §22.15.2).
var DefaultCipherSuites = []uint8{17, 3}

var (
	// ErrNoAnswer is returned when the BMC did not answer an exchange (after the retries).
	ErrNoAnswer = errors.New("no answer from the bmc")
	// ErrReadBack is returned when the boot flags read back differ from what was set.
	ErrReadBack = errors.New("boot flags read back differ from what was set")
	// ErrMalformedReply is returned when the BMC answered with a reply that cannot be read (too short, say).
	ErrMalformedReply = errors.New("malformed reply from the bmc")
	// ErrAuthentication is returned when the BMC's RAKP answer does not match the password (IPMI v2.0 §13.31):
	// the user name or password is wrong.
	ErrAuthentication = errors.New("rmcp+ authentication failed (wrong user name or password?)")
)

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
	c       *client.Client
	suite   uint8
	secrets []string
}

// sessionSetup names the commands of session activation in errors (IPMI v2.0 §13.15).
var sessionSetup = types.Command{Name: "session setup"}

// Dial opens a session, trying cfg.CipherSuites in order until one is accepted; CipherSuite tells which was.
// Errors never contain the credentials; when every suite fails the error is permanent only if the BMC answered
// each and refused one for good (see dialError.Permanent).
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

	secrets := []string{cfg.Password, cfg.Username}
	failed := &dialError{}

	for _, suite := range cfg.CipherSuites {
		c, early, err := connect(ctx, cfg, suite, secrets)
		if err == nil {
			return &Client{c: c, suite: suite, secrets: secrets}, nil
		}

		if early {
			// Before the suite mattered: the next would fail the same way.
			failed.errs = append(failed.errs, fmt.Errorf("open ipmi session: %w", err))

			break
		}

		// "cipher suite id (N)" is the library's own wording; operators search logs for it.
		failed.errs = append(failed.errs, fmt.Errorf("open ipmi session with cipher suite id (%d): %w", suite, err))

		if ctx.Err() != nil {
			break
		}
	}

	return nil, failed
}

// connect opens a session with one cipher suite. early reports a failure before the suite mattered: at Get Channel
// Authentication Capabilities, the first message of session activation, sent before any suite is proposed.
func connect(ctx context.Context, cfg Config, suite uint8, secrets []string) (c *client.Client, early bool, err error) {
	c, err = client.NewClient(cfg.Host, cfg.Port, cfg.Username, cfg.Password)
	if err != nil {
		return nil, true, permanentError{errors.New("invalid ipmi credentials: user name too long")} // the library's message names the user
	}

	// One suite goes through the single-suite path of the library, so which one was used is known.
	c.WithCipherSuiteID(types.CipherSuiteID(suite))
	c.WithTimeout(cfg.Timeout).WithRetry(cfg.Retries).WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)

	if err := c.Connect(ctx); err != nil {
		// Release the socket without waiting for a BMC that may not answer.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		c.Close(done) //nolint:errcheck

		// The library's wording, pinned with its version (v0.9.1).
		early := strings.Contains(err.Error(), "Get Channel Authentication Capabilities failed")

		return nil, early, classify(sessionSetup, err, secrets)
	}

	return c, false, nil
}

// CipherSuite returns the cipher suite of the session.
func (c *Client) CipherSuite() uint8 { return c.suite }

// Close ends the session.
func (c *Client) Close(ctx context.Context) error {
	if err := c.c.Close(ctx); err != nil {
		return fmt.Errorf("close ipmi session: %w", c.fail(types.CommandCloseSession, err))
	}

	return nil
}

// PowerStatus reports whether the machine is on (Get Chassis Status, §28.2).
func (c *Client) PowerStatus(ctx context.Context) (bool, error) {
	st, err := c.c.GetChassisStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("get chassis status: %w", c.fail(types.CommandGetChassisStatus, err))
	}

	return st.PowerIsOn, nil
}

// controlNames are the chassis control actions (Table 28-4) in errors.
var controlNames = map[chassis.ChassisControl]string{
	chassis.ChassisControlPowerDown:  "power down",
	chassis.ChassisControlPowerUp:    "power up",
	chassis.ChassisControlPowerCycle: "power cycle",
}

func (c *Client) control(ctx context.Context, what chassis.ChassisControl) error {
	if _, err := c.c.ChassisControl(ctx, what); err != nil {
		return fmt.Errorf("chassis control %s: %w", controlNames[what], c.fail(types.CommandChassisControl, err))
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

// PowerCycle power-cycles a running machine (Chassis Control, power cycle). bmc.Manager powers on one that is
// off instead: a cycle of an off machine is a no-op on many BMCs.
func (c *Client) PowerCycle(ctx context.Context) error {
	return c.control(ctx, chassis.ChassisControlPowerCycle)
}

// SetPXEOnce sets a one-time network boot in the firmware mode fw (legacy unless UEFI) and reads it back
// (Set/Get System Boot Options, boot flags parameter 5, §28.12-28.13); see ReadBackMatches for what is accepted.
func (c *Client) SetPXEOnce(ctx context.Context, fw metal.Firmware) error {
	bootType := types.BIOSBootTypeLegacy
	if fw == metal.UEFI {
		bootType = types.BIOSBootTypeEFI
	}

	want := types.BootOptionParam_BootFlags{
		BootFlagsValid:     true,
		Persist:            false,
		BIOSBootType:       bootType,
		BootDeviceSelector: types.BootDeviceSelectorForcePXE,
	}

	// Like ipmitool's "chassis bootdev", set parameter 5 alone: not every BMC implements the
	// set-in-progress parameter (0).
	if err := c.c.SetSystemBootOptionsParamFor(ctx, &want); err != nil {
		return fmt.Errorf("set boot flags: %w", c.fail(types.CommandSetSystemBootOptions, err))
	}

	got, raw, err := c.bootFlags(ctx)
	if err != nil {
		return err
	}

	if !ReadBackMatches(want, got) {
		return fmt.Errorf("set one-time pxe boot: %w (device %v, efi %t, valid %t, persistent %t; data % x)",
			ErrReadBack, got.BootDeviceSelector, bool(got.BIOSBootType), got.BootFlagsValid, got.Persist, raw)
	}

	return nil
}

// ReadBackMatches reports whether the boot flags got, read back right after a successful Set System Boot Options,
// show the one-time boot of want (a valid, one-time override of a device, in legacy or EFI mode) in effect.
//
// What BMCs answer for parameter 5 (data 1: bit 7 valid, bit 6 persistent, bit 5 EFI; data 2 bits 5:2 the
// device; IPMI v2.0 §28.13, Table 28-14):
//   - Most BMCs, and go-ipmi's simulator, echo what was set.
//   - OpenIPMI's ipmi_sim (Debian's openipmi 2.0.33) keeps only the device, which it hands to its chassis control
//     program, and answers data 1 = 00h whatever was set: after "a0 04 00 00 00" (valid, EFI, Force PXE) or
//     "80 04 00 00 00" (valid, legacy, Force PXE) it reads back "00 04 00 00 00" (lanserv/bmc_chassis.c; ipmitool
//     shows "Boot Flag Invalid").
//   - BMCs that do not implement the EFI bit (reserved in IPMI v2.0 revision 1.0) keep the valid bit and read the
//     EFI bit back clear.
//
// So a bit that was set may read back clear (dropped), but nothing may read back that was not asked for:
//   - the device must be the one set: another device, or "no override", means the set did not take;
//   - the persistent bit must read back clear (one boot was asked for, not every boot);
//   - the EFI bit must not read back set for a legacy boot (the BMC reports a mode that was not asked for);
//   - the valid bit may read back clear only when all of data 1 does, i.e. the BMC does not keep data 1 at all.
//     A BMC that echoes the EFI bit but clears the valid bit keeps data 1, and a clear valid bit there means the
//     override is not in effect (most BMCs clear it 60 s after a set, or when they consume the override).
//
// The valid bit cannot tell a set that took from one that did not on a BMC like ipmi_sim; the device can, and it
// is checked. For a legacy boot a BMC that keeps data 1 and cleared the valid bit at once is indistinguishable
// from ipmi_sim and is accepted: no such BMC is known.
func ReadBackMatches(want, got types.BootOptionParam_BootFlags) bool {
	switch {
	case got.BootDeviceSelector != want.BootDeviceSelector:
		return false
	case got.Persist && !want.Persist:
		return false
	case bool(got.BIOSBootType) && !bool(want.BIOSBootType):
		return false
	case !got.BootFlagsValid && (got.Persist || bool(got.BIOSBootType)):
		return false
	}

	return true
}

// ClearOverride removes any boot override.
func (c *Client) ClearOverride(ctx context.Context) error {
	if err := c.c.SetSystemBootOptionsParamFor(ctx, &types.BootOptionParam_BootFlags{}); err != nil {
		return fmt.Errorf("clear boot flags: %w", c.fail(types.CommandSetSystemBootOptions, err))
	}

	return nil
}

// BootOverride returns the current override as the BMC reports it: whether one is set (the valid bit and a
// device), whether it is PXE, and the firmware mode (UEFI when the EFI bit is set). A BMC that does not keep the valid bit (ipmi_sim) reports set false
// with pxe true after a one-time PXE boot was set: unlike right after a set (SetPXEOnce), a clear valid bit read
// at an arbitrary time cannot be told from an override that expired or was consumed.
func (c *Client) BootOverride(ctx context.Context) (set, pxe bool, fw metal.Firmware, err error) {
	f, _, err := c.bootFlags(ctx)
	if err != nil {
		return false, false, "", err
	}

	fw = metal.BIOS
	if f.BIOSBootType == types.BIOSBootTypeEFI {
		fw = metal.UEFI
	}

	return f.BootFlagsValid && f.BootDeviceSelector != types.BootDeviceSelectorNoOverride,
		f.BootDeviceSelector == types.BootDeviceSelectorForcePXE, fw, nil
}

// bootFlags reads parameter 5 and returns it with its data bytes.
func (c *Client) bootFlags(ctx context.Context) (types.BootOptionParam_BootFlags, []byte, error) {
	var f types.BootOptionParam_BootFlags

	resp, err := c.c.GetSystemBootOptionsParam(ctx, types.BootOptionParamSelector_BootFlags, 0, 0)
	if err != nil {
		return f, nil, fmt.Errorf("get boot flags: %w", c.fail(types.CommandGetSystemBootOptions, err))
	}

	if err := f.Unpack(resp.ParamData); err != nil {
		return f, resp.ParamData, fmt.Errorf("get boot flags: %w: %d data bytes for parameter 5, want 5", ErrMalformedReply, len(resp.ParamData))
	}

	return f, resp.ParamData, nil
}

func (c *Client) fail(cmd types.Command, err error) error { return classify(cmd, err, c.secrets) }

// classify turns a library error into this package's: a refusal (completion code, RMCP+ status, failed
// authentication) or scrubbed text that matches ErrNoAnswer, ErrMalformedReply or context.Canceled.
func classify(cmd types.Command, err error, secrets []string) error {
	if re, ok := types.IsResponseError(err); ok {
		if re.CompletionCode() == types.CodeOK {
			// go-ipmi's way of saying the answer matched the request but could not be unpacked.
			return scrub.NewError(err, ErrMalformedReply, secrets...)
		}

		return newCompletionCodeError(cmd, uint8(re.CompletionCode()))
	}

	// go-ipmi's session activation joins the errors of its cipher suite loop with %v, which ends the error
	// chain: the status and the RAKP failure are also recognised by the library's wording (v0.9.1).
	var se *types.RmcpStatusError
	if errors.As(err, &se) {
		return newSessionError(uint8(se.StatusCode()))
	}

	if m := rmcpStatus.FindStringSubmatch(err.Error()); m != nil {
		if status, perr := strconv.ParseUint(m[1], 16, 8); perr == nil {
			return newSessionError(uint8(status))
		}
	}

	if errors.Is(err, client.ErrRAKPAuthentication) || strings.Contains(err.Error(), client.ErrRAKPAuthentication.Error()) {
		return permanentError{ErrAuthentication}
	}

	var kind error

	switch {
	case errors.Is(err, context.Canceled):
		kind = context.Canceled
	case noAnswer(err):
		kind = ErrNoAnswer
	}

	return &scrub.Error{Msg: tidy(scrub.Text(err.Error(), secrets...)), Kind: kind}
}

// suiteLoop is the library's summary of its cipher suite loop, which adds nothing to the one suite tried.
var suiteLoop = regexp.MustCompile(`connect20 failed after try all cipher suite ids \(\[[0-9 ]*\]\), errs: \s*`)

// tidy puts library text on one line without the suite loop's summary.
func tidy(msg string) string {
	return strings.Join(strings.Fields(suiteLoop.ReplaceAllString(msg, "")), " ")
}

// rmcpStatus finds types.RmcpStatusError's text ("RMCP+ status 0x11: ...").
var rmcpStatus = regexp.MustCompile(`RMCP\+ status 0x([0-9a-fA-F]{1,2}):`)

// noAnswer reports whether err from the library means the BMC did not answer. go-ipmi reports unmatched
// datagrams with an unexported error, so its text is matched (pinned library version, v0.9.1).
func noAnswer(err error) bool {
	var ne net.Error

	return strings.Contains(err.Error(), "no datagram matched before deadline") || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// permanentError marks an error as a refusal the BMC will repeat.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent reports true.
func (permanentError) Permanent() bool { return true }

// dialError is the failure of every cipher suite tried.
type dialError struct{ errs []error }

func (e *dialError) Error() string {
	msgs := make([]string, 0, len(e.errs))
	for _, err := range e.errs {
		msgs = append(msgs, err.Error())
	}

	return strings.Join(msgs, "; ")
}

func (e *dialError) Unwrap() []error { return e.errs }

// Permanent reports whether the BMC answered every suite tried and refused at least one for good (a wrong
// password, no such user): asking again gets the same answers. A suite that was not answered may work next time.
// A suite's other failures count as answers: ipmi_sim, for one, answers an Open Session for a suite it lacks with
// a 2-byte reply (tag and status) that the library cannot unpack.
func (e *dialError) Permanent() bool {
	refused := false

	for _, err := range e.errs {
		switch {
		case errors.Is(err, ErrNoAnswer), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return false
		case permanent(err):
			refused = true
		}
	}

	return refused
}

func permanent(err error) bool {
	var p interface{ Permanent() bool }

	return errors.As(err, &p) && p.Permanent()
}
