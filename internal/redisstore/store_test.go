package redisstore_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

func TestConformanceStandalone(t *testing.T) {
	c := standalone(t).Client()
	limitertest.RunStoreTests(t, func(t *testing.T) limiter.Store {
		return newStore(t, c, redisstore.CallerClock)
	})
}

func TestConformanceCluster(t *testing.T) {
	c := cluster(t).Client()
	limitertest.RunStoreTests(t, func(t *testing.T) limiter.Store {
		return newStore(t, c, redisstore.CallerClock)
	})
}

func TestPostpaidConformanceStandalone(t *testing.T) {
	c := standalone(t).Client()
	limitertest.RunPostpaidTests(t, func(t *testing.T) limiter.Store {
		return newStore(t, c, redisstore.CallerClock)
	})
}

func TestPostpaidConformanceCluster(t *testing.T) {
	c := cluster(t).Client()
	limitertest.RunPostpaidTests(t, func(t *testing.T) limiter.Store {
		return newStore(t, c, redisstore.CallerClock)
	})
}
