package redisproc

import (
	"bytes"
	"strings"
	"sync"
)

// Tail is an io.Writer that keeps the last lines written to it (a child
// process's output, for error messages); a line is what ends in "\n", less
// a trailing "\r". Make one with NewTail. It is safe for concurrent use.
type Tail struct {
	mu      sync.Mutex
	max     int
	lines   []string
	partial []byte
}

// NewTail returns a Tail that keeps the last max lines.
func NewTail(max int) *Tail {
	return &Tail{max: max}
}

// Write records p's lines. It never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		t.add(strings.TrimRight(string(t.partial[:i]), "\r"))
		t.partial = t.partial[i+1:]
	}
	return len(p), nil
}

func (t *Tail) add(line string) {
	if len(t.lines) == t.max {
		t.lines = append(t.lines[:0], t.lines[1:]...)
	}
	t.lines = append(t.lines, line)
}

// String returns the lines kept, and the last one if it is not yet ended,
// joined by " | ", or "(no output)".
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := t.lines
	if len(t.partial) > 0 {
		lines = append(lines[:len(lines):len(lines)], string(t.partial))
	}
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines, " | ")
}
