// Package admincli implements the operator commands (`controller site ...`, `controller machine ...`) as
// clients of the controller's admin API on its local unix socket.
package admincli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/labels"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	"github.com/outpost-metal/outpost/shared/printable"
)

// Client talks to a running controller's admin socket.
type Client struct {
	conn        *grpc.ClientConn
	api         adminpb.AdminClient
	machinesAPI adminpb.MachinesClient
	imageBoots  adminpb.SiteMachinesClient

	// Output is how lists and shows print (default: a table).
	Output Output
}

// Dial connects to the admin socket at path (no I/O happens until the first call).
func Dial(path string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	}

	return &Client{conn: conn, api: adminpb.NewAdminClient(conn), machinesAPI: adminpb.NewMachinesClient(conn), imageBoots: adminpb.NewSiteMachinesClient(conn), Output: OutputTable}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// TokenOptions say how a join token behaves.
type TokenOptions struct {
	TTL      time.Duration
	Reusable bool
}

// CreateSite creates a site and prints its join token (once: it is not stored anywhere) to out.
func (c *Client) CreateSite(ctx context.Context, siteID, description string, opts TokenOptions, out, info io.Writer) error {
	resp, err := c.api.CreateSite(ctx, &adminpb.CreateSiteRequest{
		SiteId: siteID, Description: description, TokenTtl: durationpb.New(opts.TTL), Reusable: opts.Reusable,
	})
	if err != nil {
		return describe("create site", err)
	}

	printToken(resp, out, info)

	return nil
}

// NewToken replaces a site's join token and prints the new one.
func (c *Client) NewToken(ctx context.Context, siteID string, opts TokenOptions, out, info io.Writer) error {
	resp, err := c.api.NewJoinToken(ctx, &adminpb.NewJoinTokenRequest{
		SiteId: siteID, TokenTtl: durationpb.New(opts.TTL), Reusable: opts.Reusable,
	})
	if err != nil {
		return describe("new join token", err)
	}

	printToken(resp, out, info)

	return nil
}

func printToken(resp *adminpb.CreateSiteResponse, out, info io.Writer) {
	fmt.Fprintln(out, resp.GetJoinToken())
	fmt.Fprintf(info, "join token for site %s, valid until %s; it is shown only now.\n",
		resp.GetSiteId(), resp.GetTokenExpires().AsTime().Local().Format(time.RFC3339))
}

// ListSites prints the sites as a table.
func (c *Client) ListSites(ctx context.Context, out io.Writer, now time.Time) error {
	resp, err := c.api.ListSites(ctx, &adminpb.ListSitesRequest{})
	if err != nil {
		return describe("list sites", err)
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	writeStandby(out, resp.GetStandby())

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tSTATE\tEDGE VERSION\tLAST SEEN\tREMOTE\tDESCRIPTION")

	var refused []*adminpb.Site

	for _, s := range resp.GetSites() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.GetSiteId(), siteStateAt(s, resp.GetStandby()), dash(peer(s.GetEdgeVersion())),
			ago(s.GetLastSeen(), now), dash(peer(s.GetRemoteAddress())), peer(s.GetDescription()))

		if s.GetEdgeRefused() != "" {
			refused = append(refused, s)
		}
	}

	if err := tw.Flush(); err != nil {
		return err
	}

	// A refused edge's release is the one thing its operator must act on: said in full under the table.
	for _, s := range refused {
		fmt.Fprintf(out, "%s: edge refused %s: %s\n", s.GetSiteId(), ago(s.GetEdgeRefusedAt(), now), refusal(s.GetEdgeRefused()))
	}

	return nil
}

// peer makes a string an edge (or anyone) supplied safe to print: escapes shown, not interpreted; bounded.
func peer(s string) string { return printable.String(s, 80) }

// maxRefusal bounds a release refusal as printed: the controller's own words (the edge's version in them is
// quoted and cut), which end with what the operator must do, so they are not cut at peer's 80.
const maxRefusal = 400

// refusal prints why a site's edge was refused.
func refusal(s string) string { return printable.String(s, maxRefusal) }

// writeStandby says, above what a standby controller answered, that the sessions are elsewhere.
func writeStandby(out io.Writer, sb *adminpb.Standby) {
	if sb == nil {
		return
	}

	holder := peer(sb.GetActiveHolder())
	if holder == "" {
		holder = "none yet"
	}

	fmt.Fprintf(out, "this controller stands by; the acting one is %s (uplink %s): edges are connected there, so it alone knows which sites are online.\n",
		holder, dash(peer(sb.GetActiveUplink())))
}

// siteStateAt is siteState as the answering controller knows it: a standby cannot tell connected from offline.
func siteStateAt(s *adminpb.Site, sb *adminpb.Standby) string {
	if sb != nil && !s.GetRevoked() && s.GetEnrolled() {
		return "enrolled"
	}

	return siteState(s)
}

func siteState(s *adminpb.Site) string {
	switch {
	case s.GetRevoked():
		return "revoked"
	case s.GetConnected():
		return "connected"
	case s.GetEdgeRefused() != "":
		return "edge-refused"
	case s.GetEnrolled():
		return "offline"
	default:
		return "awaiting-enrolment"
	}
}

func ago(ts *timestamppb.Timestamp, now time.Time) string {
	if ts == nil {
		return "never"
	}

	return now.Sub(ts.AsTime()).Truncate(time.Second).String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}

	return s
}

// RevokeSite revokes a site.
func (c *Client) RevokeSite(ctx context.Context, siteID string) error {
	_, err := c.api.RevokeSite(ctx, &adminpb.RevokeSiteRequest{SiteId: siteID})

	return describe("revoke site", err)
}

// DeleteSite deletes a site.
func (c *Client) DeleteSite(ctx context.Context, siteID string) error {
	_, err := c.api.DeleteSite(ctx, &adminpb.DeleteSiteRequest{SiteId: siteID})

	return describe("delete site", err)
}

// describe turns a gRPC error into a sentence for the operator.
func describe(what string, err error) error {
	if err == nil {
		return nil
	}

	st := status.Convert(err)
	if st.Code() == codes.Unavailable {
		return fmt.Errorf("%s: cannot reach the controller's admin socket (is the controller running, with this --state-dir or --admin-socket?): %s", what, st.Message())
	}

	return fmt.Errorf("%s: %s", what, st.Message())
}

// ShowSite prints one site with its boot-asset state and its machines.
func (c *Client) ShowSite(ctx context.Context, siteID string, out io.Writer, now time.Time) error {
	resp, err := c.api.ShowSite(ctx, &adminpb.ShowSiteRequest{SiteId: siteID})
	if err != nil {
		return describe("show site", err)
	}

	machines, err := c.siteMachines(ctx, siteID)
	if err != nil {
		return err
	}

	if c.Output == OutputJSON {
		parts := map[string]proto.Message{"site": resp}
		if machines != nil {
			parts["machines"] = machines
		}

		return writeJSONObject(out, parts)
	}

	writeStandby(out, resp.GetStandby())

	s := resp.GetSite()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "state:\t%s\n", siteStateAt(s, resp.GetStandby()))
	fmt.Fprintf(tw, "description:\t%s\n", peer(s.GetDescription()))
	fmt.Fprintf(tw, "edge version:\t%s\n", dash(peer(s.GetEdgeVersion())))

	if s.GetEdgeRefused() != "" {
		fmt.Fprintf(tw, "edge refused:\t%s: %s\n", ago(s.GetEdgeRefusedAt(), now), refusal(s.GetEdgeRefused()))
	}
	fmt.Fprintf(tw, "last seen:\t%s\n", ago(s.GetLastSeen(), now))
	fmt.Fprintf(tw, "remote:\t%s\n", dash(peer(s.GetRemoteAddress())))

	if l := s.GetLabels(); len(l) > 0 {
		pairs := make([]string, 0, len(l))
		for _, k := range slices.Sorted(maps.Keys(l)) {
			pairs = append(pairs, k+"="+l[k])
		}

		fmt.Fprintf(tw, "labels:\t%s\n", peer(strings.Join(pairs, ",")))
	}

	writeSettings(tw, s.GetSettings())

	if err := tw.Flush(); err != nil {
		return err
	}

	if resp.GetAssets() != nil {
		if err := assets.WriteSiteAssets(out, resp.GetAssets()); err != nil {
			return err
		}
	}

	if machines == nil {
		return nil
	}

	fmt.Fprintf(out, "\nmachines: %d\n", machines.GetTotal())

	if len(machines.GetMachines()) == 0 {
		return nil
	}

	return writeMachines(out, machines.GetMachines(), now)
}

// SetSiteLabels replaces the labels published on a site's machines ("k=v" pairs; none clears them).
func (c *Client) SetSiteLabels(ctx context.Context, siteID string, pairs []string) error {
	parsed, err := labels.Parse(pairs)
	if err != nil {
		return err
	}

	_, err = c.api.SetSiteLabels(ctx, &adminpb.SetSiteLabelsRequest{SiteId: siteID, Labels: parsed})

	return describe("set site labels", err)
}

// SiteSettings are the settings `site set` changes; nil leaves one as it is, "" returns it to the default.
type SiteSettings struct {
	Discovery, BMCProtocol, WipeMethod, SecureBoot *string
	// ExtraConfigFile names a file of Talos documents ("" clears the site's).
	ExtraConfigFile *string
	// DHCPMode, DHCPPool, DHCPSubnet and DHCPGateway are the site's DHCP service (full mode: pool and subnet).
	DHCPMode, DHCPPool, DHCPSubnet, DHCPGateway *string
	// DHCPDNS and DHCPNTP replace the servers given to clients (empty: none).
	DHCPDNS, DHCPNTP *[]string
	// DHCPLeaseTime is the lease time (0: the edge's default).
	DHCPLeaseTime *time.Duration
}

// SetSiteSettings changes a site's own settings and prints them as stored.
func (c *Client) SetSiteSettings(ctx context.Context, siteID string, set SiteSettings, out io.Writer) error {
	req := &adminpb.SetSiteSettingsRequest{
		SiteId: siteID, Discovery: set.Discovery, BmcProtocol: set.BMCProtocol, WipeMethod: set.WipeMethod, SecureBoot: set.SecureBoot,
		DhcpMode: set.DHCPMode, DhcpPool: set.DHCPPool, DhcpSubnet: set.DHCPSubnet, DhcpGateway: set.DHCPGateway,
	}

	if set.DHCPDNS != nil {
		req.DhcpDns = &adminpb.StringList{Values: *set.DHCPDNS}
	}

	if set.DHCPNTP != nil {
		req.DhcpNtp = &adminpb.StringList{Values: *set.DHCPNTP}
	}

	if set.DHCPLeaseTime != nil {
		req.DhcpLeaseTime = durationpb.New(*set.DHCPLeaseTime)
	}

	if set.ExtraConfigFile != nil {
		req.ExtraConfig = []byte{}

		if *set.ExtraConfigFile != "" {
			data, err := readBounded(*set.ExtraConfigFile, maxExtraConfigFile)
			if err != nil {
				return fmt.Errorf("extra machine-config documents: %w", err)
			}

			req.ExtraConfig = data
		}
	}

	resp, err := c.api.SetSiteSettings(ctx, req)
	if err != nil {
		return describe("set site settings", err)
	}

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	writeSettings(tw, resp.GetSettings())

	return tw.Flush()
}

// RegisterMachines adds (or, with remove, removes) MACs of machines registered at a site before they boot, and
// prints how many the site has; ip reserves that address for the one MAC added (full DHCP mode).
func (c *Client) RegisterMachines(ctx context.Context, siteID string, macs []string, remove bool, ip string, out io.Writer) error {
	req := &adminpb.RegisterMachinesRequest{SiteId: siteID, Add: macs, Ip: ip}
	if remove {
		req.Add, req.Remove = nil, macs
	}

	resp, err := c.api.RegisterMachines(ctx, req)
	if err != nil {
		return describe("register machines", err)
	}

	_, err = fmt.Fprintf(out, "site %s: %d registered machines\n", peer(siteID), len(resp.GetRegisteredMacs()))

	return err
}

// maxPasswordFile bounds a BMC password file.
const maxPasswordFile = 4 << 10

// BootFromImage boots a machine at a site without DHCP from virtual media for the first time, through the BMC at
// endpoint as user (the password read from passwordFile, one line), and prints what it boots.
func (c *Client) BootFromImage(ctx context.Context, siteID, mac, endpoint, user, passwordFile string, out io.Writer) error {
	pw, err := readBounded(passwordFile, maxPasswordFile)
	if err != nil {
		return fmt.Errorf("boot from image: bmc password: %w", err)
	}

	resp, err := c.imageBoots.BootFromImage(ctx, &adminpb.BootFromImageRequest{
		SiteId: siteID, Mac: mac, BmcEndpoint: endpoint, BmcUsername: user, BmcPassword: strings.TrimRight(string(pw), "\r\n"),
	})
	if err != nil {
		return describe("boot from image", err)
	}

	_, err = fmt.Fprintf(out, "machine %s at site %s boots %s mode from %s with %s (%s)\n",
		peer(resp.GetSystemUuid()), peer(siteID), peer(resp.GetMode()), peer(resp.GetUrl()), peer(resp.GetAddress()), peer(mac))

	return err
}

// maxExtraConfigFile bounds the documents file read (the controller refuses more than 64 KiB anyway).
const maxExtraConfigFile = 1 << 20

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only

	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}

	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", path, limit)
	}

	return data, nil
}

// writeSettings prints a site's own settings ("default" where it has none).
func writeSettings(tw io.Writer, s *adminpb.SiteSettings) {
	orDefault := func(v string) string { return cmp.Or(peer(v), "default") }

	fmt.Fprintf(tw, "discovery:\t%s\n", orDefault(s.GetDiscovery()))
	fmt.Fprintf(tw, "bmc protocol:\t%s\n", orDefault(s.GetBmcProtocol()))
	fmt.Fprintf(tw, "wipe method:\t%s\n", orDefault(s.GetWipeMethod()))
	fmt.Fprintf(tw, "secure boot:\t%s\n", cmp.Or(peer(s.GetSecureBoot()), "each machine's BMC says"))

	docs := "default"
	if n := len(s.GetExtraConfig()); n > 0 {
		docs = fmt.Sprintf("%d bytes of the site's own", n)
	}

	fmt.Fprintf(tw, "extra machine config:\t%s\n", docs)
	fmt.Fprintf(tw, "registered machines:\t%d\n", len(s.GetRegisteredMacs()))
	fmt.Fprintf(tw, "dhcp:\t%s\n", orDefault(s.GetDhcpMode()))

	if s.GetDhcpPool() != "" {
		lease := "default"
		if d := s.GetDhcpLeaseTime().AsDuration(); d > 0 {
			lease = d.String()
		}

		fmt.Fprintf(tw, "dhcp pool:\t%s in %s\n", peer(s.GetDhcpPool()), peer(s.GetDhcpSubnet()))
		fmt.Fprintf(tw, "dhcp gateway:\t%s\n", dash(peer(s.GetDhcpGateway())))
		fmt.Fprintf(tw, "dhcp dns, ntp:\t%s; %s\n", dash(peer(strings.Join(s.GetDhcpDns(), ","))), dash(peer(strings.Join(s.GetDhcpNtp(), ","))))
		fmt.Fprintf(tw, "dhcp lease time:\t%s\n", lease)
	}

	fmt.Fprintf(tw, "dhcp reservations:\t%d\n", len(s.GetDhcpReservations()))
}

// SetAssetPolicy sets a site's boot-asset policy (passthrough, cache or offline).
func (c *Client) SetAssetPolicy(ctx context.Context, siteID, policy string) error {
	p, err := assets.ParsePolicy(policy)
	if err != nil {
		return err
	}

	_, err = c.api.SetAssetPolicy(ctx, &adminpb.SetAssetPolicyRequest{SiteId: siteID, Policy: p})

	return describe("set asset policy", err)
}
