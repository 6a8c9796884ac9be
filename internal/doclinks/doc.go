// Package doclinks holds a test that every relative link in the
// repository's Markdown (README.md, CONTRIBUTING.md, docs/ and the rest)
// names a file that exists and, with a #fragment, a heading of that file.
// It has no code of its own.
package doclinks
