package transport

import (
	"net"

	"golang.org/x/sys/unix"
)

// forceReceiveBuffer sets the buffer past net.core.rmem_max, which only
// root may; an error leaves the buffer as it was and is seen by the
// caller's check.
func forceReceiveBuffer(udp *net.UDPConn, bytes int) {
	rc, err := udp.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes) })
}
