package sshserve

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Defaults for the limits on connections not yet (or never) logged in.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxConnsPerAddr  = 16
	DefaultMaxConns         = 256
)

// limitListener refuses a connection at accept, before any SSH byte is
// read, when its source address already holds perAddr connections or the
// server holds total: each held connection is a file descriptor and a
// goroutine, and a handshake is the cheapest thing to hold open.
type limitListener struct {
	net.Listener
	perAddr, total int
	log            *slog.Logger

	mu     sync.Mutex
	n      int
	byAddr map[string]int
}

func newLimitListener(ln net.Listener, perAddr, total int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, perAddr: perAddr, total: total, log: log, byAddr: map[string]int{}}
}

// Accept returns the next connection within the limits, closing the ones
// beyond them.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		if why := l.admit(host); why != "" {
			l.log.Warn("ssh console: connection refused", "remote", c.RemoteAddr().String(), "why", why)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(host) }}, nil
	}
}

// admit counts a new connection from host, or says why it is refused.
func (l *limitListener) admit(host string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total > 0 && l.n >= l.total:
		return "the server holds its maximum of connections (--ssh-max-conns)"
	case l.perAddr > 0 && l.byAddr[host] >= l.perAddr:
		return "this address holds its maximum of connections (--ssh-max-conns-per-addr)"
	}
	l.n++
	l.byAddr[host]++
	return ""
}

func (l *limitListener) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.byAddr[host]--; l.byAddr[host] <= 0 {
		delete(l.byAddr, host)
	}
}

// open is the number of connections held now.
func (l *limitListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// limitedConn gives its slot back once, however many times it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
