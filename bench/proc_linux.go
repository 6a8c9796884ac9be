package main

import (
	"os/exec"
	"syscall"
)

// detach puts a child in its own process group, so that a Ctrl-C at the
// terminal reaches only this process, which stops its children in order;
// and has the kernel kill the child if this process dies without doing so
// (SIGKILL, a crash).
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
