// Package assetbundle is the format of boot-asset bundles, for sites reached only by hand: a directory (or a
// tar of one) holding each asset once under its SHA-256 and a manifest listing every logical name with its
// size and digest, written last. The controller writes them from what it holds (controller assets bundle),
// an operator from files at hand (edge assets bundle), and the edge imports them (edge assets import).
package assetbundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"path/filepath"
)

// ManifestName is the file at the root of an import directory or tarball that lists its assets.
const ManifestName = "outpost-assets.json"

// ErrTraversal: an import names a path outside the bundle (absolute, "..", a link).
var ErrTraversal = errors.New("path escapes the import bundle")

// Manifest is the manifest of an import directory or tarball (outpost-assets.json).
type Manifest struct {
	Version int `json:"version"`
	// Controller is the SHA-256 (hex) of the CA of the controller that made the bundle (controller assets
	// bundle); empty for a bundle made by hand (edge assets bundle). An enrolled edge refuses a bundle of
	// another controller.
	Controller string  `json:"controller,omitempty"`
	Assets     []Asset `json:"assets"`
}

// Asset is one asset of a bundle: Path is relative to the bundle root.
type Asset struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Path   string `json:"path"`
}

// Parse decodes and checks a bundle manifest.
func Parse(data []byte) (Manifest, error) {
	var b Manifest

	if err := json.Unmarshal(data, &b); err != nil {
		return Manifest{}, fmt.Errorf("decode %s: %w", ManifestName, err)
	}

	if b.Version != 1 {
		return Manifest{}, fmt.Errorf("%s: version %d, want 1", ManifestName, b.Version)
	}

	for _, a := range b.Assets {
		if err := ValidateName(a.Name); err != nil {
			return Manifest{}, fmt.Errorf("%s: %w", ManifestName, err)
		}

		if err := ValidateDigest(a.SHA256); err != nil {
			return Manifest{}, fmt.Errorf("%s: asset %s: %w", ManifestName, a.Name, err)
		}

		if a.Size < 0 {
			return Manifest{}, fmt.Errorf("%s: asset %s: negative size %d", ManifestName, a.Name, a.Size)
		}

		if _, err := CleanPath(a.Path); err != nil {
			return Manifest{}, fmt.Errorf("%s: asset %s: %w", ManifestName, a.Name, err)
		}
	}

	if b.Controller != "" && ValidateDigest(b.Controller) != nil {
		return Manifest{}, fmt.Errorf("%s: controller %q is not a CA fingerprint", ManifestName, b.Controller)
	}

	return b, nil
}

// CleanPath cleans a path inside a bundle and refuses anything that could leave it.
func CleanPath(p string) (string, error) {
	clean := path.Clean(p)
	if p == "" || !filepath.IsLocal(clean) || clean == "." {
		return "", fmt.Errorf("%w: %q", ErrTraversal, p)
	}

	return clean, nil
}
