package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
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
//
// Then, in the same run, three scripts carry the same decisions alone (no
// callers, no Store: two senders, as the Store's batcher has, each sending
// the next call when its last is answered), in calls of the size the
// Store's run formed (its ops/call):
//   - script=take, take.lua as the Store sends it: over many buckets one
//     Take a bucket, on one bucket the calls' Takes as one group ("*m");
//   - script=gcra, a bare GCRA script: one GET and one SET ... PX a
//     bucket, integer microseconds, no fractions, no rates (the reference
//     the cost targets in docs/performance.md were set against); on one bucket it reads and
//     writes the bucket once a call, as a group of Takes does;
//   - script=empty, a script that returns at once: what carrying a call
//     costs Redis (its socket, its arguments, EVALSHA) before any work.
//
// The last two report take/floor, script=take's Redis CPU a decision over
// theirs: how far the exact decision is from the least a script that
// keeps a bucket a key (or does nothing at all) can cost here. Alone, the
// scripts cost Redis less than under the Store's run, where 64 callers
// share the two cores with Redis.
func BenchmarkRedisCPU(b *testing.B) {
	spec := redisstore.TakeSpec(limiter.Request{Limit: limiter.Limit{Count: 1 << 30, Period: time.Second, Burst: 1 << 30}, Hits: 1})
	scripts := []struct {
		name, source string
		args         func(perCall int, group bool) []any // ARGV, KEYS aside
	}{
		{"script=take", redisstore.TakeScriptSource(), func(per int, group bool) []any {
			if group {
				return []any{"", "*" + strconv.Itoa(per), spec}
			}
			args := []any{""}
			for range per {
				args = append(args, spec)
			}
			return args
		}},
		{"script=gcra", bareGCRAScript, func(per int, group bool) []any {
			if group {
				return []any{per}
			}
			return []any{1}
		}},
		{"script=empty", "return 1", nil},
	}
	for _, bc := range []struct {
		name    string
		buckets int
	}{{"buckets=1000", 1000}, {"buckets=1", 1}} {
		keys := make([]string, bc.buckets)      // the Store's
		redisKeys := make([]string, bc.buckets) // the scripts', as long
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
			redisKeys[i] = "bench:{" + keys[i] + "}"
		}
		var perCall float64 // decisions a call in the Store's run
		b.Run(bc.name+"/store", func(b *testing.B) { perCall = benchStoreCPU(b, keys) })
		var take float64 // script=take's Redis CPU a decision
		for _, sc := range scripts {
			b.Run(bc.name+"/"+sc.name, func(b *testing.B) {
				if perCall == 0 {
					b.Skip("the store's run measured no calls")
				}
				per := max(1, int(perCall+0.5))
				args := scripts[0].args(per, len(keys) == 1) // the empty script gets take.lua's
				if sc.args != nil {
					args = sc.args(per, len(keys) == 1)
				}
				got := benchScriptCPU(b, sc.source, redisKeys, per, args)
				if sc.name == "script=take" {
					take = got
				} else if take > 0 {
					b.ReportMetric(take/got, "take/floor")
				}
			})
		}
	}
}

// benchStoreCPU runs 64 callers taking one token each from keys, in turn,
// through a Store, reports what it cost Redis, and returns the decisions a
// script call carried (0 for no call).
func benchStoreCPU(b *testing.B, keys []string) float64 {
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
	var perCall float64
	if calls > 0 {
		perCall = d / float64(calls)
		b.ReportMetric(float64(after.scriptUs-before.scriptUs)/float64(calls), "script-µs/call")
		b.ReportMetric(perCall, "ops/call")
	}
	b.ReportMetric(d/elapsed.Seconds(), "ops/s")
	return perCall
}

// bareGCRAScript is the script=gcra script: for each of KEYS, its tat
// (µs; missing: now) advanced by ARGV[1] µs from max(tat, now), written
// back to expire a second later; it returns the number of buckets.
const bareGCRAScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local hits = tonumber(ARGV[1])
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local tat = now
  if v then
    tat = math.max(tonumber(v), now)
  end
  redis.call('SET', KEYS[i], string.format('%d', tat + hits), 'PX', 1000)
end
return #KEYS
`

// benchScriptCPU sends b.N decisions as calls of script with ARGV args,
// perCall of them a call, from two senders, and reports and returns
// Redis's CPU µs a decision. Over many keys a call names perCall of them
// in turn; on one key, that key once (args say how many decisions).
func benchScriptCPU(b *testing.B, script string, keys []string, perCall int, args []any) float64 {
	srv, err := redistest.NewServer()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c := srv.Client()
	ctx := context.Background()
	sha, err := c.ScriptLoad(ctx, script).Result()
	if err != nil {
		b.Fatal(err)
	}
	callKeys := func(i int) []string {
		if len(keys) == 1 {
			return keys
		}
		ks := make([]string, perCall)
		for j := range ks {
			ks[j] = keys[(i*perCall+j)%len(keys)]
		}
		return ks
	}
	calls := (b.N + perCall - 1) / perCall
	before := redisCounters(b, c)
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 2 { // the batcher's two senders
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				if err := c.EvalSha(ctx, sha, callKeys(i), args...).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	after := redisCounters(b, c)
	usPerOp := float64(after.cpuUs-before.cpuUs) / float64(calls*perCall)
	b.ReportMetric(usPerOp, "redis-µs/op")
	b.ReportMetric(float64(perCall), "ops/call")
	return usPerOp
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
