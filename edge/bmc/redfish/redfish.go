// Package redfish drives a BMC's ComputerSystem over Redfish (DSP0266) with stmcginnis/gofish:
// one session per client (logged out on Close), boot override mode patched only when it must
// change, the settings-object (@Redfish.Settings, AMI "SD") variant with ETag, and read-back
// after every boot override change.
//
// Errors never wrap gofish's or net/http's error values (gofish puts whole response bodies into its errors): an
// answer with a failing HTTP status is a *StatusError, an HTML page where JSON was expected matches ErrNotJSON,
// anything else is text scrubbed of the credentials (internal/scrub) that matches at most ErrNoAnswer or
// ErrMalformedReply. Each says whether repeating the request can help (Permanent).
package redfish

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrReadBack is returned when the boot override read back differs from what was set.
var ErrReadBack = errors.New("boot override read back differs from what was set")

// ErrNotRedfish is returned by Probe for an endpoint that is not a Redfish service.
var ErrNotRedfish = errors.New("not a redfish service")

// ErrNotJSON is returned when a BMC answered a request with an HTML page where Redfish JSON was expected: the
// endpoint is a web interface or a proxy's login page rather than the Redfish service. It is permanent.
var ErrNotJSON = errors.New("the bmc answered an html page where redfish json was expected")

// ErrNoAnswer is returned when the service did not answer in time.
var ErrNoAnswer = errors.New("no answer from the redfish service")

// ErrMalformedReply is returned when an answer cannot be read as JSON (a truncated body, say).
var ErrMalformedReply = errors.New("malformed reply from the redfish service")

// Config says how to reach one BMC.
type Config struct {
	// Endpoint is the service's base URL, e.g. "https://10.0.0.5".
	Endpoint string
	Username string
	Password string
	// Insecure skips TLS verification (BMCs almost always present self-signed certificates).
	Insecure bool
	// Timeout bounds each HTTP request (default 10s).
	Timeout time.Duration
}

// HTTPClient returns the HTTP client a Config implies.
func (c Config) HTTPClient() *http.Client {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}

	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
			TLSClientConfig:       &tls.Config{InsecureSkipVerify: c.Insecure, MinVersion: tls.VersionTLS12}, // BMC certificates are self-signed
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   1,
			IdleConnTimeout:       time.Minute,
		},
	}
}

// maxBody bounds what is read from a probe answer.
const maxBody = 1 << 16

// Probe checks, without credentials, that endpoint serves a Redfish service root.
func Probe(ctx context.Context, hc *http.Client, endpoint string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+schemas.DefaultServiceRoot, nil)
	if err != nil {
		return fmt.Errorf("probe redfish: %w", err)
	}

	req.Header.Set("Accept", "application/json")

	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("probe redfish: %w", err)
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe redfish: %w: http status %d", ErrNotRedfish, resp.StatusCode)
	}

	var root struct {
		ID             string `json:"@odata.id"`
		RedfishVersion string
	}

	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&root); err != nil {
		return fmt.Errorf("probe redfish: %w: service root is not JSON", ErrNotRedfish)
	}

	if root.ID == "" && root.RedfishVersion == "" {
		return fmt.Errorf("probe redfish: %w: no service root", ErrNotRedfish)
	}

	return nil
}

// Client is a Redfish session on one BMC with its (first) ComputerSystem. Not safe for concurrent use.
type Client struct {
	api     *gofish.APIClient
	hc      *http.Client
	secrets []string
	limits  *limits
}

// Dial logs in (a Redfish session) and finds the ComputerSystem. Errors never contain the credentials.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	hc := cfg.HTTPClient()
	lim := &limits{next: hc.Transport}
	hc.Transport = htmlGuard{next: lim}
	secrets := []string{cfg.Password, cfg.Username}

	api, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:         strings.TrimSuffix(cfg.Endpoint, "/"),
		Username:         cfg.Username,
		Password:         cfg.Password,
		HTTPClient:       hc,
		ReuseConnections: true,
	})
	if err != nil {
		hc.CloseIdleConnections()

		return nil, fmt.Errorf("open redfish session: %w", classify(err, secrets))
	}

	return &Client{api: api, hc: hc, secrets: secrets, limits: lim}, nil
}

// Close logs the session out.
func (c *Client) Close(ctx context.Context) error {
	c.api.WithContext(ctx).Logout()
	c.hc.CloseIdleConnections()

	return nil
}

func (c *Client) system(ctx context.Context) (*schemas.ComputerSystem, error) {
	systems, err := c.api.WithContext(ctx).Service.Systems()
	if err != nil {
		return nil, fmt.Errorf("list systems: %w", c.fail(err))
	}

	if len(systems) == 0 {
		return nil, errors.New("list systems: the service has no ComputerSystem")
	}

	return systems[0], nil
}

// PowerStatus reports whether the machine is on.
func (c *Client) PowerStatus(ctx context.Context) (bool, error) {
	sys, err := c.system(ctx)
	if err != nil {
		return false, err
	}

	return sys.PowerState == schemas.OnPowerState, nil
}

func (c *Client) reset(ctx context.Context, types ...schemas.ResetType) error {
	sys, err := c.system(ctx)
	if err != nil {
		return err
	}

	// Use the first reset type the system allows.
	rt := types[0]

	if allowed, err := sys.GetSupportedResetTypes(); err == nil && len(allowed) > 0 {
		for _, want := range types {
			for _, a := range allowed {
				if a == want {
					rt = want

					goto found
				}
			}
		}
	}

found:
	if _, err := sys.Reset(rt); err != nil {
		return fmt.Errorf("reset %s: %w", rt, c.fail(err))
	}

	return nil
}

// PowerOn powers the machine on.
func (c *Client) PowerOn(ctx context.Context) error {
	return c.reset(ctx, schemas.OnResetType, schemas.ForceOnResetType)
}

// PowerOff powers the machine off hard.
func (c *Client) PowerOff(ctx context.Context) error {
	return c.reset(ctx, schemas.ForceOffResetType)
}

// PowerCycle power-cycles a running machine (bmc.Manager powers on one that is off instead).
func (c *Client) PowerCycle(ctx context.Context) error {
	return c.reset(ctx, schemas.PowerCycleResetType, schemas.ForceRestartResetType)
}

// SetPXEOnce sets a one-time network boot in the firmware mode fw (Legacy unless UEFI) and reads it back.
// The mode is only sent when it must change: some BMCs refuse a PATCH that names it.
func (c *Client) SetPXEOnce(ctx context.Context, fw metal.Firmware) error {
	sys, err := c.system(ctx)
	if err != nil {
		return err
	}

	mode := schemas.LegacyBootSourceOverrideMode
	if fw == metal.UEFI {
		mode = schemas.UEFIBootSourceOverrideMode
	}

	boot := &schemas.Boot{
		BootSourceOverrideEnabled: schemas.OnceBootSourceOverrideEnabled,
		BootSourceOverrideTarget:  schemas.PxeBootSource,
	}

	if sys.Boot.BootSourceOverrideMode != mode {
		boot.BootSourceOverrideMode = mode
	}

	// gofish patches the system and falls back to its @Redfish.Settings object with If-Match.
	if err := sys.SetBoot(boot); err != nil {
		return fmt.Errorf("set one-time pxe boot: %w", c.fail(err))
	}

	b, err := c.effectiveBoot(ctx)
	if err != nil {
		return fmt.Errorf("read back boot override: %w", err)
	}

	if b.BootSourceOverrideTarget != schemas.PxeBootSource || b.BootSourceOverrideEnabled != schemas.OnceBootSourceOverrideEnabled ||
		(b.BootSourceOverrideMode != "" && b.BootSourceOverrideMode != mode) {
		return fmt.Errorf("set one-time pxe boot: %w (target %q, enabled %q, mode %q)",
			ErrReadBack, b.BootSourceOverrideTarget, b.BootSourceOverrideEnabled, b.BootSourceOverrideMode)
	}

	return nil
}

// effectiveBoot returns the Boot the next boot will use: a system with a settings object
// (@Redfish.Settings, AMI's ".../SD") may hold the change there until its next reset.
func (c *Client) effectiveBoot(ctx context.Context) (schemas.Boot, error) {
	sys, err := c.system(ctx)
	if err != nil {
		return schemas.Boot{}, err
	}

	var raw struct {
		Settings struct {
			SettingsObject struct {
				ID string `json:"@odata.id"`
			}
		} `json:"@Redfish.Settings"`
	}

	if json.Unmarshal(sys.RawData, &raw) != nil || raw.Settings.SettingsObject.ID == "" || raw.Settings.SettingsObject.ID == sys.ODataID {
		return sys.Boot, nil
	}

	resp, err := c.api.WithContext(ctx).Get(raw.Settings.SettingsObject.ID)
	if err != nil {
		return schemas.Boot{}, fmt.Errorf("read settings object: %w", c.fail(err))
	}
	defer resp.Body.Close() //nolint:errcheck

	var pending struct{ Boot *schemas.Boot }

	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&pending); err != nil {
		return schemas.Boot{}, fmt.Errorf("read settings object: %w", c.fail(err))
	}

	if pending.Boot == nil || pending.Boot.BootSourceOverrideEnabled == "" {
		return sys.Boot, nil
	}

	return *pending.Boot, nil
}

// ClearOverride removes any boot override.
func (c *Client) ClearOverride(ctx context.Context) error {
	sys, err := c.system(ctx)
	if err != nil {
		return err
	}

	if err := sys.SetBoot(&schemas.Boot{BootSourceOverrideEnabled: schemas.DisabledBootSourceOverrideEnabled}); err != nil {
		return fmt.Errorf("clear boot override: %w", c.fail(err))
	}

	return nil
}

// BootOverride returns the override the next boot uses (a pending one from the settings object
// included): whether one is set, whether it is PXE, and the firmware mode (BIOS unless UEFI).
func (c *Client) BootOverride(ctx context.Context) (set, pxe bool, fw metal.Firmware, err error) {
	b, err := c.effectiveBoot(ctx)
	if err != nil {
		return false, false, "", err
	}

	fw = metal.BIOS
	if b.BootSourceOverrideMode == schemas.UEFIBootSourceOverrideMode {
		fw = metal.UEFI
	}

	return b.BootSourceOverrideEnabled != schemas.DisabledBootSourceOverrideEnabled && b.BootSourceOverrideEnabled != "",
		b.BootSourceOverrideTarget == schemas.PxeBootSource, fw, nil
}

func (c *Client) fail(err error) error { return classify(err, c.secrets) }
