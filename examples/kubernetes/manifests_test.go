// Package kubernetes_test keeps the Kubernetes examples honest: every
// manifest decodes strictly (an unknown field fails) into the Kubernetes
// API types of k8s.io/api, the objects refer to each other by the names,
// labels and ports they have, the hardening is what Envoy Gateway gives
// envoyproxy/ratelimit, every descriptor ConfigMap loads, and the Envoy
// Gateway snippets use only fields of EG's API (mirrored below from its
// source). internal/image's tests run the native Deployment's container
// from the image.
package kubernetes_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/image"
)

// exampleImage is the image every example runs: what `make image` tags by
// default.
const exampleImage = image.Repository + ":dev"

// manifest is one YAML document of a file, decoded.
type manifest struct {
	file string
	doc  int
	obj  any // *appsv1.Deployment, *corev1.Service, ...
	meta metav1.Object
}

func (m manifest) String() string { return fmt.Sprintf("%s#%d", m.file, m.doc) }

// kinds are the objects the examples may hold, by apiVersion and kind:
// each makes an empty one.
var kinds = map[string]func() metav1.Object{
	"apps/v1 Deployment":                     func() metav1.Object { return &appsv1.Deployment{} },
	"v1 Service":                             func() metav1.Object { return &corev1.Service{} },
	"v1 ConfigMap":                           func() metav1.Object { return &corev1.ConfigMap{} },
	"v1 ServiceAccount":                      func() metav1.Object { return &corev1.ServiceAccount{} },
	"policy/v1 PodDisruptionBudget":          func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2 HorizontalPodAutoscaler": func() metav1.Object { return &autoscalingv2.HorizontalPodAutoscaler{} },
}

// newObject is an empty object of apiVersion and kind, as itself and as
// its metadata; false if the examples may not hold that kind.
func newObject(apiVersion, kind string) (any, metav1.Object, bool) {
	newKind, ok := kinds[apiVersion+" "+kind]
	if !ok {
		return nil, nil, false
	}
	o := newKind()
	return o, o, true
}

// load decodes every document of file (relative to this directory)
// strictly into its Kubernetes type.
func load(t *testing.T, file string) []manifest {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	for i, doc := range splitDocuments(data) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s#%d: %v", file, i, err)
		}
		obj, meta, ok := newObject(tm.APIVersion, tm.Kind)
		if !ok {
			t.Fatalf("%s#%d: %s %s is not a kind the examples use", file, i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s#%d (%s %s): %v", file, i, tm.Kind, meta.GetName(), err)
		}
		if meta.GetName() == "" {
			t.Errorf("%s#%d: %s without a name", file, i, tm.Kind)
		}
		out = append(out, manifest{file: file, doc: i, obj: obj, meta: meta})
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no objects", file)
	}
	return out
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents that hold only comments.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var content bool
		for _, l := range strings.Split(d, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				content = true
			}
		}
		if content {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func only[T any](t *testing.T, ms []manifest, name string) T {
	t.Helper()
	var found []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok && m.meta.GetName() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

// TestStrictDecoding: a field the API does not have fails the decoding,
// which is what keeps every other test's view of the files true.
func TestStrictDecoding(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 1\n  replica: 2\n")
	if err := yaml.UnmarshalStrict(doc, &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), `unknown field "replica"`) {
		t.Errorf("UnmarshalStrict with spec.replica = %v, want an unknown-field error", err)
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, more...) {
		if f == filepath.Join("envoy-gateway", "helm-values.yaml") {
			continue // Helm values, not objects: TestEnvoyGatewayHelmValues
		}
		load(t, f)
	}
}

func TestNative(t *testing.T) {
	ms := load(t, "ratelimitd.yaml")
	redis := load(t, "redis.yaml")
	d := only[*appsv1.Deployment](t, ms, "ratelimitd")
	pod := d.Spec.Template
	c := onlyContainer(t, d)
	if c.Image != exampleImage {
		t.Errorf("image %q, want %q", c.Image, exampleImage)
	}
	if c.Command != nil {
		t.Errorf("command %q, want none (the image's entrypoint, %s)", c.Command, image.BinaryPath)
	}
	checkHardened(t, d)
	checkProbes(t, c)
	checkPorts(t, c, map[string]int32{"http": 8080, "grpc": 8081, "debug": 6070, "metrics": 19001})

	flags := map[string]string{}
	for _, a := range c.Args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Errorf("argument %q, want --flag=value", a)
		}
		flags[k] = v
	}
	for flag, want := range map[string]string{"--http-addr": ":8080", "--grpc-addr": ":8081", "--debug-addr": ":6070", "--metrics-addr": ":19001"} {
		if flags[flag] != want {
			t.Errorf("%s %q, want %s (every interface: the port the container declares)", flag, flags[flag], want)
		}
	}
	if flags["--grpc-max-connection-age"] == "" {
		t.Error("no --grpc-max-connection-age: the HPA's new replicas would get no calls from Envoy's existing connections")
	}
	if p := d.Spec.Template.Annotations["prometheus.io/port"]; p != "19001" {
		t.Errorf("prometheus.io/port %q, want the --metrics-addr port 19001", p)
	}
	cm := mountedConfigMap(t, ms, d, c, flags["--config"])
	checkDescriptors(t, cm)

	// Redis: the URL names redis.yaml's Service and port.
	rs := only[*corev1.Service](t, redis, "redis")
	if want := fmt.Sprintf("redis://%s:%d", rs.Name, rs.Spec.Ports[0].Port); flags["--redis-url"] != want {
		t.Errorf("--redis-url %q, want %q (redis.yaml's Service)", flags["--redis-url"], want)
	}
	rd := only[*appsv1.Deployment](t, redis, "redis")
	selects(t, "Service redis", rs.Spec.Selector, rd.Spec.Template.Labels)
	targets(t, rs, onlyContainer(t, rd))

	// The objects around the Deployment select its pods and reach its ports.
	selects(t, "Deployment selector", d.Spec.Selector.MatchLabels, pod.Labels)
	svc := only[*corev1.Service](t, ms, "ratelimitd")
	selects(t, "Service ratelimitd", svc.Spec.Selector, pod.Labels)
	targets(t, svc, c)
	if p := servicePort(svc, "grpc"); p == nil || p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
		t.Errorf("Service port grpc: %+v, want appProtocol kubernetes.io/h2c (Envoy speaks HTTP/2 to it)", p)
	}
	pdb := only[*policyv1.PodDisruptionBudget](t, ms, "ratelimitd")
	selects(t, "PodDisruptionBudget", pdb.Spec.Selector.MatchLabels, pod.Labels)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget maxUnavailable %v with %d replicas: a drain may take them all", pdb.Spec.MaxUnavailable, *d.Spec.Replicas)
	}
	hpa := only[*autoscalingv2.HorizontalPodAutoscaler](t, ms, "ratelimitd")
	if r := hpa.Spec.ScaleTargetRef; r.Kind != "Deployment" || r.Name != d.Name || r.APIVersion != "apps/v1" {
		t.Errorf("HPA scales %+v, want the Deployment %s", r, d.Name)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
		t.Errorf("HPA minReplicas %v, want at least 2 (the PodDisruptionBudget's)", hpa.Spec.MinReplicas)
	}
	sa := only[*corev1.ServiceAccount](t, ms, pod.Spec.ServiceAccountName)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("ServiceAccount mounts its token; ratelimitd never calls the API server")
	}
}

// TestIstio: Istio's sample, with the image the only change: file config
// from the ConfigMap at RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, Redis at
// the sample's Service, the incumbent's command and ports.
func TestIstio(t *testing.T) {
	ms := load(t, "istio/rate-limit-service.yaml")
	d := only[*appsv1.Deployment](t, ms, "ratelimit")
	c := onlyContainer(t, d)
	if c.Image != exampleImage {
		t.Errorf("image %q, want %q", c.Image, exampleImage)
	}
	if !slices.Equal(c.Command, []string{image.IncumbentPath}) {
		t.Errorf("command %q, want [%s]", c.Command, image.IncumbentPath)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	want := map[string]string{
		"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"RUNTIME_IGNOREDOTFILES": "true", "HOST": "::", "GRPC_HOST": "::",
	}
	if fmt.Sprint(env) != fmt.Sprint(want) {
		t.Errorf("environment %v, want Istio's sample's %v", env, want)
	}
	var ports []int32
	for _, p := range c.Ports {
		ports = append(ports, p.ContainerPort)
	}
	if !slices.Equal(ports, []int32{8080, 8081, 6070}) {
		t.Errorf("container ports %v, want 8080 8081 6070", ports)
	}
	cm := mountedConfigMap(t, ms, d, c, env["RUNTIME_ROOT"]+"/"+env["RUNTIME_SUBDIRECTORY"]+"/config")
	checkDescriptors(t, cm)
	svc := only[*corev1.Service](t, ms, "ratelimit")
	selects(t, "Service ratelimit", svc.Spec.Selector, d.Spec.Template.Labels)
	targets(t, svc, c)
	rs := only[*corev1.Service](t, ms, "redis")
	host, port, _ := strings.Cut(env["REDIS_URL"], ":")
	if host != rs.Name || port != strconv.Itoa(int(rs.Spec.Ports[0].Port)) {
		t.Errorf("REDIS_URL %q, want the redis Service %s:%d", env["REDIS_URL"], rs.Name, rs.Spec.Ports[0].Port)
	}
}

func onlyContainer(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("Deployment %s has %d containers, want 1", d.Name, n)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// checkHardened: what Envoy Gateway's envoy-ratelimit Deployment sets
// (internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml@d32f282942).
func checkHardened(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ps := d.Spec.Template.Spec
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("pod mounts a service account token")
	}
	if s := ps.SecurityContext; s == nil || !isTrue(s.RunAsNonRoot) || !is(s.RunAsUser, image.UID) || !is(s.RunAsGroup, image.GID) ||
		s.SeccompProfile == nil || s.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v, want runAsNonRoot, %d:%d, seccomp RuntimeDefault", ps.SecurityContext, image.UID, image.GID)
	}
	s := ps.Containers[0].SecurityContext
	if s == nil {
		t.Fatal("container without a securityContext")
	}
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"readOnlyRootFilesystem", isTrue(s.ReadOnlyRootFilesystem)},
		{"runAsNonRoot", isTrue(s.RunAsNonRoot)},
		{"runAsUser 65534", is(s.RunAsUser, image.UID)},
		{"runAsGroup 65534", is(s.RunAsGroup, image.GID)},
		{"allowPrivilegeEscalation false", s.AllowPrivilegeEscalation != nil && !*s.AllowPrivilegeEscalation},
		{"privileged false", s.Privileged != nil && !*s.Privileged},
		{"capabilities drop ALL, add none", s.Capabilities != nil && slices.Equal(s.Capabilities.Drop, []corev1.Capability{"ALL"}) && len(s.Capabilities.Add) == 0},
		{"seccomp RuntimeDefault", s.SeccompProfile != nil && s.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
	} {
		if !c.ok {
			t.Errorf("container securityContext lacks %s", c.field)
		}
	}
	r := ps.Containers[0].Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want cpu and memory requests and a memory limit", r)
	}
}

func isTrue(b *bool) bool          { return b != nil && *b }
func is(n *int64, want int64) bool { return n != nil && *n == want }

// checkProbes: startup, readiness and liveness all GET /healthcheck on
// 8080, as Envoy Gateway probes envoyproxy/ratelimit.
func checkProbes(t *testing.T, c corev1.Container) {
	t.Helper()
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe %+v, want an HTTP GET", name, p)
			continue
		}
		g := p.HTTPGet
		if g.Path != "/healthcheck" || g.Port != intstr.FromInt32(8080) || (g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP) {
			t.Errorf("%s probe GET %s %s:%s, want HTTP /healthcheck on 8080", name, g.Scheme, g.Path, g.Port.String())
		}
	}
}

func checkPorts(t *testing.T, c corev1.Container, want map[string]int32) {
	t.Helper()
	got := map[string]int32{}
	for _, p := range c.Ports {
		got[p.Name] = p.ContainerPort
		if p.Protocol != corev1.ProtocolTCP {
			t.Errorf("port %s protocol %q, want TCP", p.Name, p.Protocol)
		}
		if !slices.Contains(image.ExposedPorts(), int(p.ContainerPort)) {
			t.Errorf("port %s %d is not one the image exposes (%v)", p.Name, p.ContainerPort, image.ExposedPorts())
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("container ports %v, want %v", got, want)
	}
}

// mountedConfigMap is the ConfigMap of ms mounted at path in c.
func mountedConfigMap(t *testing.T, ms []manifest, d *appsv1.Deployment, c corev1.Container, path string) *corev1.ConfigMap {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return only[*corev1.ConfigMap](t, ms, v.ConfigMap.Name)
			}
		}
	}
	t.Fatalf("no ConfigMap mounted at %s (the config path)", path)
	return nil
}

// checkDescriptors: the ConfigMap's files are descriptor files ratelimitd
// loads, each with its rules.
func checkDescriptors(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	var files []config.File
	for name, data := range cm.Data {
		if !strings.HasSuffix(name, ".yaml") {
			t.Errorf("ConfigMap %s key %q: ratelimitd loads only *.yaml and *.yml", cm.Name, name)
		}
		files = append(files, config.File{Name: cm.Name + "/" + name, Data: []byte(data)})
	}
	if len(files) == 0 {
		t.Fatalf("ConfigMap %s holds no descriptor files", cm.Name)
	}
	if _, err := config.Parse(files); err != nil {
		t.Errorf("ConfigMap %s: %v", cm.Name, err)
	}
}

func selects(t *testing.T, what string, selector, podLabels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) {
		t.Errorf("%s %v does not select the pods (%v)", what, selector, podLabels)
	}
}

// targets: every port of s reaches a port c declares, by name or number.
func targets(t *testing.T, s *corev1.Service, c corev1.Container) {
	t.Helper()
	for _, sp := range s.Spec.Ports {
		tp := sp.TargetPort
		if tp == (intstr.IntOrString{}) {
			tp = intstr.FromInt32(sp.Port)
		}
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return (tp.Type == intstr.String && cp.Name == tp.StrVal) || (tp.Type == intstr.Int && cp.ContainerPort == tp.IntVal)
		}) {
			t.Errorf("Service %s port %s targets %s, which container %s does not declare", s.Name, sp.Name, tp.String(), c.Name)
		}
	}
}

func servicePort(s *corev1.Service, name string) *corev1.ServicePort {
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Name == name {
			return &s.Spec.Ports[i]
		}
	}
	return nil
}

// decodeStrict is yaml.UnmarshalStrict with the file named in the error.
func decodeStrict(t *testing.T, name string, data []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(bytes.TrimSpace(data), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
