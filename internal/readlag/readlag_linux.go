package readlag

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"syscall"
	"unsafe"
)

// Stamp turns on the kernel's receive stamps on tc and returns it as a
// Conn whose reads note their wait to note (nil: only Received).
func Stamp(tc *net.TCPConn, note NoteFunc) (*Conn, error) {
	raw, err := tc.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
		})
		err = cmp.Or(cerr, err)
	}
	if err != nil {
		return nil, fmt.Errorf("SO_TIMESTAMPNS on %s: %w", tc.RemoteAddr(), err)
	}
	return &Conn{TCPConn: tc, raw: raw, oob: make([]byte, oobSize), note: note}, nil
}

// Read reads as the embedded connection does (through the runtime's
// poller, so read deadlines hold), with recvmsg for the stamp.
func (c *Conn) Read(p []byte) (int, error) {
	var n, oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), p, c.oob, 0)
			if rerr != syscall.EINTR {
				return rerr != syscall.EAGAIN
			}
		}
	})
	if err == nil && rerr != nil {
		err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	if msgs, perr := syscall.ParseSocketControlMessage(c.oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
				c.noteStamp((*syscall.Timespec)(unsafe.Pointer(&m.Data[0])).Nano())
			}
		}
	}
	return n, nil
}
