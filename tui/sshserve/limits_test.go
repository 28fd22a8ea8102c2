package sshserve

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// rawConn is a TCP connection from a chosen loopback address that never
// speaks SSH; ended is closed once the server closes it.
type rawConn struct {
	c     net.Conn
	got   atomic.Int64
	ended chan struct{}
}

func holdFrom(t *testing.T, from, addr string) *rawConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("connect from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rawConn{c: c, ended: make(chan struct{})}
	go func() {
		defer close(r.ended)
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			r.got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	return r
}

// closedWithin reports whether the server closed the connection within
// limit.
func (r *rawConn) closedWithin(limit time.Duration) bool { return closedWithin(r.ended, limit) }

func loginFrom(t *testing.T, from, addr string, key gossh.Signer) *gossh.Client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cc, chans, reqs, err := gossh.NewClientConn(c, addr, &gossh.ClientConfig{User: "ops", Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
	if err != nil {
		c.Close()
		t.Fatalf("login from %s: %v", from, err)
	}
	cl := gossh.NewClient(cc, chans, reqs)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestSSHConnectionLimits(t *testing.T) {
	const perAddr, total = 4, 10
	handshake := time.Second
	c := startConsole(t, func(cfg *Config) {
		cfg.HandshakeTimeout, cfg.MaxConnsPerAddr, cfg.MaxConns = handshake, perAddr, total
	})

	var idle []*rawConn
	for range perAddr {
		idle = append(idle, holdFrom(t, "127.0.0.1", c.addr))
	}
	// Accepted ones get the server's version line; wait for it, so the
	// server has counted them before the next is tried.
	waitBanner := func(rs ...*rawConn) {
		t.Helper()
		for _, r := range rs {
			deadline := time.Now().Add(5 * time.Second)
			for r.got.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("an accepted connection got no SSH version line in 5s")
				}
				select {
				case <-r.ended:
					if r.got.Load() == 0 {
						t.Fatal("a connection within the caps was closed at once")
					}
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}
	waitBanner(idle...)
	over := holdFrom(t, "127.0.0.1", c.addr)
	if !over.closedWithin(2 * time.Second) {
		t.Fatalf("connection %d from one address was held, want it refused (cap %d)", perAddr+1, perAddr)
	}
	if n := over.got.Load(); n != 0 {
		t.Errorf("a refused connection got %d bytes, want none", n)
	}

	var more []*rawConn
	for range perAddr {
		more = append(more, holdFrom(t, "127.0.0.3", c.addr))
	}
	waitBanner(more...)
	// A listed key still logs in from another address while both hold.
	cl := loginFrom(t, "127.0.0.2", c.addr, c.operator)
	last := holdFrom(t, "127.0.0.4", c.addr)
	waitBanner(last)
	beyond := holdFrom(t, "127.0.0.5", c.addr)
	if !beyond.closedWithin(2 * time.Second) {
		t.Fatalf("connection %d in all was held, want it refused (cap %d)", total+1, total)
	}

	// Nobody of the idle ones finished a handshake: each is closed once the
	// handshake timeout passes, while the logged-in session stays.
	for _, r := range append(append(idle, more...), last) {
		if !r.closedWithin(handshake + 5*time.Second) {
			t.Fatalf("an idle connection was still open %s after the handshake timeout", 5*time.Second)
		}
	}
	if _, _, err := cl.SendRequest("keepalive@openssh.com", true, nil); err != nil {
		t.Errorf("the logged-in session ended with the idle ones: %v", err)
	}
	// Their slots are given back.
	again := holdFrom(t, "127.0.0.1", c.addr)
	waitBanner(again)
}
