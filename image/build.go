package image

import (
	"fmt"
	"os"
	"path/filepath"
)

// Outputs names what Build wrote.
type Outputs struct {
	ExtensionDir string
	OCILayout    string
	OCIArchive   string
	Patch        string
}

// Build writes every appliance artifact under outDir: extension/ (the system extension tree), oci/ (the same
// as an OCI image layout), outpost-edge.oci.tar (the layout as an archive) and, when patch is not nil,
// machine-config-patch.yaml.
func Build(c Config, patch *PatchConfig, outDir string) (Outputs, error) {
	out := Outputs{
		ExtensionDir: filepath.Join(outDir, "extension"),
		OCILayout:    filepath.Join(outDir, "oci"),
		OCIArchive:   filepath.Join(outDir, ServiceName+".oci.tar"),
	}

	if err := os.RemoveAll(out.ExtensionDir); err != nil {
		return out, fmt.Errorf("clear %s: %w", out.ExtensionDir, err)
	}

	if err := WriteExtension(c, out.ExtensionDir); err != nil {
		return out, err
	}

	tmp, err := os.MkdirTemp(outDir, ".build-*")
	if err != nil {
		return out, fmt.Errorf("create build directory: %w", err)
	}
	defer os.RemoveAll(tmp) //nolint:errcheck

	img, err := BuildOCI(c, out.ExtensionDir, tmp)
	if err != nil {
		return out, err
	}

	if err := WriteOCILayout(img, out.OCILayout, ServiceName+":"+c.Version); err != nil {
		return out, err
	}

	if err := WriteOCIArchive(out.OCILayout, out.OCIArchive); err != nil {
		return out, fmt.Errorf("write OCI archive: %w", err)
	}

	if patch != nil {
		data, err := MachineConfigPatch(*patch)
		if err != nil {
			return out, err
		}

		out.Patch = filepath.Join(outDir, "machine-config-patch.yaml")
		if err := os.WriteFile(out.Patch, data, 0o600); err != nil {
			return out, fmt.Errorf("write machine config patch: %w", err)
		}
	}

	return out, nil
}
