//go:build !linux

package readlag

import (
	"errors"
	"net"
)

// Stamp fails: only Linux stamps receives (see the package doc).
func Stamp(tc *net.TCPConn, note NoteFunc) (*Conn, error) {
	return nil, errors.New("readlag: receive stamps need Linux")
}
