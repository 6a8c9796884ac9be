//go:build testhooks

package main

import "flag"

// addTestFlags adds the flags of a build for tests (go build -tags
// testhooks), which the process tests use to put ratelimitd in states a
// test cannot otherwise bring about; a release build has none of them.
//
// --test-batch-hold holds each batch of coalesced Redis calls that long
// from its first call (redisstore.Options.TestBatchHold): the queueing of
// a saturated CPU, while Redis stays healthy.
func addTestFlags(fs *flag.FlagSet, c *serveConfig) {
	fs.DurationVar(&c.redis.BatchHold, "test-batch-hold", 0, "tests only: hold each batch of coalesced Redis calls this long from its first call")
}
