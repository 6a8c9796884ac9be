package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// File is one descriptor file: its name, as errors show it, and its content.
type File struct {
	Name string
	Data []byte
}

// Load reads the descriptor files at path and returns their Set.
//
// path is a file, or a directory whose *.yaml and *.yml files are read (not
// recursively). In a directory, names starting with "." are skipped (such as
// the "..data" entries of a Kubernetes ConfigMap volume) and symbolic links
// are followed (a ConfigMap mounts its files as links). Files are named in
// errors by their path. A directory without descriptor files is an error, so
// that a half-mounted volume does not silently remove every limit.
//
// Problems in the files are reported all at once, as *Error values joined
// with errors.Join; I/O errors are returned as they are (errors.Is works).
func Load(path string) (*Set, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		return Parse([]File{{Name: path, Data: data}})
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []File
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(path, name)
		st, err := os.Stat(full) // follows links
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		data, err := readFile(full)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: full, Data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml or *.yml files", path)
	}
	return Parse(files)
}

// readFile reads at most one byte more than MaxFileSize, enough for Parse to
// reject a file that is too large without reading all of it.
func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxFileSize+1))
}

// Parse is Load from memory: it checks files, one domain each (several files
// may share a domain), and returns their Set. The order of files does not
// matter; they are taken sorted by name. No files give an empty Set.
//
// Every problem found is reported, as *Error values joined with errors.Join
// and sorted by file and position; the Set is then nil.
func Parse(files []File) (*Set, error) {
	files = slices.Clone(files)
	slices.SortStableFunc(files, func(a, b File) int { return cmp.Compare(a.Name, b.Name) })
	probs := &problems{}
	b := &builder{probs: probs, domains: make(map[string]*domainTree)}
	for i, f := range files {
		if i > 0 && files[i-1].Name == f.Name {
			probs.add(f.Name, 0, 0, "", "file given twice")
			continue
		}
		ft := parseFile(f, probs)
		if ft.domain != "" {
			b.add(ft)
		}
	}
	s := &Set{domains: b.domains, hash: hashFiles(files)}
	for _, t := range b.domains {
		b.check(t)
		s.list = append(s.list, t.domain)
	}
	if err := probs.err(); err != nil {
		return nil, err
	}
	s.warnings = probs.sortedWarnings()
	slices.SortFunc(s.list, func(a, b *Domain) int { return strings.Compare(a.Name, b.Name) })
	return s, nil
}

// hashFiles hashes the files, sorted by name, each name and content preceded
// by its length so that no two different sets of files hash alike.
func hashFiles(files []File) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, f := range files {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f.Name)))])
		h.Write([]byte(f.Name))
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f.Data)))])
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}
