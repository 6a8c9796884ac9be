package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// inotifyFDs counts this process's open inotify descriptors (the config
// watcher holds one).
func inotifyFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// TestFailedStartLeavesNoConfigWatch: serve failing to start after the
// config loaded (unusable TLS files, an address in use) leaves no file
// watch behind; it used to leak the config watcher's inotify descriptor
// and goroutine.
func TestFailedStartLeavesNoConfigWatch(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	tests := []struct {
		name  string
		extra []string
	}{
		{"unusable TLS files", []string{"--grpc-tls-cert", filepath.Join(dir, "missing.pem"), "--grpc-tls-key", filepath.Join(dir, "missing-key.pem")}},
		{"gRPC address in use", []string{"--grpc-addr", taken.Addr().String()}},
		{"HTTP address in use", []string{"--http-addr", taken.Addr().String()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := inotifyFDs(t)
			args := append([]string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, tt.extra...)
			if err := run(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard); err == nil {
				t.Fatal("run = nil, want an error")
			}
			if after := inotifyFDs(t); after != before {
				t.Errorf("%d inotify descriptors open after the failed start, %d before", after, before)
			}
		})
	}
}
