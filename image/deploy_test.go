package image_test

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/outpost-metal/outpost/controller/status"
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
	deployments     []appsv1.Deployment
	services        []corev1.Service
	budgets         []policyv1.PodDisruptionBudget
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
		case "PodDisruptionBudget":
			objs.budgets = append(objs.budgets, policyv1.PodDisruptionBudget{})
			target, version = &objs.budgets[len(objs.budgets)-1], "policy/v1"
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

// httpAccessVars are the variables that give the controller's HTTP listener its token and TLS certificate,
// which it needs off loopback.
var httpAccessVars = []string{"OUTPOST_HTTP_TOKEN_FILE", "OUTPOST_HTTP_TLS_CERT", "OUTPOST_HTTP_TLS_KEY"}

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
	require.Len(t, objs.deployments, 1)
	require.Len(t, objs.services, 2)
	require.Len(t, objs.budgets, 1)

	for _, m := range []metav1.ObjectMeta{
		objs.serviceAccounts[0].ObjectMeta, objs.configMaps[0].ObjectMeta, objs.deployments[0].ObjectMeta,
		objs.services[0].ObjectMeta, objs.services[1].ObjectMeta, objs.budgets[0].ObjectMeta,
	} {
		require.Equal(t, ns, m.Namespace, "%s is not in the manifest's namespace", m.Name)
	}

	// two controllers, one acting and one standing by; a new pod is alive before an old one goes
	d := objs.deployments[0]
	require.NotNil(t, d.Spec.Replicas)
	require.EqualValues(t, 2, *d.Spec.Replicas, "an active controller and a standby")
	require.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, d.Spec.Strategy.Type)
	require.NotNil(t, d.Spec.Strategy.RollingUpdate)
	require.Equal(t, "1", d.Spec.Strategy.RollingUpdate.MaxSurge.String(), "a new pod starts before an old one stops")
	require.Equal(t, "0", d.Spec.Strategy.RollingUpdate.MaxUnavailable.String(), "an old pod stops only once a new one is alive")

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
	require.EqualValues(t, image.ControllerGID, *pod.SecurityContext.FSGroup, "the volumes must be readable and writable by the controller's group")

	// the two are spread over nodes where the cluster can
	require.NotNil(t, pod.Affinity)
	require.NotNil(t, pod.Affinity.PodAntiAffinity, "no pod anti-affinity")

	spread := false

	for _, term := range pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.PodAffinityTerm.LabelSelector)
		require.NoError(t, err)

		if term.PodAffinityTerm.TopologyKey == corev1.LabelHostname && sel.Matches(labels.Set(d.Spec.Template.Labels)) && term.Weight > 0 {
			spread = true
		}
	}

	require.True(t, spread, "no preferred anti-affinity of the controller's pods to each other by node")
	require.Empty(t, pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, "a one-node cluster could not run both")

	// voluntary evictions take one at a time
	pdb := objs.budgets[0]
	require.NotNil(t, pdb.Spec.MinAvailable)
	require.Equal(t, "1", pdb.Spec.MinAvailable.String())
	require.Nil(t, pdb.Spec.MaxUnavailable)
	pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	require.NoError(t, err)
	require.True(t, pdbSel.Matches(labels.Set(d.Spec.Template.Labels)), "the PodDisruptionBudget does not select the controller's pods")

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

	// Every probe asks /healthz, over TLS. Readiness is not /readyz (200 only while acting): Kubernetes counts
	// ready pods for rollouts and disruption budgets, and with a standby never ready a rollout (maxUnavailable
	// 0) would wait forever for a new pod to be ready, and the budget would never let the acting pod be evicted.
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		require.NotNil(t, p, "%s probe", name)
		require.NotNil(t, p.HTTPGet, "%s probe is not an HTTP GET", name)
		require.Equal(t, "/healthz", p.HTTPGet.Path, "%s probe", name)
		require.Equal(t, corev1.URISchemeHTTPS, p.HTTPGet.Scheme, "%s probe: the HTTP listener is off loopback, so TLS", name)
		require.Equal(t, image.ControllerHTTPPort, int(containerPort(t, c, p.HTTPGet.Port.StrVal, p.HTTPGet.Port.IntVal)), "%s probe port", name)
	}

	require.NotNil(t, c.SecurityContext)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}

	// the key comes from a Secret, under the name the controller reads
	key, ok := env[image.EnvOmniServiceAccountKey]
	require.True(t, ok, "no %s", image.EnvOmniServiceAccountKey)
	require.Empty(t, key.Value, "the key is written into the manifest")
	require.NotNil(t, key.ValueFrom)
	require.NotNil(t, key.ValueFrom.SecretKeyRef, "the key does not come from a Secret")
	require.NotEmpty(t, key.ValueFrom.SecretKeyRef.Name)

	require.Len(t, c.EnvFrom, 1)
	require.Equal(t, objs.configMaps[0].Name, c.EnvFrom[0].ConfigMapRef.Name)
	require.Contains(t, objs.configMaps[0].Data, image.EnvOmniEndpoint, "the pair needs Omni (its lease, sites and CA)")

	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}

	mounted := func(path string) (corev1.VolumeMount, corev1.Volume) {
		t.Helper()

		for _, m := range c.VolumeMounts {
			if path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
				v, ok := volumes[m.Name]
				require.True(t, ok, "mount %s names no volume", m.Name)

				return m, v
			}
		}

		t.Fatalf("nothing is mounted at %s", path)

		return corev1.VolumeMount{}, corev1.Volume{}
	}

	// With Omni the state directory holds caches only: it goes with the pod.
	_, state := mounted(image.ControllerStateDir)
	require.NotNil(t, state.EmptyDir, "the state directory is not an emptyDir")

	// The image listens for HTTP off loopback, where the controller wants a token and TLS: they come from files
	// of a Secret mounted read-only.
	httpListen := envMap(image.ControllerEnv())[image.EnvControllerHTTPListen]
	require.False(t, status.IsLoopback(httpListen), "the image's HTTP listener %q", httpListen)

	for _, name := range httpAccessVars {
		e, ok := env[name]
		require.True(t, ok, "no %s: the controller refuses an HTTP listener off loopback without it", name)
		require.True(t, filepath.IsAbs(e.Value), "%s=%q", name, e.Value)

		m, v := mounted(e.Value)
		require.True(t, m.ReadOnly, "%s is on a writable mount", name)
		require.NotNil(t, v.Secret, "%s is not from a Secret", name)
		require.NotEmpty(t, v.Secret.SecretName)
	}

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
		"unknown field": bytes.Replace(m, []byte("  replicas: 2\n"), []byte("  replicas: 2\n  replica: 2\n"), 1),
		"wrong type":    bytes.Replace(m, []byte("  replicas: 2\n"), []byte("  replicas: two\n"), 1),
		"budget field":  bytes.Replace(m, []byte("  minAvailable: 1\n"), []byte("  minAvailable: 1\n  minAvailible: 1\n"), 1),
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

// writeHTTPSecret writes what the manifest's HTTP Secret holds (token, tls.crt, tls.key) into dir and returns
// the token.
func writeHTTPSecret(t *testing.T, dir string) string {
	t.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outpost-controller"},
		DNSNames: []string{"outpost-controller.outpost.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)

	token := rand.Text()

	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600))

	return token
}

// TestKubernetesPodRuns runs the real controller with the environment the manifest's pod has (the image's, and
// the container's own variables with the Secret's files and the state directory moved to the test's), and asks
// what the kubelet's probes ask: they must pass, while the rest of the HTTP listener wants the token. It runs
// without Omni (the ConfigMap's values are placeholders to fill in), so the controller acts alone.
func TestKubernetesPodRuns(t *testing.T) {
	t.Parallel()

	if testing.Short() {
		t.Skip("builds the controller; skipped under -short")
	}

	objs, err := decodeManifest(image.KubernetesManifest())
	require.NoError(t, err)

	c := objs.deployments[0].Spec.Template.Spec.Containers[0]
	dir := t.TempDir()

	// the pod's files, moved into the test's directory
	moved := map[string]string{}

	for _, m := range c.VolumeMounts {
		moved[m.MountPath] = filepath.Join(dir, strings.ReplaceAll(strings.Trim(m.MountPath, "/"), "/", "_"))
	}

	move := func(p string) string {
		for from, to := range moved {
			if rest, ok := strings.CutPrefix(p, from); ok && (rest == "" || rest[0] == '/') {
				return to + rest
			}
		}

		return p
	}

	// The HTTP listener keeps the image's empty host (every address, off loopback) on a free port; edges'
	// uplink stays on loopback.
	anyLn, err := net.Listen("tcp", ":0")
	require.NoError(t, err)

	httpPort := anyLn.Addr().(*net.TCPAddr).Port
	require.NoError(t, anyLn.Close())

	env := overrideEnv(image.ControllerEnv(), map[string]string{
		image.EnvControllerStateDir:     move(image.ControllerStateDir),
		image.EnvControllerUplinkListen: freeAddr(t),
		image.EnvControllerHTTPListen:   ":" + strconv.Itoa(httpPort),
	})

	secretDir := ""

	for _, e := range c.Env {
		if e.ValueFrom != nil {
			continue // the Omni key: no Omni here
		}

		env = append(env, e.Name+"="+move(e.Value))

		if e.Name == httpAccessVars[0] {
			secretDir = filepath.Dir(move(e.Value))
		}
	}

	require.NotEmpty(t, secretDir, "no %s in the container's environment", httpAccessVars[0])
	token := writeHTTPSecret(t, secretDir)
	require.NoError(t, os.MkdirAll(move(image.ControllerStateDir), 0o700))

	var logs bytes.Buffer

	cmd := exec.Command(buildController(t))
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &logs, &logs
	require.NoError(t, cmd.Start())

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() //nolint:errcheck
			<-waited
		}
	})

	// as the kubelet does: TLS without checking the certificate
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // the kubelet's probes do not verify either
	}
	base := "https://127.0.0.1:" + strconv.Itoa(httpPort)

	get := func(path, bearer string) (int, error) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			return 0, err
		}

		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}

		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}

		resp.Body.Close() //nolint:errcheck

		return resp.StatusCode, nil
	}

	startup := c.StartupProbe.HTTPGet
	deadline := time.Now().Add(time.Minute)

	for {
		code, err := get(startup.Path, "")
		if err == nil {
			require.Equal(t, http.StatusOK, code, "startup probe %s", startup.Path)

			break
		}

		select {
		case err := <-waited:
			t.Fatalf("the controller exited with the pod's environment: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}

		require.True(t, time.Now().Before(deadline), "no answer to the startup probe within a minute: %v\n%s", err, logs.String())
	}

	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		code, err := get(p.HTTPGet.Path, "")
		require.NoError(t, err, "%s probe", name)
		require.Equal(t, http.StatusOK, code, "%s probe %s", name, p.HTTPGet.Path)
	}

	// the rest of the listener is the operator's: the token, read from the Secret's file, lets one in
	code, err := get("/metrics", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "/metrics without the token")

	code, err = get("/metrics", token)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "/metrics with the Secret's token")

	// what a load balancer's health check asks, without the token: without Omni there is no lease, so it acts
	code, err = get("/readyz", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "/readyz")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))

	select {
	case err := <-waited:
		require.NoError(t, err, "the controller did not exit cleanly on SIGTERM:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the controller did not stop within 30 s of SIGTERM:\n%s", logs.String())
	}
}
