package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// TestRedisLoggerWritesThroughSlog: a go-redis line comes out as one record
// of the logger in use, at debug level, in its format; below debug it is
// not written.
func TestRedisLoggerWritesThroughSlog(t *testing.T) {
	dialErr := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	tests := []struct {
		name    string
		format  string
		level   slog.Level
		want    string // the whole output; "" for none
		wantRec map[string]any
	}{
		{name: "json at debug", format: "json", level: slog.LevelDebug, wantRec: map[string]any{
			"level": "DEBUG", "logger": "go-redis",
			"msg": "redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:1: connect: connection refused",
		}},
		{name: "text at debug", format: "text", level: slog.LevelDebug,
			want: `level=DEBUG msg="redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:1: connect: connection refused" logger=go-redis` + "\n"},
		{name: "json at info", format: "json", level: slog.LevelInfo},
		{name: "text at error", format: "text", level: slog.LevelError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			// As newLogger builds it, without the time, so that records
			// can be compared whole.
			opts := &slog.HandlerOptions{Level: tt.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}
			log := slog.New(slog.NewTextHandler(&buf, opts))
			if tt.format == "json" {
				log = slog.New(slog.NewJSONHandler(&buf, opts))
			}
			var r redisstore.Logger
			r.Use(log)
			r.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 1, dialErr)
			got := buf.String()
			if tt.wantRec != nil {
				var rec map[string]any
				if err := json.Unmarshal([]byte(got), &rec); err != nil {
					t.Fatalf("output %q: not one JSON record: %v", got, err)
				}
				if len(rec) != len(tt.wantRec) {
					t.Errorf("record %v, want %v", rec, tt.wantRec)
				}
				for k, v := range tt.wantRec {
					if rec[k] != v {
						t.Errorf("record %v: %s = %v, want %v", rec, k, rec[k], v)
					}
				}
				return
			}
			if got != tt.want {
				t.Errorf("output %q, want %q", got, tt.want)
			}
		})
	}
}
