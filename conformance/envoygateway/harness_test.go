package envoygateway

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/proctest"
)

const (
	// gatewayIRKey is the IR key of Gateway default/eg, which EG's Envoy
	// xDS server expects as node.cluster.
	gatewayIRKey = "default/eg"
	// egXDSAddr and egRateLimitXDSAddr are EG's fixed ports: its Envoy xDS
	// server (bootstrap.DefaultXdsServerPort) and its rate-limit xDS server
	// (ratelimit.XdsGrpcSotwConfigServerPort), v1.9.1.
	egXDSAddr          = "127.0.0.1:18000"
	egRateLimitXDSAddr = "127.0.0.1:18001"
)

// process is a child process with its output kept for the test's log.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *proctest.Buffer
	done chan struct{}
}

func start(t *testing.T, name string, env []string, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, out: &proctest.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	var w io.Writer = p.out
	if d := os.Getenv("RATELIMITD_EG_LOGDIR"); d != "" {
		// The whole output, kept after the test, for what tail leaves out.
		f, err := os.OpenFile(filepath.Join(d, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w = io.MultiWriter(p.out, f)
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop sends SIGTERM to the process group, and SIGKILL after 10 s.
func (p *process) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Logf("%s: no exit 10 s after SIGTERM: SIGKILL", p.name)
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *process) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitListening waits until addr accepts a TCP connection or p exits.
func waitListening(t *testing.T, p *process, addr string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("%s exited before listening on %s:\n%s", p.name, addr, p.tail(40))
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("%s: nothing listening on %s within %v:\n%s", p.name, addr, d, p.tail(40))
}

// freePort is the port of proctest.FreeAddr.
func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(proctest.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// envoyGateway is EG run standalone: the file resource provider on
// dir/resources, host infrastructure with its homes under dir, global
// rate limiting with a Redis backend (examples/standalone/envoy-gateway.yaml
// and api/v1alpha1 EnvoyGateway.rateLimit, v1.9.1). The host
// infrastructure also tries to start Envoy with func-e, which fails here
// (no Envoy, no network); EG logs that and serves xDS all the same.
type envoyGateway struct {
	bin, dir, config string
	resources        string
	certs            string // certgen --local's output: envoy-gateway/, envoy/, envoy-rate-limit/
	proc             *process
}

func newEnvoyGateway(t *testing.T, bin, dir, redisAddr string) *envoyGateway {
	t.Helper()
	eg := &envoyGateway{bin: bin, dir: dir, config: filepath.Join(dir, "envoy-gateway.yaml"), resources: filepath.Join(dir, "resources")}
	home := filepath.Join(dir, "home")
	eg.certs = filepath.Join(home, "certs")
	for _, d := range []string{eg.resources, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: [%q]
    infrastructure:
      type: Host
      host:
        configHome: %q
        dataHome: %q
        stateHome: %q
        runtimeDir: %q
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
rateLimit:
  backend:
    type: Redis
    redis:
      url: redis://%s
`, eg.resources, home, filepath.Join(dir, "data"), filepath.Join(dir, "state"), filepath.Join(dir, "run"), redisAddr)
	if err := os.WriteFile(eg.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "certgen", "--local", "--config-home", home).CombinedOutput()
	if err != nil {
		t.Fatalf("envoy-gateway certgen --local: %v\n%s", err, out)
	}
	return eg
}

func (eg *envoyGateway) start(t *testing.T) {
	t.Helper()
	env := append(os.Environ(), "HOME="+eg.dir)
	eg.proc = start(t, "envoy-gateway", env, eg.bin, "server", "--config-path", eg.config)
	waitListening(t, eg.proc, egRateLimitXDSAddr, 90*time.Second)
	waitListening(t, eg.proc, egXDSAddr, 30*time.Second)
}

// write puts one file of resources in the provider's directory, whole
// (written beside it, then renamed), so EG never reads half of it.
func (eg *envoyGateway) write(t *testing.T, name, yaml string) {
	t.Helper()
	tmp := filepath.Join(eg.dir, "."+name)
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(eg.resources, name)); err != nil {
		t.Fatal(err)
	}
}

// dnsName is the first DNS SAN of a certificate file: the name a client
// checks the server for (certgen's names are Kubernetes service names;
// the test reaches them on loopback). A wildcard's first label becomes
// "ratelimit".
func dnsName(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.DNSNames) == 0 {
		t.Fatalf("%s: no DNS names", file)
	}
	return strings.Replace(c.DNSNames[0], "*", "ratelimit", 1)
}

// ratelimit is ratelimitd run as /bin/ratelimit with the environment EG
// gives its rate-limit container (internal/infrastructure/kubernetes/
// ratelimit/resource.go, expectedRateLimitContainerEnv, v1.9.1; the same
// as cmd/ratelimitd's egEnv), its addresses pointed at loopback and its
// /certs at certgen's envoy-rate-limit files, which EG mounts there.
type ratelimit struct {
	bin       string
	env       []string
	grpcAddr  string
	httpAddr  string
	debugAddr string // /rlconfig
	promAddr  string // /metrics
	proc      *process
}

func newRatelimit(t *testing.T, bin string, eg *envoyGateway, redisAddr, runtime string) *ratelimit {
	t.Helper()
	certs := filepath.Join(eg.certs, "envoy-rate-limit")
	grpcPort, httpPort, debugPort, promPort := freePort(t), freePort(t), freePort(t), freePort(t)
	env := map[string]string{
		"RUNTIME_ROOT": runtime, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": egRateLimitXDSAddr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":  "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": filepath.Join(certs, "tls.crt"), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": filepath.Join(certs, "tls.key"),
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": filepath.Join(certs, "ca.crt"),
		"GRPC_SERVER_USE_TLS":               "true", "GRPC_SERVER_TLS_CERT": filepath.Join(certs, "tls.crt"), "GRPC_SERVER_TLS_KEY": filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT":            filepath.Join(certs, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp", "REDIS_URL": redisAddr,
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:" + promPort,
		// Loopback and free ports instead of EG's 0.0.0.0:8080/8081/6070,
		// and the DNS name EG's certificate is for, which the Service
		// name envoy-gateway resolves to in a cluster.
		"HOST": "127.0.0.1", "PORT": httpPort, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": grpcPort,
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": debugPort,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN": dnsName(t, filepath.Join(eg.certs, "envoy-gateway", "tls.crt")),
	}
	// PROMETHEUS_MAPPER_YAML is left out: EG mounts its statsd-exporter
	// mapping there, which only renames metrics.
	r := &ratelimit{bin: bin, grpcAddr: "127.0.0.1:" + grpcPort, httpAddr: "127.0.0.1:" + httpPort,
		debugAddr: "127.0.0.1:" + debugPort, promAddr: "127.0.0.1:" + promPort}
	for k, v := range env {
		r.env = append(r.env, k+"="+v)
	}
	r.env = append(r.env, "PATH="+os.Getenv("PATH"))
	return r
}

func (r *ratelimit) start(t *testing.T) {
	t.Helper()
	r.proc = start(t, "ratelimit", r.env, r.bin)
	waitListening(t, r.proc, r.grpcAddr, 30*time.Second)
}

// buildRatelimit builds ../../cmd/ratelimitd as dir/ratelimit, the name
// under which it reads envoyproxy/ratelimit's environment.
// RATELIMITD_BIN, when set, names a ratelimitd binary to run instead.
func buildRatelimit(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "ratelimit")
	if prebuilt := os.Getenv("RATELIMITD_BIN"); prebuilt != "" {
		if err := os.Symlink(prebuilt, bin); err != nil {
			t.Fatal(err)
		}
		return bin
	}
	cmd := exec.CommandContext(context.Background(), "go", "build", "-o", bin, "./cmd/ratelimitd")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ratelimitd: %v\n%s", err, out)
	}
	return bin
}
