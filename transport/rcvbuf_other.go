//go:build !linux

package transport

import "net"

// forceReceiveBuffer has no way past the system's cap here.
func forceReceiveBuffer(*net.UDPConn, int) {}
