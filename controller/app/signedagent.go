package app

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machines"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// signedAgentNeeds is the key under which a site's signed agent images are among its needs: no machine has it,
// and it names the site (assets.Needs keeps a key at one site only).
func signedAgentNeeds(siteID string) string { return "signed agent images of site " + siteID }

// signedAgentRetry is how soon a site whose signed agent images could not be resolved is tried again.
const signedAgentRetry = time.Minute

// signedAgents keeps each site's signed agent images (its boot table's signed_agent): at a site whose operator
// said its machines enforce Secure Boot (controller site set --secure-boot on), a machine that has no plan yet
// (its first boot) is offered agent mode as a signed image, which the controller resolves like any agent-mode
// plan with the site's edge's addresses baked in (the image's command line is locked), one per architecture.
// Until the site's edge has said how its machines reach it, or where the source has none, the site has none,
// and its edge's own signed file is what such a machine boots. A site's images are among its needs, so the
// library fetches them once and the site holds them.
type signedAgents struct {
	log      *zap.Logger
	planner  lifecycle.Planner
	tables   *boottables.Tables
	policies *machines.SitePolicies
	needs    *assets.Needs
	install  *assets.InstallFiles

	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
}

func newSignedAgents(log *zap.Logger, planner lifecycle.Planner, tables *boottables.Tables, policies *machines.SitePolicies,
	needs *assets.Needs, install *assets.InstallFiles,
) *signedAgents {
	return &signedAgents{
		log: log.With(zap.String("component", "signed agent images")), planner: planner, tables: tables, policies: policies,
		needs: needs, install: install, pending: map[string]bool{}, wake: make(chan struct{}, 1),
	}
}

// Kick asks for a site's images to be worked out again (its Secure Boot setting or its edge's reach changed).
func (s *signedAgents) Kick(siteID string) {
	if s == nil {
		return
	}

	s.mu.Lock()
	s.pending[siteID] = true
	s.mu.Unlock()

	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run works out the images of every kicked site until ctx ends.
func (s *signedAgents) Run(ctx context.Context) error {
	for {
		s.mu.Lock()
		sites := slices.Sorted(maps.Keys(s.pending))
		clear(s.pending)
		s.mu.Unlock()

		for _, site := range sites {
			if err := s.refresh(ctx, site); err != nil && ctx.Err() == nil {
				s.log.Warn("site's signed agent images not resolved; its edge's own signed file serves meanwhile",
					zap.String("site", site), zap.Duration("retry_in", signedAgentRetry), zap.Error(err))
				time.AfterFunc(signedAgentRetry, func() { s.Kick(site) })
			}
		}

		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
	}
}

// refresh resolves a site's images and hands them to its table and its needs (none when its machines do not
// enforce Secure Boot, or its edge has not said how they reach it).
func (s *signedAgents) refresh(ctx context.Context, siteID string) error {
	reach := s.tables.Reach(siteID)

	var (
		images map[string]*bootpb.SignedImage
		refs   []*assetspb.AssetRef
		wants  []assets.Want
	)

	if s.policies.SecureBoot(siteID) == bootpb.SecureBoot_SECURE_BOOT_ON && reach.GetHttpBase() != "" {
		for _, arch := range []metal.Arch{metal.AMD64, metal.ARM64} {
			// A machine with no plan of its own is an agent-mode machine with nothing else said of it.
			plan, err := s.planner.Plan(ctx, bootplans.Machine{Arch: arch, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, Reach: reach})
			if err != nil {
				return err
			}

			if plan.SignedURL == "" {
				continue
			}

			r, w, err := planAssets(s.install, plan)
			if err != nil {
				return err
			}

			if images == nil {
				images = map[string]*bootpb.SignedImage{}
			}

			images[arch.IPXE()] = &bootpb.SignedImage{Url: plan.SignedURL, UpstreamUrl: plan.UpstreamSignedURL}
			refs, wants = append(refs, r...), append(wants, w...)
		}
	}

	s.needs.SetMachine(siteID, signedAgentNeeds(siteID), refs, wants...)
	s.tables.SetSignedAgent(siteID, images)

	return nil
}
