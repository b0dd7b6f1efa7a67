package sites

import (
	"context"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
)

// statusKeeper writes SiteStatus resources as sessions come and go.
type statusKeeper struct {
	w   state.State
	now func() time.Time
}

// connected records a new session and returns how many sessions the site has opened.
func (k *statusKeeper) connected(ctx context.Context, live *liveSession, log *zap.Logger) uint64 {
	var sessions uint64

	k.modify(ctx, live.siteID, log, func(spec *resources.SiteStatus) {
		v := spec.TypedSpec().Value
		v.Connected = true
		v.EdgeVersion = live.edgeVersion
		v.ConnectedSince = timestamppb.New(live.since)
		v.LastSeen = timestamppb.New(k.now())
		v.RemoteAddress = live.peer.RemoteAddr().String()
		v.CertificateNotAfter = timestamppb.New(live.certExpiry)
		v.Sessions++
		sessions = v.Sessions
	})

	return sessions
}

func (k *statusKeeper) seen(ctx context.Context, siteID string, log *zap.Logger) {
	k.modify(ctx, siteID, log, func(spec *resources.SiteStatus) {
		spec.TypedSpec().Value.LastSeen = timestamppb.New(k.now())
	})
}

func (k *statusKeeper) disconnected(ctx context.Context, siteID string, log *zap.Logger) {
	k.modify(ctx, siteID, log, func(spec *resources.SiteStatus) {
		v := spec.TypedSpec().Value
		v.Connected = false
		v.LastSeen = timestamppb.New(k.now())
	})
}

func (k *statusKeeper) modify(ctx context.Context, siteID string, log *zap.Logger, fn func(*resources.SiteStatus)) {
	err := safe.StateModify(ctx, k.w, resources.NewSiteStatus(siteID), func(r *resources.SiteStatus) error {
		fn(r)

		return nil
	})
	if err != nil && ctx.Err() == nil {
		log.Warn("record site status", zap.Error(err))
	}
}

// Status returns the recorded connection state of a site (zero value when it never connected).
func Status(ctx context.Context, st state.State, siteID string) (*resources.SiteStatus, error) {
	res, err := safe.StateGetByID[*resources.SiteStatus](ctx, st, siteID)
	if state.IsNotFoundError(err) {
		return resources.NewSiteStatus(siteID), nil
	}

	return res, err
}
