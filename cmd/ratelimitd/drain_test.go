package main

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestDrainCutExitStatus runs the binary with a call held for its token
// (about 3 s) and SIGTERMs it: with a --shutdown-timeout shorter than the
// hold, the call is answered UNAVAILABLE and the process exits 3
// (exitDrainCut), saying why; with a longer one the call is answered OK and
// the process exits 0.
func TestDrainCutExitStatus(t *testing.T) {
	tests := []struct {
		name     string
		timeout  string
		wantExit int
		wantCode codes.Code // of the held call
	}{
		{"cut short", "300ms", exitDrainCut, codes.Unavailable},
		{"clean drain", "1m", 0, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeConfig(t, map[string]string{"agents.yaml": holdConfig})
			p := startProc(t, "--config", cfg, "--shutdown-timeout", tt.timeout)
			held := holdCall(t, servertest.Dial(t, p.grpcAddr))
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			var exitErr error
			select {
			case exitErr = <-p.exited:
				p.exited <- exitErr
			case <-time.After(20 * time.Second):
				t.Fatalf("still running 20 s after SIGTERM\n%s", p.logs)
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(exitErr, &ee) {
				code = ee.ExitCode()
			} else if exitErr != nil {
				t.Fatalf("wait: %v", exitErr)
			}
			if code != tt.wantExit {
				t.Errorf("exit status %d, want %d\n%s", code, tt.wantExit, p.logs)
			}
			if tt.wantExit == exitDrainCut && !strings.Contains(p.logs.String(), "drain cut short") {
				t.Errorf("no log line says the drain was cut short:\n%s", p.logs)
			}
			select {
			case r := <-held:
				if got := status.Code(r.err); got != tt.wantCode {
					t.Errorf("the held call = %v, %v; want code %v", r.resp.GetOverallCode(), r.err, tt.wantCode)
				}
			case <-time.After(20 * time.Second):
				t.Error("the held call was not answered")
			}
		})
	}
}
