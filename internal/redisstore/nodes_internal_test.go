package redisstore

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// replyError is a Redis error reply, as go-redis reads one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestRedirectOf reads each redirect a Cluster node answers, with the
// node to ask in go-redis's form (an IPv6 host bracketed), and nothing
// from other errors.
func TestRedirectOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want redirect
	}{
		{replyError("MOVED 3999 127.0.0.1:6381"), redirect{moved, "127.0.0.1:6381"}},
		{replyError("ASK 3999 127.0.0.1:6381"), redirect{ask, "127.0.0.1:6381"}},
		{replyError("MOVED 3999 ::1:6381"), redirect{moved, "[::1]:6381"}},
		{replyError("ASK 12 [fe80::1]:7000"), redirect{ask, "[fe80::1]:7000"}},
		{replyError("MOVED 3999 redis-2.redis:6379"), redirect{moved, "redis-2.redis:6379"}},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), redirect{kind: tryAgain}},
		{replyError("CLUSTERDOWN The cluster is down"), redirect{kind: clusterDown}},
		{replyError("MOVED 3999"), redirect{}},
		{replyError("MOVED"), redirect{}},
		{replyError("OOM command not allowed"), redirect{}},
		{errors.New("MOVED 3999 127.0.0.1:6381"), redirect{}}, // not a reply: a message
		{context.DeadlineExceeded, redirect{}},
	} {
		if got := redirectOf(tc.err); got != tc.want {
			t.Errorf("redirectOf(%q) = %+v, want %+v", tc.err, got, tc.want)
		}
	}
}

// TestALateRedirectIsNoFailure: the answer a caller gave up on, when it is
// a redirect, reaches the breaker as limiter.ErrTryAgain (the node
// answered, for a slot it does not serve now), and other errors as they
// are.
func TestALateRedirectIsNoFailure(t *testing.T) {
	for _, tc := range []struct {
		err       error
		tryAgain  bool
		unchanged bool
	}{
		{replyError("ASK 14876 127.0.0.1:7002"), true, false},
		{replyError("MOVED 14876 127.0.0.1:7002"), true, false},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true, false},
		{replyError("CLUSTERDOWN The cluster is down"), true, false},
		{replyError("OOM command not allowed when used memory > 'maxmemory'"), false, true},
		{errors.New("read: connection reset by peer"), false, true},
	} {
		cmd := redis.NewCmd(context.Background())
		cmd.SetErr(tc.err)
		got := roundTripErr(cmd)
		if errors.Is(got, limiter.ErrTryAgain) != tc.tryAgain || (tc.unchanged && got != tc.err) {
			t.Errorf("roundTripErr(%q) = %v, want ErrTryAgain %v", tc.err, got, tc.tryAgain)
		}
	}
	if err := roundTripErr(redis.NewCmd(context.Background())); err != nil {
		t.Errorf("roundTripErr(an answer) = %v, want nil", err)
	}
}
