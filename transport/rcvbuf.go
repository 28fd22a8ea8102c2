package transport

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ReceiveBufferBytes is the UDP receive buffer gpuctl asks for on every
// QUIC socket. A server with thousands of nodes takes bursts of their
// packets while it is busy; what does not fit is dropped by the kernel,
// and each QUIC connection that lost a packet waits for its loss recovery.
// quic-go asks for 7 MiB; a server needs more headroom than that.
const ReceiveBufferBytes = 32 << 20

// sizeReceiveBuffer sets udp's receive buffer to ReceiveBufferBytes: the
// ordinary way, capped by net.core.rmem_max, then, where that falls short,
// SO_RCVBUFFORCE (root only, Linux only). It logs what the kernel granted
// when that is less than asked, saying how to raise the cap: a short
// buffer drops packets under load instead of failing.
func sizeReceiveBuffer(udp *net.UDPConn, log *slog.Logger) {
	if err := udp.SetReadBuffer(ReceiveBufferBytes); err != nil {
		log.Warn("set the UDP receive buffer", "want_bytes", ReceiveBufferBytes, "err", err)
	}
	got, err := receiveBuffer(udp)
	if err != nil {
		log.Warn("read the UDP receive buffer size", "err", err)
		return
	}
	if got >= ReceiveBufferBytes {
		return
	}
	forceReceiveBuffer(udp, ReceiveBufferBytes)
	if got, err = receiveBuffer(udp); err == nil && got >= ReceiveBufferBytes {
		return
	}
	log.Warn("the kernel capped the UDP receive buffer: under load it drops packets and QUIC waits to resend them; raise the cap (sysctl -w net.core.rmem_max=67108864) or run as root",
		"want_bytes", ReceiveBufferBytes, "got_bytes", got, "rmem_max", rmemMax())
}

// receiveBuffer is the socket's receive buffer as the kernel reports it.
// Linux reports twice what was set (its bookkeeping overhead) and grants
// half of it for data.
func receiveBuffer(udp *net.UDPConn) (int, error) {
	rc, err := udp.SyscallConn()
	if err != nil {
		return 0, err
	}
	var size int
	var serr error
	if err := rc.Control(func(fd uintptr) { size, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("getsockopt SO_RCVBUF: %w", serr)
	}
	if runtime.GOOS == "linux" {
		size /= 2
	}
	return size, nil
}

// rmemMax is net.core.rmem_max, or "" where it cannot be read.
func rmemMax() string {
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		return ""
	}
	return string(b[:len(b)-min(1, len(b))])
}
