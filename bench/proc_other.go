//go:build !linux

package main

import "os/exec"

// detach does nothing here: a Ctrl-C at the terminal reaches the children
// too, and a child outlives this process if it is killed. The children are
// still stopped when run returns.
func detach(cmd *exec.Cmd) {}
