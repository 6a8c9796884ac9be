package main

// End-to-end tests against real ratelimitd processes (built once per test
// binary) and real redis-server processes, all on loopback. These are the
// few tests that run on real time; their tolerances are generous.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"iter"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/proctest"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

var (
	buildOnce sync.Once
	binDir    string // removed by TestMain
	binPath   string
	buildErr  error

	hooksOnce     sync.Once
	hooksPath     string // in binDir
	hooksBuildErr error
)

// TestMain removes the binary the process tests built (about 40 MB a run).
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binary builds ratelimitd (without the race detector: it is the system
// under test, not the test) once per test binary, into a directory
// TestMain removes.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ratelimitd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir, binPath = dir, filepath.Join(dir, "ratelimitd")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// hooksBinary builds ratelimitd with the testhooks build tag (the flags
// of testflags_hooks.go) once per test binary, beside binary's.
func hooksBinary(t *testing.T) string {
	t.Helper()
	binary(t) // makes binDir
	hooksOnce.Do(func() {
		hooksPath = filepath.Join(binDir, "ratelimitd-testhooks")
		out, err := exec.Command("go", "build", "-tags", "testhooks", "-o", hooksPath, ".").CombinedOutput()
		if err != nil {
			hooksBuildErr = fmt.Errorf("go build -tags testhooks: %v\n%s", err, out)
		}
	})
	if hooksBuildErr != nil {
		t.Fatal(hooksBuildErr)
	}
	return hooksPath
}

// proc is a running ratelimitd process.
type proc struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	logs     *proctest.Buffer
	exited   chan error
}

// logLine is a JSON log line of a ratelimitd process: its time, message
// and the Redis Cluster node it names (if any).
type logLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
	Node string    `json:"node"`
}

// logLines yields p's JSON log lines so far, in order; it skips the lines
// that are not JSON.
func (p *proc) logLines() iter.Seq[logLine] {
	return func(yield func(logLine) bool) {
		for line := range strings.Lines(p.logs.String()) {
			var l logLine
			if json.Unmarshal([]byte(line), &l) == nil && !yield(l) {
				return
			}
		}
	}
}

// startProc starts ratelimitd with args (plus loopback addresses on free
// ports and JSON logs) and waits until it serves.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	return launchProc(t, args...).await(t)
}

// launchingProc is a ratelimitd process started but maybe not serving yet.
type launchingProc struct {
	name  string // what the process is called in failures
	p     *proc
	ready chan [2]string // its addresses, once it serves
	// prepared is closed once a Redis backend's first preparation ended
	// ("backend ready" or "backend not ready" logged); nil without Redis.
	prepared chan struct{}
}

// launchProc starts ratelimitd as startProc does, without waiting.
func launchProc(t *testing.T, args ...string) launchingProc {
	t.Helper()
	return launchProcAt(t, "ratelimitd", binary(t), args...)
}

// launchProcAt is launchProc for the ratelimitd binary at path.
func launchProcAt(t *testing.T, name, path string, args ...string) launchingProc {
	t.Helper()
	args = append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"}, args...)
	withRedis := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--redis-") && !strings.Contains(a, "timeout") })
	return spawn(t, name, path, nil, withRedis, args...)
}

// startHooksProc is startProc for the build with test hooks
// (hooksBinary), whose flags args may use.
func startHooksProc(t *testing.T, args ...string) *proc {
	t.Helper()
	return launchProcAt(t, "ratelimitd (testhooks)", hooksBinary(t), args...).await(t)
}

// spawn starts the program at path (called name in failures) with exactly
// env (nothing from the test's environment) and args, copies its stderr
// into p.logs and watches the JSON log lines for "ratelimitd started" and,
// with watchPrepared, for the end of the backend's first preparation. The
// process is killed when the test ends.
func spawn(t *testing.T, name, path string, env []string, watchPrepared bool, args ...string) launchingProc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append([]string{}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: &proctest.Buffer{}, exited: make(chan error, 1)}
	ready := make(chan [2]string, 1)
	var prepared chan struct{}
	if watchPrepared {
		prepared = make(chan struct{})
	}
	var prepareOnce sync.Once
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.logs.Write(append(sc.Bytes(), '\n'))
			var line struct {
				Msg      string `json:"msg"`
				GRPCAddr string `json:"grpc_addr"`
				HTTPAddr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				switch line.Msg {
				case "ratelimitd started":
					ready <- [2]string{line.GRPCAddr, line.HTTPAddr}
				case "backend ready", "backend not ready; answering per --on-backend-failure until it is":
					if prepared != nil {
						prepareOnce.Do(func() { close(prepared) })
					}
				}
			}
		}
		io.Copy(io.Discard, stderr)
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return launchingProc{name: name, p: p, ready: ready, prepared: prepared}
}

// await waits until the process serves and, with a Redis backend, until its
// first preparation ended (gRPC health says SERVING from then if Redis is
// up).
func (l launchingProc) await(t *testing.T) *proc {
	t.Helper()
	p := l.p
	select {
	case addrs := <-l.ready:
		p.grpcAddr, p.httpAddr = addrs[0], addrs[1]
		if l.prepared != nil {
			select {
			case <-l.prepared:
			case <-time.After(20 * time.Second):
				t.Fatalf("%s did not prepare its backend in 20s\n%s", l.name, p.logs)
			}
		}
		return p
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("%s exited before serving: %v\n%s", l.name, err, p.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not start in 20s\n%s", l.name, p.logs)
	}
	return nil
}

// readiness is what p tells its probes: gRPC health of the service
// "ratelimit", asked on conn (a connection to p), and the status code and
// body of GET /readyz. It fails the test if either cannot be asked.
func (p *proc) readiness(t *testing.T, conn *grpc.ClientConn) (health healthpb.HealthCheckResponse_ServingStatus, code int, body string) {
	t.Helper()
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	code, body = servertest.Get(t, "http://"+p.httpAddr+"/readyz")
	return h.GetStatus(), code, body
}

const meshConfig = `domain: mesh
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, burst: 20, name: hot}
`

// loadResult is what a load's calls were answered: the admitted and
// denied counts, the other errors by code, and the slowest call's time.
type loadResult struct {
	admitted, denied atomic.Int64
	mu               sync.Mutex
	errs             map[codes.Code]int
	slowest          atomic.Int64 // ns
}

// record counts one call of the load that took took and was answered
// resp, err. It is safe for concurrent use.
func (r *loadResult) record(took time.Duration, resp *rlsv3.RateLimitResponse, err error) {
	raiseTo(&r.slowest, int64(took))
	switch {
	case err != nil:
		r.mu.Lock()
		r.errs[status.Code(err)]++
		r.mu.Unlock()
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		r.admitted.Add(1)
	default:
		r.denied.Add(1)
	}
}

// raiseTo raises *a to v if it is less: *a is the maximum of the values
// raised to, whatever the goroutines' order.
func raiseTo(a *atomic.Int64, v int64) {
	for old := a.Load(); v > old && !a.CompareAndSwap(old, v); old = a.Load() {
	}
}

// meshRequest is a call on runLoad's bucket: domain mesh, k=one (the
// bucket of meshConfig, wideConfig and sentinelFailoverConfig).
func meshRequest() *rlsv3.RateLimitRequest {
	return servertest.Request("mesh", servertest.Desc("k", "one"))
}

// callEach runs callers goroutines, spread over clients in turn, each
// calling ShouldRateLimit with req until ctx is done (or it has made
// 100,000 calls, more than a test's load makes), each call with its own
// deadline callTimeout and a 1 ms pause after it: about one call a
// millisecond a caller at most. After each call it calls seen, in the
// caller's goroutine, with the caller's index (0 to callers-1), when the
// call started and ended, and its answer. It returns once every caller
// has stopped.
func callEach(ctx context.Context, clients []rlsv3.RateLimitServiceClient, callers int, callTimeout time.Duration, req *rlsv3.RateLimitRequest,
	seen func(caller int, start, end time.Time, resp *rlsv3.RateLimitResponse, err error)) {
	var wg sync.WaitGroup
	for i := range callers {
		c := clients[i%len(clients)]
		wg.Go(func() {
			for n := 0; n < 100_000 && ctx.Err() == nil; n++ {
				callCtx, cancel := context.WithTimeout(context.Background(), callTimeout)
				start := time.Now()
				resp, err := c.ShouldRateLimit(callCtx, req)
				end := time.Now()
				cancel()
				seen(i, start, end, resp, err)
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// runLoad runs clients callers that call ShouldRateLimit on one bucket
// (meshRequest) through the servers at addrs, round-robin, each on a
// connection of its own server's, until ctx is done, each call with its
// own deadline, as callEach does. It returns what the calls were answered.
func runLoad(ctx context.Context, t *testing.T, addrs []string, clients int, callTimeout time.Duration) *loadResult {
	t.Helper()
	conns := make([]rlsv3.RateLimitServiceClient, len(addrs))
	for i, a := range addrs {
		conns[i] = rlsClient(t, a)
	}
	return meshLoad(ctx, conns, clients, callTimeout)
}

// meshLoad is runLoad over clients already made (connected, say, so that
// the load's clock does not run while they connect).
func meshLoad(ctx context.Context, clients []rlsv3.RateLimitServiceClient, callers int, callTimeout time.Duration) *loadResult {
	res := &loadResult{errs: map[codes.Code]int{}}
	callEach(ctx, clients, callers, callTimeout, meshRequest(), func(_ int, start, end time.Time, resp *rlsv3.RateLimitResponse, err error) {
		res.record(end.Sub(start), resp, err)
	})
	return res
}

// checkMeshLimit runs 50 clients across three replicas for five seconds on
// one 100/s burst-20 bucket and checks the total admitted.
func checkMeshLimit(t *testing.T, backendArgs ...string) {
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	var addrs []string
	for range 3 {
		args := append([]string{"--config", dir}, backendArgs...)
		addrs = append(addrs, startProc(t, args...).grpcAddr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	res := runLoad(ctx, t, addrs, 50, 2*time.Second)
	elapsed := time.Since(start).Seconds()
	admitted := float64(res.admitted.Load())
	upper := 100*elapsed + 20
	t.Logf("%.0f admitted, %d denied in %.2fs; bound %.0f; errors %v", admitted, res.denied.Load(), elapsed, upper, res.errs)
	failed := 0
	for _, n := range res.errs {
		failed += n
	}
	// Redis is healthy: every call is decided, however busy the machine.
	if calls := int(admitted) + int(res.denied.Load()) + failed; failed > 0 {
		t.Errorf("%d of %d calls failed with Redis healthy: %v", failed, calls, res.errs)
	}
	if admitted > upper*1.01 {
		t.Errorf("over-admitted: %.0f > %.0f (+1%%)", admitted, upper)
	}
	// The bucket is drained all along, so it admits nearly its whole rate.
	if admitted < 0.95*(100*5+20) {
		t.Errorf("under-admitted: %.0f < 95%% of %d", admitted, 100*5+20)
	}
}

func TestMeshWideLimitOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	checkMeshLimit(t, "--redis-url", "redis://"+srv.Addr)
}

func TestMeshWideLimitOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	checkMeshLimit(t, "--redis-cluster-addrs", strings.Join(cl.Addrs, ","))
}

// TestRedisKilledDuringLoad kills Redis in the middle of a load run in deny
// mode and restarts it: every call is answered within its deadline, no
// bucket grants more than rate·time + burst over the whole episode, and
// limiting resumes soon after Redis is back.
func TestRedisKilledDuringLoad(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--on-backend-failure", "deny",
		"--backend-timeout", "50ms", "--breaker-open-for", "200ms", "--redis-dial-timeout", "50ms", "--pprof")
	// A short load first, so that the connections a load keeps open are
	// in the baseline.
	warm, stopWarm := context.WithTimeout(context.Background(), 200*time.Millisecond)
	runLoad(warm, t, []string{p.grpcAddr}, 20, time.Second)
	stopWarm()
	baseline := goroutines(t, p.httpAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	after := make(chan *loadResult, 1)
	go func() {
		time.Sleep(time.Second)
		srv.Stop()
		time.Sleep(time.Second)
		if err := srv.Restart(); err != nil {
			t.Errorf("restart redis: %v", err)
		}
		// Give the breaker time to probe, then measure the last second.
		time.Sleep(time.Second)
		ctx2, cancel2 := context.WithTimeout(context.Background(), 900*time.Millisecond)
		defer cancel2()
		after <- runLoad(ctx2, t, []string{p.grpcAddr}, 5, time.Second)
	}()
	res := runLoad(ctx, t, []string{p.grpcAddr}, 20, time.Second)
	afterRestart := <-after
	elapsed := time.Since(start).Seconds()
	if len(res.errs) > 0 {
		t.Errorf("deny mode: calls failed %v, want every call answered", res.errs)
	}
	if slow := time.Duration(res.slowest.Load()); slow > 500*time.Millisecond {
		t.Errorf("slowest call took %v, want well under its 1s deadline", slow)
	}
	total := float64(res.admitted.Load() + afterRestart.admitted.Load())
	if upper := 100*elapsed + 20; total > upper*1.01 {
		t.Errorf("admitted %.0f over the episode, more than rate·time + burst = %.0f", total, upper)
	}
	if afterRestart.admitted.Load() == 0 {
		t.Errorf("nothing admitted in the second after Redis came back (denied %d, errors %v):\n%s",
			afterRestart.denied.Load(), afterRestart.errs, p.logs)
	}
	// No goroutine leaked through the outage: thousands of calls were
	// answered by the failure mode; allow for the second load's connection.
	var settled int
	for range 40 {
		if settled = goroutines(t, p.httpAddr); settled <= baseline+30 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("goroutines: %d before the outage, %d after", baseline, settled)
	if settled > baseline+30 {
		t.Errorf("%d goroutines after the outage, %d before: a leak", settled, baseline)
	}
}

// goroutines reads how many goroutines a ratelimitd started with --pprof
// has.
func goroutines(t *testing.T, httpAddr string) int {
	t.Helper()
	_, body := servertest.Get(t, "http://"+httpAddr+"/debug/pprof/goroutine?debug=1")
	var n int
	if _, err := fmt.Sscanf(body, "goroutine profile: total %d", &n); err != nil {
		t.Fatalf("reading the goroutine profile: %v", err)
	}
	return n
}

// TestSlowRedisAnswersWithinTheDeadline stalls Redis (CLIENT PAUSE) for
// 1.5 s under calls with 1 s deadlines: in error mode they answer
// UNAVAILABLE well within their deadline, none waits for the stall. Until
// the breaker opens, a call costs at most a read timeout (100ms here: the
// bound of every round trip) or, on a new connection, a dial and its
// handshake's read; after, it is answered at once.
func TestSlowRedisAnswersWithinTheDeadline(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--backend-timeout", "20ms", "--redis-read-timeout", "100ms")
	if err := srv.Client().Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res := runLoad(ctx, t, []string{p.grpcAddr}, 4, time.Second)
	if slow := time.Duration(res.slowest.Load()); slow > 700*time.Millisecond {
		t.Errorf("slowest call took %v while Redis stalled, want at most a dial (250ms) and two read timeouts (100ms)", slow)
	}
	if !strings.Contains(p.logs.String(), "backend failing") {
		t.Errorf("the breaker did not open while Redis stalled:\n%s", p.logs)
	}
	if res.errs[codes.Unavailable] == 0 {
		t.Errorf("no UNAVAILABLE answers while Redis stalled (admitted %d, errors %v)", res.admitted.Load(), res.errs)
	}
}

// TestSIGTERMDrainsAndExitsZero sends SIGTERM during load: the process
// answers what is in flight, then exits 0.
func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	p := startProc(t, "--config", dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan *loadResult, 1)
	go func() { done <- runLoad(ctx, t, []string{p.grpcAddr}, 16, time.Second) }()
	time.Sleep(300 * time.Millisecond)
	stopProc(t, p)
	cancel()
	res := <-done
	for code, n := range res.errs {
		// Calls made after the listener closed fail to connect; a call cut
		// off mid-flight would be another code.
		if code != codes.Unavailable {
			t.Errorf("%d calls failed with %v during shutdown", n, code)
		}
	}
	if res.admitted.Load() == 0 {
		t.Error("no call was answered before SIGTERM")
	}
	if !strings.Contains(p.logs.String(), `"msg":"stopped"`) {
		t.Errorf("no 'stopped' log line:\n%s", p.logs)
	}
}

// testCA is a certificate authority made for one test, writing its files
// under dir.
type testCA struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
	next int64
}

func newTestCA(t *testing.T, dir string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ratelimitd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, dir: dir, cert: cert, key: key, next: 2}
	ca.file = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

// issue writes a certificate and key named name, for a server on
// 127.0.0.1 or for a client, and returns their paths.
func (ca *testCA) issue(name string, server bool) (certFile, keyFile string) {
	ca.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.next), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	ca.next++
	if server {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+"-key.pem", "EC PRIVATE KEY", keyDER)
}

func (ca *testCA) write(name, typ string, b []byte) string {
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return path
}

// TestRedisOverTLSWithACLUser runs the Redis backend against a
// redis-server that speaks only TLS and knows only an ACL user.
func TestRedisOverTLSWithACLUser(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir)
	caFile := ca.file
	certFile, keyFile := ca.issue("redis", true)
	_, port, _ := net.SplitHostPort(proctest.FreeAddr(t))
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: install it (apt-get install -y redis-server)")
	}
	redis := exec.Command(redisBin, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no",
		"--user", "default", "off", "--user", "limiter", "on", ">s3cret", "~*", "+@all",
		"--save", "", "--appendonly", "no", "--dir", dir)
	var redisLog proctest.Buffer
	redis.Stdout, redis.Stderr = &redisLog, &redisLog
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redis.Process.Kill(); redis.Wait() })

	cfg := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	url := fmt.Sprintf("rediss://limiter:s3cret@127.0.0.1:%s", port)
	p := startProc(t, "--config", cfg, "--redis-url", url, "--redis-tls-ca", caFile, "--backend-timeout", "1s")
	rls := rlsClient(t, p.grpcAddr)
	req := servertest.Request("api", servertest.Desc("model", "gpt-4o"))
	var codesSeen []rlsv3.RateLimitResponse_Code
	deadline := time.Now().Add(10 * time.Second) // redis-server may still be starting
	for len(codesSeen) < 6 && time.Now().Before(deadline) {
		resp, err := rls.ShouldRateLimit(context.Background(), req)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		codesSeen = append(codesSeen, resp.GetOverallCode())
	}
	want := "[OK OK OK OK OK OVER_LIMIT]"
	if fmt.Sprint(codesSeen) != want {
		t.Fatalf("over TLS as an ACL user: %v, want %s\nratelimitd:\n%s\nredis:\n%s", codesSeen, want, p.logs, redisLog.String())
	}

	// The wrong password is refused: calls fail, never admit.
	bad := startProc(t, "--config", cfg, "--redis-url", fmt.Sprintf("rediss://limiter:wrong@127.0.0.1:%s", port),
		"--redis-tls-ca", caFile, "--backend-timeout", "1s")
	_, err = rlsClient(t, bad.grpcAddr).ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("wrong password: %v, want Unavailable", err)
	}
	// Without the CA the server's certificate is not trusted.
	untrusted := startProc(t, "--config", cfg, "--redis-url", url, "--backend-timeout", "1s")
	_, err = rlsClient(t, untrusted.grpcAddr).ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("untrusted certificate: %v, want Unavailable", err)
	}
}

// TestQuotaGroupAcrossReplicas: three aliases of one 10/min quota group,
// called through two replicas sharing Redis, admit 10 in all.
func TestQuotaGroupAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"ai.yaml": `domain: ai
quota_groups:
  deployment: {unit: minute, requests_per_unit: 10}
descriptors:
  - {key: model, value: gpt-4o, quota_group: deployment}
  - {key: model, value: gpt-4o-latest, quota_group: deployment}
  - {key: model, value: chat-default, quota_group: deployment}
`})
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--backend-timeout", "1s")
		clients = append(clients, rlsClient(t, p.grpcAddr))
	}
	aliases := []string{"gpt-4o", "gpt-4o-latest", "chat-default"}
	var got []string
	for i := range 12 {
		req := servertest.Request("ai", servertest.Desc("model", aliases[i%3]))
		resp, err := clients[i%2].ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		got = append(got, resp.GetOverallCode().String())
	}
	want := strings.Repeat("OK ", 10) + "OVER_LIMIT OVER_LIMIT"
	if strings.Join(got, " ") != want {
		t.Errorf("12 calls over 3 aliases and 2 replicas: %v, want 10 OK then OVER_LIMIT", got)
	}
}

// TestHealthFollowsTheFailureMode: with Redis down, a replica in error
// mode tells Envoy's health checks NOT_SERVING and /readyz 503 once its
// breaker opens, and SERVING again once Redis answers; one in deny mode
// keeps serving, /readyz saying "degraded".
func TestHealthFollowsTheFailureMode(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	args := []string{"--config", dir, "--redis-url", "redis://" + srv.Addr, "--backend-timeout", "50ms",
		"--breaker-open-for", "100ms", "--redis-dial-timeout", "50ms"}
	strict := startProc(t, append(args, "--on-backend-failure", "error")...)
	lenient := startProc(t, append(args, "--on-backend-failure", "deny")...)
	req := servertest.Request("mesh", servertest.Desc("k", "health"))
	state := func(p *proc) (healthpb.HealthCheckResponse_ServingStatus, int, string) {
		t.Helper()
		conn := servertest.Dial(t, p.grpcAddr)
		rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
		return p.readiness(t, conn)
	}
	serving := healthpb.HealthCheckResponse_SERVING
	if h, code, _ := state(strict); h != serving || code != http.StatusOK {
		t.Fatalf("Redis up: health %v, /readyz %d; want SERVING, 200", h, code)
	}
	srv.Stop()
	// Health turns when the breaker opens: once calls have failed for
	// --breaker-failing-for (the backend timeout, 50 ms), not at the
	// first failure.
	down := time.Now()
	for {
		h, code, _ := state(strict)
		if h == healthpb.HealthCheckResponse_NOT_SERVING && code == http.StatusServiceUnavailable {
			if took := time.Since(down); took < 50*time.Millisecond {
				t.Errorf("NOT_SERVING %v after Redis stopped, before the breaker could open (50 ms)", took)
			}
			break
		}
		if time.Since(down) > 10*time.Second {
			t.Fatalf("10 s after Redis stopped, error mode: health %v, /readyz %d; want NOT_SERVING, 503", h, code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h, code, body := state(lenient); h != serving || code != http.StatusOK || !strings.Contains(body, "degraded") {
		t.Errorf("Redis down, deny mode: health %v, /readyz %d %q; want SERVING, 200 degraded", h, code, body)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	deadline := back.Add(10 * time.Second)
	for {
		h, code, _ := state(strict)
		if h == serving && code == http.StatusOK {
			t.Logf("serving again %v after Redis came back", time.Since(back).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after Redis came back: health %v, /readyz %d; want SERVING, 200", h, code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisMetrics: /metrics shows how calls reached Redis, and what the
// denial cache answered instead. Three calls one after the other on a
// bucket of one token: the first takes it, Redis denies the second (the
// cache learns the denial), the cache denies the third.
func TestRedisMetrics(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"api.yaml": `domain: api
descriptors:
  - {key: client, rate_limit: {unit: hour, requests_per_unit: 1}}
`})
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--backend-timeout", "1s")
	rls := rlsClient(t, p.grpcAddr)
	req := servertest.Request("api", servertest.Desc("client", "a"))
	var got []string
	for range 3 {
		resp, err := rls.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.GetOverallCode().String())
	}
	if want := "OK OVER_LIMIT OVER_LIMIT"; strings.Join(got, " ") != want {
		t.Fatalf("3 calls on one token: %v, want %s", got, want)
	}
	code, body := servertest.Get(t, "http://"+p.httpAddr+"/metrics")
	for _, want := range []string{
		"ratelimitd_redis_takes_total 2",
		// The start-up probe (scripts loaded before it), then the two Takes.
		"ratelimitd_redis_script_calls_total 3",
		"ratelimitd_redis_scripts_total 3",
		"ratelimitd_redis_round_trips_total 3",  // no NOSCRIPT: the scripts were loaded at start
		"ratelimitd_redis_direct_calls_total 3", // Redis idle each time
		"ratelimitd_denial_cache_learned_total 1",
		"ratelimitd_denial_cache_denials_total 1",
	} {
		if code != http.StatusOK || !strings.Contains(body, want+"\n") {
			t.Errorf("GET /metrics = %d, lacks %q", code, want)
		}
	}
}

// TestHeapFloorReachesTheRuntime: the GC percent a process runs with, as
// /metrics reports it, is raised by the heap floor while the live heap is
// small (at most 1600: 64 MiB over the runtime's 4 MiB minimum), and is
// GOGC's default with the floor off.
func TestHeapFloorReachesTheRuntime(t *testing.T) {
	dir := writeConfig(t, map[string]string{"api.yaml": "domain: api\n"})
	for _, tt := range []struct {
		floor    string
		min, max float64
	}{
		{"64", 101, 1600},
		{"0", 100, 100},
	} {
		p := startProc(t, "--config", dir, "--gc-heap-floor-mib", tt.floor)
		if got := scrape(t, p).value("go_gc_gogc_percent"); got < tt.min || got > tt.max {
			t.Errorf("--gc-heap-floor-mib %s: go_gc_gogc_percent %v, want %v to %v", tt.floor, got, tt.min, tt.max)
		}
	}
}
