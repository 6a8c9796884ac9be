package redact

import (
	"fmt"
	"strings"
	"testing"
)

func TestValue(t *testing.T) {
	tests := []struct {
		mode Mode
		in   string
		want string
	}{
		{Off, "sk-live-0123456789", "sk-live-0123456789"},
		{Off, "", ""},
		{Hash, "", ""},
		{Prefix, "", ""},
		{Prefix, "sk-live-0123456789", "sk-l…"},
		{Prefix, "abcdefgh", "abcd…"},
		{Prefix, "abcdefg", "abc…"},
		{Prefix, "42", "4…"},
		{Prefix, "7", "…"},
		{Prefix, "żółwiątko", "żółw…"},
		{Prefix, "\xff\xfe\xfd\xfc", "\xff\xfe…"},
		{Hash, "user-1", "sha256:c6c289e4"}, // echo -n user-1 | sha256sum
		{Mode(0), "user-1", "sha256:c6c289e4"},
	}
	for _, tt := range tests {
		if got := tt.mode.Value(tt.in); got != tt.want {
			t.Errorf("%v.Value(%q) = %q, want %q", tt.mode, tt.in, got, tt.want)
		}
	}
	if Hash.Value("user-1") == Hash.Value("user-2") {
		t.Error("Hash gives two values the same stand-in")
	}
	if got := Hash.Value(strings.Repeat("x", 1<<16)); len(got) != len("sha256:")+HashDigits {
		t.Errorf("Hash of a long value = %q, want %d hex digits", got, HashDigits)
	}
}

func TestParse(t *testing.T) {
	for _, name := range Modes {
		m, err := Parse(name)
		if err != nil || m.String() != name {
			t.Errorf("Parse(%q) = %v, %v; want the mode named so", name, m, err)
		}
	}
	for _, m := range []Mode{0, Prefix + 1, -1} {
		if got, want := m.String(), fmt.Sprintf("Mode(%d)", int(m)); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
	if _, err := Parse("sha1"); err == nil || !strings.Contains(err.Error(), "want off, hash or prefix") {
		t.Errorf("Parse(sha1) = %v, want an error listing the choices", err)
	}
}
