package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisUsage is what the server asked of Redis during the measured phase,
// from the deltas of Redis's own counters (INFO stats, INFO commandstats).
//
// Commands counts every command Redis executed except our PING and INFO
// calls, including those a script runs (redis.call): it measures Redis's
// work, and is more than what clients sent. Scripts counts the EVALSHA,
// EVAL, EVALSHA_RO, EVAL_RO, FCALL and FCALL_RO that clients sent; a
// pipeline of N scripts is N scripts. RoundTrips is the delta of
// total_reads_processed (read events on client sockets) less our own INFO
// call: a pipeline or one multi-key script sent in one write is read in one
// event, so it is one round trip, while N separate calls are N. It can
// overcount when a large pipeline arrives in several reads, and it counts
// every client of this Redis, so give the server a Redis of its own.
// CPUMicros is the CPU time Redis spent (used_cpu_user + used_cpu_sys of
// INFO cpu), in µs: on a machine whose cores are shared it runs slower
// than on its own, so compare it within one run.
type RedisUsage struct {
	Commands              int64            `json:"commands"`
	Scripts               int64            `json:"scripts"`
	RoundTrips            int64            `json:"round_trips"`
	CommandsPerDecision   float64          `json:"commands_per_decision"`
	ScriptsPerDecision    float64          `json:"scripts_per_decision"`
	RoundTripsPerDecision float64          `json:"round_trips_per_decision"`
	CPUMicros             int64            `json:"cpu_us"`
	CPUMicrosPerDecision  float64          `json:"cpu_us_per_decision"`
	ByCommand             map[string]int64 `json:"by_command,omitempty"`
}

// redisSnapshot holds the counters read by one INFO call.
type redisSnapshot struct {
	commands int64            // total_commands_processed
	reads    int64            // total_reads_processed
	calls    map[string]int64 // per command, from cmdstat_<name>:calls=
	cpuUs    int64            // used_cpu_user + used_cpu_sys, in µs
}

// redisCounters reads a Redis server's INFO counters.
type redisCounters struct {
	c *redis.Client
}

func newRedisCounters(addr string) (*redisCounters, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	// One connection: one read event per INFO call.
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	return &redisCounters{c: c}, nil
}

func (r *redisCounters) close() { r.c.Close() }

func (r *redisCounters) snapshot(ctx context.Context) (redisSnapshot, error) {
	// Connect first, so that the connection's own handshake happens before
	// the INFO whose counters we keep.
	if err := r.c.Ping(ctx).Err(); err != nil {
		return redisSnapshot{}, fmt.Errorf("redis %s: ping: %w", r.c.Options().Addr, err)
	}
	text, err := r.c.Info(ctx, "stats", "commandstats", "cpu").Result()
	if err != nil {
		return redisSnapshot{}, fmt.Errorf("redis %s: INFO: %w", r.c.Options().Addr, err)
	}
	return parseInfo(text)
}

// parseInfo reads the counters RedisUsage needs from INFO output.
func parseInfo(text string) (redisSnapshot, error) {
	s := redisSnapshot{calls: map[string]int64{}, commands: -1, reads: -1}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case name == "total_commands_processed":
			s.commands, _ = strconv.ParseInt(val, 10, 64)
		case name == "total_reads_processed":
			s.reads, _ = strconv.ParseInt(val, 10, 64)
		case name == "used_cpu_user" || name == "used_cpu_sys":
			sec, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return s, fmt.Errorf("INFO %s: %w", name, err)
			}
			s.cpuUs += int64(sec * 1e6)
		case strings.HasPrefix(name, "cmdstat_"):
			for _, kv := range strings.Split(val, ",") {
				if n, ok := strings.CutPrefix(kv, "calls="); ok {
					c, err := strconv.ParseInt(n, 10, 64)
					if err != nil {
						return s, fmt.Errorf("INFO %s: %w", name, err)
					}
					s.calls[strings.TrimPrefix(name, "cmdstat_")] = c
				}
			}
		}
	}
	if s.commands < 0 || s.reads < 0 {
		return s, fmt.Errorf("INFO has no total_commands_processed or total_reads_processed (Redis 6.2 or later needed)")
	}
	return s, nil
}

// usage is what happened between two snapshots, for decisions answered.
// Each snapshot is one PING and one INFO on one connection; the deltas
// include the PING and INFO of the second snapshot's read events and the
// first snapshot's INFO command, which are removed.
func usage(before, after redisSnapshot, decisions int64) RedisUsage {
	u := RedisUsage{ByCommand: map[string]int64{}}
	// Ours among them: the first snapshot's INFO (counted once it ran) and
	// the second one's PING.
	own := map[string]int64{"info": 1, "ping": 1}
	for name, n := range after.calls {
		d := n - before.calls[name] - own[name]
		if d <= 0 {
			continue
		}
		u.ByCommand[name] = d
		u.Commands += d
		switch strings.ToLower(name) {
		case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
			u.Scripts += d
		}
	}
	u.RoundTrips = max(0, after.reads-before.reads-2) // our PING and INFO
	u.CPUMicros = after.cpuUs - before.cpuUs
	if decisions > 0 {
		u.CommandsPerDecision = float64(u.Commands) / float64(decisions)
		u.ScriptsPerDecision = float64(u.Scripts) / float64(decisions)
		u.RoundTripsPerDecision = float64(u.RoundTrips) / float64(decisions)
		u.CPUMicrosPerDecision = float64(u.CPUMicros) / float64(decisions)
	}
	return u
}
