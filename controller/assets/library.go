package assets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/atomicfile"
)

// Library holds the install assets the controller fetched from upstream: the image factory's kernels and
// initramfs files, and the installer images of its registry. Each is fetched once, verified and stored by
// SHA-256 in the relay directory (where the relay serves edges from), and known by the logical names edges
// serve it under. What it holds is remembered in an index file beside the assets, so a restarted controller
// neither fetches again nor accepts a second download of a name whose content differs from the first:
// upstream content of one name never changes, and two downloads that disagree are refused, not served.
//
// Fetches run in Run's workers, a few at once; Want queues one and answers at once. Every asset that becomes
// held is announced on Held, so those waiting for it (the sites' needs) publish it.
type Library struct {
	cfg  LibraryConfig
	log  *zap.Logger
	now  func() time.Time
	held chan struct{}
	wake chan struct{}

	mu      sync.Mutex
	entries map[string]*libEntry
	queue   []string
}

// LibraryConfig configures a Library.
type LibraryConfig struct {
	// Dir is the relay directory the assets are stored in by digest (the index file lives there too).
	Dir string
	// Client fetches from upstream; it should take the proxy from the environment and trust the configured
	// roots (UpstreamClient).
	Client *http.Client
	// Workers is how many fetches run at once.
	Workers int
	// MaxSize bounds one file or blob (an endless answer is cut there).
	MaxSize int64
	// Timeout bounds one fetch; IdleTimeout cuts a download that receives nothing for that long.
	Timeout, IdleTimeout time.Duration
	// Metrics counts fetches (nil: not counted).
	Metrics *Metrics
}

// DefaultLibrary returns the defaults over dir.
func DefaultLibrary(dir string, client *http.Client) LibraryConfig {
	return LibraryConfig{Dir: dir, Client: client, Workers: 2, MaxSize: 2 << 30, Timeout: 30 * time.Minute, IdleTimeout: time.Minute}
}

// Validate checks the configuration.
func (c LibraryConfig) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("install asset library: no directory")
	case c.Client == nil:
		return errors.New("install asset library: no HTTP client")
	case c.Workers <= 0 || c.MaxSize <= 0 || c.Timeout <= 0 || c.IdleTimeout <= 0:
		return fmt.Errorf("install asset library: workers %d, max size %d, timeout %s and idle timeout %s must be positive",
			c.Workers, c.MaxSize, c.Timeout, c.IdleTimeout)
	}

	return nil
}

// Want is one thing the library is asked to hold: a file (Name is its logical name, URL where it comes
// from) or an image (Image is its reference, Arch the platform whose content is held).
type Want struct {
	Name, URL string
	Image     string
	Arch      string
}

// Key identifies a want in the library (and in its index).
func (w Want) Key() string {
	if w.Image != "" {
		return "image:" + w.Image + "@" + w.Arch
	}

	return w.Name
}

// source is where w comes from: its URL or image reference.
func (w Want) source() string {
	if w.Image != "" {
		return w.Image
	}

	return w.URL
}

// Progress is what the library knows of one want.
type Progress struct {
	Key string
	// Source is where it comes from upstream (a URL or an image reference).
	Source string
	// Held says the controller has it (Refs then answers).
	Held bool
	// Done and Total are the bytes fetched so far and the expected size (0: not known yet).
	Done, Total int64
	// Err is the last fetch's failure ("" while it works or worked).
	Err string
}

type libEntry struct {
	Want Want                  `json:"want"`
	Refs []*assetsapi.AssetRef `json:"refs,omitempty"`

	queued      bool
	done, total int64
	err         string
	failedAt    time.Time
}

func (e *libEntry) held() bool { return len(e.Refs) > 0 && !e.queued }

// libraryIndex is the index file's name in the relay directory.
const libraryIndex = "install-assets.json"

// retryFailedAfter is how long a failed fetch is left alone before a Want tries it again.
const retryFailedAfter = 30 * time.Second

// ErrContentChanged is returned when a second fetch of a name differs from the content held under it.
var ErrContentChanged = errors.New("upstream content differs from the held copy")

// NewLibrary returns a library over cfg.Dir, loading what an earlier run held (an entry whose files are gone
// is fetched again when wanted, and must come back the same).
func NewLibrary(cfg LibraryConfig, log *zap.Logger) (*Library, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("install asset library: %w", err)
	}

	l := &Library{
		cfg: cfg, log: log.With(zap.String("component", "install-assets")), now: time.Now,
		held: make(chan struct{}, 1), wake: make(chan struct{}, 1), entries: map[string]*libEntry{},
	}

	data, err := os.ReadFile(filepath.Join(cfg.Dir, libraryIndex))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("install asset library index: %w", err)
	}

	if len(data) > 0 {
		var saved []*libEntry
		if err := json.Unmarshal(data, &saved); err != nil {
			return nil, fmt.Errorf("install asset library index %s: %w", filepath.Join(cfg.Dir, libraryIndex), err)
		}

		for _, e := range saved {
			if e.Want.Key() != "" && validRefs(e.Refs) {
				l.entries[e.Want.Key()] = e
			}
		}
	}

	return l, nil
}

func validRefs(refs []*assetsapi.AssetRef) bool {
	for _, r := range refs {
		if r.GetName() == "" || !digestRe.MatchString(r.GetSha256()) || r.GetSize() < 0 {
			return false
		}
	}

	return len(refs) > 0
}

// Held is signalled (coalesced) whenever a want becomes held.
func (l *Library) Held() <-chan struct{} { return l.held }

// Refs returns the asset references of a held want (a file's carries its upstream URL, for edges allowed to
// fetch it themselves), or false when the controller does not hold all of it.
func (l *Library) Refs(w Want) ([]*assetsapi.AssetRef, bool) {
	l.mu.Lock()

	var (
		refs []*assetsapi.AssetRef
		held bool
	)

	if e := l.entries[w.Key()]; e != nil {
		refs, held = e.Refs, e.held()
	}
	l.mu.Unlock()

	if !held || !l.present(refs) {
		return nil, false
	}

	return refs, true
}

// Want makes the library hold w, queueing its fetch unless it is held or on its way; a failed fetch is tried
// again by a Want at least retryFailedAfter later. It tells whether w is held now.
func (l *Library) Want(w Want) bool {
	if _, ok := l.Refs(w); ok {
		return true
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	e := l.entries[w.Key()]
	if e == nil {
		e = &libEntry{Want: w}
		l.entries[w.Key()] = e
	}

	if e.queued || (e.err != "" && l.now().Sub(e.failedAt) < retryFailedAfter) {
		return false
	}

	e.Want, e.queued, e.err, e.done = w, true, "", 0
	l.queue = append(l.queue, w.Key())

	select {
	case l.wake <- struct{}{}:
	default:
	}

	return false
}

// Progress returns what the library knows of w.
func (l *Library) Progress(w Want) (Progress, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	e := l.entries[w.Key()]
	if e == nil {
		return Progress{}, false
	}

	var size int64
	for _, r := range e.Refs {
		size += r.GetSize()
	}

	return Progress{Key: w.Key(), Source: e.Want.source(), Held: e.held() && l.present(e.Refs), Done: e.done, Total: max(e.total, size), Err: e.err}, true
}

// present reports whether the relay directory has every file of refs.
func (l *Library) present(refs []*assetsapi.AssetRef) bool {
	for _, r := range refs {
		if _, err := os.Stat(filepath.Join(l.cfg.Dir, r.GetSha256())); err != nil {
			return false
		}
	}

	return true
}

// Run fetches queued wants until ctx ends.
func (l *Library) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)

	for range l.cfg.Workers {
		g.Go(func() error {
			for {
				key, ok := l.next()
				if !ok {
					select {
					case <-ctx.Done():
						return nil
					case <-l.wake:
						continue
					}
				}

				l.fetch(ctx, key)
			}
		})
	}

	return g.Wait()
}

func (l *Library) next() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if len(l.queue) == 0 {
		return "", false
	}

	key := l.queue[0]
	l.queue = l.queue[1:]

	if len(l.queue) > 0 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}

	return key, true
}

// fetch fetches one want, checks it against what was held under its key before (if anything) and records it.
func (l *Library) fetch(ctx context.Context, key string) {
	l.mu.Lock()
	e := l.entries[key]
	w, before := e.Want, slices.Clone(e.Refs)
	l.mu.Unlock()

	log := l.log.With(zap.String("asset", key))
	log.Info("fetching install asset")

	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()

	var (
		refs []*assetsapi.AssetRef
		err  error
	)

	if w.Image != "" {
		refs, err = l.pullImage(ctx, key, w)
	} else {
		var ref *assetsapi.AssetRef
		if ref, err = l.download(ctx, key, w.URL); err == nil {
			ref.Name, ref.Urls = w.Name, []string{w.URL}
			refs = []*assetsapi.AssetRef{ref}
		}
	}

	if err == nil && len(before) > 0 && !sameContent(before, refs) {
		err = fmt.Errorf("%w: %s", ErrContentChanged, key)
	}

	if m := l.cfg.Metrics; m != nil {
		m.fetches.WithLabelValues(map[bool]string{true: "failed", false: "held"}[err != nil]).Inc()
	}

	if err != nil {
		l.mu.Lock()
		e.queued, e.err, e.failedAt = false, strings.TrimSpace(err.Error()), l.now()
		l.mu.Unlock()

		if ctx.Err() == nil {
			log.Warn("install asset fetch failed", zap.Error(err))
		}

		return
	}

	// Recorded in the index before anyone sees it held, so a controller starting next remembers its digests.
	l.mu.Lock()
	e.Refs, e.err = refs, ""
	l.mu.Unlock()

	if err := l.save(); err != nil {
		log.Warn("install asset index not saved (the asset is fetched again after a restart)", zap.Error(err))
	}

	l.mu.Lock()
	e.queued = false
	l.mu.Unlock()

	log.Info("install asset held", zap.Int("files", len(refs)))

	select {
	case l.held <- struct{}{}:
	default:
	}
}

// sameContent reports whether two fetches of one want gave the same names and digests.
func sameContent(a, b []*assetsapi.AssetRef) bool {
	key := func(refs []*assetsapi.AssetRef) []string {
		out := make([]string, 0, len(refs))
		for _, r := range refs {
			out = append(out, r.GetName()+"="+r.GetSha256())
		}

		slices.Sort(out)

		return out
	}

	return slices.Equal(key(a), key(b))
}

// addProgress counts fetched bytes of key; total, when positive, adds to the expected size.
func (l *Library) addProgress(key string, done, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if e := l.entries[key]; e != nil {
		e.done += done
		e.total += max(total, 0)
	}

	if m := l.cfg.Metrics; m != nil && done > 0 {
		m.fetchedBytes.Add(float64(done))
	}
}

// save writes the index of held wants atomically.
func (l *Library) save() error {
	l.mu.Lock()

	saved := make([]*libEntry, 0, len(l.entries))
	for _, e := range l.entries {
		if len(e.Refs) > 0 {
			saved = append(saved, &libEntry{Want: e.Want, Refs: e.Refs})
		}
	}
	l.mu.Unlock()

	slices.SortFunc(saved, func(a, b *libEntry) int { return strings.Compare(a.Want.Key(), b.Want.Key()) })

	data, err := json.MarshalIndent(saved, "", "  ")
	if err != nil {
		return err
	}

	return atomicfile.Write(filepath.Join(l.cfg.Dir, libraryIndex), data, 0o644)
}
