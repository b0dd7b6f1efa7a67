package omni

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/runtime"
	"github.com/siderolabs/talos/pkg/machinery/config/types/siderolink"
)

// MaxExtraDocumentsSize bounds the operator's extra documents: the edge serves them to every machine that boots
// into agent mode, and Talos reads them before it has anything but memory.
const MaxExtraDocumentsSize = 64 << 10

// ExtraDocuments are Talos configuration documents an operator adds to what machines in agent mode get at
// /config, beside Omni's join config: what a site needs before the agent can reach Omni (a static address or a
// VLAN link, resolvers, time servers, a registry mirror). The zero value adds nothing.
type ExtraDocuments struct {
	text string
	// kinds are the documents' "kind/name", for logs.
	kinds []string
}

// Empty reports whether there is nothing to add.
func (d ExtraDocuments) Empty() bool { return d.text == "" }

// Kinds lists the documents as kind or kind/name.
func (d ExtraDocuments) Kinds() []string { return d.kinds }

// omniKinds are the documents Omni's join config carries: a second one would conflict with Omni's. (A
// TrustedRootsConfig is fine under a name other than the controller's own, outpost-ca.)
var omniKinds = map[string]bool{
	siderolink.Kind:       true,
	runtime.EventSinkKind: true,
	runtime.KmsgLogKind:   true,
}

// LoadExtraDocuments reads and checks the documents in the file at path (see ParseExtraDocuments).
func LoadExtraDocuments(path string) (ExtraDocuments, error) {
	f, err := os.Open(path)
	if err != nil {
		return ExtraDocuments{}, fmt.Errorf("extra machine-config documents: %w", err)
	}
	defer f.Close() //nolint:errcheck

	data, err := io.ReadAll(io.LimitReader(f, MaxExtraDocumentsSize+1))
	if err != nil {
		return ExtraDocuments{}, fmt.Errorf("extra machine-config documents: read %s: %w", path, err)
	}

	d, err := ParseExtraDocuments(data)
	if err != nil {
		return ExtraDocuments{}, fmt.Errorf("extra machine-config documents in %s: %w", path, err)
	}

	return d, nil
}

// ParseExtraDocuments loads Talos multi-documents with machinery's loader and validates each. Refused: more than
// MaxExtraDocumentsSize, a v1alpha1 machine configuration (Omni gives a machine its configuration when it is
// allocated; in agent mode it must not get one), and the kinds Omni's join config carries already
// (SideroLinkConfig, EventSinkConfig, KmsgLogConfig).
func ParseExtraDocuments(data []byte) (ExtraDocuments, error) {
	if len(data) > MaxExtraDocumentsSize {
		return ExtraDocuments{}, fmt.Errorf("more than %d bytes", MaxExtraDocumentsSize)
	}

	if len(bytes.TrimSpace(data)) == 0 {
		return ExtraDocuments{}, errors.New("no documents")
	}

	prov, err := configloader.NewFromBytes(data)
	if err != nil {
		return ExtraDocuments{}, fmt.Errorf("load: %w", err)
	}

	if prov.RawV1Alpha1() != nil {
		return ExtraDocuments{}, errors.New("a v1alpha1 machine configuration cannot be added: Omni gives a machine " +
			"its configuration when it is allocated (use multi-documents such as LinkConfig, ResolverConfig, TimeSyncConfig)")
	}

	var kinds []string

	for _, doc := range prov.Documents() {
		id := docID(doc)
		if omniKinds[doc.Kind()] {
			return ExtraDocuments{}, fmt.Errorf("%s: Omni's join config has this document already", id)
		}

		kinds = append(kinds, id)
	}

	if _, err := prov.ValidateAsClient(agentMode{}); err != nil {
		return ExtraDocuments{}, fmt.Errorf("validate: %w", err)
	}

	text, err := prov.EncodeString(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return ExtraDocuments{}, fmt.Errorf("encode: %w", err)
	}

	return ExtraDocuments{text: strings.TrimSpace(text), kinds: kinds}, nil
}

// CheckSiteDocuments checks a site's own documents (ParseExtraDocuments) and that they fit beside the
// provider's, d: machinery refuses two documents that conflict, as it would when a machine reads them.
func (d ExtraDocuments) CheckSiteDocuments(site []byte) error {
	docs, err := ParseExtraDocuments(site)
	if err != nil {
		return err
	}

	if d.Empty() {
		return nil
	}

	if _, err := configloader.NewFromBytes([]byte(joinDocuments(d.text, docs.text))); err != nil {
		return fmt.Errorf("they do not fit beside the provider's own (--extra-machine-config-file): %w", err)
	}

	return nil
}

// appendTo returns the join config's documents followed by the extra ones, checked together by machinery (two
// documents that conflict are refused): the error says so, and the caller serves the join config alone.
func (d ExtraDocuments) appendTo(docs string) (string, error) {
	if d.Empty() {
		return docs, nil
	}

	merged := joinDocuments(docs, d.text)

	if _, err := configloader.NewFromBytes([]byte(merged)); err != nil {
		return "", fmt.Errorf("extra machine-config documents do not fit with Omni's join config: %w", err)
	}

	return merged, nil
}

func docID(doc config.Document) string {
	if named, ok := doc.(config.NamedDocument); ok && named.Name() != "" {
		return doc.Kind() + "/" + named.Name()
	}

	return doc.Kind()
}

// agentMode is the runtime the documents are validated for: a bare-metal machine in agent mode, running from
// memory, not installed.
type agentMode struct{}

func (agentMode) String() string        { return "metal" }
func (agentMode) RequiresInstall() bool { return false }
func (agentMode) InContainer() bool     { return false }

// joinDocuments is two multi-document texts as one (what machines and machinery read).
func joinDocuments(first, second string) string {
	return strings.TrimSpace(first) + "\n---\n" + strings.TrimSpace(second) + "\n"
}
