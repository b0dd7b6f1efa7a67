package registry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outpost-metal/outpost/shared/ocinames"
)

// Prefix is the path the registry is served under (distribution spec: every endpoint starts with /v2/).
const Prefix = "/v2/"

// maxPathLen bounds the request paths parsed: the longest valid one is a manifest by tag,
// /v2/<113>/manifests/<128>, or a manifest by digest, well under it.
const maxPathLen = 512

// route is what a request path asks for.
type route int

const (
	routeBase     route = iota + 1 // GET /v2/
	routeManifest                  // /v2/<name>/manifests/<reference>
	routeBlob                      // /v2/<name>/blobs/<digest>
	routeTags                      // /v2/<name>/tags/list
)

// target is a parsed request path: the route, the repository and, for manifests, the tag or digest (hex),
// for blobs the digest (hex).
type target struct {
	route route
	repo  string
	tag   string
	hex   string
}

// Errors the path parser returns; the handler maps each to the spec's error code and status.
var (
	// errUnknownPath: not an endpoint of the pull API.
	errUnknownPath = errors.New("unknown path")
	// errBadPath: characters or lengths no valid path has (escapes, control bytes, overlong).
	errBadPath = errors.New("invalid path")
	// errBadTag: a manifest reference that is neither a tag nor a digest.
	errBadTag = errors.New("invalid manifest reference")
)

// parsePath parses the escaped path of a request (URL.EscapedPath). It accepts only what the spec's grammar
// allows, so a percent escape (an encoded slash, a dot segment in disguise) is refused outright: nothing a
// valid repository, tag or digest contains needs one. Repositories, tags and digests that pass are valid
// logical names of the edge's cache (ocinames).
func parsePath(path string) (target, error) {
	if len(path) > maxPathLen {
		return target{}, fmt.Errorf("%w: longer than %d bytes", errBadPath, maxPathLen)
	}

	rest, ok := strings.CutPrefix(path, Prefix)
	if !ok {
		return target{}, errUnknownPath
	}

	if rest == "" {
		return target{route: routeBase}, nil
	}

	for i := range len(rest) {
		if c := rest[i]; c == '%' || c <= ' ' || c >= 0x7f {
			return target{}, fmt.Errorf("%w: byte %q at %d", errBadPath, c, len(Prefix)+i)
		}
	}

	// The endpoint is named by the last two segments, so a repository may have components such as
	// "manifests" or "blobs" of its own; references and digests never contain a slash.
	repoAndKind, last, ok := cutLast(rest)
	if !ok {
		return target{}, errUnknownPath
	}

	repo, kind, ok := cutLast(repoAndKind)
	if !ok {
		return target{}, errUnknownPath
	}

	var t target

	switch kind {
	case "manifests":
		t.route = routeManifest
	case "blobs":
		t.route = routeBlob
	case "tags":
		if last != "list" {
			return target{}, errUnknownPath
		}

		t.route = routeTags
	default:
		return target{}, errUnknownPath
	}

	if err := ocinames.ValidateRepository(repo); err != nil {
		return target{}, err
	}

	t.repo = repo

	switch t.route {
	case routeManifest:
		if strings.Contains(last, ":") {
			hex, err := ocinames.ParseDigest(last)
			if err != nil {
				return target{}, err
			}

			t.hex = hex

			break
		}

		if err := ocinames.ValidateTag(last); err != nil {
			return target{}, fmt.Errorf("%w: %w", errBadTag, err)
		}

		t.tag = last
	case routeBlob:
		hex, err := ocinames.ParseDigest(last)
		if err != nil {
			return target{}, err
		}

		t.hex = hex
	}

	return t, nil
}

// cutLast splits s at its last slash; both sides must be non-empty.
func cutLast(s string) (string, string, bool) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 || i == len(s)-1 {
		return "", "", false
	}

	return s[:i], s[i+1:], true
}
