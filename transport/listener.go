package transport

import (
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/quic-go/quic-go"
)

// ErrListenerClosed is returned by Accept once the listener is closed.
var ErrListenerClosed = errors.New("listener closed")

const (
	// maxAcceptFailures consecutive errors from the QUIC listener end the
	// accept loop; each is followed by a growing pause.
	maxAcceptFailures = 10
	acceptQueue       = 64
	// acceptQueueTimeout is how long a verified connection waits for the
	// caller's Accept before it is turned away as busy.
	acceptQueueTimeout = 10 * time.Second
	// Joins are the one unauthenticated protocol: each holds a slot from
	// its handshake until it is answered, so slots are few, bounded per
	// source address as well as in total, and short-lived.
	maxConcurrentJoins = 32
	maxJoinsPerAddr    = 4
	// joinRequestTimeout bounds the wait for a join request, and joinLinger
	// the wait for the node to close after its answer.
	joinRequestTimeout = 2 * time.Second
	joinLinger         = 2 * time.Second
	// joinHookTimeout bounds the server's own work on a join (its hooks).
	joinHookTimeout = 5 * time.Second
)

// JoinInfo describes a node asking to join, for ListenConfig.OnJoin.
type JoinInfo struct {
	Node    string
	Remote  net.Addr
	TokenID string
	Version *api.Version
	// PublicKey is the key the node generated; KeySHA256 names it
	// (KeySHA256 of the key).
	PublicKey crypto.PublicKey
	KeySHA256 string
}

// PeerInfo describes a node or client whose certificate the CA verified,
// for ListenConfig.CheckPeer.
type PeerInfo struct {
	Role   Role
	Name   string
	Cert   *x509.Certificate
	Remote net.Addr
}

// ListenConfig tunes Listen. The zero value is usable.
type ListenConfig struct {
	Logger *slog.Logger
	// OnJoin, when set, is called after a join token has been verified and
	// before the node certificate is issued; an error refuses the join and
	// its text is sent to the node. The token's use is taken after it.
	OnJoin func(ctx context.Context, info JoinInfo) error
	// Standby, when set, is asked first about every join: a server that is
	// a standby of a highly available control plane returns who leads, and
	// the node is sent on to the leader (with none elected, turned away as
	// busy) before its token is looked at, since only the leader writes
	// the token ledger. nil: this server takes joins.
	Standby func() *NotLeaderError
	// OnJoined, when set, is called with the certificate issued to a node
	// before it is sent; an error refuses the join.
	OnJoined func(ctx context.Context, info JoinInfo, cert *x509.Certificate) error
	// CheckPeer, when set, is called for every node and client connection
	// once its certificate verified, before Accept returns it; an error
	// (a revoked certificate) closes the connection with CodeRefused and
	// the error's text.
	CheckPeer func(ctx context.Context, peer PeerInfo) error
}

// Listener accepts node and client connections on one UDP port and serves
// joins itself.
type Listener struct {
	auth *Authority
	log  *slog.Logger
	cfg  ListenConfig
	udp  *net.UDPConn
	tr   *quic.Transport
	ql   *quic.Listener

	conns chan *Conn
	done  chan struct{}
	wg    sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	live    map[*quic.Conn]struct{}
	peers   map[*Conn]struct{} // verified, whether handed out yet or not
	joins   map[string]int     // joins in progress per source address
	joining int
	loopErr error
	closed  bool

	probe *lagProbe
}

// ReceiveLag is how far behind the listener's receive path is now: a
// packet read now may have waited this long in the socket's buffer and
// the QUIC read loop. A busy server credits its nodes this much before
// it takes their silence for a failure.
func (l *Listener) ReceiveLag() time.Duration { return l.probe.lag(time.Now()) }

// Listen serves the node, client and join protocols on the UDP address
// addr (e.g. ":7443" or "127.0.0.1:0") until ctx is done or Close is
// called.
func Listen(ctx context.Context, addr string, auth *Authority, cfg ListenConfig) (*Listener, error) {
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", uaddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	l := &Listener{
		auth:  auth,
		log:   cfg.Logger,
		cfg:   cfg,
		udp:   udp,
		conns: make(chan *Conn, acceptQueue),
		done:  make(chan struct{}),
		live:  map[*quic.Conn]struct{}{},
		peers: map[*Conn]struct{}{},
		joins: map[string]int{},
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	sizeReceiveBuffer(udp, l.log)
	l.tr = &quic.Transport{Conn: udp, StatelessResetKey: auth.statelessResetKey()}
	l.ql, err = l.tr.Listen(serverTLS(auth), quicConfig)
	if err != nil {
		l.tr.Close()
		udp.Close()
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	pctx, stopProbe := context.WithCancel(context.Background())
	l.probe = startLagProbe(pctx, l.tr, udp, l.log.Warn)
	l.wg.Add(1)
	go l.acceptLoop()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	go func() {
		<-l.done
		stopProbe()
	}()
	go func() {
		<-l.done
		stop()
	}()
	l.log.Info("listening", "addr", l.Addr().String(), "ca_sha256", auth.CAHash())
	return l, nil
}

// statelessResetKey is derived from the join secret so that it survives a
// restart: peers of a restarted server learn at once that their connection
// is gone instead of waiting for the idle timeout.
func (a *Authority) statelessResetKey() *quic.StatelessResetKey {
	a.mu.RLock()
	m := hmac.New(sha256.New, a.secret)
	a.mu.RUnlock()
	m.Write([]byte("gpuctl quic stateless reset"))
	var k quic.StatelessResetKey
	copy(k[:], m.Sum(nil))
	return &k
}

// Addr returns the UDP address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// Accept returns the next verified node or client connection. Joins never
// reach it.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("accept: %w", ctx.Err())
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.loopErr != nil {
			return nil, l.loopErr
		}
		return nil, ErrListenerClosed
	}
}

// Close stops accepting, closes every connection handed out or still being
// verified with CodeShutdown, and releases the UDP port.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.shutdown(nil)
		l.wg.Wait()
		// Connections still queued for Accept were never handed out.
		for {
			select {
			case c := <-l.conns:
				c.qc.CloseWithError(CodeShutdown, "server shutting down")
				continue
			default:
			}
			break
		}
		l.tr.Close()
		if err := l.udp.Close(); err != nil {
			l.closeErr = fmt.Errorf("close listener %s: %w", l.Addr(), err)
		}
	})
	return l.closeErr
}

func (l *Listener) shutdown(loopErr error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.loopErr = loopErr
	live := make([]*quic.Conn, 0, len(l.live))
	for qc := range l.live {
		live = append(live, qc)
	}
	l.mu.Unlock()
	close(l.done)
	l.ql.Close()
	for _, qc := range live {
		qc.CloseWithError(CodeShutdown, "server shutting down")
	}
}

func (l *Listener) track(qc *quic.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.live[qc] = struct{}{}
	context.AfterFunc(qc.Context(), func() {
		l.mu.Lock()
		delete(l.live, qc)
		l.mu.Unlock()
	})
	return true
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	failures := 0
	for {
		qc, err := l.ql.Accept(context.Background())
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, quic.ErrServerClosed) {
				l.shutdown(fmt.Errorf("accept on %s: %w", l.Addr(), err))
				return
			}
			failures++
			l.log.Warn("accept failed", "err", err, "failures", failures)
			if failures >= maxAcceptFailures {
				l.shutdown(fmt.Errorf("accept on %s: %d failures in a row, last: %w", l.Addr(), failures, err))
				return
			}
			pause := min(10*time.Millisecond<<failures, 2*time.Second)
			select {
			case <-time.After(pause):
			case <-l.done:
				return
			}
			continue
		}
		failures = 0
		if !l.track(qc) {
			qc.CloseWithError(CodeShutdown, "server shutting down")
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.handle(qc)
		}()
	}
}

func (l *Listener) handle(qc *quic.Conn) {
	state := qc.ConnectionState().TLS
	alpn := state.NegotiatedProtocol
	log := l.log.With("remote", qc.RemoteAddr().String(), "alpn", alpn)
	if alpn == ALPNJoin {
		l.serveJoin(qc, log)
		return
	}
	c, err := l.verify(alpn, state.PeerCertificates)
	if err != nil {
		log.Warn("refused peer", "err", err)
		qc.CloseWithError(CodeRefused, err.Error())
		return
	}
	c.qc = qc
	// Known to Disconnect before CheckPeer looks, so a revocation that
	// lands in between still catches the connection.
	l.trackPeer(c)
	if l.cfg.CheckPeer != nil {
		if err := l.cfg.CheckPeer(qc.Context(), PeerInfo{Role: c.role, Name: c.name, Cert: c.cert, Remote: qc.RemoteAddr()}); err != nil {
			log.Warn("refused peer", "role", c.role, "name", c.name, "serial", c.Serial(), "err", err)
			qc.CloseWithError(CodeRefused, err.Error())
			return
		}
	}
	log.Debug("peer connected", "role", c.role, "name", c.name)
	timer := time.NewTimer(acceptQueueTimeout)
	defer timer.Stop()
	select {
	case l.conns <- c:
	case <-l.done:
		qc.CloseWithError(CodeShutdown, "server shutting down")
	case <-timer.C:
		log.Warn("no Accept for verified peer; turning it away", "name", c.name)
		qc.CloseWithError(CodeBusy, "server busy: try again shortly")
	}
}

func (l *Listener) trackPeer(c *Conn) {
	l.mu.Lock()
	l.peers[c] = struct{}{}
	l.mu.Unlock()
	context.AfterFunc(c.qc.Context(), func() {
		l.mu.Lock()
		delete(l.peers, c)
		l.mu.Unlock()
	})
}

// Disconnect closes, with CodeRefused and reason, every verified node or
// client connection for which match is true (those of a certificate just
// revoked), whether Accept has returned it yet or not, and returns how
// many it closed.
func (l *Listener) Disconnect(match func(c *Conn) bool, reason string) int {
	l.mu.Lock()
	var hit []*Conn
	for c := range l.peers {
		if match(c) {
			hit = append(hit, c)
		}
	}
	l.mu.Unlock()
	for _, c := range hit {
		c.qc.CloseWithError(CodeRefused, reason)
	}
	return len(hit)
}

// verify checks the client certificate against the cluster CA and the role
// the ALPN requires.
func (l *Listener) verify(alpn string, chain []*x509.Certificate) (*Conn, error) {
	role, name, err := l.auth.VerifyPeer(chain)
	if err != nil {
		return nil, err
	}
	switch alpn {
	case ALPNNode:
		if role != RoleNode {
			return nil, fmt.Errorf("a %s certificate (%q) cannot connect as a node: a node needs the node certificate it gets by joining with a token", role, name)
		}
	case ALPNClient:
		if !role.IsClient() {
			return nil, fmt.Errorf("a %s certificate (%q) cannot connect as a gpuctl client: use a client config (viewer, operator or admin) from the cluster admin", role, name)
		}
	default:
		return nil, fmt.Errorf("unknown application protocol %q", alpn)
	}
	return &Conn{role: role, name: name, alpn: alpn, cert: chain[0]}, nil
}

// takeJoinSlot reserves a join slot for a connection from remote, or says
// why there is none.
func (l *Listener) takeJoinSlot(remote net.Addr) (release func(), busy string) {
	host := remote.String()
	if ua, ok := remote.(*net.UDPAddr); ok {
		host = ua.IP.String()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.joins[host] >= maxJoinsPerAddr:
		return nil, fmt.Sprintf("server busy: %d joins from %s in progress; try again shortly", l.joins[host], host)
	case l.joining >= maxConcurrentJoins:
		return nil, fmt.Sprintf("server busy with %d other joins; try again shortly", l.joining)
	}
	l.joins[host]++
	l.joining++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.joining--
		if l.joins[host]--; l.joins[host] <= 0 {
			delete(l.joins, host)
		}
	}, ""
}

func (l *Listener) serveJoin(qc *quic.Conn, log *slog.Logger) {
	release, busy := l.takeJoinSlot(qc.RemoteAddr())
	if release == nil {
		log.Warn("join turned away", "why", busy)
		qc.CloseWithError(CodeBusy, busy)
		return
	}
	defer release()
	rctx, cancel := context.WithTimeout(qc.Context(), joinRequestTimeout)
	defer cancel()
	s, err := qc.AcceptStream(rctx)
	if err != nil {
		log.Warn("join: no request", "err", err)
		qc.CloseWithError(CodeProtocol, fmt.Sprintf("no join request within %s", joinRequestTimeout))
		return
	}
	deadline, _ := rctx.Deadline()
	s.SetReadDeadline(deadline)
	var req api.JoinRequest
	if err := api.NewFrameReader(s).Read(&req); err != nil {
		log.Warn("join: bad request", "err", err)
		qc.CloseWithError(CodeProtocol, "join: unreadable request: "+err.Error())
		return
	}
	hctx, hcancel := context.WithTimeout(qc.Context(), joinHookTimeout)
	resp, noLeader := l.join(hctx, qc.RemoteAddr(), &req)
	hcancel()
	if noLeader {
		// A standby with no leader to name: the join is worth trying
		// again shortly, here or at another server, as when busy.
		log.Warn("join turned away: no leader", "node", req.GetNodeName(), "err", resp.Error)
		qc.CloseWithError(CodeBusy, resp.Error)
		return
	}
	if resp.LeaderAddr != "" {
		log.Info("join sent on to the leader", "node", req.GetNodeName(), "leader", resp.LeaderAddr)
	} else if resp.Error != "" {
		log.Warn("join refused", "node", req.GetNodeName(), "err", resp.Error)
	} else {
		log.Info("node joined", "node", req.GetNodeName())
	}
	s.SetWriteDeadline(time.Now().Add(joinLinger))
	if err := api.WriteFrame(s, resp); err != nil {
		log.Warn("join: send answer", "err", err)
		qc.CloseWithError(CodeProtocol, "join: send answer failed")
		return
	}
	s.Close()
	// The node closes the connection once it has the answer; closing first
	// could drop the answer still in flight.
	linger := time.NewTimer(joinLinger)
	defer linger.Stop()
	select {
	case <-qc.Context().Done():
	case <-linger.C:
	case <-l.done:
	}
	qc.CloseWithError(CodeNoError, "join done")
}

// join checks and answers a join request. A standby's *NotLeaderError
// names the leader in the answer, or, with no leader elected, sets
// noLeader: nothing was written either way.
func (l *Listener) join(ctx context.Context, remote net.Addr, req *api.JoinRequest) (resp *api.JoinResponse, noLeader bool) {
	resp, err := l.joinChecked(ctx, remote, req)
	if err == nil {
		return resp, false
	}
	var nl *NotLeaderError
	if errors.As(err, &nl) && nl.Leader != "" {
		// The node's NotLeaderError says the rest.
		reason := nl.Reason
		if reason == "" {
			reason = "this server is a standby"
		}
		return &api.JoinResponse{Error: reason, LeaderAddr: nl.Leader}, false
	}
	return &api.JoinResponse{Error: err.Error()}, nl != nil
}

func (l *Listener) joinChecked(ctx context.Context, remote net.Addr, req *api.JoinRequest) (*api.JoinResponse, error) {
	refuse := func(format string, args ...any) (*api.JoinResponse, error) {
		return nil, fmt.Errorf(format, args...)
	}
	if err := api.CheckVersion(req.GetVersion()); err != nil {
		return refuse("%v", err)
	}
	if l.cfg.Standby != nil {
		if nl := l.cfg.Standby(); nl != nil {
			return nil, nl
		}
	}
	if err := l.auth.CheckToken(req.GetToken()); err != nil {
		return refuse("%v", err)
	}
	if err := ValidateName(req.GetNodeName()); err != nil {
		return refuse("node %v", err)
	}
	pub, err := x509.ParsePKIXPublicKey(req.GetPublicKeyDer())
	if err != nil {
		return refuse("public key: %v", err)
	}
	if err := checkPublicKey(pub); err != nil {
		return refuse("public key: %v", err)
	}
	tok, _ := ParseToken(req.GetToken())
	info := JoinInfo{Node: req.GetNodeName(), Remote: remote, TokenID: tok.ID, Version: req.GetVersion(), PublicKey: pub, KeySHA256: KeySHA256(pub)}
	if l.cfg.OnJoin != nil {
		if err := l.cfg.OnJoin(ctx, info); err != nil {
			return nil, err
		}
	}
	if err := l.auth.UseToken(req.GetToken(), req.GetNodeName()); err != nil {
		return refuse("%v", err)
	}
	cert, err := l.auth.IssueNode(pub, req.GetNodeName())
	if err != nil {
		return refuse("%v", err)
	}
	if l.cfg.OnJoined != nil {
		if err := l.cfg.OnJoined(ctx, info, cert); err != nil {
			return refuse("%v", err)
		}
	}
	return &api.JoinResponse{CertDer: cert.Raw, CaCertDer: l.auth.CACert().Raw}, nil
}
