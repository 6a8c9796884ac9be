//go:build !testhooks

package main

import "flag"

// addTestFlags adds the flags only a build for tests has (see
// testflags_hooks.go): none in this one.
func addTestFlags(*flag.FlagSet, *serveConfig) {}
