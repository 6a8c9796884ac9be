package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// newCallerClockStore returns a Store on a Redis of its own, deciding at
// the callers' now, and the client it uses. The scripts a batch sent by
// hand may call are loaded: such a batch gets no NOSCRIPT retry.
func newCallerClockStore(t *testing.T, prefix string) (*Store, *redis.Client) {
	t.Helper()
	s, c := ownServerStore(t, Options{Clock: CallerClock, Prefix: prefix})
	for _, script := range []*redis.Script{s.take, s.takeOne, s.refund} {
		if err := script.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return s, c
}

// execTakes sends calls, Takes built by hand whose requests are reqs[i],
// as one batch, and returns each one's decoded answer, failing the test if
// one is an error.
func execTakes(t *testing.T, s *Store, calls []*call, reqs [][]limiter.Request) []takeResult {
	t.Helper()
	s.server.batch.exec(calls)
	res := make([]takeResult, len(calls))
	for i, c := range calls {
		<-c.done
		r, err := decodeTakeCmd(c.cmd, reqs[i], false)
		if err != nil {
			t.Fatalf("Take %d: %v", i+1, err)
		}
		res[i] = r
	}
	return res
}

// TestMergedTakesAreDecidedInOrder sends one batch by hand: four Takes
// that merge into one take.lua call (the second of two requests, one on a
// bucket holding garbage; the last of two requests too) and a refund
// beside them. Each Take gets its own answer, as if sent alone: the first,
// third and fourth on the state the ones before them left, the second an
// error naming its bucket, which writes nothing and does not spoil the
// others (nor their places in the reply).
func TestMergedTakesAreDecidedInOrder(t *testing.T) {
	s, c := newCallerClockStore(t, "merge:")
	ctx := context.Background()
	if err := c.Set(ctx, s.Key("bad"), "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2}
	one := func(key string) []limiter.Request { return []limiter.Request{{Key: key, Limit: l, Hits: 1}} }
	takeCall := func(key string, now time.Time) *call {
		return &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{
			script: s.take, keys: []string{s.Key(key)}, args: s.takeArgs(now, one(key)), merge: true,
		}}
	}
	refund := &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{
		script: s.refund, keys: []string{s.Key("other")},
		args: s.refundArgs(t0, []limiter.Request{{Key: "other", Limit: l, Hits: 1}}),
	}}
	two := func(k1, k2 string) []limiter.Request { return append(one(k1), one(k2)...) }
	pairCall := func(k1, k2 string) *call {
		return &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{
			script: s.take, keys: []string{s.Key(k1), s.Key(k2)}, args: s.takeArgs(t0, two(k1, k2)), merge: true,
		}}
	}
	first, bad, third, pair := takeCall("a", t0), pairCall("c", "bad"), takeCall("a", t0.Add(time.Minute)), pairCall("d", "a")
	s.server.batch.exec([]*call{first, bad, refund, third, pair})

	for _, c := range []*call{first, bad, refund, third, pair} {
		<-c.done
	}
	if res, err := decodeTakeCmd(first.cmd, one("a"), false); err != nil || res.decisions[0] != (limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: time.Hour}) {
		t.Errorf("first Take = %+v, %v; want admitted with 1 left", res.decisions, err)
	}
	if _, err := decodeTakeCmd(bad.cmd, two("c", "bad"), false); err == nil || !strings.Contains(err.Error(), "not TAT:Frac") {
		t.Errorf("Take on a bucket holding garbage: %v, want an error saying so", err)
	}
	if n := c.Exists(ctx, s.Key("c")).Val(); n != 0 {
		t.Errorf("the failed Take wrote its other bucket (%d keys), want nothing written", n)
	}
	// A minute later, after the first Take: 1h59m until full, 0 left.
	if res, err := decodeTakeCmd(third.cmd, one("a"), false); err != nil || res.decisions[0] != (limiter.Decision{Allowed: true, ResetAfter: 2*time.Hour - time.Minute}) {
		t.Errorf("third Take = %+v, %v; want admitted on what the first left", res.decisions, err)
	}
	// At t0 (a caller's clock), after the first and third Takes left a
	// empty until t0+2h: d admitted, a not, so the pair is denied.
	if res, err := decodeTakeCmd(pair.cmd, two("d", "a"), false); err != nil || res.allowed || !res.decisions[0].Allowed || res.decisions[1].Allowed {
		t.Errorf("last Take = %+v, %v; want d admitted and a denied", res, err)
	}
	if err := refund.cmd.Err(); err != nil {
		t.Errorf("refund beside merged Takes: %v", err)
	}
	if st := s.Stats(); st != (Stats{Calls: 5, Scripts: 2, RoundTrips: 1}) {
		t.Errorf("Stats = %+v, want 5 calls as 2 scripts in 1 round trip", st)
	}

	// A server that lost its scripts (restarted, flushed) answers the
	// merged call NOSCRIPT; it goes again as EVAL, in a second round trip,
	// and each Take still gets its own answer.
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	fourth, other := takeCall("a", t0.Add(2*time.Hour)), takeCall("b", t0)
	s.server.batch.exec([]*call{fourth, other})
	<-fourth.done
	<-other.done
	// Two hours on, a is full again (the third Take left it full at
	// +2h): this one leaves 1 of 2.
	if res, err := decodeTakeCmd(fourth.cmd, one("a"), false); err != nil || res.decisions[0] != (limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: time.Hour}) {
		t.Errorf("Take after SCRIPT FLUSH = %+v, %v", res.decisions, err)
	}
	if res, err := decodeTakeCmd(other.cmd, one("b"), false); err != nil || res.decisions[0] != (limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: time.Hour}) {
		t.Errorf("second Take after SCRIPT FLUSH = %+v, %v", res.decisions, err)
	}
	if st := s.Stats(); st != (Stats{Calls: 7, Scripts: 3, RoundTrips: 3}) {
		t.Errorf("Stats = %+v, want the merged call resent once after NOSCRIPT", st)
	}
}

// oneBucketTake is a mergeable take.lua call of one Take decided at now,
// its requests all on the bucket key under l, one a hit count, and those
// requests.
func oneBucketTake(ctx context.Context, s *Store, key string, l limiter.Limit, now time.Time, hits ...int64) (*call, []limiter.Request) {
	var keys []string
	var reqs []limiter.Request
	for _, h := range hits {
		keys = append(keys, s.Key(key))
		reqs = append(reqs, limiter.Request{Key: key, Limit: l, Hits: h})
	}
	return &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{
		script: s.take, keys: keys, args: s.takeArgs(now, reqs), merge: true,
	}}, reqs
}

// TestMergedTakesDecideAtTheirOwnNow: with a caller's clock, each Take
// merged into one take.lua call is decided at the now its caller took
// (the "@µs" before every Take but the first), not at the first Take's:
// one bucket of one token an hour, a Take at t0 (admitted), one half an
// hour later (denied, the token is half an hour away), a two-request Take
// an hour later (admitted on the refilled token, its check too), and one
// more at that time (denied). Decided all at t0, the third would be denied.
func TestMergedTakesDecideAtTheirOwnNow(t *testing.T) {
	s, _ := newCallerClockStore(t, "nows:")
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	tests := []struct {
		at         time.Time
		hits       []int64
		allowed    bool
		retryFirst time.Duration
	}{
		{t0, []int64{1}, true, 0},
		{t0.Add(30 * time.Minute), []int64{1}, false, 30 * time.Minute},
		{t0.Add(time.Hour), []int64{0, 1}, true, 0},
		{t0.Add(time.Hour), []int64{1}, false, time.Hour},
	}
	var calls []*call
	var reqsOf [][]limiter.Request
	for _, tt := range tests {
		c, reqs := oneBucketTake(ctx, s, "b", l, tt.at, tt.hits...)
		calls = append(calls, c)
		reqsOf = append(reqsOf, reqs)
	}
	results := execTakes(t, s, calls, reqsOf)
	if st := s.Stats(); st.Scripts != 1 {
		t.Fatalf("Stats = %+v, want the four Takes in one script call", st)
	}
	for i, tt := range tests {
		res := results[i]
		if res.now != tt.at.UnixMicro() || res.allowed != tt.allowed || res.decisions[0].RetryAfter != tt.retryFirst {
			t.Errorf("Take %d at t0+%v = decided at t0+%v, allowed %v, %+v; want allowed %v, retry after %v",
				i, tt.at.Sub(t0), time.UnixMicro(res.now).Sub(t0), res.allowed, res.decisions, tt.allowed, tt.retryFirst)
		}
	}
}

// TestMergedTakeWithARepeatedKey sends one batch by hand, four Takes on
// one bucket merged into one take.lua call: one request, then two Takes of
// two requests on that same bucket (the first needs more tokens than the
// bucket has left, the second does not), then one request. Each Take
// decides its repeated key on the state the earlier Takes of the call
// wrote, its second request on the state its first leaves, exactly as
// limiter.DecideAll.
func TestMergedTakeWithARepeatedKey(t *testing.T) {
	s, c := newCallerClockStore(t, "repeat:")
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 3}
	var reqsOf [][]limiter.Request
	takeCall := func(hits ...int64) *call {
		c, reqs := oneBucketTake(ctx, s, "r", l, t0, hits...)
		reqsOf = append(reqsOf, reqs)
		return c
	}
	calls := []*call{takeCall(1), takeCall(1, 2), takeCall(1, 1), takeCall(1)}
	want := []struct {
		allowed   bool
		decisions []limiter.Decision
	}{
		// 3 tokens: takes 1.
		{true, []limiter.Decision{{Allowed: true, Remaining: 2, ResetAfter: time.Hour}}},
		// 2 left, 3 wanted: denied; the first request reports a check.
		{false, []limiter.Decision{
			{Allowed: true, Remaining: 2, ResetAfter: time.Hour},
			{RetryAfter: time.Hour, ResetAfter: 2 * time.Hour},
		}},
		// Nothing written by the denied Take: 2 left, 2 taken.
		{true, []limiter.Decision{
			{Allowed: true, Remaining: 1, ResetAfter: 2 * time.Hour},
			{Allowed: true, ResetAfter: 3 * time.Hour},
		}},
		// Empty.
		{false, []limiter.Decision{{RetryAfter: time.Hour, ResetAfter: 3 * time.Hour}}},
	}
	for i, res := range execTakes(t, s, calls, reqsOf) {
		if res.allowed != want[i].allowed || !slices.Equal(res.decisions, want[i].decisions) {
			t.Errorf("Take %d = %+v (allowed %v), want %+v (allowed %v)",
				i+1, res.decisions, res.allowed, want[i].decisions, want[i].allowed)
		}
	}
	if st := s.Stats(); st != (Stats{Calls: 4, Scripts: 1, RoundTrips: 1}) {
		t.Errorf("Stats = %+v, want 4 calls as 1 script in 1 round trip", st)
	}
	// The bucket holds the state the last Take left (3 tokens taken: full
	// 3h after t0), and expires then.
	if v, err := c.Get(ctx, s.Key("r")).Result(); err != nil || v != fmt.Sprintf("%d:0:1:3600000000", t0.Add(3*time.Hour).UnixMicro()) {
		t.Errorf("bucket holds %q, %v; want the state the last Take left", v, err)
	}
	if ttl := c.PTTL(ctx, s.Key("r")).Val(); ttl < 3*time.Hour-time.Minute || ttl > 3*time.Hour {
		t.Errorf("bucket expires in %v, want 3h: when it is full again", ttl)
	}
}

// TestASharedBucketIsWrittenTwiceACall sends one batch by hand: six Takes
// merged into one take.lua call, each on its own bucket and on one bucket
// they all share (a limit every request names). Each Take decides on what
// the ones before it left, and the shared bucket is written twice (at its
// first change and after the last Take), not six times, ending in the
// state the last Take left.
func TestASharedBucketIsWrittenTwiceACall(t *testing.T) {
	s, c := newCallerClockStore(t, "shared:")
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	shared := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	own := limiter.Limit{Count: 1, Period: time.Second, Burst: 5}
	const takes = 6
	var calls []*call
	var reqsOf [][]limiter.Request
	for i := range takes {
		reqs := []limiter.Request{
			{Key: fmt.Sprintf("own%d", i), Limit: own, Hits: 1},
			{Key: "model", Limit: shared, Hits: 1},
		}
		calls = append(calls, &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{
			script: s.take, keys: []string{s.Key(reqs[0].Key), s.Key(reqs[1].Key)}, args: s.takeArgs(t0, reqs), merge: true,
		}})
		reqsOf = append(reqsOf, reqs)
	}
	for i, res := range execTakes(t, s, calls, reqsOf) {
		// The shared bucket has 10 tokens; Take i leaves 9-i.
		if want := (limiter.Decision{Allowed: true, Remaining: int64(takes - 1 - i + 4), ResetAfter: time.Duration(i+1) * 100 * time.Millisecond}); !res.allowed || res.decisions[1] != want {
			t.Errorf("Take %d's shared bucket = %+v (allowed %v), want %+v", i+1, res.decisions[1], res.allowed, want)
		}
	}
	if n := commandCalls(t, c, "set"); n != takes+2 {
		t.Errorf("SET ran %d times for %d own buckets and one shared bucket, want %d", n, takes, takes+2)
	}
	if v, err := c.Get(ctx, s.Key("model")).Result(); err != nil || v != fmt.Sprintf("%d:0:10:1000000", t0.Add(takes*100*time.Millisecond).UnixMicro()) {
		t.Errorf("shared bucket holds %q, %v; want the state the last Take left", v, err)
	}
	if ttl := c.PTTL(ctx, s.Key("model")).Val(); ttl <= 0 {
		t.Errorf("shared bucket's TTL = %v, want it to expire", ttl)
	}
}

// commandCalls is how many times c's server ran command (lower case) since
// it started or its stats were reset: INFO commandstats.
func commandCalls(t *testing.T, c *redis.Client, command string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls=")
		if !ok {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(rest, "%d", &n); err != nil {
			t.Fatalf("INFO commandstats %q: %v", line, err)
		}
		return n
	}
	return 0
}

// TestTakeOfManyBuckets: a call reads its buckets in chunks (Lua's unpack
// has a bound); a Take of 2,500 buckets decides every one.
func TestTakeOfManyBuckets(t *testing.T) {
	s, _ := newCallerClockStore(t, "")
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	reqs := make([]limiter.Request, 2500)
	for i := range reqs {
		reqs[i] = limiter.Request{Key: fmt.Sprint("k", i), Limit: l, Hits: 1}
	}
	for round, want := range []bool{true, false} {
		d, err := s.Take(context.Background(), t0, reqs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := range d {
			if d[i].Allowed != want {
				t.Fatalf("round %d: request %d allowed %v, want %v", round, i, d[i].Allowed, want)
			}
		}
	}
}

// TestEnvelopesBoundMergedCalls: mergeable calls share a command up to
// mergeMaxKeys buckets; a larger Take goes alone; other calls go alone.
func TestEnvelopesBoundMergedCalls(t *testing.T) {
	take := &redis.Script{}
	other := &redis.Script{}
	mk := func(keys int, merge bool, script *redis.Script) *call {
		return &call{scriptCall: scriptCall{script: script, keys: make([]string, keys), merge: merge}}
	}
	batch := []*call{
		mk(1, true, take), mk(75, true, take), mk(75, true, take), // 76, then 75
		mk(1, false, other), // alone
		mk(52, true, take),  // joins the 75: 127
		mk(2, true, take),   // 129 > 128: a new one
		mk(150, true, take), // too large to share: alone
		mk(1, true, take),   // a new one after it
	}
	var got []int // keys per envelope
	for _, e := range envelopes(batch) {
		got = append(got, len(e.keys))
	}
	if want := []int{76, 127, 1, 2, 150, 1}; !slices.Equal(got, want) {
		t.Errorf("keys per command = %v, want %v", got, want)
	}
}

// TestDecodeTake: take.lua's reply read against limiter.DecideAll, which
// gives the answer; a reply whose admission DecideAll does not share, or of
// the wrong length, is an error.
func TestDecodeTake(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2}
	reqs := []limiter.Request{{Key: "a", Limit: l, Hits: 1}}
	full := limiter.State{}
	empty := limiter.State{TAT: t0.Add(2 * time.Hour).UnixMicro()}
	tests := []struct {
		name    string
		reply   []int64
		want    limiter.Decision
		wantErr string
	}{
		{"admitted", []int64{t0.UnixMicro(), 1, full.TAT, full.Frac},
			limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: time.Hour}, ""},
		{"denied", []int64{t0.UnixMicro(), 0, empty.TAT, empty.Frac},
			limiter.Decision{RetryAfter: time.Hour, ResetAfter: 2 * time.Hour}, ""},
		{"script admits what DecideAll denies", []int64{t0.UnixMicro(), 1, empty.TAT, empty.Frac},
			limiter.Decision{}, "take script admitted true where limiter.DecideAll admits false"},
		{"script denies what DecideAll admits", []int64{t0.UnixMicro(), 0, full.TAT, full.Frac},
			limiter.Decision{}, "take script admitted false where limiter.DecideAll admits true"},
		{"short", []int64{t0.UnixMicro(), 1, 0},
			limiter.Decision{}, "take script returned 3 integers, want 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := decodeTake(tt.reply, reqs, false)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("decodeTake = %+v, %v; want an error containing %q", res, err, tt.wantErr)
				}
				return
			}
			if err != nil || len(res.decisions) != 1 || res.decisions[0] != tt.want || res.now != t0.UnixMicro() {
				t.Errorf("decodeTake = %+v, %v; want %+v at %d", res, err, tt.want, t0.UnixMicro())
			}
		})
	}
}

// TestMalformedSpecFailsItsTakeAlone sends one batch by hand: a Take whose
// second request's spec is malformed, merged between two good Takes, and a
// one-request Take with a malformed spec. Each bad Take gets an error naming
// the spec and writes nothing (not even its good request's bucket); the
// good ones are decided as usual.
func TestMalformedSpecFailsItsTakeAlone(t *testing.T) {
	s, c := newCallerClockStore(t, "spec:")
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2}
	one := func(key string) []limiter.Request { return []limiter.Request{{Key: key, Limit: l, Hits: 1}} }
	takeCall := func(keys []string, args []any) *call {
		return &call{ctx: ctx, done: make(chan struct{}), scriptCall: scriptCall{script: s.take, keys: keys, args: args, merge: true}}
	}
	good := func(key string) *call { return takeCall([]string{s.Key(key)}, s.takeArgs(t0, one(key))) }
	tests := []struct {
		name string
		spec string
	}{
		{"empty", ""},
		{"unknown kind", "q:1:0:0:0:0:0:0"},
		{"count 0", "t:0:0:0:0:0:0:0"},
		{"a field short", "t:1:0:0:0:0:0"},
		{"not a number", "t:1:0:0:x:0:0:0"},
		{"trailing text", "t:1:0:0:0:0:0:0:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pair := s.takeArgs(t0, append(one("pair-a"), one("pair-b")...))
			pair[3] = tt.spec
			bad := takeCall([]string{s.Key("pair-a"), s.Key("pair-b")}, pair)
			single := takeCall([]string{s.Key("single")}, []any{s.nowArg(t0), tt.spec})
			before, after := good("before"), good("after")
			s.server.batch.exec([]*call{before, bad, after, single})
			// Alone in its batch, a one-request Take runs take_one.lua.
			alone := takeCall([]string{s.Key("alone")}, []any{s.nowArg(t0), tt.spec})
			alone.alone = s.takeOne
			s.server.batch.exec([]*call{alone})
			for _, c := range []*call{before, bad, after, single, alone} {
				<-c.done
			}
			for name, c := range map[string]*call{"two-request Take": bad, "one-request Take": single, "one-request Take alone": alone} {
				if _, err := decodeTakeCmd(c.cmd, make([]limiter.Request, len(c.keys)), false); err == nil || !strings.Contains(err.Error(), "malformed request spec") {
					t.Errorf("%s with spec %q: %v, want an error naming the malformed spec", name, tt.spec, err)
				}
			}
			for _, key := range []string{"pair-a", "pair-b", "single", "alone"} {
				if n := c.Exists(ctx, s.Key(key)).Val(); n != 0 {
					t.Errorf("bucket %s written by a Take with a malformed spec", key)
				}
			}
			for name, c := range map[string]*call{"before": before, "after": after} {
				if res, err := decodeTakeCmd(c.cmd, one(name), false); err != nil || !res.decisions[0].Allowed {
					t.Errorf("good Take %s beside malformed ones = %+v, %v; want admitted", name, res.decisions, err)
				}
			}
			if err := c.Del(ctx, s.Key("before"), s.Key("after")).Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
