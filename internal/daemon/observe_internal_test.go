package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestReadersCountQueuedCalls: a call the metrics and the page have not
// been handed yet (they get calls in batches, a while after the answer)
// is handed over by a scrape, a read of /limits or of /limits.json before
// it is served. In a synctest bubble the batch's timer cannot fire while
// the test runs on, so only the readers can hand the calls over.
func TestReadersCountQueuedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, err := newObservability(context.Background(), Config{}, "memory")
		if err != nil {
			t.Fatal(err)
		}
		defer obs.close()
		srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
		if err != nil {
			t.Fatal(err)
		}
		h := obs.handler(http.NotFoundHandler(), srv, func() (string, string) { return "file", "" })
		for n, path := range []string{"/metrics", "/limits", "/limits.json"} {
			obs.observer().ObserveCall(server.Call{Domain: "queued", Checked: true, Start: time.Now(), Code: codes.Unavailable})
			if got := queuedCalls(t, obs); got != float64(n) {
				t.Fatalf("before GET %s: %v calls counted, want %d (the new one queued)", path, got, n)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s: %d", path, rec.Code)
			}
			if got := queuedCalls(t, obs); got != float64(n+1) {
				t.Errorf("after GET %s: %v calls counted, want %d", path, got, n+1)
			}
		}
	})
}

// queuedCalls is what obs's registry counts of the calls of
// TestReadersCountQueuedCalls, gathered without handing queued calls over.
func queuedCalls(t *testing.T, obs *observability) float64 {
	t.Helper()
	families, err := obs.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ratelimitd_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "domain" && l.GetValue() == "queued" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
