package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTotalCap pins the cap on a whole config: a directory whose files
// together are over it, a single file over it, and files in memory (as an
// xDS push gives them) over it are refused with an error naming the total
// and the cap; at the cap they load.
func TestTotalCap(t *testing.T) {
	// padded is a valid file of domain name, padded with a comment to size.
	padded := func(name string, size int) string {
		s := domainFile(name)
		if pad := size - len(s) - 3; pad > 0 {
			s += "# " + strings.Repeat("x", pad) + "\n"
		}
		return s
	}
	const cap = 4096
	opts := LoadOptions{MaxTotalBytes: cap}
	tests := []struct {
		name    string
		sizes   []int // one file each
		wantErr string
	}{
		{"under the cap", []int{1000, 1000}, ""},
		{"at the cap", []int{2048, 2048}, ""},
		{"over the cap by a byte", []int{2048, 2049}, "2 files of 4097 bytes in all, more than the cap of 4096 bytes"},
		{"many small files", []int{600, 600, 600, 600, 600, 600, 600, 600}, "8 files of 4800 bytes in all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var files []File
			for i, n := range tt.sizes {
				data := padded(fmt.Sprintf("d%d", i), n)
				if len(data) != n {
					t.Fatalf("padded file is %d bytes, want %d", len(data), n)
				}
				name := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
				writeFile(t, name, data)
				files = append(files, File{Name: name, Data: []byte(data)})
			}
			for _, c := range []struct {
				call string
				run  func() (*Set, error)
			}{
				{"LoadWith", func() (*Set, error) { return LoadWith(dir, opts) }},
				{"ParseWith", func() (*Set, error) { return ParseWith(files, opts) }},
			} {
				s, err := c.run()
				if tt.wantErr == "" {
					if err != nil {
						t.Errorf("%s = %v, want a Set", c.call, err)
					} else if len(s.Domains()) != len(tt.sizes) {
						t.Errorf("%s: %d domains, want %d", c.call, len(s.Domains()), len(tt.sizes))
					}
					continue
				}
				if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("%s = %v, want ErrTooLarge with %q", c.call, err, tt.wantErr)
				}
				if s != nil {
					t.Errorf("%s returned a Set with the error", c.call)
				}
			}
		})
	}
}

// TestTotalCapSingleFile checks the cap on a path that is one file, and
// that the error says the cap in MiB.
func TestTotalCapSingleFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "big.yaml")
	writeFile(t, name, domainFile("big")+"# "+strings.Repeat("x", 1<<20)+"\n")
	_, err := LoadWith(name, LoadOptions{MaxTotalBytes: 1 << 20})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "(1 MiB)") || !strings.HasPrefix(err.Error(), name+": ") {
		t.Errorf("LoadWith(%s) = %v, want ErrTooLarge naming the file and 1 MiB", name, err)
	}
	if _, err := LoadWith(name, LoadOptions{MaxTotalBytes: 2 << 20}); err != nil {
		t.Errorf("LoadWith(%s) under a 2 MiB cap = %v", name, err)
	}
}

// TestTotalCapDefault checks that Load and Parse apply the default cap,
// 16 MiB: five files just under 4 MiB are over it, refused from their
// sizes, before any is checked.
func TestTotalCapDefault(t *testing.T) {
	dir := t.TempDir()
	const size = 4 << 20
	body := domainFile("x") + "# " + strings.Repeat("x", size-len(domainFile("x"))-10) + "\n"
	var files []File
	for i := range 5 {
		name := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
		data := strings.Replace(body, "domain: x", fmt.Sprintf("domain: d%d", i), 1)
		if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: name, Data: []byte(data)})
	}
	want := fmt.Sprintf("more than the cap of %d bytes (16 MiB)", DefaultMaxTotalBytes)
	if _, err := Load(dir); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("Load(5 × ~4 MiB) = %v, want ErrTooLarge with %q", err, want)
	}
	if _, err := Parse(files); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("Parse(5 × ~4 MiB) = %v, want ErrTooLarge with %q", err, want)
	}
	if _, err := Parse(files[:4]); err != nil {
		t.Errorf("Parse(4 × ~4 MiB) = %v, want a Set", err)
	}
}

// TestHashFiles checks that HashFiles is the Hash of the Set that Parse
// returns, whatever the order of the files.
func TestHashFiles(t *testing.T) {
	files := []File{{Name: "b.yaml", Data: []byte(domainFile("b"))}, {Name: "a.yaml", Data: []byte(domainFile("a"))}}
	s, err := Parse(files)
	if err != nil {
		t.Fatal(err)
	}
	if got := HashFiles(files); got != s.Hash() {
		t.Errorf("HashFiles = %s, want the Set's Hash %s", got, s.Hash())
	}
	if HashFiles(files[:1]) == s.Hash() {
		t.Errorf("HashFiles of one file equals that of both")
	}
}
