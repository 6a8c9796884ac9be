package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// TestGiveBackAfterOtherTakes drives one slot of a multi-slot Take by hand:
// take.lua, then other requests, then giveback.lua.
func TestGiveBackAfterOtherTakes(t *testing.T) {
	s, c := ownServerStore(t, Options{Prefix: "gb:", Clock: CallerClock})
	ctx := context.Background()
	t0 := limitertest.T0
	l := limiter.Limit{Count: 1, Period: time.Minute, Burst: 10}
	state := func(key string) limiter.State {
		v, err := c.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		var st limiter.State
		if _, err := FmtSscan(v, &st); err != nil {
			t.Fatalf("GET %s = %q: %v", key, v, err)
		}
		return st
	}
	giveBack := func(now time.Time, key string, reqs []limiter.Request, res takeResult) {
		t.Helper()
		if err := s.giveBackGroups(ctx, now, []string{key}, reqs, [][]int{{0}}, []takeResult{res}, []error{nil}); err != nil {
			t.Fatalf("give back: %v", err)
		}
	}

	for _, tc := range []struct {
		name       string
		other      time.Duration // when another request takes 3
		giveBackAt time.Duration
		want       time.Duration // the TAT after the give-back, from t0
	}{
		// Ours (2 tokens) ends at t0+2m; the other request chains on it to
		// t0+5m; the give-back moves it back by exactly 2m. (Had ours never
		// run, the other would have ended at t0+3m10s: the bucket is left
		// fuller by the 10s that refilled during the window.)
		{"others chained on ours", 10 * time.Second, 20 * time.Second, 3 * time.Minute},
		// Ours has refilled by the time of the give-back (t0+2m): the
		// other request started from a full bucket; nothing to give back.
		{"ours refilled already", 2 * time.Minute, 2 * time.Minute, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := s.Key(tc.name)
			reqs := []limiter.Request{{Key: tc.name, Limit: l, Hits: 2}}
			res, err := s.run(ctx, time.Time{}, t0, []string{key}, reqs, true)
			if err != nil || !res.allowed || !res.giveBack[0].needed {
				t.Fatalf("take = %+v, %v", res, err)
			}
			if _, err := s.Take(ctx, t0.Add(tc.other), []limiter.Request{{Key: tc.name, Limit: l, Hits: 3}}); err != nil {
				t.Fatal(err)
			}
			giveBack(t0.Add(tc.giveBackAt), key, reqs, res)
			if got, want := state(key), (limiter.State{TAT: t0.Add(tc.want).UnixMicro(), Count: l.Count, PeriodUS: l.Period.Microseconds()}); got != want {
				t.Errorf("after the give-back, state = %+v, want TAT t0+%v", got, tc.want)
			}
		})
	}
}
