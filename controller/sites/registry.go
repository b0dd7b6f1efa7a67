package sites

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// Errors the registry's callers branch on.
var (
	// ErrUnknownSite means no site has that ID (never created, or deleted).
	ErrUnknownSite = errors.New("unknown site")
	// ErrSiteExists means a site with that ID already exists.
	ErrSiteExists = errors.New("site already exists")
	// ErrRevoked means the site was revoked.
	ErrRevoked = errors.New("site revoked")
	// ErrTokenRejected means a join token does not match the site's current token.
	ErrTokenRejected = errors.New("join token rejected")
	// ErrTokenExpired means a join token is past its expiry.
	ErrTokenExpired = errors.New("join token expired")
	// ErrTokenUsed means a single-use join token was already used.
	ErrTokenUsed = errors.New("join token already used")
)

// maxCertificatesPerSite is how many client certificates stay valid per site: the newest and the one it replaced.
const maxCertificatesPerSite = 2

// Registry keeps the sites as COSI resources: creation with a join token (stored hashed),
// token consumption, the certificates issued, revocation and deletion.
type Registry struct {
	st   state.State
	kind resources.SiteKind
	now  func() time.Time
	rand io.Reader
	ca   *CA
}

// NewRegistry returns a registry of the sites in st, kept in the controller's own store (resources.LocalSites)
// unless the option Kind says otherwise. rand supplies token secrets; now is the clock.
func NewRegistry(st state.State, ca *CA, rand io.Reader, now func() time.Time, opts ...RegistryOption) *Registry {
	r := &Registry{st: st, kind: resources.LocalSites, ca: ca, rand: rand, now: now}
	for _, o := range opts {
		o(r)
	}

	return r
}

// RegistryOption changes how a Registry keeps sites.
type RegistryOption func(*Registry)

// Kind keeps the sites as resources of kind: Types.Sites keeps them in Omni, in the provider's namespace.
func Kind(kind resources.SiteKind) RegistryOption { return func(r *Registry) { r.kind = kind } }

// TokenOptions say how a new join token behaves.
type TokenOptions struct {
	// TTL is how long the token is valid.
	TTL time.Duration
	// Reusable lets the token enrol more than one edge.
	Reusable bool
}

// DefaultTokenTTL is the validity of a join token unless the operator says otherwise.
const DefaultTokenTTL = 24 * time.Hour

func (o TokenOptions) ttl() time.Duration {
	if o.TTL <= 0 {
		return DefaultTokenTTL
	}

	return o.TTL
}

// Create creates a site and returns its join token, which is not stored anywhere: only its hash is.
func (r *Registry) Create(ctx context.Context, siteID, description string, opts TokenOptions) (uplink.JoinToken, time.Time, error) {
	if err := uplink.ValidateSiteID(siteID); err != nil {
		return uplink.JoinToken{}, time.Time{}, err
	}

	tok, err := r.newToken(siteID)
	if err != nil {
		return uplink.JoinToken{}, time.Time{}, err
	}

	now := r.now()
	expires := now.Add(opts.ttl())

	site := r.kind.New(siteID)
	spec := site.TypedSpec().Value
	spec.Description = description
	spec.TokenHash = tok.SecretHash()
	spec.TokenExpires = timestamppb.New(expires)
	spec.TokenReusable = opts.Reusable
	spec.Created = timestamppb.New(now)

	if err := r.st.Create(ctx, site); err != nil {
		if state.IsConflictError(err) {
			return uplink.JoinToken{}, time.Time{}, fmt.Errorf("create site %s: %w", siteID, ErrSiteExists)
		}

		return uplink.JoinToken{}, time.Time{}, fmt.Errorf("create site %s: %w", siteID, err)
	}

	return tok, expires, nil
}

// NewToken replaces a site's join token, for enrolling a replacement edge. A revoked site cannot get one.
func (r *Registry) NewToken(ctx context.Context, siteID string, opts TokenOptions) (uplink.JoinToken, time.Time, error) {
	tok, err := r.newToken(siteID)
	if err != nil {
		return uplink.JoinToken{}, time.Time{}, err
	}

	expires := r.now().Add(opts.ttl())

	_, err = r.update(ctx, siteID, func(site *resources.Site) error {
		spec := site.TypedSpec().Value
		if spec.Revoked {
			return fmt.Errorf("site %s: %w", siteID, ErrRevoked)
		}

		spec.TokenHash = tok.SecretHash()
		spec.TokenExpires = timestamppb.New(expires)
		spec.TokenReusable = opts.Reusable
		spec.TokenUsed = false

		return nil
	})

	return tok, expires, err
}

func (r *Registry) newToken(siteID string) (uplink.JoinToken, error) {
	secret := make([]byte, uplink.SecretLen)
	if _, err := io.ReadFull(r.rand, secret); err != nil {
		return uplink.JoinToken{}, fmt.Errorf("generate join token secret: %w", err)
	}

	return uplink.JoinToken{SiteID: siteID, Secret: secret, CAFingerprint: r.ca.Fingerprint()}, nil
}

// CheckToken checks a join token without using it up: what enrolment asks before it signs anything.
func (r *Registry) CheckToken(ctx context.Context, tok uplink.JoinToken) error {
	site, err := r.Get(ctx, tok.SiteID)
	if err != nil {
		return err
	}

	return r.tokenError(site, tok)
}

// ConsumeToken checks a join token and, for a single-use token, marks it used. It is safe against
// two edges racing with the same token: exactly one wins.
func (r *Registry) ConsumeToken(ctx context.Context, tok uplink.JoinToken) error {
	_, err := r.update(ctx, tok.SiteID, func(site *resources.Site) error {
		if err := r.tokenError(site, tok); err != nil {
			return err
		}

		site.TypedSpec().Value.TokenUsed = true

		return nil
	})

	return err
}

// tokenError says why tok does not enrol an edge of site, or nil.
func (r *Registry) tokenError(site *resources.Site, tok uplink.JoinToken) error {
	spec := site.TypedSpec().Value

	switch {
	case spec.Revoked:
		return fmt.Errorf("site %s: %w", tok.SiteID, ErrRevoked)
	case len(spec.TokenHash) == 0 || subtle.ConstantTimeCompare(spec.TokenHash, tok.SecretHash()) != 1:
		return fmt.Errorf("site %s: %w: it is not the site's current token (replaced?)", tok.SiteID, ErrTokenRejected)
	case !r.now().Before(spec.TokenExpires.AsTime()):
		return fmt.Errorf("site %s: %w at %s", tok.SiteID, ErrTokenExpired, spec.TokenExpires.AsTime().UTC().Format(time.RFC3339))
	case spec.TokenUsed && !spec.TokenReusable:
		return fmt.Errorf("site %s: %w (tokens are single use unless created reusable)", tok.SiteID, ErrTokenUsed)
	}

	return nil
}

// AddCertificate records a certificate issued to the site; older ones beyond the newest two stop working.
func (r *Registry) AddCertificate(ctx context.Context, siteID, serial string) error {
	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		spec := site.TypedSpec().Value
		if spec.Revoked {
			return fmt.Errorf("site %s: %w", siteID, ErrRevoked)
		}

		spec.CertificateSerials = append(spec.CertificateSerials, serial)
		if n := len(spec.CertificateSerials); n > maxCertificatesPerSite {
			spec.CertificateSerials = spec.CertificateSerials[n-maxCertificatesPerSite:]
		}

		return nil
	})

	return err
}

// Authorize checks that a certificate serial is currently valid for the site.
func (r *Registry) Authorize(ctx context.Context, siteID, serial string) error {
	site, err := r.Get(ctx, siteID)
	if err != nil {
		return err
	}

	spec := site.TypedSpec().Value

	if spec.Revoked {
		return fmt.Errorf("site %s: %w", siteID, ErrRevoked)
	}

	if !slices.Contains(spec.CertificateSerials, serial) {
		return fmt.Errorf("site %s: certificate %s is no longer valid (replaced by a newer one, or the site was re-created)", siteID, serial)
	}

	return nil
}

// Revoke revokes a site: its certificates stop working and its join token too.
func (r *Registry) Revoke(ctx context.Context, siteID string) error {
	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		spec := site.TypedSpec().Value
		spec.Revoked = true
		spec.CertificateSerials = nil
		spec.TokenHash = nil

		return nil
	})

	return err
}

// SetAssetPolicy stores the site's boot-asset policy (an outpost.assets.Policy value).
func (r *Registry) SetAssetPolicy(ctx context.Context, siteID string, policy int32) error {
	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		site.TypedSpec().Value.AssetPolicy = policy

		return nil
	})

	return err
}

// SetLabels replaces the labels published on the site's machines (validated by the caller).
func (r *Registry) SetLabels(ctx context.Context, siteID string, labels map[string]string) error {
	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		site.TypedSpec().Value.Labels = maps.Clone(labels)

		return nil
	})

	return err
}

// Delete removes a site.
func (r *Registry) Delete(ctx context.Context, siteID string) error {
	if err := r.st.Destroy(ctx, r.kind.New(siteID).Metadata()); err != nil {
		if state.IsNotFoundError(err) {
			return fmt.Errorf("delete site %s: %w", siteID, ErrUnknownSite)
		}

		return fmt.Errorf("delete site %s: %w", siteID, err)
	}

	return nil
}

// Get returns a site.
func (r *Registry) Get(ctx context.Context, siteID string) (*resources.Site, error) {
	site, err := safe.StateGet[*resources.Site](ctx, r.st, r.kind.New(siteID).Metadata())
	if err != nil {
		if state.IsNotFoundError(err) {
			return nil, fmt.Errorf("site %s: %w", siteID, ErrUnknownSite)
		}

		return nil, fmt.Errorf("get site %s: %w", siteID, err)
	}

	return site, nil
}

// List returns all sites sorted by ID.
func (r *Registry) List(ctx context.Context) ([]*resources.Site, error) {
	list, err := safe.StateList[*resources.Site](ctx, r.st, r.kind.New("").Metadata())
	if err != nil {
		return nil, fmt.Errorf("list sites: %w", err)
	}

	return slices.Collect(list.All()), nil
}

// Watch calls changed with a site's ID each time the site is created, changed or deleted, by this process or
// any other writing the same store (a standby controller's admin socket, against Omni), until ctx ends or the
// watch fails; it returns that error (nil when ctx ended). It does not replay the sites that exist already.
func (r *Registry) Watch(ctx context.Context, changed func(siteID string)) error {
	return r.watch(ctx, false, func(ev state.Event) { changed(ev.Resource.Metadata().ID()) })
}

// watch calls fn with every creation, change and deletion of a site (first with every site there is, when
// bootstrap is set) until ctx ends (nil) or the watch fails (its error).
func (r *Registry) watch(ctx context.Context, bootstrap bool, fn func(state.Event)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var opts []state.WatchKindOption
	if bootstrap {
		opts = append(opts, state.WithBootstrapContents(true))
	}

	events := make(chan state.Event)
	if err := r.st.WatchKind(ctx, r.kind.New("").Metadata(), events, opts...); err != nil {
		return fmt.Errorf("watch sites: %w", err)
	}

	for {
		var ev state.Event

		select {
		case <-ctx.Done():
			return nil
		case ev = <-events:
		}

		switch ev.Type {
		case state.Errored:
			return fmt.Errorf("watch sites: %w", ev.Error)
		case state.Created, state.Updated, state.Destroyed:
			fn(ev)
		case state.Bootstrapped, state.Noop:
		}
	}
}

func (r *Registry) update(ctx context.Context, siteID string, fn func(*resources.Site) error) (*resources.Site, error) {
	site, err := safe.StateUpdateWithConflicts(ctx, r.st, r.kind.New(siteID).Metadata(), fn)
	if err != nil {
		if state.IsNotFoundError(err) {
			return nil, fmt.Errorf("site %s: %w", siteID, ErrUnknownSite)
		}

		return nil, err
	}

	return site, nil
}
