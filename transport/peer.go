package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// ALPNPeer is the protocol between nodemons: a node asks its witnesses
// to vouch for its ranks (agent's peer lease). Both ends present their
// node certificates, which must chain to the cluster CA.
const ALPNPeer = "gpuctl-peer/1"

// peerQUICConfig keeps a peer connection alive between rounds and notices
// a dead witness within a few rounds.
var peerQUICConfig = func() *quic.Config {
	c := quicConfig.Clone()
	c.MaxIdleTimeout, c.KeepAlivePeriod = 10*time.Second, 2*time.Second
	c.EnableDatagrams = false
	return c
}()

// PeerListener accepts other nodes' connections on a node.
type PeerListener struct {
	udp *net.UDPConn
	tr  *quic.Transport
	ql  *quic.Listener
}

// ListenPeers listens for other nodes of id's cluster at addr.
func ListenPeers(addr string, id *Identity) (*PeerListener, error) {
	if id.Role != RoleNode {
		return nil, fmt.Errorf("listen for peers on %s: a %s identity; a node certificate is needed", addr, id.Role)
	}
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for peers on %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", uaddr)
	if err != nil {
		return nil, fmt.Errorf("listen for peers on %s: %w", addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	ql, err := tr.Listen(peerTLS(id, ""), peerQUICConfig)
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("listen for peers on %s: %w", addr, err)
	}
	return &PeerListener{udp: udp, tr: tr, ql: ql}, nil
}

// Addr is the UDP address the listener is bound to.
func (l *PeerListener) Addr() net.Addr { return l.udp.LocalAddr() }

// Accept returns the next connection from a node of the cluster; its
// certificate was verified in the handshake.
func (l *PeerListener) Accept(ctx context.Context) (*Conn, error) {
	qc, err := l.ql.Accept(ctx)
	if err != nil {
		return nil, fmt.Errorf("accept peer: %w", err)
	}
	return peerConn(qc)
}

// Close stops listening and closes every peer connection.
func (l *PeerListener) Close() error {
	err := l.ql.Close()
	return errors.Join(err, l.tr.Close(), l.udp.Close())
}

// DialPeer connects to the node name's peer listener at addr, as id.
func (d *Dialer) DialPeer(ctx context.Context, addr, name string, id *Identity) (*Conn, error) {
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial peer %s at %s: %w", name, addr, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, dialTimeout)
	defer cancel()
	qc, err := d.tr.Dial(ctx, uaddr, peerTLS(id, name), peerQUICConfig)
	if err != nil {
		return nil, fmt.Errorf("dial peer %s at %s: %w", name, addr, peerError(err))
	}
	return peerConn(qc)
}

func peerConn(qc *quic.Conn) (*Conn, error) {
	state := qc.ConnectionState().TLS
	if state.NegotiatedProtocol != ALPNPeer || len(state.PeerCertificates) == 0 {
		qc.CloseWithError(CodeProtocol, "unexpected application protocol")
		return nil, fmt.Errorf("peer %s negotiated %q, not %s", qc.RemoteAddr(), state.NegotiatedProtocol, ALPNPeer)
	}
	_, name, err := RoleOf(state.PeerCertificates[0])
	if err != nil {
		qc.CloseWithError(CodeRefused, err.Error())
		return nil, fmt.Errorf("peer %s: %w", qc.RemoteAddr(), err)
	}
	return &Conn{qc: qc, role: RoleNode, name: name, alpn: ALPNPeer, cert: state.PeerCertificates[0]}, nil
}

// peerTLS is the TLS configuration of both ends of a peer connection: each
// presents its node certificate and accepts only a node certificate of the
// same CA (node certificates are for client authentication, so the usual
// server verification is replaced, not skipped). A dialer names the node
// it expects; a listener takes any node.
func peerTLS(id *Identity, want string) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(id.CA)
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		chain, err := parseChain("peer", raw)
		if err != nil {
			return err
		}
		role, name, err := verifyChain(chain, roots, x509.ExtKeyUsageClientAuth, time.Now())
		if err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		if role != RoleNode {
			return fmt.Errorf("peer presented a %s certificate, not a node's", role)
		}
		if want != "" && name != want {
			return fmt.Errorf("peer at this address is node %q, not %q: its address changed; the server names it again at the next launch", name, want)
		}
		return nil
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{ALPNPeer},
		Certificates:           []tls.Certificate{id.Certificate},
		ClientAuth:             tls.RequireAnyClientCert,
		InsecureSkipVerify:     true,
		VerifyPeerCertificate:  verify,
		SessionTicketsDisabled: true,
	}
}
