package image_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/outpost-metal/outpost/image"
)

// unitOptions parses the unit into section -> name -> values (a name given twice keeps both, in order).
func unitOptions(t *testing.T, data []byte) map[string]map[string][]string {
	t.Helper()

	opts, err := unit.DeserializeOptions(bytes.NewReader(data))
	require.NoError(t, err)

	out := map[string]map[string][]string{}

	for _, o := range opts {
		if out[o.Section] == nil {
			out[o.Section] = map[string][]string{}
		}

		out[o.Section][o.Name] = append(out[o.Section][o.Name], o.Value)
	}

	return out
}

// unitEnvironment returns the variables the unit's Environment= lines set.
func unitEnvironment(t *testing.T, svc map[string][]string) map[string]string {
	t.Helper()

	env := map[string]string{}

	for _, line := range svc["Environment"] {
		for _, kv := range strings.Fields(line) {
			k, v, ok := strings.Cut(kv, "=")
			require.True(t, ok, "Environment=%s", line)

			env[k] = v
		}
	}

	return env
}

func TestControllerUnit(t *testing.T) {
	t.Parallel()

	data := image.ControllerUnit()
	onDisk, err := os.ReadFile(image.ControllerUnitFile)
	require.NoError(t, err)
	require.Equal(t, onDisk, data, "embedded unit differs from the file")

	opts := unitOptions(t, data)
	svc := opts["Service"]
	require.NotNil(t, svc, "no [Service] section")

	single := func(name string) string {
		t.Helper()
		require.Len(t, svc[name], 1, "%s= given %d times", name, len(svc[name]))

		return svc[name][0]
	}

	require.Equal(t, image.ControllerBinary, single("ExecStart"), "the unit runs the binary where the image has it")
	require.Equal(t, "on-failure", single("Restart"))
	require.Equal(t, "yes", single("DynamicUser"))
	require.Equal(t, "0700", single("StateDirectoryMode"))
	require.Equal(t, image.ControllerStateDir, "/var/lib/"+single("StateDirectory"), "StateDirectory= is where the controller keeps its state")
	require.True(t, strings.HasPrefix(single("EnvironmentFile"), "-/etc/"), "the settings and the Omni key come from an optional file under /etc")

	for name, want := range map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"PrivateDevices": "yes", "CapabilityBoundingSet": "", "RestrictNamespaces": "yes", "MemoryDenyWriteExecute": "yes",
	} {
		require.Equal(t, want, single(name), "%s=", name)
	}

	env := unitEnvironment(t, svc)
	require.Equal(t, image.ControllerStateDir, env[image.EnvControllerStateDir])
	require.Equal(t, ":"+strconv.Itoa(image.ControllerUplinkPort), env[image.EnvControllerUplinkListen])
	require.True(t, strings.HasSuffix(env[image.EnvControllerHTTPListen], ":"+strconv.Itoa(image.ControllerHTTPPort)))
	require.NotContains(t, env, image.EnvOmniServiceAccountKey, "the key belongs in the environment file, not the unit")

	require.Equal(t, []string{"multi-user.target"}, opts["Install"]["WantedBy"])
	require.Contains(t, opts["Unit"]["After"], "network-online.target")
}

// systemdAnalyze runs `systemd-analyze verify` and `security --offline` on unit (ExecStart pointed at an
// executable that exists here, which verify insists on) and returns what they objected to.
func systemdAnalyze(t *testing.T, data []byte) []string {
	t.Helper()

	self, err := os.Executable()
	require.NoError(t, err)

	data = bytes.Replace(data, []byte("ExecStart="+image.ControllerBinary), []byte("ExecStart="+self), 1)
	path := filepath.Join(t.TempDir(), "outpost-controller.service")
	require.NoError(t, os.WriteFile(path, data, 0o644))

	var problems []string

	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil {
		problems = append(problems, "verify: "+err.Error())
	}

	// verify exits 0 on unknown keys and bad values and only says so; every line about the unit is a problem
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, path) {
			problems = append(problems, "verify: "+strings.TrimSpace(line))
		}
	}

	// --threshold is the exposure level times ten (systemd 252: 1.2 for this unit)
	out, err = exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=20", "--no-pager", path).CombinedOutput()
	if err != nil {
		problems = append(problems, "security: exposure above 2.0: "+lastLine(string(out)))
	}

	return problems
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")

	return lines[len(lines)-1]
}

func TestControllerUnitSystemdAnalyze(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skipf("systemd-analyze is not installed (Debian's systemd package): %v", err)
	}

	require.Empty(t, systemdAnalyze(t, image.ControllerUnit()))

	// the check can fail: a misspelt key and a unit without hardening are both reported
	bad := bytes.Replace(image.ControllerUnit(), []byte("Restart=on-failure"), []byte("Restrat=on-failure"), 1)
	require.NotEmpty(t, systemdAnalyze(t, bad), "a misspelt key passes")

	bare := []byte("[Service]\nExecStart=" + image.ControllerBinary + "\n")
	require.NotEmpty(t, systemdAnalyze(t, bare), "an unhardened unit passes")
}

// k8sObjects are the manifest's objects by kind.
type k8sObjects struct {
	namespaces      []corev1.Namespace
	serviceAccounts []corev1.ServiceAccount
	configMaps      []corev1.ConfigMap
	claims          []corev1.PersistentVolumeClaim
	deployments     []appsv1.Deployment
	services        []corev1.Service
}

// decodeManifest decodes every document of a manifest strictly into the Kubernetes API type of its kind: an
// unknown field, a kind not expected here or a value of the wrong type is an error.
func decodeManifest(data []byte) (k8sObjects, error) {
	var objs k8sObjects

	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))

	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}

		if err != nil {
			return objs, err
		}

		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return objs, err
		}

		if tm.Kind == "" && len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}

		var (
			target  any
			version string
		)

		switch tm.Kind {
		case "Namespace":
			objs.namespaces = append(objs.namespaces, corev1.Namespace{})
			target, version = &objs.namespaces[len(objs.namespaces)-1], "v1"
		case "ServiceAccount":
			objs.serviceAccounts = append(objs.serviceAccounts, corev1.ServiceAccount{})
			target, version = &objs.serviceAccounts[len(objs.serviceAccounts)-1], "v1"
		case "ConfigMap":
			objs.configMaps = append(objs.configMaps, corev1.ConfigMap{})
			target, version = &objs.configMaps[len(objs.configMaps)-1], "v1"
		case "PersistentVolumeClaim":
			objs.claims = append(objs.claims, corev1.PersistentVolumeClaim{})
			target, version = &objs.claims[len(objs.claims)-1], "v1"
		case "Deployment":
			objs.deployments = append(objs.deployments, appsv1.Deployment{})
			target, version = &objs.deployments[len(objs.deployments)-1], "apps/v1"
		case "Service":
			objs.services = append(objs.services, corev1.Service{})
			target, version = &objs.services[len(objs.services)-1], "v1"
		default:
			return objs, errors.New("unexpected kind " + strconv.Quote(tm.Kind))
		}

		if tm.APIVersion != version {
			return objs, errors.New(tm.Kind + ": apiVersion " + strconv.Quote(tm.APIVersion) + ", want " + version)
		}

		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			return objs, errors.New(tm.Kind + ": " + err.Error())
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []byte

	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}

	return out
}

// containerPort returns the port a probe or Service names (by name or number) on the container.
func containerPort(t *testing.T, c corev1.Container, name string, number int32) int32 {
	t.Helper()

	for _, p := range c.Ports {
		if (name != "" && p.Name == name) || (name == "" && p.ContainerPort == number) {
			return p.ContainerPort
		}
	}

	t.Fatalf("container %s has no port %q/%d", c.Name, name, number)

	return 0
}

// manifestEnvNames returns the variables the manifest gives the controller (ConfigMap keys and env).
func manifestEnvNames(objs k8sObjects) []string {
	var names []string

	for _, cm := range objs.configMaps {
		for k := range cm.Data {
			names = append(names, k)
		}
	}

	for _, d := range objs.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				names = append(names, e.Name)
			}
		}
	}

	return names
}

func TestKubernetesManifest(t *testing.T) {
	t.Parallel()

	onDisk, err := os.ReadFile(image.KubernetesManifestFile)
	require.NoError(t, err)
	require.Equal(t, onDisk, image.KubernetesManifest(), "embedded manifest differs from the file")

	objs, err := decodeManifest(image.KubernetesManifest())
	require.NoError(t, err)

	require.Len(t, objs.namespaces, 1)
	ns := objs.namespaces[0].Name
	require.Len(t, objs.serviceAccounts, 1)
	require.Len(t, objs.configMaps, 1)
	require.Len(t, objs.claims, 1)
	require.Len(t, objs.deployments, 1)
	require.Len(t, objs.services, 2)

	for _, m := range []metav1.ObjectMeta{
		objs.serviceAccounts[0].ObjectMeta, objs.configMaps[0].ObjectMeta, objs.claims[0].ObjectMeta,
		objs.deployments[0].ObjectMeta, objs.services[0].ObjectMeta, objs.services[1].ObjectMeta,
	} {
		require.Equal(t, ns, m.Namespace, "%s is not in the manifest's namespace", m.Name)
	}

	d := objs.deployments[0]
	require.NotNil(t, d.Spec.Replicas)
	require.EqualValues(t, 1, *d.Spec.Replicas, "two controllers against one Omni: the controller takes no lease yet and its sites and CA are on the volume")
	require.Equal(t, appsv1.RecreateDeploymentStrategyType, d.Spec.Strategy.Type, "a rolling update runs two at once")

	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	require.NoError(t, err)
	require.True(t, sel.Matches(labels.Set(d.Spec.Template.Labels)), "the Deployment's selector does not match its pods")

	pod := d.Spec.Template.Spec
	require.Equal(t, objs.serviceAccounts[0].Name, pod.ServiceAccountName)
	require.NotNil(t, pod.EnableServiceLinks)
	require.False(t, *pod.EnableServiceLinks, "service links put OUTPOST_CONTROLLER_* variables into the controller's environment")
	require.NotNil(t, pod.SecurityContext)
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.EqualValues(t, image.ControllerUID, *pod.SecurityContext.RunAsUser)
	require.EqualValues(t, image.ControllerGID, *pod.SecurityContext.FSGroup, "the state volume must be writable by the controller's group")

	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]

	// the image is the one make image builds: outpost-controller:<tag>, from whatever registry
	repo, tag, ok := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
	require.True(t, ok, "image %q has no tag", c.Image)
	require.Equal(t, image.ControllerImageName, repo)
	require.NotEmpty(t, tag)
	require.Empty(t, c.Command, "the image's entrypoint runs the controller")

	require.Equal(t, image.ControllerUplinkPort, int(containerPort(t, c, "uplink", 0)))
	require.Equal(t, image.ControllerHTTPPort, int(containerPort(t, c, "http", 0)))

	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		require.NotNil(t, p, "%s probe", name)
		require.NotNil(t, p.HTTPGet, "%s probe is not an HTTP GET", name)
		require.Equal(t, "/healthz", p.HTTPGet.Path, "%s probe", name)
		require.Equal(t, image.ControllerHTTPPort, int(containerPort(t, c, p.HTTPGet.Port.StrVal, p.HTTPGet.Port.IntVal)), "%s probe port", name)
	}

	require.NotNil(t, c.SecurityContext)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)

	// the key comes from a Secret, under the name the controller reads
	var key *corev1.EnvVar

	for i := range c.Env {
		if c.Env[i].Name == image.EnvOmniServiceAccountKey {
			key = &c.Env[i]
		}
	}

	require.NotNil(t, key, "no %s", image.EnvOmniServiceAccountKey)
	require.Empty(t, key.Value, "the key is written into the manifest")
	require.NotNil(t, key.ValueFrom)
	require.NotNil(t, key.ValueFrom.SecretKeyRef, "the key does not come from a Secret")
	require.NotEmpty(t, key.ValueFrom.SecretKeyRef.Name)

	require.Len(t, c.EnvFrom, 1)
	require.Equal(t, objs.configMaps[0].Name, c.EnvFrom[0].ConfigMapRef.Name)
	require.Contains(t, objs.configMaps[0].Data, image.EnvOmniEndpoint)

	// the state directory is on the claim, which is ReadWriteOnce
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}

	var stateClaim string

	for _, m := range c.VolumeMounts {
		if m.MountPath == image.ControllerStateDir {
			require.NotNil(t, volumes[m.Name].PersistentVolumeClaim, "the state directory is not on a persistent volume")
			stateClaim = volumes[m.Name].PersistentVolumeClaim.ClaimName
		}
	}

	require.Equal(t, objs.claims[0].Name, stateClaim, "the state directory is not mounted from the manifest's claim")
	require.Equal(t, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, objs.claims[0].Spec.AccessModes)

	// one Service carries the uplink, the other the HTTP port; both select the pods
	servicePorts := map[int32]bool{}

	for _, s := range objs.services {
		require.True(t, labelsContain(d.Spec.Template.Labels, s.Spec.Selector), "Service %s does not select the controller's pods", s.Name)

		for _, p := range s.Spec.Ports {
			target := containerPort(t, c, p.TargetPort.StrVal, p.TargetPort.IntVal)
			require.Equal(t, p.Port, target, "Service %s port %d", s.Name, p.Port)
			servicePorts[target] = true
		}
	}

	require.Equal(t, map[int32]bool{image.ControllerUplinkPort: true, image.ControllerHTTPPort: true}, servicePorts)
}

// labelsContain reports whether a non-empty selector sub matches labels.
func labelsContain(set, sub map[string]string) bool {
	for k, v := range sub {
		if set[k] != v {
			return false
		}
	}

	return len(sub) > 0
}

func TestKubernetesManifestStrict(t *testing.T) {
	t.Parallel()

	m := image.KubernetesManifest()

	for name, bad := range map[string][]byte{
		"unknown field": bytes.Replace(m, []byte("  replicas: 1\n"), []byte("  replicas: 1\n  replica: 2\n"), 1),
		"wrong type":    bytes.Replace(m, []byte("  replicas: 1\n"), []byte("  replicas: one\n"), 1),
		"unknown kind":  append(bytes.Clone(m), []byte("---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n")...),
		"wrong version": bytes.Replace(m, []byte("apiVersion: apps/v1\n"), []byte("apiVersion: apps/v1beta1\n"), 1),
	} {
		require.NotEqual(t, m, bad, name)

		_, err := decodeManifest(bad)
		require.Error(t, err, name)
	}
}

func TestRenderKubernetesManifest(t *testing.T) {
	t.Parallel()

	for _, ref := range []string{"registry.example.test/outpost/outpost-controller:v1.2.3", "outpost-controller:v0.1.0"} {
		out, err := image.RenderKubernetesManifest(ref)
		require.NoError(t, err, ref)

		objs, err := decodeManifest(out)
		require.NoError(t, err, ref)
		require.Equal(t, ref, objs.deployments[0].Spec.Template.Spec.Containers[0].Image)
	}

	for ref, want := range map[string]string{
		"outpost-controller":        "give a tag or a digest",
		"registry.test:5000/o/c":    "give a tag or a digest",
		"outpost controller:v1":     "controller image",
		"outpost-controller:v1\nx:": "controller image",
	} {
		_, err := image.RenderKubernetesManifest(ref)
		require.ErrorContains(t, err, want, ref)
	}
}
