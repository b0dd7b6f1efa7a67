package httpd

import (
	"fmt"
	"net/url"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
)

// registryMirror is the Talos document that sends a machine's pulls from the installer image's registry to
// this edge's registry at base (http://host[:port], as the machine reached this edge); under UpstreamNever
// the machine never falls back to the registry itself.
func registryMirror(installer, base string, rule UpstreamRule) ([]byte, error) {
	ref, err := name.ParseReference(installer)
	if err != nil {
		return nil, fmt.Errorf("installer image %q: %w", installer, err)
	}

	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("edge url %q: %w", base, err)
	}

	doc := cri.NewRegistryMirrorConfigV1Alpha1(ref.Context().RegistryStr())
	doc.RegistryEndpoints = []cri.RegistryEndpoint{{EndpointURL: meta.URL{URL: u}}}

	if rule == UpstreamNever {
		skip := true
		doc.RegistrySkipFallback = &skip
	}

	out, err := encoder.NewEncoder(doc, encoder.WithComments(encoder.CommentsDisabled)).Encode()
	if err != nil {
		return nil, fmt.Errorf("registry mirror document: %w", err)
	}

	return out, nil
}
