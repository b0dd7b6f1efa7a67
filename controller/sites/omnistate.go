package sites

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/controller/seal"
)

// Sealer seals and opens the CA's key (controller/seal's Box, with the key derived from the provider's
// service-account key: every controller of the provider has it, a reader of the provider's namespace does not).
type Sealer interface {
	Seal(v string) (string, error)
	Open(v string) (string, error)
}

// CASealPurpose is the purpose the CA key's sealing key is derived for (seal.KeyFromServiceAccount).
const CASealPurpose = "enrollment ca"

// CAOrigin says where LoadOrCreateSharedCA found the CA.
type CAOrigin string

// The origins of a shared CA.
const (
	CAFromOmni     CAOrigin = "omni"     // kept in Omni already
	CAImported     CAOrigin = "imported" // taken from the state directory of a controller that kept it there
	CACreated      CAOrigin = "created"  // new: neither Omni nor the state directory had one
	CAFromConflict CAOrigin = "omni (another controller created it at the same moment)"
)

// ErrCASchema means Omni holds a CA record written by a newer controller: it is neither used nor replaced.
var ErrCASchema = errors.New("enrollment CA record from a newer controller")

// LoadOrCreateSharedCA returns the enrollment CA kept in Omni (st, the provider's types) with its key sealed by
// box, so that every controller of the provider, moved, rebuilt or standing by, signs and checks edge
// certificates with the same CA and join tokens keep their pinned fingerprint. When Omni holds none, the CA in
// dir (where a controller kept it before) is imported, so edges enrolled then need nothing new; with none there
// either, a CA is created. Two controllers starting at once agree on one: the second create conflicts, and the
// loser loads the winner's.
func LoadOrCreateSharedCA(ctx context.Context, st state.State, types resources.Types, box Sealer, dir string,
	now time.Time,
) (*CA, CAOrigin, error) {
	ca, err := loadSharedCA(ctx, st, types, box)
	if err == nil {
		return ca, CAFromOmni, nil
	}

	if !state.IsNotFoundError(err) {
		return nil, "", err
	}

	origin := CAImported

	ca, certPEM, keyPEM, err := readCAFiles(dir)

	switch {
	case errors.Is(err, os.ErrNotExist):
		origin = CACreated

		ca, certPEM, keyPEM, err = NewCA(now)
		if err != nil {
			return nil, "", err
		}
	case err != nil:
		return nil, "", err
	}

	sealed, err := box.Seal(string(keyPEM))
	if err != nil {
		return nil, "", fmt.Errorf("seal enrollment CA key: %w", err)
	}

	rec := types.NewEnrollmentCA(resources.EnrollmentCAID)
	rec.TypedSpec().Value = &specs.EnrollmentCASpec{
		CertificatePem: certPEM, SealedKey: sealed, Created: timestamppb.New(now), Schema: resources.EnrollmentCASchema,
	}

	if err := st.Create(ctx, rec); err != nil {
		if !state.IsConflictError(err) {
			return nil, "", fmt.Errorf("keep enrollment CA in omni: %w", err)
		}

		winner, lerr := loadSharedCA(ctx, st, types, box)
		if lerr != nil {
			return nil, "", lerr
		}

		return winner, CAFromConflict, nil
	}

	return ca, origin, nil
}

// loadSharedCA reads and opens the CA record; a state.NotFound error when there is none.
func loadSharedCA(ctx context.Context, st state.State, types resources.Types, box Sealer) (*CA, error) {
	rec, err := safe.StateGet[*resources.EnrollmentCA](ctx, st, types.NewEnrollmentCA(resources.EnrollmentCAID).Metadata())
	if err != nil {
		if state.IsNotFoundError(err) {
			return nil, err
		}

		return nil, fmt.Errorf("read enrollment CA from omni: %w", err)
	}

	spec := rec.TypedSpec().Value
	if spec.GetSchema() > resources.EnrollmentCASchema {
		return nil, fmt.Errorf("%w (schema %d, this controller knows %d): upgrade this controller", ErrCASchema,
			spec.GetSchema(), resources.EnrollmentCASchema)
	}

	if !seal.Sealed(spec.GetSealedKey()) {
		return nil, errors.New("enrollment CA in omni: its key is not sealed: refusing a CA whose key every reader of the provider's namespace has seen")
	}

	keyPEM, err := box.Open(spec.GetSealedKey())
	if err != nil {
		if errors.Is(err, seal.ErrOpen) {
			return nil, fmt.Errorf("enrollment CA in omni: %w (was the controller given another provider's service-account key?)", err)
		}

		return nil, fmt.Errorf("enrollment CA in omni: %w", err)
	}

	ca, err := parseCA(spec.GetCertificatePem(), []byte(keyPEM))
	if err != nil {
		return nil, fmt.Errorf("enrollment CA in omni: %w", err)
	}

	return ca, nil
}

// readCAFiles reads the CA a controller kept in dir; an error wrapping os.ErrNotExist when there is none.
func readCAFiles(dir string) (*CA, []byte, []byte, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read CA certificate: %w", err)
	}

	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read CA key: %w", err)
	}

	ca, err := parseCA(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load CA from %s: %w", dir, err)
	}

	return ca, certPEM, keyPEM, nil
}

// parseCA makes a CA of a PEM certificate and key.
func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}

	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("the CA key cannot sign")
	}

	if !pair.Leaf.IsCA {
		return nil, errors.New("the certificate is not a CA certificate")
	}

	return &CA{cert: pair.Leaf, key: signer}, nil
}

// ImportSites copies into to every site of from that to does not hold: the sites a controller kept in its state
// directory, taken to Omni once, so that nothing an operator created is lost when the controller moves its
// state there. A site to holds already is left as it is (to is the truth once it has the site). It returns how
// many it copied.
func ImportSites(ctx context.Context, from, to *Registry, log *zap.Logger) (int, error) {
	local, err := from.List(ctx)
	if err != nil {
		return 0, err
	}

	copied := 0

	for _, site := range local {
		id := site.Metadata().ID()

		if _, err := to.Get(ctx, id); err == nil {
			continue
		} else if !errors.Is(err, ErrUnknownSite) {
			return copied, err
		}

		rec := to.kind.New(id)
		rec.TypedSpec().Value = proto.Clone(site.TypedSpec().Value).(*specs.SiteSpec) // Clone keeps the type

		if err := to.st.Create(ctx, rec); err != nil && !state.IsConflictError(err) {
			return copied, fmt.Errorf("import site %s: %w", id, err)
		}

		copied++

		log.Info("site imported from the state directory", zap.String("site", id))
	}

	return copied, nil
}
