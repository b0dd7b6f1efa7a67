package vmedia

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/assetbundle"
	"github.com/outpost-metal/outpost/shared/atomicfile"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Prefix is the path the edge serves images under: /vmedia/<sha256 hex>.iso.
const Prefix = "/vmedia/"

// MaxImages bounds the images kept on the edge; the oldest go first.
const MaxImages = 16

// ErrUnknownMAC means a machine's image was asked for without a MAC, and the machine never booted one.
var ErrUnknownMAC = errors.New("no mac is known for the machine: boot it from an image once by its mac")

// ErrNoLoader means the edge has no boot loader for images (the appliance's vmedia loader file is missing).
var ErrNoLoader = errors.New("this edge has no boot loader for virtual-media images")

// Boot is what a machine's image boots: the boot script's decision for it.
type Boot struct {
	// Mode is agent or install.
	Mode string
	// Kernel and Initrd are asset names the edge serves under /assets/.
	Kernel, Initrd string
	// Args is the kernel command line; ${uuid} is filled in when the machine is known.
	Args []string
}

// Planner decides a machine's boot from the site's boot table, as a boot script would (uuid may be empty for
// a machine never booted: it is found by mac).
type Planner interface {
	Boot(uuid string, mac net.HardwareAddr) (Boot, error)
}

// Assets opens the assets Boot names.
type Assets interface {
	Open(name string) (*os.File, error)
}

// Config is a Store's setting.
type Config struct {
	// Dir holds the images and what the store learnt (created when missing).
	Dir string
	// Loader is the EFI boot loader file (hack/vmedia-loader.sh); empty or missing: ErrNoLoader.
	Loader string
	// BaseURL is how BMCs reach the edge's HTTP server (http://host[:port]).
	BaseURL string
}

// Store builds images, keeps them by what they hold and serves them; it remembers which MAC each machine
// booted an image with. Safe for concurrent use.
type Store struct {
	cfg    Config
	plans  Planner
	assets Assets
	dhcp   func() *bootpb.DHCP

	mu   sync.Mutex // one build at a time; guards macs
	macs map[string]string
}

// Image is a built image.
type Image struct {
	// URL is where the BMC fetches it; Name is its file name under Prefix.
	URL, Name string
	Mode      string
	Static    Static
}

// NewStore opens a store. dhcp returns the site's DHCP settings (the reservations).
func NewStore(cfg Config, plans Planner, assets Assets, dhcp func() *bootpb.DHCP) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "images"), 0o755); err != nil {
		return nil, fmt.Errorf("virtual media: %w", err)
	}

	s := &Store{cfg: cfg, plans: plans, assets: assets, dhcp: dhcp, macs: map[string]string{}}

	raw, err := os.ReadFile(s.macsPath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("virtual media: %w", err)
	default:
		if err := json.Unmarshal(raw, &s.macs); err != nil {
			return nil, fmt.Errorf("virtual media: %s: %w", s.macsPath(), err)
		}
	}

	return s, nil
}

func (s *Store) macsPath() string { return filepath.Join(s.cfg.Dir, "macs.json") }

// MACOf returns the MAC a machine booted an image with (Remember).
func (s *Store) MACOf(uuid string) (net.HardwareAddr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()

	hw, err := net.ParseMAC(s.macs[metal.NormalizeID(uuid)])

	return hw, err == nil
}

// Remember records that machine uuid boots images with mac (persisted).
func (s *Store) Remember(uuid string, mac net.HardwareAddr) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	id := metal.NormalizeID(uuid)
	if s.macs[id] == mac.String() {
		return nil
	}

	next := make(map[string]string, len(s.macs)+1)
	for k, v := range s.macs {
		if v != mac.String() { // a MAC belongs to one machine: the newest says which
			next[k] = v
		}
	}

	next[id] = mac.String()

	raw, err := json.Marshal(next)
	if err != nil {
		return err
	}

	if err := atomicfile.Write(s.macsPath(), raw, 0o600); err != nil {
		return fmt.Errorf("virtual media: remember %s: %w", id, err)
	}

	s.macs = next

	return nil
}

// Image builds (or finds) the image machine uuid boots now with the address reserved for mac (nil: the MAC it
// booted an image with before).
func (s *Store) Image(_ context.Context, uuid string, mac net.HardwareAddr) (Image, error) {
	if len(mac) == 0 {
		known, ok := s.MACOf(uuid)
		if !ok {
			return Image{}, fmt.Errorf("machine %s: %w", uuid, ErrUnknownMAC)
		}

		mac = known
	}

	if s.cfg.Loader == "" {
		return Image{}, ErrNoLoader
	}

	loader, err := os.Stat(s.cfg.Loader)
	if err != nil {
		return Image{}, fmt.Errorf("%w: %w", ErrNoLoader, err)
	}

	static, err := StaticFor(s.dhcp(), mac)
	if err != nil {
		return Image{}, err
	}

	boot, err := s.plans.Boot(uuid, mac)
	if err != nil {
		return Image{}, err
	}

	args := make([]string, 0, len(boot.Args)+1)
	for _, a := range boot.Args {
		if uuid != "" {
			a = strings.ReplaceAll(a, "${uuid}", metal.NormalizeID(uuid))
		}

		args = append(args, a)
	}

	args = append(args, static.KernelArg())

	kernel, err := s.assets.Open(boot.Kernel)
	if err != nil {
		return Image{}, fmt.Errorf("image kernel %s: %w", boot.Kernel, err)
	}
	defer kernel.Close() //nolint:errcheck

	initrd, err := s.assets.Open(boot.Initrd)
	if err != nil {
		return Image{}, fmt.Errorf("image initramfs %s: %w", boot.Initrd, err)
	}
	defer initrd.Close() //nolint:errcheck

	// The image is named by everything it is made of.
	h := sha256.New()
	fmt.Fprintf(h, "loader %d %d\n", loader.Size(), loader.ModTime().UnixNano())

	for _, f := range []*os.File{kernel, initrd} {
		st, err := f.Stat()
		if err != nil {
			return Image{}, fmt.Errorf("image: %w", err)
		}

		fmt.Fprintf(h, "%s %d %d\n", f.Name(), st.Size(), st.ModTime().UnixNano())
	}

	fmt.Fprintf(h, "%q\n", args)

	name := hex.EncodeToString(h.Sum(nil)) + ".iso"
	img := Image{URL: s.cfg.BaseURL + Prefix + name, Name: name, Mode: boot.Mode, Static: static}

	s.mu.Lock()
	defer s.mu.Unlock()

	path := filepath.Join(s.cfg.Dir, "images", name)
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		os.Chtimes(path, now, now) //nolint:errcheck // the age only orders pruning

		return img, nil
	}

	tmp := path + ".part"
	if err := Build(s.cfg.Loader, Contents{Kernel: kernel, Initrd: initrd, Args: args}, tmp, s.cfg.Dir); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return Image{}, err
	}

	if err := os.Rename(tmp, path); err != nil {
		return Image{}, fmt.Errorf("image: %w", err)
	}

	s.prune(name)

	return img, nil
}

// prune removes the oldest images beyond MaxImages, never keep.
func (s *Store) prune(keep string) {
	entries, err := os.ReadDir(filepath.Join(s.cfg.Dir, "images"))
	if err != nil {
		return
	}

	type aged struct {
		name string
		at   time.Time
	}

	var images []aged

	for _, e := range entries {
		if info, err := e.Info(); err == nil && isImageName(e.Name()) && e.Name() != keep {
			images = append(images, aged{e.Name(), info.ModTime()})
		}
	}

	slices.SortFunc(images, func(a, b aged) int { return a.at.Compare(b.at) })

	for len(images) > MaxImages-1 {
		os.Remove(filepath.Join(s.cfg.Dir, "images", images[0].name)) //nolint:errcheck
		images = images[1:]
	}
}

// isImageName reports whether name is an image's file name: <sha256 hex>.iso.
func isImageName(name string) bool {
	digest, ok := strings.CutSuffix(name, ".iso")

	return ok && assetbundle.ValidateDigest(digest) == nil
}

// ParseName returns the image file name of a request path under Prefix; false for anything else.
func ParseName(path string) (string, bool) {
	name, ok := strings.CutPrefix(path, Prefix)

	return name, ok && isImageName(name)
}

// ServeHTTP serves GET and HEAD of an image, with ranges (a BMC reads it as a block device).
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, ok := ParseName(r.URL.Path)
	if !ok {
		http.NotFound(w, r)

		return
	}

	root, err := os.OpenRoot(filepath.Join(s.cfg.Dir, "images"))
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}
	defer root.Close() //nolint:errcheck

	f, err := root.Open(name)
	if err != nil {
		http.NotFound(w, r)

		return
	}
	defer f.Close() //nolint:errcheck

	st, err := f.Stat()
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)

		return
	}

	w.Header().Set("Content-Type", "application/x-iso9660-image")
	w.Header().Set("ETag", `"`+strings.TrimSuffix(name, ".iso")+`"`)
	http.ServeContent(w, r, "", st.ModTime(), io.ReadSeeker(f))
}
