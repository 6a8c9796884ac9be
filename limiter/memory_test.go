package limiter_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

func TestMemoryStoreConformance(t *testing.T) {
	limitertest.RunStoreTests(t, func(t *testing.T) limiter.Store {
		return limiter.NewMemoryStore(limiter.MemoryOptions{})
	})
}

func TestMemoryStorePostpaid(t *testing.T) {
	limitertest.RunPostpaidTests(t, func(t *testing.T) limiter.Store {
		return limiter.NewMemoryStore(limiter.MemoryOptions{})
	})
}
