package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
)

// Manifest media types served (OCI image spec v1.1 "Media Types"; Docker image manifest v2, schema 2).
// Docker schema 1 and anything else are not served.
const (
	MediaTypeOCIManifest  = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeOCIIndex     = "application/vnd.oci.image.index.v1+json"
	MediaTypeDockerV2     = "application/vnd.docker.distribution.manifest.v2+json"
	MediaTypeDockerV2List = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// MaxManifestBytes bounds the manifests served: the distribution spec lets registries refuse larger ones,
// and containerd refuses them too. Larger content is never read.
const MaxManifestBytes = 4 << 20

// errNotManifest: the content is not a manifest or index this registry serves.
var errNotManifest = errors.New("not an image manifest or index")

// mediaTypeOf returns the media type of a manifest or index: its own mediaType field, or when that is absent
// (the OCI spec makes it optional) an index if it lists manifests and an image manifest if it has a config
// and layers.
func mediaTypeOf(data []byte) (string, error) {
	var m struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     string          `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
		Layers        json.RawMessage `json:"layers"`
	}

	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("%w: %w", errNotManifest, err)
	}

	if m.SchemaVersion != 2 {
		return "", fmt.Errorf("%w: schema version %d", errNotManifest, m.SchemaVersion)
	}

	switch m.MediaType {
	case MediaTypeOCIManifest, MediaTypeOCIIndex, MediaTypeDockerV2, MediaTypeDockerV2List:
		return m.MediaType, nil
	case "":
		switch {
		case m.Manifests != nil && m.Config == nil:
			return MediaTypeOCIIndex, nil
		case m.Config != nil && m.Layers != nil && m.Manifests == nil:
			return MediaTypeOCIManifest, nil
		}

		return "", fmt.Errorf("%w: no media type, and neither an index nor a manifest", errNotManifest)
	default:
		return "", fmt.Errorf("%w: media type %q", errNotManifest, m.MediaType)
	}
}

// accepts reports whether a request's Accept headers admit mediaType: no Accept header (or none that
// parses) admits anything, as do "*/*" and "application/*"; parameters (q=0 included) are not weighed.
func accepts(values []string, mediaType string) bool {
	parsed := false

	for _, v := range values {
		for item := range strings.SplitSeq(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(item))
			if err != nil {
				continue
			}

			parsed = true

			if mt == mediaType || mt == "*/*" || mt == "application/*" {
				return true
			}
		}
	}

	return !parsed
}
