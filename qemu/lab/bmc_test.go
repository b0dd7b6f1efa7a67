package lab_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// curlRedfish calls the machine's Redfish service from inside its site with basic authentication.
func curlRedfish(site *lab.Site, m *lab.Machine, user, password, method, path, body string) (string, error) {
	dial := lab.DialerIn(site.NS)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the virtual BMC's self-signed certificate
	}}
	defer hc.CloseIdleConnections()

	req, err := http.NewRequest(method, "https://"+m.BMCAddress+path, strings.NewReader(body))
	if err != nil {
		return "", err
	}

	req.SetBasicAuth(user, password)

	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}

	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close() //nolint:errcheck

	b, _ := io.ReadAll(resp.Body) //nolint:errcheck
	if resp.StatusCode >= 300 {
		return string(b), fmt.Errorf("redfish %s %s: %s", method, path, resp.Status)
	}

	return string(b), nil
}

// bmcPower switches the machine on or off through its virtual BMC's network protocol.
func bmcPower(t *testing.T, site *lab.Site, m *lab.Machine, user, password string, on bool) error {
	t.Helper()

	if m.Spec.BMC == lab.Redfish {
		reset := "ForceOff"
		if on {
			reset = "On"
		}

		out, err := curlRedfish(site, m, user, password, "POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", `{"ResetType":"`+reset+`"}`)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}

		return nil
	}

	state := "off"
	if on {
		state = "on"
	}

	if out, err := ipmitool(t, site.NS, m.BMCAddress, user, password, "chassis", "power", state); err != nil {
		return fmt.Errorf("ipmitool power %s: %w: %s", state, err, out)
	}

	return nil
}

// bmcPXEOnce sets the one-time PXE boot override through the virtual BMC.
func bmcPXEOnce(t *testing.T, site *lab.Site, m *lab.Machine, user, password string) error {
	t.Helper()

	if m.Spec.BMC == lab.Redfish {
		out, err := curlRedfish(site, m, user, password, "PATCH", "/redfish/v1/Systems/1",
			`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}

		return nil
	}

	if out, err := ipmitool(t, site.NS, m.BMCAddress, user, password, "chassis", "bootdev", "pxe"); err != nil {
		return fmt.Errorf("ipmitool bootdev pxe: %w: %s", err, out)
	}

	return nil
}
