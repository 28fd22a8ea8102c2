package workload

import (
	"errors"
	"net"
	"strconv"
)

// FreePortPair returns a TCP port p on host such that p and p+1 are both
// free now: ringtrain's training communicator meets at MASTER_PORT and its
// control communicator at MASTER_PORT+1.
func FreePortPair(host string) (int, error) {
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p < 65535 {
			if l2, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+1))); err == nil {
				l2.Close()
				l.Close()
				return p, nil
			}
		}
		l.Close()
	}
	return 0, errors.New("no two adjacent free TCP ports found on " + host)
}
