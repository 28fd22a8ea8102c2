package transport

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"
)

func TestJoinThenDialNode(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	joined := make(chan JoinInfo, 4)
	l := startListener(t, a, ListenConfig{OnJoin: func(_ context.Context, info JoinInfo) error {
		joined <- info
		return nil
	}})
	addr := l.Addr().String()
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := Join(ctx, addr, tok, "gpu-01", dir); err != nil {
		t.Fatalf("Join: %v", err)
	}
	if info := <-joined; info.Node != "gpu-01" || info.TokenID == "" || info.Remote == nil {
		t.Errorf("OnJoin saw %+v, want the join of gpu-01", info)
	}
	for _, f := range []string{NodeCertFile, NodeKeyFile, CACertFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("join did not store %s: %v", f, err)
		}
	}
	// Joining again into the same dir must not replace the identity.
	_, err = Join(ctx, addr, tok, "gpu-01", dir)
	wantErrContains(t, err, "joined before")

	id, err := LoadNodeIdentity(dir)
	if err != nil {
		t.Fatalf("LoadNodeIdentity: %v", err)
	}
	if id.Role != RoleNode || id.Name != "gpu-01" {
		t.Fatalf("identity is %s %q", id.Role, id.Name)
	}
	d := newDialer(t)
	nc, err := d.DialNode(ctx, addr, id)
	if err != nil {
		t.Fatalf("DialNode: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	if nc.Role() != RoleServer {
		t.Errorf("dialed peer role %s, want server", nc.Role())
	}
	sc := acceptOne(t, ctx, l)
	if sc.Role() != RoleNode || sc.Name() != "gpu-01" || sc.ALPN() != ALPNNode {
		t.Fatalf("server sees %s %q over %s", sc.Role(), sc.Name(), sc.ALPN())
	}

	// The handshake of the control stream, both ways.
	cs, err := nc.OpenStream(ctx, StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	hello := &api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion(), Role: "node"}}}
	if err := cs.Send(hello); err != nil {
		t.Fatal(err)
	}
	ss, err := sc.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got api.AgentMessage
	if err := ss.Recv(&got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, hello) {
		t.Fatalf("server got %v, want %v", &got, hello)
	}
	welcome := &api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{Version: api.CurrentVersion(), ServerName: "test"}}}
	if err := ss.Send(welcome); err != nil {
		t.Fatal(err)
	}
	var w api.ServerMessage
	if err := cs.Recv(&w); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&w, welcome) {
		t.Fatalf("node got %v", &w)
	}
}

func TestJoinRefused(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	a := newAuthorityIn(t, dir, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{OnJoin: func(_ context.Context, info JoinInfo) error {
		if info.Node == "taken" {
			return errors.New("a node named taken is already registered: pick another name")
		}
		return nil
	}})
	addr := l.Addr().String()
	past := newAuthorityIn(t, dir, AuthorityOptions{Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	expired, _, err := past.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	good, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := newAuthority(t, AuthorityOptions{}).CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ParseToken(good)
	p.mac[0] ^= 1
	forged := p.String()

	tests := []struct {
		name, token, node string
		refused           bool // refused by the server rather than by the node's own checks
		want              string
	}{
		{"expired", expired, "gpu-01", true, "join token expired"},
		{"forged", forged, "gpu-01", true, "signature does not verify"},
		{"other cluster", foreign, "gpu-01", false, "does not match the join token's CA hash"},
		{"refused by hook", good, "taken", true, "already registered"},
		{"malformed", "gpj1.nonsense", "gpu-01", false, "malformed join token"},
		{"bad node name", good, "gpu 01", false, "node name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			_, err := Join(ctx, addr, tc.token, tc.node, state)
			wantErrContains(t, err, tc.want)
			var ref *RefusedError
			if got := errors.As(err, &ref); got != tc.refused {
				t.Errorf("refused by server = %v, want %v (err %v)", got, tc.refused, err)
			}
			if entries, _ := os.ReadDir(state); len(entries) != 0 {
				t.Errorf("a failed join left files in the state dir: %v", entries)
			}
		})
	}
}

func TestJoinRefusesOtherProtocolVersion(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ParseToken(tok)
	d := newDialer(t)
	c, err := d.dial(ctx, l.Addr().String(), clientTLS(ALPNJoin, nil, nil, &p.CAHash, "127.0.0.1", time.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &api.JoinRequest{Version: &api.Version{Major: api.ProtocolMajor + 1}, Token: tok, NodeName: "gpu-09", PublicKeyDer: []byte{1}}
	if err := api.WriteFrame(s, req); err != nil {
		t.Fatal(err)
	}
	var resp api.JoinResponse
	if err := api.NewFrameReader(s).Read(&resp); err != nil {
		t.Fatal(err)
	}
	wantErrContains(t, errors.New(resp.GetError()), "same major release")
	if len(resp.GetCertDer()) != 0 {
		t.Errorf("refused join carries a certificate")
	}
}

func TestPeerIdentityRefused(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	a := newAuthorityIn(t, dir, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	addr := l.Addr().String()
	d := newDialer(t)

	node := joinNode(t, ctx, l, a, "gpu-01")
	viewer, err := a.IssueClient("bob", RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := newAuthority(t, AuthorityOptions{}).IssueClient("mallory", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	foreign.CA = a.CACert() // it trusts the right server, but its own certificate is from elsewhere
	past := newAuthorityIn(t, dir, AuthorityOptions{Now: func() time.Time { return time.Now().Add(-72 * time.Hour) }, ClientCertTTL: 24 * time.Hour})
	expired, err := past.IssueClient("old", RoleOperator)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		alpn string
		id   *Identity
		want string
	}{
		{"viewer on node ALPN", ALPNNode, viewer, "cannot connect as a node"},
		{"node on client ALPN", ALPNClient, node, "cannot connect as a gpuctl client"},
		{"client cert from another CA", ALPNClient, foreign, "not issued by this cluster's CA"},
		{"node-ALPN cert from another CA", ALPNNode, foreign, "not issued by this cluster's CA"},
		{"expired client cert", ALPNClient, expired, "expired"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			expectRefused(t, ctx, func() (*Conn, error) { return d.dialIdentity(ctx, addr, tc.alpn, tc.id) }, tc.want)
		})
	}
	// The public entry points check the identity before dialing at all.
	_, err = d.DialNode(ctx, addr, viewer)
	wantErrContains(t, err, "not a node identity")
	_, err = d.DialClient(ctx, addr, node)
	wantErrContains(t, err, "not a client identity")

	// None of the refused peers reached Accept; a good client does.
	c, err := d.DialClient(ctx, addr, viewer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := acceptOne(t, ctx, l)
	if sc.Role() != RoleViewer || sc.Name() != "bob" {
		t.Fatalf("first accepted peer is %s %q, want viewer bob", sc.Role(), sc.Name())
	}
}

func TestDialerVerifiesServer(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	_, port, _ := net.SplitHostPort(l.Addr().String())
	admin, err := a.IssueClient("root", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	d := newDialer(t)

	// Dial the listener's address while naming a host its certificate
	// does not cover.
	tlsConf := clientTLS(ALPNClient, &admin.Certificate, poolOf(a), nil, "gpu-head.invalid", time.Now)
	_, err = d.dial(ctx, "127.0.0.1:"+port, tlsConf)
	wantErrContains(t, err, `not valid for "gpu-head.invalid"`)

	// A client of another cluster does not trust this server.
	other, err := newAuthority(t, AuthorityOptions{}).IssueClient("root", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.DialClient(ctx, l.Addr().String(), other)
	wantErrContains(t, err, "not issued by this cluster's CA")
}

func TestStreamsRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	node := joinNode(t, ctx, l, a, "gpu-01")
	nc, err := newDialer(t).DialNode(ctx, l.Addr().String(), node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	sc := acceptOne(t, ctx, l)

	kinds := []StreamKind{StreamControl, StreamTelemetry, StreamEvents, StreamRequest}
	// Open every kind before the server accepts any, as a busy node would.
	sent := map[StreamKind][]*api.AgentMessage{}
	for i, k := range kinds {
		s, err := nc.OpenStream(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 3 {
			m := &api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{Seq: uint64(i*10 + j)}}}
			if err := s.Send(m); err != nil {
				t.Fatal(err)
			}
			sent[k] = append(sent[k], m)
		}
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	for range kinds {
		s, err := sc.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := sent[s.Kind()]
		if !ok {
			t.Fatalf("accepted a %s stream twice or of an unsent kind", s.Kind())
		}
		delete(sent, s.Kind())
		for _, w := range want {
			var got api.AgentMessage
			if err := s.Recv(&got); err != nil {
				t.Fatalf("%s stream: %v", s.Kind(), err)
			}
			if !proto.Equal(&got, w) {
				t.Fatalf("%s stream: got %v, want %v", s.Kind(), &got, w)
			}
		}
		var extra api.AgentMessage
		if err := s.Recv(&extra); err != io.EOF {
			t.Fatalf("%s stream after last message: %v, want io.EOF", s.Kind(), err)
		}
	}

	// A client request stream answered by the server.
	viewer, err := a.IssueClient("bob", RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := DialClient(ctx, l.Addr().String(), viewer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	scc := acceptOne(t, ctx, l)
	req, err := cc.OpenStream(ctx, StreamRequest)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Send(&api.Hello{Role: "client", Software: "gpuctl test"}); err != nil {
		t.Fatal(err)
	}
	sreq, err := scc.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h api.Hello
	if err := sreq.Recv(&h); err != nil || h.GetSoftware() != "gpuctl test" || sreq.Kind() != StreamRequest {
		t.Fatalf("request: %v %v %s", &h, err, sreq.Kind())
	}
	if err := sreq.Send(&api.Welcome{ServerName: "srv"}); err != nil {
		t.Fatal(err)
	}
	var w api.Welcome
	if err := req.Recv(&w); err != nil || w.GetServerName() != "srv" {
		t.Fatalf("response: %v %v", &w, err)
	}
}

func TestListenerSurvivesGarbage(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	addr := l.Addr().String()
	uaddr := l.Addr().(*net.UDPAddr)

	// Random datagrams, short and full-sized.
	raw, err := net.DialUDP("udp", nil, uaddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, n := range []int{1, 20, 1200, 1500} {
		b := make([]byte, n)
		rand.Read(b)
		if _, err := raw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	d := newDialer(t)
	// A QUIC client speaking another protocol.
	_, err = d.dial(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h3"}})
	if err == nil {
		t.Errorf("a dial with ALPN h3 succeeded")
	}
	// The node protocol without a client certificate.
	// The client finishes its side of the handshake before the server
	// sees no certificate came, so the refusal may come just after the dial.
	if nc, err := d.dial(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPNNode}}); err == nil {
		select {
		case <-nc.Context().Done():
		case <-ctx.Done():
			t.Fatal("a node connection without a certificate stayed open")
		}
	}
	// A join connection that sends nonsense instead of a request.
	tok, _, _ := a.CreateToken(time.Hour)
	p, _ := ParseToken(tok)
	jc, err := d.dial(ctx, addr, clientTLS(ALPNJoin, nil, nil, &p.CAHash, "127.0.0.1", time.Now))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jc.qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	js.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	select {
	case <-jc.Context().Done():
	case <-ctx.Done():
		t.Fatal("server kept a join connection that sent garbage")
	}
	var app *quic.ApplicationError
	if err := context.Cause(jc.Context()); !errors.As(err, &app) || app.ErrorCode != CodeProtocol {
		t.Errorf("garbage join closed with %v, want CodeProtocol", err)
	}

	// A node that opens a stream of an unknown kind is cut off.
	node := joinNode(t, ctx, l, a, "gpu-01")
	bad, err := d.DialNode(ctx, addr, node)
	if err != nil {
		t.Fatal(err)
	}
	sc := acceptOne(t, ctx, l)
	bs, err := bad.qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bs.Write([]byte{42})
	_, err = sc.AcceptStream(ctx)
	wantErrContains(t, err, "unknown stream kind 42")
	select {
	case <-bad.Context().Done():
	case <-ctx.Done():
		t.Fatal("node with a bad stream kind was not disconnected")
	}
	wantErrContains(t, bad.Err(), "unknown stream kind 42")

	// After all that the listener still serves a good node.
	good, err := d.DialNode(ctx, addr, node)
	if err != nil {
		t.Fatalf("dial after garbage: %v", err)
	}
	defer good.Close()
	gc := acceptOne(t, ctx, l)
	if gc.Name() != "gpu-01" {
		t.Fatalf("accepted %q", gc.Name())
	}
}

func TestListenerCloseNotifiesPeers(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	lctx, stop := context.WithCancel(context.Background())
	l, err := Listen(lctx, "127.0.0.1:0", a, ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	viewer, _ := a.IssueClient("bob", RoleViewer)
	c, err := newDialer(t).DialClient(ctx, l.Addr().String(), viewer)
	if err != nil {
		t.Fatal(err)
	}
	acceptOne(t, ctx, l)
	stop() // canceling the Listen context closes the listener
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("client not told of the shutdown")
	}
	wantErrContains(t, c.Err(), "shutting down")
	if _, err := l.Accept(ctx); !errors.Is(err, ErrListenerClosed) {
		t.Errorf("Accept after close: %v, want ErrListenerClosed", err)
	}
}

// BenchmarkFrameRoundTrip measures request/response frames over one
// loopback QUIC stream between a node and the server.
func BenchmarkFrameRoundTrip(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			benchRoundTrip(b, size)
		})
	}
}

// benchPair returns both ends of one telemetry stream between a joined
// node and a listener on loopback.
func benchPair(b *testing.B) (node, server *Stream) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	a, err := OpenAuthority(b.TempDir(), AuthorityOptions{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := Listen(ctx, "127.0.0.1:0", a, ListenConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	tok, _, _ := a.CreateToken(time.Hour)
	d, err := NewDialer(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	id, err := d.Join(ctx, l.Addr().String(), tok, "bench", b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	nc, err := d.DialNode(ctx, l.Addr().String(), id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	sc, err := l.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sc.Close() })
	cs, err := nc.OpenStream(ctx, StreamTelemetry)
	if err != nil {
		b.Fatal(err)
	}
	ss, err := sc.AcceptStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return cs, ss
}

func benchRoundTrip(b *testing.B, size int) {
	cs, ss := benchPair(b)
	echoDone := make(chan error, 1)
	go func() {
		var m api.Welcome
		for {
			if err := ss.Recv(&m); err != nil {
				if err == io.EOF {
					err = nil
				}
				echoDone <- err
				return
			}
			if err := ss.Send(&m); err != nil {
				echoDone <- err
				return
			}
		}
	}()
	msg := &api.Welcome{ServerName: string(make([]byte, size))}
	wire := proto.Size(msg)
	var reply api.Welcome
	b.SetBytes(int64(2 * wire))
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if err := cs.Send(msg); err != nil {
			b.Fatal(err)
		}
		if err := cs.Recv(&reply); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "roundtrips/s")
	b.ReportMetric(float64(2*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(2*b.N*wire)/elapsed.Seconds()/1e6, "MB/s")
	cs.CloseWrite()
	if err := <-echoDone; err != nil {
		b.Fatal(err)
	}
}

func poolOf(a *Authority) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(a.CACert())
	return p
}

// BenchmarkFrameStream measures one-way frames on a loopback QUIC stream,
// the shape of a telemetry burst.
func BenchmarkFrameStream(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			cs, ss := benchPair(b)
			msg := &api.Welcome{ServerName: string(make([]byte, size))}
			wire := proto.Size(msg)
			got := make(chan int, 1)
			go func() {
				var m api.Welcome
				n := 0
				for ss.Recv(&m) == nil {
					n++
				}
				got <- n
			}()
			b.SetBytes(int64(wire))
			start := time.Now()
			sent := 0
			for b.Loop() {
				if err := cs.Send(msg); err != nil {
					b.Fatal(err)
				}
				sent++
			}
			cs.CloseWrite()
			if n := <-got; n != sent {
				b.Fatalf("received %d of %d frames", n, sent)
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(sent)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(sent*wire)/elapsed.Seconds()/1e6, "MB/s")
		})
	}
}
