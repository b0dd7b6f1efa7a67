package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/sites"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/assetbundle"
)

// checkSiteSettings is the rule for what an operator may set on a site (controller site set): the discovery
// names the boot table knows, the BMC protocols and wipe methods the lifecycle knows, a DHCP service the boot
// table accepts (bootpb.DHCP.Check), and documents machinery accepts beside the provider's own.
func (b *builder) checkSiteSettings(_ string, s sites.Settings) error {
	var errs []error

	if _, err := bootpb.ParseDiscovery(s.Discovery); err != nil {
		errs = append(errs, err)
	}

	if _, err := machines.ParseSitePolicy(s.BMCProtocol, s.WipeMethod, s.SecureBoot, false); err != nil {
		errs = append(errs, err)
	}

	if err := s.DHCP.Table().Check(); err != nil {
		errs = append(errs, err)
	}

	if len(s.ExtraConfig) > 0 {
		if err := b.extraDocs.CheckSiteDocuments(s.ExtraConfig); err != nil {
			errs = append(errs, fmt.Errorf("extra machine-config documents: %w", err))
		}
	}

	return errors.Join(errs...)
}

// applySiteSettings hands a site's settings to those that apply them: its boot table (discovery, registered
// machines, documents, DHCP service) and the lifecycle's site policies (BMC protocol, wipe method, the labels
// its machines carry). Settings stored before this controller's rules changed, and now refused by them, are
// logged and the site keeps the defaults.
func (b *builder) applySiteSettings(siteID string, s sites.Settings) {
	log := b.log.With(zap.String("site", siteID))

	b.edges.policies.SetLabels(siteID, s.Labels) // checked when set, and not part of the rules below
	asset, staged := s.AssetPolicy, s.Staged     // set by their own commands, and not part of the rules below

	if err := b.checkSiteSettings(siteID, s); err != nil {
		log.Warn("site settings refused; the site runs with the controller's defaults", zap.Error(err))

		s = sites.Settings{}
	}

	discovery, _ := bootpb.ParseDiscovery(s.Discovery)                                                                                    // checked above
	policy, _ := machines.ParseSitePolicy(s.BMCProtocol, s.WipeMethod, s.SecureBoot, s.DHCP.Mode == bootpb.DHCPMode_DHCP_MODE_OFF.Name()) // checked above

	b.edges.tables.SetSite(siteID, boottables.SiteTable{
		Discovery: discovery, RegisteredMACs: s.RegisteredMACs, ExtraConfig: s.ExtraConfig, DHCP: s.DHCP.Table(), SecureBoot: policy.SecureBoot,
	})

	if err := b.edges.policies.Set(siteID, policy); err != nil {
		log.Warn("site policy refused", zap.Error(err)) // cannot happen after the check
	}

	b.signed.Kick(siteID) // its Secure Boot may have changed: its signed agent images with it

	// The asset policy is the site's own (a stored one this controller does not know falls back to the default).
	if err := b.assets.catalog.SetPolicy(siteID, assetspb.Policy(asset)); err != nil {
		log.Warn("site asset policy refused; the site has the default policy", zap.Error(err))
		_ = b.assets.catalog.SetPolicy(siteID, assetspb.Policy_POLICY_UNSPECIFIED) //nolint:errcheck // the default is known
	}

	b.stageAt(siteID, staged) // also republishes what the site must hold: that depends on its policy

}

// newSiteSettings applies every site's settings now, so the first table a site's edge gets carries them, and
// runs "site settings", which follows every later change (made through any controller's admin socket).
func (b *builder) newSiteSettings(ctx context.Context) error {
	list, err := b.registry.List(ctx)
	if err != nil {
		return err
	}

	for _, site := range list {
		b.applySiteSettings(site.Metadata().ID(), sites.SettingsOf(site))
	}

	b.run("site settings", func(ctx context.Context) error {
		b.registry.FollowSettings(ctx, b.log, b.applySiteSettings)

		return nil
	})

	return nil
}

// stageAt hands the site's staged install profiles to its needs: the files and installer image of each, as
// the install source names them. A stored profile this controller cannot read is logged and left out.
func (b *builder) stageAt(siteID string, staged []string) {
	if b.assets.resolver == nil {
		staged = nil
	}

	var (
		refs  []*assetspb.AssetRef
		wants []assets.Want
	)

	for _, s := range staged {
		st, err := assets.ParseStaged(s)
		if err != nil {
			b.log.Warn("staged profile left out", zap.String("site", siteID), zap.Error(err))

			continue
		}

		boot := b.assets.resolver.BootOf(st)

		local, err := b.assets.install.Refs("staged "+s, boot.KernelURL, boot.InitrdURL)
		if err != nil {
			b.log.Warn("staged profile's local files left out", zap.String("site", siteID), zap.Error(err))
		}

		refs = append(refs, local...)
		wants = append(wants, boot.Wants(st.Arch)...)
	}

	b.assets.needs.SetStaged(siteID, refs, wants)
}

// staging is how the admin API names a staged profile: the install source gives the schematic of extensions.
type staging struct{ source installSource }

// StagedProfile implements sites.Staging.
func (s staging) StagedProfile(ctx context.Context, schematicID string, extensions []string, version, arch string) (string, error) {
	if schematicID == "" {
		id, err := s.source.Schematic(ctx, extensions)
		if err != nil {
			return "", fmt.Errorf("schematic of %v: %w", extensions, err)
		}

		schematicID = id
	}

	st, err := assets.Staged{Version: version, SchematicID: schematicID, Arch: arch}.Check()
	if err != nil {
		return "", err
	}

	return st.String(), nil
}

// bundler writes a site's needed assets the controller holds into a bundle made by this controller's CA.
type bundler struct {
	assets     *siteAssets
	relayDir   string
	controller string
}

// BundleSite implements sites.Bundler.
func (b bundler) BundleSite(siteID, dir string) (*adminpb.BundleAssetsResponse, error) {
	resp := &adminpb.BundleAssetsResponse{Controller: b.controller}

	var files []assetbundle.File

	for _, r := range b.assets.catalog.Needed(siteID) {
		files = append(files, assetbundle.File{Name: r.GetName(), Source: filepath.Join(b.relayDir, r.GetSha256())})
	}

	for _, u := range b.assets.needs.SiteAssets(siteID).GetUpstream() {
		resp.NotHeld = append(resp.NotHeld, u.GetKey())
	}

	m, err := assetbundle.Write(dir, files, b.controller)
	if err != nil {
		return nil, fmt.Errorf("bundle for site %s: %w", siteID, err)
	}

	for _, a := range m.Assets {
		resp.Assets++
		resp.Bytes += a.Size
	}

	return resp, nil
}
