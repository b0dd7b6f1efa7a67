// Package machineaccess lets the controller reach machines through their site's edge: the agent's
// management.AgentService as if it were local, and the machine's BMC through the edge's BMC service.
// A call for a machine that is not at the named site is refused before it leaves the controller.
package machineaccess

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
)

// Sentinel errors callers branch on.
var (
	// ErrWrongSite means the machine is known at another site than the one named.
	ErrWrongSite = errors.New("machine is not at this site")
	// ErrUnknownMachine means no site is known for the machine.
	ErrUnknownMachine = errors.New("machine is not known at any site")
)

// ConnFunc returns the connection to a site's edge (sites.Server.Conn).
type ConnFunc func(siteID string) (grpc.ClientConnInterface, error)

// Locator tells which site a machine is at.
type Locator interface {
	// SiteOf returns the site the machine was last seen at.
	SiteOf(machineID string) (siteID string, ok bool)
}

// Client reaches machines through their sites' edges.
type Client struct {
	conn  ConnFunc
	sites Locator
}

// New returns a Client.
func New(conn ConnFunc, sites Locator) *Client {
	return &Client{conn: conn, sites: sites}
}

// check refuses a machine that is not at siteID.
func (c *Client) check(siteID, machineID string) error {
	at, ok := c.sites.SiteOf(machineID)
	if !ok {
		return fmt.Errorf("machine %s at site %s: %w", machineID, siteID, ErrUnknownMachine)
	}

	if at != siteID {
		return fmt.Errorf("machine %s at site %s: %w (it is at site %s)", machineID, siteID, ErrWrongSite, at)
	}

	return nil
}

// Online tells whether the site has a live session to its edge now. Callers use it to tell a site that is
// gone from an edge that answered with an error of its own (a BMC or agent it cannot reach).
func (c *Client) Online(siteID string) bool {
	_, err := c.conn(siteID)

	return err == nil
}
