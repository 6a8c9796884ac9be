package image_test

// The image's binary run from its unpacked root filesystem. As root (CI
// and the dev machines run as root), the process is chrooted into that
// root and runs as 65534:65534, so it sees only the image's files, owned by
// root and not writable by it: the CA bundle where Go looks, no /tmp, a
// root it cannot write to, as under readOnlyRootFilesystem. Otherwise it
// runs from the root's path on the host, and the test still checks that it
// wrote nothing there.

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/internal/image"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// rootfs is one run's unpacked image.
type rootfs struct {
	dir    string
	chroot bool // the process runs chrooted into dir, as 65534:65534
}

// path is p (absolute, in the image) as the process sees it.
func (r rootfs) path(p string) string {
	if r.chroot {
		return p
	}
	return filepath.Join(r.dir, p)
}

// write puts a file at p in the image, as a volume mount would, readable
// by everyone and writable by root only.
func (r rootfs) write(t *testing.T, p string, data []byte) {
	t.Helper()
	host := filepath.Join(r.dir, p)
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// launch is how to start the image's binary, and where it then serves.
type launch struct {
	path     string // in the image: image.BinaryPath or image.IncumbentPath
	args     []string
	env      []string // the whole environment
	grpcAddr string   // loopback host:port
	httpAddr string
	httpOK   []string // URLs that answer 200 once it serves
}

// call is one ShouldRateLimit and the overall code it must get.
type call struct {
	req  *rlsv3.RateLimitRequest
	want rlsv3.RateLimitResponse_Code
}

// imageRun is one way the image is run: start prepares the root (config
// files) and what lives outside it (Redis, a control plane) and says how
// to start the process; calls are then made in order.
type imageRun struct {
	name  string
	start func(t *testing.T, root rootfs) launch
	calls []call
}

func TestRun(t *testing.T) {
	for _, r := range []imageRun{
		{
			// examples/kubernetes/ratelimitd.yaml's container: its
			// arguments, its ConfigMap at its mount path, a real Redis
			// for its --redis-url, loopback addresses for its listeners;
			// its probes' paths answer 200.
			name:  "kubernetes example, native flags",
			start: kubernetesExample,
			calls: append(repeat(5, loginCall(rlsv3.RateLimitResponse_OK)), loginCall(rlsv3.RateLimitResponse_OVER_LIMIT)),
		},
		{
			// Istio's sample with the image swapped: /bin/ratelimit reads
			// envoyproxy/ratelimit's environment. PATH=/ has 1 a
			// minute, any other path 100.
			name:  "istio example, the incumbent's environment",
			start: istioExample,
			calls: []call{
				pathCall("/", rlsv3.RateLimitResponse_OK),
				pathCall("/", rlsv3.RateLimitResponse_OVER_LIMIT),
				pathCall("/other", rlsv3.RateLimitResponse_OK),
			},
		},
	} {
		t.Run(r.name, func(t *testing.T) { runImage(t, r) })
	}
}

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

func kubernetesExample(t *testing.T, root rootfs) launch {
	d, cm := exampleDeployment(t, "ratelimitd.yaml", "ratelimitd")
	c := d.Spec.Template.Spec.Containers[0]
	mountConfigMap(t, root, d, cm)
	redis := redistest.Start(t)
	l := launch{path: image.BinaryPath, grpcAddr: freeAddr(t), httpAddr: freeAddr(t)}
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
	if len(c.Command) > 0 {
		l.path = c.Command[0]
	}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--grpc-addr":
			value = l.grpcAddr
		case "--http-addr":
			value = l.httpAddr
		case "--debug-addr":
			value = freeAddr(t)
		case "--metrics-addr":
			value = freeAddr(t)
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
	d, cm := exampleDeployment(t, "istio/rate-limit-service.yaml", "ratelimit")
	c := d.Spec.Template.Spec.Containers[0]
	mountConfigMap(t, root, d, cm)
	redis := redistest.Start(t)
	l := launch{path: c.Command[0], grpcAddr: freeAddr(t), httpAddr: freeAddr(t)}
	l.httpOK = []string{"http://" + l.httpAddr + "/healthcheck"}
	_, httpPort, _ := net.SplitHostPort(l.httpAddr)
	_, grpcPort, _ := net.SplitHostPort(l.grpcAddr)
	_, debugPort, _ := net.SplitHostPort(freeAddr(t))
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
	data, err := os.ReadFile(filepath.Join(moduleRoot, "examples/kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
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

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runImage unpacks the image, starts r's process from it, waits until
// gRPC health says SERVING, checks the HTTP paths, makes r's calls, stops
// it with SIGTERM (it must exit 0) and checks that it wrote nothing.
func runImage(t *testing.T, r imageRun) {
	f := built(t)
	root := rootfs{dir: filepath.Join(t.TempDir(), "rootfs"), chroot: os.Geteuid() == 0}
	if _, err := unpack(f.img, root.dir); err != nil {
		t.Fatal(err)
	}
	if !root.chroot {
		t.Log("not root: running the binary from the unpacked root without chroot or user 65534")
	}
	l := r.start(t, root)
	before := snapshot(t, root.dir)

	cmd := exec.Command(root.path(l.path), l.args...)
	cmd.Env = l.env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = root.path("/")
	if root.chroot {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Chroot:     root.dir,
			Credential: &syscall.Credential{Uid: image.UID, Gid: image.GID},
		}
	}
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", l.path, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
	})
	if root.chroot {
		checkUser(t, cmd.Process.Pid)
	}

	conn, err := grpc.NewClient(l.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	awaitServing(t, conn, exited, logs)
	for _, p := range l.httpOK {
		resp, err := http.Get(p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200\n%s", p, resp.StatusCode, logs)
		}
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	for i, c := range r.calls {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, c.req)
		cancel()
		if err != nil {
			t.Fatalf("call %d: ShouldRateLimit(%v) = %v\n%s", i, c.req, err, logs)
		}
		if resp.OverallCode != c.want {
			t.Errorf("call %d: ShouldRateLimit(%v) = %v, want %v", i, c.req, resp.OverallCode, c.want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0\n%s", err, logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20s after SIGTERM\n%s", logs)
	}
	if after := snapshot(t, root.dir); after != before {
		t.Errorf("the process changed its root filesystem:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// awaitServing polls gRPC health (the empty service: the whole server)
// until SERVING, for at most 20 s, failing at once if the process exits.
func awaitServing(t *testing.T, conn *grpc.ClientConn, exited chan error, logs *lockedBuffer) {
	t.Helper()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("exited before serving: %v\n%s", err, logs)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("not SERVING after 20s (last: %v, %v)\n%s", resp, err, logs)
		}
	}
}

// checkUser: the process runs as 65534:65534 (real and effective).
func checkUser(t *testing.T, pid int) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if k != "Uid" && k != "Gid" {
			continue
		}
		ids := strings.Fields(v)
		want := fmt.Sprint(image.UID)
		if k == "Gid" {
			want = fmt.Sprint(image.GID)
		}
		if len(ids) < 2 || ids[0] != want || ids[1] != want {
			t.Errorf("process %s %q, want %s", k, v, want)
		}
	}
}

// snapshot lists every file under dir with its type, mode, size and
// modification time.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%s %v %d %d\n", rel, info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
