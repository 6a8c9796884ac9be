package redisproc_test

import (
	"fmt"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/redisproc"
)

// TestTail: a Tail keeps the last lines written, in whatever pieces they
// come, without their "\r\n", and shows a line not yet ended.
func TestTail(t *testing.T) {
	tl := redisproc.NewTail(3)
	if got := tl.String(); got != "(no output)" {
		t.Errorf("empty Tail = %q, want (no output)", got)
	}
	for i := range 5 {
		fmt.Fprintf(tl, "line %d\r\n", i)
	}
	tl.Write([]byte("par"))
	if got, want := tl.String(), "line 2 | line 3 | line 4 | par"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
	tl.Write([]byte("tial\nnext"))
	if got, want := tl.String(), "line 3 | line 4 | partial | next"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
}
