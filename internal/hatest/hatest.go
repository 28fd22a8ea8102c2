// Package hatest holds test fixtures for a highly available control plane
// until its real servers exist: a fake standby (a real transport.Listener
// with the cluster CA that names the leader and does nothing else), a UDP
// link that can be cut without a word (a leader lost to SIGKILL or a dead
// host sends no CONNECTION_CLOSE), and the cluster PKI shared by servers.
package hatest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// SharePKI copies the cluster CA and join secret of the server whose pki
// directory is from into to, so that a server opening to issues its own
// server certificate from the same CA (as every server of a highly
// available control plane does).
func SharePKI(t testing.TB, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{transport.CACertFile, transport.CAKeyFile, transport.TokenSecretFile} {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatalf("share the cluster PKI: %v", err)
		}
		if err := os.WriteFile(filepath.Join(to, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// StandbyReason is what the fake standby says with every refusal.
const StandbyReason = "this server is a standby"

// Standby is a fake standby server: it answers every node's hello with
// Welcome{error, leader_addr}, every client request with
// ClientResponse{error, leader_addr}, sends joins on to the leader, and
// counts what it was asked.
type Standby struct {
	l *transport.Listener

	mu       sync.Mutex
	leader   string
	hellos   []time.Time
	requests []*api.ClientRequest
}

// StartStandby runs a standby of the cluster whose pki directory is pki,
// naming leader ("" for none elected), on 127.0.0.1:0.
func StartStandby(t testing.TB, pki, leader string) *Standby {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	SharePKI(t, pki, dir)
	auth, err := transport.OpenAuthority(dir, transport.AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Standby{leader: leader}
	ctx, cancel := context.WithCancel(context.Background())
	s.l, err = transport.Listen(ctx, "127.0.0.1:0", auth, transport.ListenConfig{Standby: s.notLeader})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		s.l.Close()
		<-done
	})
	return s
}

// Addr is the standby's address.
func (s *Standby) Addr() string { return s.l.Addr().String() }

// SetLeader changes the leader named ("" for none).
func (s *Standby) SetLeader(addr string) {
	s.mu.Lock()
	s.leader = addr
	s.mu.Unlock()
}

// Hellos returns when each node hello came.
func (s *Standby) Hellos() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.hellos...)
}

// Requests returns the client requests it was sent.
func (s *Standby) Requests() []*api.ClientRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*api.ClientRequest(nil), s.requests...)
}

func (s *Standby) notLeader() *transport.NotLeaderError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &transport.NotLeaderError{Leader: s.leader, Reason: StandbyReason}
}

func (s *Standby) serve(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := s.l.Accept(ctx)
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			if c.ALPN() == transport.ALPNNode {
				s.serveNode(ctx, c)
			} else {
				s.serveClient(ctx, c)
			}
		}()
	}
}

// serveNode answers the hello and waits for the node to hang up, so that
// the welcome is not lost behind the close.
func (s *Standby) serveNode(ctx context.Context, c *transport.Conn) {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.AcceptStream(hctx)
	if err != nil {
		return
	}
	var m api.AgentMessage
	if err := st.Recv(&m); err != nil || m.GetHello() == nil {
		return
	}
	nl := s.notLeader()
	s.mu.Lock()
	s.hellos = append(s.hellos, time.Now())
	s.mu.Unlock()
	st.Send(&api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{
		Version: api.CurrentVersion(), Error: nl.Reason, LeaderAddr: nl.Leader}}})
	select {
	case <-c.Context().Done():
	case <-hctx.Done():
	}
}

func (s *Standby) serveClient(ctx context.Context, c *transport.Conn) {
	for {
		st, err := c.AcceptStream(ctx)
		if err != nil {
			return
		}
		var req api.ClientRequest
		if err := st.Recv(&req); err != nil {
			st.Cancel(0)
			continue
		}
		nl := s.notLeader()
		s.mu.Lock()
		s.requests = append(s.requests, &req)
		s.mu.Unlock()
		st.Send(&api.ClientResponse{Error: nl.Reason, LeaderAddr: nl.Leader})
		st.CloseWrite()
	}
}

// Link is a UDP relay in front of a server: peers dial Addr, and Cut
// drops every packet from then on, both ways, without a word, as a server
// lost to SIGKILL or a dead host would.
type Link struct {
	front *net.UDPConn
	to    *net.UDPAddr

	mu    sync.Mutex
	cut   bool
	peers map[string]*net.UDPConn // per peer address, the relay's socket towards the server
	wg    sync.WaitGroup
}

// StartLink relays 127.0.0.1:0 to the server at to.
func StartLink(t testing.TB, to string) *Link {
	t.Helper()
	ua, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{front: front, to: ua, peers: map[string]*net.UDPConn{}}
	l.wg.Add(1)
	go l.relayIn()
	t.Cleanup(l.close)
	return l
}

// Addr is the address peers dial.
func (l *Link) Addr() string { return l.front.LocalAddr().String() }

// Cut drops everything from now on.
func (l *Link) Cut() {
	l.mu.Lock()
	l.cut = true
	l.mu.Unlock()
}

func (l *Link) isCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

func (l *Link) relayIn() {
	defer l.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := l.front.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if l.isCut() {
			continue
		}
		back, err := l.peer(from)
		if err != nil {
			continue
		}
		back.Write(buf[:n])
	}
}

// peer returns the socket relaying from's packets to the server, starting
// the relay of the server's answers back to from.
func (l *Link) peer(from *net.UDPAddr) (*net.UDPConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.peers[from.String()]; ok {
		return c, nil
	}
	c, err := net.DialUDP("udp", nil, l.to)
	if err != nil {
		return nil, err
	}
	l.peers[from.String()] = c
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ICMP errors from a closed server port
			}
			if l.isCut() {
				continue
			}
			l.front.WriteToUDP(buf[:n], from)
		}
	}()
	return c, nil
}

func (l *Link) close() {
	l.front.Close()
	l.mu.Lock()
	for _, c := range l.peers {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}
