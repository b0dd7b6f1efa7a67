package redfish

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/stmcginnis/gofish/schemas"
)

// Errors of virtual media.
var (
	// ErrNoVirtualCD means the BMC offers no virtual media that takes a CD image.
	ErrNoVirtualCD = errors.New("the bmc offers no virtual cd")
	// ErrHalfMounted means the BMC accepted an image but does not show it to the host (it could not fetch it,
	// or it records the URL without mounting it): the machine would boot without it.
	ErrHalfMounted = errors.New("the bmc accepted the image but does not show it to the host")
)

// virtualCD finds the BMC's virtual media that takes a CD image: the system's own (newer services), else its
// managers'.
func (c *Client) virtualCD(ctx context.Context) (*schemas.VirtualMedia, error) {
	sys, err := c.system(ctx)
	if err != nil {
		return nil, err
	}

	lists := []func() ([]*schemas.VirtualMedia, error){sys.VirtualMedia}

	managers, err := c.api.WithContext(ctx).Service.Managers()
	if err != nil {
		return nil, fmt.Errorf("list managers: %w", c.fail(err))
	}

	for _, m := range managers {
		lists = append(lists, m.VirtualMedia)
	}

	for _, list := range lists {
		media, err := list()
		if err != nil {
			return nil, fmt.Errorf("list virtual media: %w", c.fail(err))
		}

		for _, m := range media {
			if slices.Contains(m.MediaTypes, schemas.CDVirtualMediaType) || slices.Contains(m.MediaTypes, schemas.DVDVirtualMediaType) {
				return m, nil
			}
		}
	}

	return nil, ErrNoVirtualCD
}

// BootFromMedia mounts the CD image at image in the BMC's virtual CD (ejecting what it held), checks that the
// host sees it, and sets a one-time UEFI boot from the CD, read back. It returns the system's UUID as the BMC
// reports it: the machine that will boot the image.
func (c *Client) BootFromMedia(ctx context.Context, image string) (string, error) {
	cd, err := c.virtualCD(ctx)
	if err != nil {
		return "", err
	}

	if isInserted(cd) || cd.Image != "" {
		if _, err := cd.EjectMedia(); err != nil {
			return "", fmt.Errorf("eject %s: %w", cd.Image, c.fail(err))
		}
	}

	inserted, protected := true, true
	if _, err := cd.InsertMedia(&schemas.VirtualMediaInsertMediaParameters{Image: image, Inserted: &inserted, WriteProtected: &protected}); err != nil {
		return "", fmt.Errorf("insert image: %w", c.fail(err))
	}

	// Read the CD again: a BMC may answer the action and still not show the image to the host.
	now, err := c.virtualCD(ctx)
	if err != nil {
		return "", err
	}

	if !isInserted(now) || now.Image != image {
		return "", fmt.Errorf("insert image: %w (inserted %t, image %q)", ErrHalfMounted, isInserted(now), now.Image)
	}

	sys, err := c.system(ctx)
	if err != nil {
		return "", err
	}

	boot := &schemas.Boot{BootSourceOverrideEnabled: schemas.OnceBootSourceOverrideEnabled, BootSourceOverrideTarget: schemas.CdBootSource}
	if sys.Boot.BootSourceOverrideMode != schemas.UEFIBootSourceOverrideMode {
		boot.BootSourceOverrideMode = schemas.UEFIBootSourceOverrideMode
	}

	if err := sys.SetBoot(boot); err != nil {
		return "", fmt.Errorf("set one-time cd boot: %w", c.fail(err))
	}

	b, err := c.effectiveBoot(ctx)
	if err != nil {
		return "", fmt.Errorf("read back boot override: %w", err)
	}

	if b.BootSourceOverrideTarget != schemas.CdBootSource || b.BootSourceOverrideEnabled != schemas.OnceBootSourceOverrideEnabled {
		return "", fmt.Errorf("set one-time cd boot: %w (target %q, enabled %q)", ErrReadBack, b.BootSourceOverrideTarget, b.BootSourceOverrideEnabled)
	}

	return sys.UUID, nil
}

// EjectMedia empties the BMC's virtual CD (an empty one is no error).
func (c *Client) EjectMedia(ctx context.Context) error {
	cd, err := c.virtualCD(ctx)
	if err != nil {
		return err
	}

	if !isInserted(cd) && cd.Image == "" {
		return nil
	}

	if _, err := cd.EjectMedia(); err != nil {
		return fmt.Errorf("eject %s: %w", cd.Image, c.fail(err))
	}

	return nil
}

// isInserted reads Inserted (absent: not inserted).
func isInserted(m *schemas.VirtualMedia) bool { return m.Inserted != nil && *m.Inserted }
