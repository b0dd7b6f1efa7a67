package image

import (
	"bytes"
	_ "embed" // the systemd unit and the Kubernetes manifest
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// The controller's deployment files, kept as files in the repository (image/controller/) so that they can be
// read and used without building anything, and embedded so that `make image` ships them beside the image.
const (
	// ControllerUnitFile is the systemd unit, relative to this package.
	ControllerUnitFile = "controller/outpost-controller.service"
	// KubernetesManifestFile is the Kubernetes manifest, relative to this package.
	KubernetesManifestFile = "controller/kubernetes.yaml"
	// manifestImage is the image line of the manifest as committed: the name BuildController gives the image
	// with make's fallback version.
	manifestImage = "image: " + ControllerImageName + ":dev"
)

//go:embed controller/outpost-controller.service
var controllerUnit []byte

//go:embed controller/kubernetes.yaml
var kubernetesManifest []byte

// ControllerUnit returns the systemd unit.
func ControllerUnit() []byte { return bytes.Clone(controllerUnit) }

// RenderKubernetesManifest returns the Kubernetes manifest with the controller's image set to ref, the name the
// image was pushed under (a registry's name for it, or outpost-controller:<version> for a cluster that has the
// image loaded already).
func RenderKubernetesManifest(ref string) ([]byte, error) {
	if _, err := name.ParseReference(ref); err != nil {
		return nil, fmt.Errorf("controller image %q: %w", ref, err)
	}

	// A name without a tag or digest would pull whatever is "latest" when the pod starts.
	if last := ref[strings.LastIndex(ref, "/")+1:]; !strings.ContainsAny(last, ":@") {
		return nil, fmt.Errorf("controller image %q: give a tag or a digest", ref)
	}

	if n := bytes.Count(kubernetesManifest, []byte(manifestImage+"\n")); n != 1 {
		return nil, fmt.Errorf("kubernetes manifest: %d lines %q, want one", n, manifestImage)
	}

	return bytes.Replace(kubernetesManifest, []byte(manifestImage+"\n"), []byte("image: "+ref+"\n"), 1), nil
}
