package image

import "bytes"

// KubernetesManifest returns the Kubernetes manifest as committed (embedded).
func KubernetesManifest() []byte { return bytes.Clone(kubernetesManifest) }
