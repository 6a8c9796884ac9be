package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// File is one descriptor file: its name, as errors show it, and its content.
type File struct {
	Name string
	Data []byte
}

// DefaultMaxTotalBytes is the default of LoadOptions.MaxTotalBytes: the
// largest config accepted, all its files together, in bytes (16 MiB). An
// xDS push is held to it once converted to descriptor YAML, which takes
// 1.25 to 2.03 times the bytes of the resources on the wire for Envoy
// Gateway's shapes: envoyproxy/ratelimit, run as Envoy Gateway runs it,
// takes pushes of at most gRPC's default 4 MiB (8.1 MiB as YAML), so this
// admits every push it can receive, with room.
const DefaultMaxTotalBytes = 16 << 20

// ErrTooLarge marks the error of a config whose files together are larger
// than LoadOptions.MaxTotalBytes: none of it is checked, none is loaded.
var ErrTooLarge = errors.New("config too large")

// LoadOptions bound what Load, ReadFiles and Parse accept. The zero value
// means the documented defaults.
type LoadOptions struct {
	// MaxTotalBytes is the largest config accepted, the sizes of all its
	// files added up, in bytes; default DefaultMaxTotalBytes. Checking a
	// config costs time and memory in proportion to its size, and a reload
	// holds the old config and the new one at once: the cap bounds both for
	// a directory of many files, which the per-file cap (MaxFileSize) does
	// not, and for a config pushed over xDS.
	MaxTotalBytes int64
}

func (o LoadOptions) maxTotal() int64 {
	if o.MaxTotalBytes <= 0 {
		return DefaultMaxTotalBytes
	}
	return o.MaxTotalBytes
}

// tooLarge is the error of files of total bytes over the cap of o.
func (o LoadOptions) tooLarge(where string, total int64, files int) error {
	return fmt.Errorf("%s: %w: %d files of %d bytes in all, more than the cap of %d bytes (%s)",
		where, ErrTooLarge, files, total, o.maxTotal(), mib(o.maxTotal()))
}

// mib writes n bytes in MiB, as "16 MiB" or "1.5 MiB".
func mib(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', -1, 64) + " MiB"
}

// Load reads the descriptor files at path and returns their Set, with the
// default LoadOptions; see LoadWith.
func Load(path string) (*Set, error) {
	return LoadWith(path, LoadOptions{})
}

// LoadWith reads the descriptor files at path (see ReadFiles) and returns
// their Set (see ParseWith).
//
// Problems in the files are reported all at once, as *Error values joined
// with errors.Join; I/O errors are returned as they are (errors.Is works),
// and a config over the total cap as an error wrapping ErrTooLarge.
func LoadWith(path string, opts LoadOptions) (*Set, error) {
	files, err := ReadFiles(path, opts)
	if err != nil {
		return nil, err
	}
	return ParseWith(files, opts)
}

// ReadFiles reads the descriptor files at path, without checking them.
//
// path is a file, or a directory whose *.yaml and *.yml files are read (not
// recursively). In a directory, names starting with "." are skipped (such as
// the "..data" entries of a Kubernetes ConfigMap volume) and symbolic links
// are followed (a ConfigMap mounts its files as links). Files are named by
// their path. A directory without descriptor files is an error, so that a
// half-mounted volume does not silently remove every limit.
//
// Files larger than opts.MaxTotalBytes together are an error wrapping
// ErrTooLarge, found from their sizes before any is read; no file is read
// past MaxFileSize+1 bytes (enough for Parse to reject it) nor past the
// cap, so memory stays bounded by it whatever is on disk.
func ReadFiles(path string, opts LoadOptions) ([]File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		if st.Size() > opts.maxTotal() {
			return nil, opts.tooLarge(path, st.Size(), 1)
		}
		data, err := readFile(path, opts.maxTotal())
		if err != nil {
			return nil, err
		}
		if int64(len(data)) > opts.maxTotal() {
			return nil, opts.tooLarge(path, int64(len(data)), 1) // it grew
		}
		return []File{{Name: path, Data: data}}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var names []string
	var total int64
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
		names = append(names, full)
		total += st.Size()
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml or *.yml files", path)
	}
	if total > opts.maxTotal() {
		return nil, opts.tooLarge(path, total, len(names))
	}
	files := make([]File, 0, len(names))
	var read int64
	for _, full := range names {
		data, err := readFile(full, opts.maxTotal()-read)
		if err != nil {
			return nil, err
		}
		read += int64(len(data))
		if read > opts.maxTotal() {
			// The files grew since they were listed.
			return nil, opts.tooLarge(path, read, len(names))
		}
		files = append(files, File{Name: full, Data: data})
	}
	return files, nil
}

// readFile reads at most one byte more than MaxFileSize, enough for Parse to
// reject a file that is too large without reading all of it, and at most
// one byte more than room.
func readFile(name string, room int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, min(MaxFileSize, room)+1))
}

// Parse is Load from memory, with the default LoadOptions; see ParseWith.
func Parse(files []File) (*Set, error) {
	return ParseWith(files, LoadOptions{})
}

// ParseWith is LoadWith from memory: it checks files, one domain each
// (several files may share a domain), and returns their Set. The order of
// files does not matter; they are taken sorted by name. No files give an
// empty Set. Files larger than opts.MaxTotalBytes together are an error
// wrapping ErrTooLarge, and none of them is checked.
//
// Every problem found is reported, as *Error values joined with errors.Join
// and sorted by file and position; the Set is then nil.
func ParseWith(files []File, opts LoadOptions) (*Set, error) {
	var total int64
	for _, f := range files {
		total += int64(len(f.Data))
	}
	if total > opts.maxTotal() {
		return nil, opts.tooLarge("config", total, len(files))
	}
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

// HashFiles is the Hash of the Set that Parse would return for files, found
// without checking them: two reads of the same files hash alike.
func HashFiles(files []File) string {
	files = slices.Clone(files)
	slices.SortStableFunc(files, func(a, b File) int { return cmp.Compare(a.Name, b.Name) })
	return hashFiles(files)
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
