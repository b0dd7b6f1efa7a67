package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// maxHealthMessage bounds the provider health message Omni shows (the list of offline sites is cut to fit).
const maxHealthMessage = 256

// siteHealth is the provider's health as Omni shows it: healthy while every site is connected, otherwise how
// many are connected and which are not, named in order, cut to fit Omni's field.
func siteHealth(list func(context.Context) ([]string, error), online func(siteID string) bool) func(context.Context) error {
	return func(ctx context.Context) error {
		sites, err := list(ctx)
		if err != nil {
			return fmt.Errorf("site registry: %w", err)
		}

		var offline []string

		for _, s := range sites {
			if !online(s) {
				offline = append(offline, s)
			}
		}

		if len(offline) == 0 {
			return nil
		}

		msg := fmt.Sprintf("%d of %d sites connected; offline: ", len(sites)-len(offline), len(sites))

		var b strings.Builder

		b.WriteString(msg)

		for i, s := range offline {
			more := fmt.Sprintf(" (+%d more)", len(offline)-i)

			sep := ""
			if i > 0 {
				sep = ", "
			}

			if b.Len()+len(sep)+len(s)+len(" (+999999 more)") > maxHealthMessage {
				b.WriteString(more)

				break
			}

			b.WriteString(sep + s)
		}

		return errors.New(b.String())
	}
}
