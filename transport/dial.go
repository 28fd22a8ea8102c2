package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/quic-go/quic-go"
)

// Dialer dials gpuctl servers from one UDP socket, shared by every
// connection it makes, so a reconnecting node keeps one local port.
type Dialer struct {
	udp *net.UDPConn
	tr  *quic.Transport
	log *slog.Logger
	// now is the clock used to check the server certificate.
	now func() time.Time
}

// NewDialer opens a UDP socket on an ephemeral port for dialing.
func NewDialer(logger *slog.Logger) (*Dialer, error) { return newDialerOn(logger, nil) }

// newDialerOn dials from laddr (nil: any address, an ephemeral port).
func newDialerOn(logger *slog.Logger, laddr *net.UDPAddr) (*Dialer, error) {
	udp, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("open dialer socket: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sizeReceiveBuffer(udp, logger)
	return &Dialer{udp: udp, tr: &quic.Transport{Conn: udp}, log: logger, now: time.Now}, nil
}

// Close closes every connection the dialer made, without notice to the
// peer, and releases the socket. Close connections first to tell the peer.
func (d *Dialer) Close() error {
	d.tr.Close()
	return d.udp.Close()
}

// DialNode connects to the server at addr as a node with a node identity
// from LoadNodeIdentity.
func (d *Dialer) DialNode(ctx context.Context, addr string, id *Identity) (*Conn, error) {
	if id == nil || id.Role != RoleNode {
		return nil, fmt.Errorf("dial node %s: identity is not a node identity (load it with LoadNodeIdentity)", addr)
	}
	return d.dialIdentity(ctx, addr, ALPNNode, id)
}

// DialClient connects to the server at addr as a gpuctl client with a client
// identity from LoadClientConfig.
func (d *Dialer) DialClient(ctx context.Context, addr string, id *Identity) (*Conn, error) {
	if id == nil || !id.Role.IsClient() {
		return nil, fmt.Errorf("dial client %s: identity is not a client identity (viewer, operator or admin; load it with LoadClientConfig)", addr)
	}
	return d.dialIdentity(ctx, addr, ALPNClient, id)
}

func (d *Dialer) dialIdentity(ctx context.Context, addr, alpn string, id *Identity) (*Conn, error) {
	host, _, err := splitServer(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", alpn, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(id.CA)
	cert := id.Certificate
	qconf := quicConfig
	if alpn == ALPNClient {
		qconf = clientQUICConfig
	}
	return d.dialWith(ctx, addr, clientTLS(alpn, &cert, roots, nil, host, d.now), qconf)
}

func (d *Dialer) dial(ctx context.Context, addr string, tlsConf *tls.Config) (*Conn, error) {
	return d.dialWith(ctx, addr, tlsConf, quicConfig)
}

func (d *Dialer) dialWith(ctx context.Context, addr string, tlsConf *tls.Config, qconf *quic.Config) (*Conn, error) {
	alpn := tlsConf.NextProtos[0]
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", alpn, addr, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, dialTimeout)
	defer cancel()
	qc, err := d.tr.Dial(ctx, uaddr, tlsConf, qconf)
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", alpn, addr, peerError(err))
	}
	state := qc.ConnectionState().TLS
	if state.NegotiatedProtocol != alpn || len(state.PeerCertificates) == 0 {
		qc.CloseWithError(CodeProtocol, "unexpected application protocol")
		return nil, fmt.Errorf("dial %s %s: server negotiated %q", alpn, addr, state.NegotiatedProtocol)
	}
	role, name, err := RoleOf(state.PeerCertificates[0])
	if err != nil {
		qc.CloseWithError(CodeRefused, "server certificate carries no role")
		return nil, fmt.Errorf("dial %s %s: %w", alpn, addr, err)
	}
	return &Conn{qc: qc, role: role, name: name, alpn: alpn, cert: state.PeerCertificates[0]}, nil
}

// Join trades token for a node certificate at the server at addr and stores
// node.crt, node.key and ca.crt in dir. The server is authenticated by the
// CA hash in the token, since the node has no CA yet. Join refuses to
// replace an identity already in dir.
func (d *Dialer) Join(ctx context.Context, addr, token, nodeName, dir string) (*Identity, error) {
	id, err := d.join(ctx, addr, token, nodeName, dir)
	if err != nil {
		return nil, fmt.Errorf("join %s as %s: %w", addr, nodeName, err)
	}
	return id, nil
}

func (d *Dialer) join(ctx context.Context, addr, token, nodeName, dir string) (*Identity, error) {
	tok, err := ParseToken(token)
	if err != nil {
		return nil, err
	}
	if err := ValidateName(nodeName); err != nil {
		return nil, fmt.Errorf("node %w", err)
	}
	host, _, err := splitServer(addr)
	if err != nil {
		return nil, err
	}
	certPath, keyPath, caPath := filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile), filepath.Join(dir, CACertFile)
	for _, p := range []string{certPath, keyPath} {
		have, err := exists(p)
		if err != nil {
			return nil, err
		}
		if have {
			return nil, fmt.Errorf("%s already exists: this node has joined before; move %s and %s aside to join again", p, NodeCertFile, NodeKeyFile)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate node key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("encode node public key: %w", err)
	}

	ctx, cancel := withDefaultTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := d.dial(ctx, addr, clientTLS(ALPNJoin, nil, nil, &tok.CAHash, host, d.now))
	if err != nil {
		return nil, err
	}
	defer c.qc.CloseWithError(CodeNoError, "joined")
	s, err := c.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("open join stream: %w", peerError(err))
	}
	if deadline, ok := ctx.Deadline(); ok {
		s.SetDeadline(deadline)
	}
	req := &api.JoinRequest{Version: api.CurrentVersion(), Token: tok.String(), NodeName: nodeName, PublicKeyDer: pubDER}
	if err := api.WriteFrame(s, req); err != nil {
		return nil, fmt.Errorf("send join request: %w", peerError(err))
	}
	s.Close()
	var resp api.JoinResponse
	if err := api.NewFrameReader(s).Read(&resp); err != nil {
		return nil, fmt.Errorf("read join answer: %w", peerError(err))
	}
	if resp.GetError() != "" {
		if leader := resp.GetLeaderAddr(); leader != "" {
			return nil, &NotLeaderError{Server: addr, Leader: leader, Reason: resp.GetError()}
		}
		return nil, &RefusedError{Reason: resp.GetError()}
	}
	ca, err := x509.ParseCertificate(resp.GetCaCertDer())
	if err != nil {
		return nil, fmt.Errorf("server sent an unparsable CA certificate: %w", err)
	}
	if sha256.Sum256(ca.Raw) != tok.CAHash {
		return nil, errors.New("server sent a CA certificate other than the one the token pins")
	}
	cert, err := x509.ParseCertificate(resp.GetCertDer())
	if err != nil {
		return nil, fmt.Errorf("server sent an unparsable node certificate: %w", err)
	}
	id, err := newIdentity(cert, key, ca)
	if err != nil {
		return nil, fmt.Errorf("server sent an unusable node certificate: %w", err)
	}
	if id.Role != RoleNode || id.Name != nodeName {
		return nil, fmt.Errorf("server issued a %s certificate for %q, want a node certificate for %q", id.Role, id.Name, nodeName)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	if err := saveIdentity(id, certPath, keyPath, caPath); err != nil {
		return nil, err
	}
	d.log.Info("joined cluster", "server", addr, "node", nodeName, "dir", dir, "ca_sha256", fmt.Sprintf("%x", tok.CAHash))
	return id, nil
}

// Join trades a join token for a node identity stored in dir, using a
// one-off socket. See Dialer.Join.
func Join(ctx context.Context, addr, token, nodeName, dir string) (*Identity, error) {
	d, err := NewDialer(nil)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", addr, err)
	}
	defer d.Close()
	return d.Join(ctx, addr, token, nodeName, dir)
}

// DialNode connects as a node using a socket of its own that is released
// when the connection closes. A node that reconnects should keep a Dialer.
func DialNode(ctx context.Context, addr string, id *Identity) (*Conn, error) {
	return dialOnce(func(d *Dialer) (*Conn, error) { return d.DialNode(ctx, addr, id) })
}

// DialClient connects as a gpuctl client using a socket of its own that is
// released when the connection closes.
func DialClient(ctx context.Context, addr string, id *Identity) (*Conn, error) {
	return dialOnce(func(d *Dialer) (*Conn, error) { return d.DialClient(ctx, addr, id) })
}

func dialOnce(dial func(*Dialer) (*Conn, error)) (*Conn, error) {
	d, err := NewDialer(nil)
	if err != nil {
		return nil, err
	}
	c, err := dial(d)
	if err != nil {
		d.Close()
		return nil, err
	}
	context.AfterFunc(c.Context(), func() { d.Close() })
	return c, nil
}
