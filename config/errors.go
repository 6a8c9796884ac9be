package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Error is one problem in a descriptor file. Load and Parse report every
// problem they find, joined with errors.Join; use errors.As to get the first
// *Error, or unwrap the joined error (interface{ Unwrap() []error }) to get
// them all.
type Error struct {
	// File is the file's name as given to Parse (or found by Load).
	File string
	// Line and Column are 1-based; zero when unknown.
	Line, Column int
	// Path names the descriptor the problem is in, "domain > key=value > key",
	// or "" for a problem with the file as a whole.
	Path string
	// Msg says what is wrong, starting with the field when there is one
	// ("rate_limit.unit: unknown unit …").
	Msg string
}

// Error formats the problem as "file:line:col: path: msg", leaving out the
// parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":" + strconv.Itoa(e.Column))
		}
	}
	if e.Path != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(e.Path)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// maxErrors bounds how many problems one Parse reports, so that a hostile or
// badly broken file does not produce megabytes of errors. Problems are found
// mostly in file order, so keeping the first keepErrors is enough to report
// the first maxErrors by position.
const (
	maxErrors  = 100
	keepErrors = 10 * maxErrors
)

// problems collects the errors and warnings of one Parse.
type problems struct {
	list    []*Error
	dropped int
	// warnings are kept up to keepErrors too.
	warnings []*Error
}

func (p *problems) warn(file string, line, col int, path, format string, args ...any) {
	if len(p.warnings) >= keepErrors {
		return
	}
	p.warnings = append(p.warnings, &Error{File: file, Line: line, Column: col, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// sortedWarnings returns the warnings sorted by position.
func (p *problems) sortedWarnings() []*Error {
	slices.SortStableFunc(p.warnings, func(a, b *Error) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	return p.warnings
}

func (p *problems) add(file string, line, col int, path, format string, args ...any) {
	if len(p.list) >= keepErrors {
		p.dropped++
		return
	}
	p.list = append(p.list, &Error{File: file, Line: line, Column: col, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// err returns the problems sorted by position and joined, or nil.
func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	slices.SortStableFunc(p.list, func(a, b *Error) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	list := p.list
	more := p.dropped
	if len(list) > maxErrors {
		more += len(list) - maxErrors
		list = list[:maxErrors]
	}
	errs := make([]error, 0, len(list)+1)
	for _, e := range list {
		errs = append(errs, e)
	}
	if more > 0 {
		errs = append(errs, &Error{Msg: fmt.Sprintf("too many problems: %d more not shown", more)})
	}
	return errors.Join(errs...)
}

// pathPart writes one descriptor level for people: "key=value", or "key" for
// a key-only level. Keys and values that could be misread (empty, spaces,
// '>', '=', quotes, control or invisible characters) are quoted.
func pathPart(key, value string) string {
	if value == "" {
		return quoteIfNeeded(key)
	}
	return quoteIfNeeded(key) + "=" + quoteIfNeeded(value)
}

func quoteIfNeeded(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r == ' ' || r == '>' || r == '=' || r == '"' || r == '\\' || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func joinPath(parent, part string) string {
	return parent + " > " + part
}
