package reload_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/reload"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// serve runs srv behind a real gRPC server on a loopback port and returns a
// go-control-plane client for it.
func serve(t *testing.T, srv *server.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	return servertest.Start(t, servertest.Options{RateLimit: srv}).Client()
}

// reloadInto starts a Watcher on dir that sets srv's config on each load
// and reports the loaded hashes.
func reloadInto(t *testing.T, dir string, srv *server.Server, debounce time.Duration) <-chan string {
	t.Helper()
	set, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(set)
	loaded := make(chan string, 1000)
	w, err := reload.New(reload.Options{
		Path:     dir,
		Current:  set,
		Debounce: debounce,
		OnLoad: func(s *config.Set) {
			srv.SetConfig(s)
			loaded <- s.Hash()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return loaded
}

// waitHash waits until a load with the hash of the files at dir arrives.
func waitHash(t *testing.T, loaded <-chan string, dir string) {
	t.Helper()
	want, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(timeout)
	for {
		select {
		case h := <-loaded:
			if h == want.Hash() {
				return
			}
		case <-deadline:
			t.Fatalf("the files at %s were not loaded within %v", dir, timeout)
		}
	}
}

// rlRequest is a request in domain d with a descriptor of one entry for
// each key, value pair in kv.
func rlRequest(kv ...string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "d"}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, servertest.Desc(kv[i], kv[i+1]))
	}
	return req
}

// TestReloadStorm rewrites the config 100 times while clients call the
// server over gRPC: no call fails, and the last config is the one in force.
func TestReloadStorm(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	version := func(i int) string {
		return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d, burst: 1000000, name: v%d}\n", 1000+i, i)
	}
	writeFile(t, name, version(0))
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, srv)
	loaded := reloadInto(t, dir, srv, 5*time.Millisecond)

	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.ShouldRateLimit(context.Background(), rlRequest("k", fmt.Sprint(g, n%10)))
				calls.Add(1)
				if err == nil && (len(resp.GetStatuses()) != 1 || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK) {
					err = fmt.Errorf("answer %v", resp)
				}
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	// Stops the load, also when the test fails midway.
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)
	batchStart := calls.Load()
	for i := 1; i <= 100; i++ {
		if i%2 == 0 {
			writeByRename(t, name, version(i))
		} else {
			writeFile(t, name, version(i)) // in place: may be seen half-written
		}
		if i%10 == 0 {
			// Make sure reloads happen under load: this batch's reload took
			// effect, and at least 10 calls were answered meanwhile.
			waitHash(t, loaded, dir)
			waitCalls(t, &calls, batchStart+10)
			batchStart = calls.Load()
		}
	}
	stopLoad()
	if failures.Load() > 0 {
		t.Errorf("%d of %d calls failed during the reload storm; first: %v", failures.Load(), calls.Load(), firstErr.Load())
	}
	final, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Config().Hash(); got != final.Hash() {
		t.Errorf("config in force has hash %s, want the final files' %s", got, final.Hash())
	}
	resp, err := client.ShouldRateLimit(context.Background(), rlRequest("k", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetStatuses()[0].GetCurrentLimit(); got.GetName() != "v100" || got.GetRequestsPerUnit() != 1100 {
		t.Errorf("after the storm, current_limit = %v, want v100 at 1100/s", got)
	}
}

// waitCalls waits until calls reaches n, for at most 10 s.
func waitCalls(t *testing.T, calls *atomic.Int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d calls answered in 10 s during the storm, want %d", calls.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBucketsSurviveReload takes from two buckets, reloads a config in
// which one rule's rate changed and the other did not, and checks that
// neither bucket was reset to full: the changed rule applies its new rate to
// the time its bucket already owes, the unchanged one carries on.
func TestBucketsSurviveReload(t *testing.T) {
	// Only a's rate changes.
	rates := func(aPerMinute int) string {
		return fmt.Sprintf(`domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: %d, burst: 10, name: a}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10, name: b}
`, aPerMinute)
	}
	before, after := rates(60), rates(120)
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	writeFile(t, name, before)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) // time stands still
	srv, err := server.New(server.Options{
		Store: limiter.NewMemoryStore(limiter.MemoryOptions{}),
		Now:   func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	loaded := reloadInto(t, dir, srv, 5*time.Millisecond)
	remaining := func(key string) (uint32, uint32) {
		t.Helper()
		resp, err := srv.ShouldRateLimit(context.Background(), rlRequest(key, "x"))
		if err != nil {
			t.Fatalf("ShouldRateLimit(%s=x): %v", key, err)
		}
		st := resp.GetStatuses()[0]
		return st.GetLimitRemaining(), st.GetCurrentLimit().GetRequestsPerUnit()
	}
	for range 4 {
		remaining("a")
		remaining("b")
	}
	// a owes 4 s (4 tokens at 1 per second), b owes 24 s (4 at 1 per 6 s).
	if err := os.WriteFile(name, []byte(after), 0o644); err != nil {
		t.Fatal(err)
	}
	waitHash(t, loaded, dir)

	// a now gains a token every 0.5 s and is full after 5 s. It keeps the
	// 4 tokens it spent (limiter.State): 2 s at the new rate, plus 0.5 s
	// for this call, 5 left. Reset to full, it would have 9; kept as time
	// owed (4 s), 1.
	if got, rate := remaining("a"); got != 5 || rate != 120 {
		t.Errorf("changed rule a after reload: %d remaining at %d/min, want 5 at 120/min (the 4 tokens spent kept)", got, rate)
	}
	// b is unchanged: 10 − 4 − 1.
	if got, rate := remaining("b"); got != 5 || rate != 10 {
		t.Errorf("unchanged rule b after reload: %d remaining at %d/min, want 5 at 10/min", got, rate)
	}
}
