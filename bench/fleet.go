package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/tokenlease"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// fleetOptions shape the fleet simulation.
type fleetOptions struct {
	replicas, callers int // replicas, and callers per replica
	rate, burst       int64
	offered           float64 // offered load, as a multiple of the rate
	skew              float64 // share of it on the first replica; 0: even
	duration          time.Duration
	redisServer       string
}

// fleetResult is one phase of the simulation (token leases off or on).
type fleetResult struct {
	leases              bool
	admitted, denied    int64
	elapsed             time.Duration
	bound               float64 // rate·t + burst at the end
	worst               float64 // the largest admitted/(rate·t + burst) at a second's end
	perSecond           []int64 // admitted in each second
	redis               RedisUsage
	local, slices       int64 // leases on: admitted from slices, slices taken
	decisionsPerCoreSec float64
}

// runFleet is the fleet command: replicas of ratelimitd's Redis path (a
// redisstore.Store each, with its own connections, behind the denial
// cache as the daemon builds it, and with --token-leases a
// tokenlease.Leaser), in this process, on one redis-server it starts,
// share one hot bucket offered a multiple of its rate by paced callers.
// It runs with leases off, then on, and prints for each: admitted per
// second against the cumulative bound rate·t + burst, utilization, Redis
// CPU per decision and decisions a second per Redis core. A second whose
// cumulative admissions pass the bound fails the run.
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := fleetOptions{}
	fs := flag.NewFlagSet("ratelimit-bench fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.replicas, "replicas", 32, "replicas sharing the bucket")
	fs.IntVar(&o.callers, "callers", 2, "callers per replica")
	fs.Int64Var(&o.rate, "rate", 10000, "the bucket's rate, tokens a second")
	fs.Int64Var(&o.burst, "burst", 2000, "the bucket's burst")
	fs.Float64Var(&o.offered, "offered", 2, "offered load, a multiple of the rate, spread evenly over the replicas")
	fs.Float64Var(&o.skew, "skew", 0, "share of the offered load on the first replica, the rest spread evenly (0: all even)")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "length of each phase")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if o.replicas < 1 || o.callers < 1 || o.rate < 1 || o.burst < 1 || o.offered <= 0 || o.duration <= 0 {
		return usageError{errors.New("fleet: --replicas, --callers, --rate, --burst, --offered and --duration must be positive")}
	}
	if o.skew < 0 || o.skew >= 1 || (o.skew > 0 && o.replicas < 2) {
		return usageError{errors.New("fleet: --skew must be in [0, 1), with at least 2 replicas")}
	}
	dir, err := os.MkdirTemp("", "ratelimit-bench-fleet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var procs children
	defer procs.stopAll()
	addr, err := procs.startRedis(ctx, o.redisServer, dir)
	if err != nil {
		return err
	}
	var results []fleetResult
	for _, leases := range []bool{false, true} {
		res, err := fleetPhase(ctx, o, addr, leases)
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	printFleet(stdout, o, results)
	for _, r := range results {
		if r.worst > 1 {
			return fmt.Errorf("fleet: leases %v admitted %.4f× rate·t + burst at a second's end", r.leases, r.worst)
		}
	}
	return nil
}

// fleetPhase runs one phase on a bucket of its own.
func fleetPhase(ctx context.Context, o fleetOptions, addr string, leases bool) (fleetResult, error) {
	res := fleetResult{leases: leases}
	lim := limiter.Limit{Count: o.rate, Period: time.Second, Burst: o.burst}
	key := fmt.Sprintf("fleet-%v", leases)
	type replica struct {
		store  limiter.Store
		leaser *tokenlease.Leaser
		close  func()
	}
	reps := make([]replica, o.replicas)
	for i := range reps {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
		st, err := redisstore.New(c, redisstore.Options{Prefix: "fleet:"})
		if err != nil {
			return res, err
		}
		cache, err := denialcache.New(denialcache.Options{})
		if err != nil {
			return res, err
		}
		var front limiter.Store = cache.Learn(st)
		r := replica{close: func() { st.Close(); c.Close() }}
		if leases {
			l, err := tokenlease.New(front, tokenlease.Options{})
			if err != nil {
				return res, err
			}
			r.leaser, front = l, l
		}
		r.store = cache.Front(front)
		reps[i] = r
	}
	counters, err := newRedisCounters(addr)
	if err != nil {
		return res, err
	}
	defer counters.close()
	before, err := counters.snapshot(ctx)
	if err != nil {
		return res, err
	}
	seconds := int(o.duration / time.Second)
	perSecond := make([]atomic.Int64, seconds+1)
	var denied atomic.Int64
	callers := o.replicas * o.callers
	offered := o.offered * float64(o.rate) // calls a second, all replicas
	// share is replica r's part of the offered load.
	share := func(r int) float64 {
		switch {
		case o.skew == 0:
			return 1 / float64(o.replicas)
		case r == 0:
			return o.skew
		}
		return (1 - o.skew) / float64(o.replicas-1)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		r := i % o.replicas
		store := reps[r].store
		interval := time.Duration(float64(time.Second) * float64(o.callers) / (share(r) * offered))
		wg.Go(func() {
			next := start.Add(time.Duration(i) * interval / time.Duration(callers))
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				now := time.Now()
				if now.Sub(start) >= o.duration {
					return
				}
				next = next.Add(interval)
				if behind := now.Sub(next); behind > 10*interval {
					next = now // a caller far behind starts again from now
				}
				d, err := store.Take(ctx, now, []limiter.Request{{Key: key, Limit: lim, Hits: 1}})
				switch {
				case err != nil:
					denied.Add(1) // counted as not admitted; Redis is healthy here
				case d[0].Allowed:
					perSecond[int(now.Sub(start)/time.Second)].Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	after, err := counters.snapshot(ctx)
	if err != nil {
		return res, err
	}
	var total int64
	for s := range seconds {
		n := perSecond[s].Load()
		total += n
		res.perSecond = append(res.perSecond, n)
		bound := float64(o.rate)*float64(s+1) + float64(o.burst)
		res.worst = max(res.worst, float64(total)/bound)
	}
	res.admitted, res.denied = total+perSecond[seconds].Load(), denied.Load()
	res.bound = float64(o.rate)*res.elapsed.Seconds() + float64(o.burst)
	res.redis = usage(before, after, res.admitted+res.denied)
	if res.redis.CPUMicros > 0 {
		res.decisionsPerCoreSec = float64(res.admitted+res.denied) / (float64(res.redis.CPUMicros) / 1e6)
	}
	for _, r := range reps {
		if r.leaser != nil {
			r.leaser.Close()
			st := r.leaser.Stats()
			res.local += st.Local
			res.slices += st.Slices
		}
		r.close()
	}
	return res, nil
}

// printFleet prints the phases side by side.
func printFleet(w io.Writer, o fleetOptions, results []fleetResult) {
	spread := "evenly"
	if o.skew > 0 {
		spread = fmt.Sprintf("%.0f%% on one replica", 100*o.skew)
	}
	fmt.Fprintf(w, "fleet: %d replicas × %d callers on one redis-server, one bucket of %d/s burst %d offered %.1f× its rate (%s) for %v a phase\n",
		o.replicas, o.callers, o.rate, o.burst, o.offered, spread, o.duration)
	fmt.Fprintf(w, "%8s %10s %10s %12s %12s %10s %14s %16s %12s %10s\n",
		"leases", "admitted", "denied", "rate·t+burst", "utilization", "worst/bound", "redis µs/dec", "dec/s/redis-core", "from slices", "slices")
	for _, r := range results {
		on := "off"
		if r.leases {
			on = "on"
		}
		fmt.Fprintf(w, "%8s %10d %10d %12.0f %11.2f%% %10.4f %14.3f %16.0f %12d %10d\n",
			on, r.admitted, r.denied, r.bound, 100*float64(r.admitted)/r.bound, r.worst, r.redis.CPUMicrosPerDecision, r.decisionsPerCoreSec, r.local, r.slices)
	}
	for _, r := range results {
		fmt.Fprintf(w, "admitted per second, leases %v: %v\n", r.leases, r.perSecond)
	}
}
