// Command faultproxy runs faultproxy's proxies in a process of their own,
// for a parent that controls them through its stdin and stdout
// (faultproxy.StartRemote starts it; faultproxy.Serve is the protocol).
// It exits when its stdin ends, so it never outlives its parent.
package main

import (
	"fmt"
	"os"

	"github.com/ratelimitd/ratelimitd/internal/faultproxy"
)

func main() {
	if err := faultproxy.Serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
