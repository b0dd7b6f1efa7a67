package sites

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// maxHealthMessage bounds the provider health message Omni shows (the list of offline sites is cut to fit).
const maxHealthMessage = 256

// Health is the provider's health as Omni shows it (the COSI runtime's health heartbeat): healthy while every
// registered site has a live session, otherwise how many are connected and which are not, named in order,
// cut to fit Omni's field.
func (s *Server) Health(ctx context.Context) error {
	list, err := s.opts.Registry.List(ctx)
	if err != nil {
		return fmt.Errorf("site registry: %w", err)
	}

	ids := make([]string, 0, len(list))
	for _, site := range list {
		ids = append(ids, site.Metadata().ID())
	}

	return HealthOf(ids, s.Connected)
}

// HealthOf is the health Omni is told for sites, given which are connected: nil when all are, else how many
// are and the names of those that are not, within the length Omni shows.
func HealthOf(sites []string, online func(siteID string) bool) error {
	var offline []string

	for _, s := range sites {
		if !online(s) {
			offline = append(offline, s)
		}
	}

	if len(offline) == 0 {
		return nil
	}

	var b strings.Builder

	fmt.Fprintf(&b, "%d of %d sites connected; offline: ", len(sites)-len(offline), len(sites))

	for i, s := range offline {
		sep := ""
		if i > 0 {
			sep = ", "
		}

		if b.Len()+len(sep)+len(s)+len(" (+999999 more)") > maxHealthMessage {
			fmt.Fprintf(&b, " (+%d more)", len(offline)-i)

			break
		}

		b.WriteString(sep + s)
	}

	return errors.New(b.String())
}
