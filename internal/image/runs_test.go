package image_test

// The rows of TestRun: how each deployment of the image starts it.

import (
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/internal/image"
	"github.com/ratelimitd/ratelimitd/internal/proctest"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

func loginCall(want rlsv3.RateLimitResponse_Code) call {
	return call{
		req: &rlsv3.RateLimitRequest{
			Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/login"}}},
			},
		},
		want: want,
	}
}

func repeat(n int, c call) []call {
	out := make([]call, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// exampleLaunch reads the example Deployment in file, whose container is
// named name, mounts its ConfigMap into root and starts a Redis for it. It
// returns the container, the Redis, and a launch of the container's
// command (as a runtime would: the image's entrypoint if it has none) with
// free loopback gRPC and HTTP addresses.
func exampleLaunch(t *testing.T, root rootfs, file, name string) (corev1.Container, *redistest.Server, launch) {
	d, cm := exampleDeployment(t, file, name)
	mountConfigMap(t, root, d, cm)
	c := d.Spec.Template.Spec.Containers[0]
	l := launch{path: image.BinaryPath, grpcAddr: proctest.FreeAddr(t), httpAddr: proctest.FreeAddr(t)}
	if len(c.Command) > 0 {
		l.path = c.Command[0]
	}
	return c, redistest.Start(t), l
}

func kubernetesExample(t *testing.T, root rootfs) launch {
	c, redis, l := exampleLaunch(t, root, "ratelimitd.yaml", "ratelimitd")
	paths := []string{"/healthz", "/readyz"}
	// The Deployment's probes, which the manifest test pins to port 8080,
	// the --http-addr port.
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && p.HTTPGet != nil && !slices.Contains(paths, p.HTTPGet.Path) {
			paths = append(paths, p.HTTPGet.Path)
		}
	}
	for _, p := range paths {
		l.httpOK = append(l.httpOK, "http://"+l.httpAddr+p)
	}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--grpc-addr":
			value = l.grpcAddr
		case "--http-addr":
			value = l.httpAddr
		case "--debug-addr":
			value = proctest.FreeAddr(t)
		case "--metrics-addr":
			value = proctest.FreeAddr(t)
			l.httpOK = append(l.httpOK, "http://"+value+"/metrics")
		case "--redis-url":
			value = "redis://" + redis.Addr
		case "--config":
			value = root.path(value)
		}
		l.args = append(l.args, name+"="+value)
	}
	return l
}

// istioExample is examples/kubernetes/istio's ratelimit container:
// /bin/ratelimit with Istio's sample environment, its ConfigMap at its
// mount path (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config), a real Redis for
// its REDIS_URL, and the listeners (the sample's "::", every interface)
// on free loopback ports.
func istioExample(t *testing.T, root rootfs) launch {
	c, redis, l := exampleLaunch(t, root, "istio/rate-limit-service.yaml", "ratelimit")
	l.httpOK = []string{"http://" + l.httpAddr + "/healthcheck"}
	_, httpPort, _ := net.SplitHostPort(l.httpAddr)
	_, grpcPort, _ := net.SplitHostPort(l.grpcAddr)
	_, debugPort, _ := net.SplitHostPort(proctest.FreeAddr(t))
	for _, e := range c.Env {
		v := e.Value
		switch e.Name {
		case "HOST", "GRPC_HOST":
			v = "127.0.0.1"
		case "REDIS_URL":
			v = redis.Addr
		case "RUNTIME_ROOT":
			v = root.path(v)
		}
		l.env = append(l.env, e.Name+"="+v)
	}
	l.env = append(l.env, "PORT="+httpPort, "GRPC_PORT="+grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+debugPort)
	return l
}

// egDomain and egRoute name the listener and route of the EG-shaped
// snapshot the xDS row pushes.
const egDomain, egRoute = "default/eg/http", "route-a"

// envoyGatewayDeployment is EG's envoy-ratelimit container
// (internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml@d32f282942):
// /bin/ratelimit with EG's environment, its Secret's files at /certs in
// the image's root, and what lies outside pointed at the test's own: the
// xDS server (mutual TLS, node envoy-ratelimit), Redis, loopback
// listeners. One difference: xdstest issues a client and a server
// certificate where EG's certgen issues one for both, so gRPC serves
// /certs/grpc.crt.
func envoyGatewayDeployment(t *testing.T, root rootfs) launch {
	certs := xdstest.NewCerts(t)
	xs := xdstest.Start(t, xdstest.Options{TLS: certs})
	redis := redistest.Start(t)
	for file, src := range map[string]string{
		"/certs/tls.crt": certs.ClientCert, "/certs/tls.key": certs.ClientKey, "/certs/ca.crt": certs.CA.File,
		"/certs/grpc.crt": certs.ServerCert, "/certs/grpc.key": certs.ServerKey,
	} {
		root.write(t, file, readFile(t, src))
	}
	l := launch{path: image.IncumbentPath, grpcAddr: proctest.FreeAddr(t), httpAddr: proctest.FreeAddr(t), grpcCA: certs.CA.File}
	l.httpOK = []string{"http://" + l.httpAddr + "/healthcheck"}
	metrics := proctest.FreeAddr(t)
	l.httpOK = append(l.httpOK, "http://"+metrics+"/metrics")
	_, httpPort, _ := net.SplitHostPort(l.httpAddr)
	_, grpcPort, _ := net.SplitHostPort(l.grpcAddr)
	_, debugPort, _ := net.SplitHostPort(proctest.FreeAddr(t))
	l.env = []string{
		"RUNTIME_ROOT=" + root.path("/data"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xs.Addr(), "CONFIG_GRPC_XDS_NODE_ID=" + xdstest.EGNodeID,
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + root.path("/certs/grpc.crt"), "GRPC_SERVER_TLS_KEY=" + root.path("/certs/grpc.key"),
		"GRPC_SERVER_TLS_CA_CERT=" + root.path("/certs/ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + root.path("/certs/tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + root.path("/certs/tls.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + root.path("/certs/ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + metrics, "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
		"HOST=127.0.0.1", "PORT=" + httpPort, "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
	}
	l.ready = func(t *testing.T) {
		xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(egDomain, egRoute, false))
		if req := xs.WaitForACK(t, "1"); req.ClientCert != "ratelimitd-1" {
			t.Errorf("ACK with client certificate %q, want ratelimitd-1 (/certs/tls.crt)", req.ClientCert)
		}
	}
	return l
}

// egRule0 asks for rule 0 of xdstest.EGConfig (10 a minute).
func egRule0(want rlsv3.RateLimitResponse_Code) call {
	return call{
		req: &rlsv3.RateLimitRequest{
			Domain: egDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: egRoute, Value: egRoute}, {Key: "rule-0-match-0", Value: "rule-0-match-0"},
			}}},
		},
		want: want,
	}
}

func pathCall(path string, want rlsv3.RateLimitResponse_Code) call {
	return call{
		req: &rlsv3.RateLimitRequest{
			Domain: "echo-ratelimit",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "PATH", Value: path}}},
			},
		},
		want: want,
	}
}

// mountConfigMap writes cm's files where d's container mounts it, as the
// kubelet would.
func mountConfigMap(t *testing.T, root rootfs, d *appsv1.Deployment, cm *corev1.ConfigMap) {
	t.Helper()
	for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				for name, data := range cm.Data {
					root.write(t, filepath.Join(m.MountPath, name), []byte(data))
				}
				return
			}
		}
	}
	t.Fatalf("Deployment %s does not mount ConfigMap %s", d.Name, cm.Name)
}

// exampleDeployment reads the Deployment called name and the ConfigMap in
// the same file from examples/kubernetes/file (whose own tests check them
// strictly).
func exampleDeployment(t *testing.T, file, name string) (*appsv1.Deployment, *corev1.ConfigMap) {
	t.Helper()
	data := readFile(t, filepath.Join(moduleRoot, "examples/kubernetes", file))
	var d *appsv1.Deployment
	var cm *corev1.ConfigMap
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var head struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case head.Kind == "Deployment" && head.Metadata.Name == name:
			d = &appsv1.Deployment{}
			err = yaml.UnmarshalStrict([]byte(doc), d)
		case head.Kind == "ConfigMap":
			cm = &corev1.ConfigMap{}
			err = yaml.UnmarshalStrict([]byte(doc), cm)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if d == nil || cm == nil || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("examples/kubernetes/%s: want a Deployment %s of one container and a ConfigMap", file, name)
	}
	return d, cm
}
