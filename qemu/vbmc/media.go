package vbmc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"sync"
)

// BootCD is the boot override target of the virtual CD (Redfish "Cd").
const BootCD BootDevice = "cd"

// Errors a virtual CD returns; the Redfish front end maps each to its own status and message.
var (
	// ErrBadImageURL means the image named is not an absolute http(s) URL this BMC can fetch.
	ErrBadImageURL = errors.New("image is not an absolute http or https url")
	// ErrMediaInUse means an image is mounted already: eject it first (DSP2046, InsertMedia).
	ErrMediaInUse = errors.New("virtual media already holds an image: eject it first")
	// ErrMediaRefused is what a BMC set up to refuse every mount answers (MediaRefuse).
	ErrMediaRefused = errors.New("the bmc refused to mount the image")
	// ErrNotRunning is what a MediaBackend returns when the machine is off: the medium takes effect at its next start.
	ErrNotRunning = errors.New("the machine is not running")
)

// MaxImageURL bounds the length of an image URL.
const MaxImageURL = 2048

// MediaFault is a misbehaviour a virtual CD can be set up with, as some BMCs show it.
type MediaFault string

// Faults.
const (
	// MediaHealthy mounts what it is given.
	MediaHealthy MediaFault = ""
	// MediaRefuse answers every InsertMedia with a server error.
	MediaRefuse MediaFault = "refuse"
	// MediaHalfMount accepts InsertMedia and records the image, but never shows it to the host: Inserted stays
	// false and the machine boots without it (a BMC that could not fetch the image after answering).
	MediaHalfMount MediaFault = "half-mount"
)

// MediaBackend changes the medium of the machine's CD-ROM drive (QMP for a QEMU machine).
type MediaBackend interface {
	// Insert loads image (an http(s) URL) into the drive; ErrNotRunning when the machine is off.
	Insert(ctx context.Context, image string) error
	// Eject empties the drive; ErrNotRunning when the machine is off.
	Eject(ctx context.Context) error
}

// Media is a BMC's virtual CD: the image it holds, whether the host sees it, and the backend that puts it in the
// machine's drive. It is safe for concurrent use.
type Media struct {
	backend MediaBackend

	mu       sync.Mutex
	fault    MediaFault
	image    string
	inserted bool
	inserts  int
	ejects   int
}

// NewMedia returns an empty virtual CD; backend may be nil (the state only, as for a machine the test plays).
func NewMedia(backend MediaBackend) *Media {
	return &Media{backend: backend}
}

// SetFault makes the virtual CD misbehave from now on (MediaHealthy: behave).
func (m *Media) SetFault(f MediaFault) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.fault = f
}

// CheckImageURL checks that image is an absolute http(s) URL without user information or control characters,
// at most MaxImageURL long.
func CheckImageURL(image string) error {
	if len(image) > MaxImageURL {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadImageURL, len(image), MaxImageURL)
	}

	if strings.ContainsFunc(image, func(r rune) bool { return r <= 0x20 || r == 0x7f }) {
		return fmt.Errorf("%w: it holds spaces or control characters", ErrBadImageURL)
	}

	u, err := url.Parse(image)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadImageURL, err)
	}

	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%w: scheme %q", ErrBadImageURL, u.Scheme)
	case u.Host == "":
		return fmt.Errorf("%w: no host", ErrBadImageURL)
	case u.User != nil:
		return fmt.Errorf("%w: user information in the url", ErrBadImageURL)
	}

	return nil
}

// Insert mounts image: ErrBadImageURL, ErrMediaInUse while one is mounted, ErrMediaRefused from a refusing BMC,
// or the backend's error (the drive is left empty). A running machine gets the medium at once, an off one at its
// next start (Image).
func (m *Media) Insert(ctx context.Context, image string) error {
	if err := CheckImageURL(image); err != nil {
		return err
	}

	m.mu.Lock()
	defer m.mu.Unlock()

	switch {
	case m.image != "":
		return ErrMediaInUse
	case m.fault == MediaRefuse:
		return ErrMediaRefused
	case m.fault == MediaHalfMount:
		m.image = image

		return nil
	}

	if m.backend != nil {
		if err := m.backend.Insert(ctx, image); err != nil && !errors.Is(err, ErrNotRunning) {
			return fmt.Errorf("insert %s: %w", image, err)
		}
	}

	m.image, m.inserted = image, true
	m.inserts++

	return nil
}

// Eject empties the virtual CD (nothing to eject is no error).
func (m *Media) Eject(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.image == "" {
		return nil
	}

	if m.inserted && m.backend != nil {
		if err := m.backend.Eject(ctx); err != nil && !errors.Is(err, ErrNotRunning) {
			return fmt.Errorf("eject: %w", err)
		}
	}

	m.image, m.inserted = "", false
	m.ejects++

	return nil
}

// Image returns the image the host sees ("" when none: empty, or half-mounted).
func (m *Media) Image() string {
	m.mu.Lock()
	defer m.mu.Unlock()

	if !m.inserted {
		return ""
	}

	return m.image
}

// MediaState is what a virtual CD shows over Redfish.
type MediaState struct {
	// Image is the URL recorded ("" when none); Inserted says whether the host sees it.
	Image    string
	Inserted bool
	// Inserts and Ejects count the media mounted into and taken out of the drive.
	Inserts, Ejects int
}

// State returns the virtual CD's state.
func (m *Media) State() MediaState {
	m.mu.Lock()
	defer m.mu.Unlock()

	return MediaState{Image: m.image, Inserted: m.inserted, Inserts: m.inserts, Ejects: m.ejects}
}

// imageName is the last path element of an image URL (Redfish ImageName).
func imageName(image string) string {
	u, err := url.Parse(image)
	if err != nil || u.Path == "" {
		return ""
	}

	return path.Base(u.Path)
}
