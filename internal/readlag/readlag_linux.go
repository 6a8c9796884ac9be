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
	c := &Conn{TCPConn: tc, raw: raw, oob: make([]byte, oobSize), note: note}
	c.recv = c.recvmsg
	return c, nil
}

// recvmsg is the poller's callback for Read (made once, in c.recv: a
// method value made per Read would be allocated per Read): one recvmsg
// into c.buf, its results in c's fields; false asks the poller to wait
// for the socket to be readable.
func (c *Conn) recvmsg(fd uintptr) bool {
	for {
		c.n, c.oobn, _, _, c.rerr = syscall.Recvmsg(int(fd), c.buf, c.oob, 0)
		if c.rerr != syscall.EINTR {
			return c.rerr != syscall.EAGAIN
		}
	}
}

// Read reads as the embedded connection does (through the runtime's
// poller, so read deadlines hold), with recvmsg for the stamp.
func (c *Conn) Read(p []byte) (int, error) {
	c.buf = p
	err := c.raw.Read(c.recv)
	c.buf = nil
	n, rerr := c.n, c.rerr
	if err == nil && rerr != nil {
		err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	c.noteStamp(stampIn(c.oob[:c.oobn]))
	return n, nil
}

// stampIn returns the SCM_TIMESTAMPNS stamp in the control messages oob
// holds, in ns since the epoch, or 0 if there is none. It reads them in
// place, as syscall.ParseSocketControlMessage lays them out, without its
// slice of messages.
func stampIn(oob []byte) int64 {
	const hdr, word = syscall.SizeofCmsghdr, int(unsafe.Sizeof(uintptr(0)))
	align := func(n int) int { return (n + word - 1) &^ (word - 1) } // CMSG_ALIGN
	for len(oob) >= hdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdr || l > len(oob) {
			return 0
		}
		data := oob[align(hdr):l]
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SO_TIMESTAMPNS && len(data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			return (*syscall.Timespec)(unsafe.Pointer(&data[0])).Nano()
		}
		oob = oob[min(align(l), len(oob)):]
	}
	return 0
}
