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
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/image"
	"github.com/ratelimitd/ratelimitd/internal/proctest"
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
	// grpcCA, when set, is the PEM file of the CA of the gRPC server's
	// certificate: gRPC is TLS (1.3) and verified against it.
	grpcCA string
	// ready, when set, runs once the process serves and before the calls
	// (to push a config, say).
	ready func(t *testing.T)
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
		{
			// The Deployment Envoy Gateway renders, image swapped:
			// /bin/ratelimit with EG's environment, config over mTLS
			// xDS from a management server built as EG builds its own.
			// Rule 0 of the EG-shaped snapshot is 10 a minute.
			name:  "envoy gateway's deployment, config over xDS",
			start: envoyGatewayDeployment,
			calls: append(repeat(10, egRule0(rlsv3.RateLimitResponse_OK)), egRule0(rlsv3.RateLimitResponse_OVER_LIMIT)),
		},
	} {
		t.Run(r.name, func(t *testing.T) { runImage(t, r) })
	}
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
	// A port proctest.FreeAddr found free may be taken by another test
	// before the process binds it: start again, with new ports, a few times.
	var (
		l       launch
		before  string
		cmd     *exec.Cmd
		stopped bool
		exited  chan error
		logs    *proctest.Buffer
		conn    *grpc.ClientConn
	)
	for attempt := 1; ; attempt++ {
		l = r.start(t, root)
		before = snapshot(t, root.dir)

		cmd = exec.Command(root.path(l.path), l.args...)
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
		logs = &proctest.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", l.path, err)
		}
		proc, done := cmd, make(chan error, 1)
		exited = done
		go func() { done <- proc.Wait() }()
		t.Cleanup(func() {
			if proc != cmd || !stopped {
				proc.Process.Kill()
				<-done
			}
		})
		if root.chroot {
			checkUser(t, cmd.Process.Pid)
		}

		creds := insecure.NewCredentials()
		if l.grpcCA != "" {
			pem, err := os.ReadFile(l.grpcCA)
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(pem)
			creds = credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13})
		}
		var err error
		if conn, err = grpc.NewClient(l.grpcAddr, grpc.WithTransportCredentials(creds)); err != nil {
			t.Fatal(err)
		}
		if err = awaitServing(conn, exited); err == nil {
			break
		}
		if attempt < 3 && strings.Contains(logs.String(), "address already in use") {
			t.Logf("attempt %d: a port was taken meanwhile; starting again: %v", attempt, err)
			conn.Close()
			continue
		}
		t.Fatalf("%v\n%s", err, logs)
	}
	defer conn.Close()
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
	if l.ready != nil {
		l.ready(t)
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
// until SERVING, for at most 20 s, and fails at once if the process exits.
func awaitServing(conn *grpc.ClientConn, exited chan error) error {
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited before serving: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not SERVING after 20s (last: %v, %v)", resp, err)
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
