package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// BenchmarkRedisCPU measures what a decision costs Redis: 64 callers take
// one token each, through one Store on a redis-server of the benchmark's
// own, over 1,000 buckets and on one bucket (every take admitted: a limit
// far above the load). It reports Redis's CPU time per decision (INFO cpu)
// and the take scripts' own time per call and per decision (INFO
// commandstats), the figures the cost model in docs/performance.md cites.
func BenchmarkRedisCPU(b *testing.B) {
	for _, bc := range []struct {
		name    string
		buckets int
	}{{"buckets=1000", 1000}, {"buckets=1", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			srv, err := redistest.NewServer()
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "bench:"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			lim := limiter.Limit{Count: 1 << 30, Period: time.Second, Burst: 1 << 30}
			keys := make([]string, bc.buckets)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			ctx := context.Background()
			before := redisCounters(b, srv.Client())
			var n atomic.Int64
			start := time.Now()
			b.ResetTimer()
			b.SetParallelism(32) // 64 callers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				i := int(n.Add(1)) * 7919
				for pb.Next() {
					i++
					req := []limiter.Request{{Key: keys[i%len(keys)], Limit: lim, Hits: 1}}
					if _, err := s.Take(ctx, time.Now(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			elapsed := time.Since(start)
			after := redisCounters(b, srv.Client())
			d := float64(b.N)
			b.ReportMetric(float64(after.cpuUs-before.cpuUs)/d, "redis-µs/op")
			calls := after.scriptCalls - before.scriptCalls
			b.ReportMetric(float64(after.scriptUs-before.scriptUs)/d, "script-µs/op")
			if calls > 0 {
				b.ReportMetric(float64(after.scriptUs-before.scriptUs)/float64(calls), "script-µs/call")
				b.ReportMetric(d/float64(calls), "ops/call")
			}
			b.ReportMetric(d/elapsed.Seconds(), "ops/s")
		})
	}
}

type counters struct {
	cpuUs, scriptCalls, scriptUs int64
}

func redisCounters(b *testing.B, c *redis.Client) counters {
	b.Helper()
	text, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var out counters
	for _, line := range strings.Split(text, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			out.cpuUs += int64(f * 1e6)
		case k == "cmdstat_evalsha" || k == "cmdstat_eval" || k == "cmdstat_fcall":
			for _, f := range strings.Split(v, ",") {
				name, val, _ := strings.Cut(f, "=")
				x, _ := strconv.ParseInt(val, 10, 64)
				switch name {
				case "calls":
					out.scriptCalls += x
				case "usec":
					out.scriptUs += x
				}
			}
		}
	}
	return out
}
