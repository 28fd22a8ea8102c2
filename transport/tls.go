package transport

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/quic-go/quic-go"
)

// Application protocols, one per role, all served on the same UDP port.
const (
	ALPNNode   = "gpuctl-node/1"
	ALPNClient = "gpuctl-client/1"
	ALPNJoin   = "gpuctl-join/1"
)

// Connection close codes gpuctl sends in CONNECTION_CLOSE.
const (
	CodeNoError  quic.ApplicationErrorCode = 0x0
	CodeRefused  quic.ApplicationErrorCode = 0x1 // the peer's identity is not allowed here
	CodeProtocol quic.ApplicationErrorCode = 0x2 // the peer broke the gpuctl protocol
	CodeBusy     quic.ApplicationErrorCode = 0x3 // the server cannot take the connection now
	CodeShutdown quic.ApplicationErrorCode = 0x4 // the endpoint is shutting down
)

const (
	handshakeTimeout = 10 * time.Second
	idleTimeout      = 30 * time.Second
	keepAlive        = 10 * time.Second
	// dialTimeout bounds a dial whose context has no deadline.
	dialTimeout = 15 * time.Second
	// ClientIdleTimeout is how soon a gpuctl client's connection to a
	// server lost without a word (killed, its host dead) ends, sooner than
	// idleTimeout: the client's keep-alives keep the connection busy, so
	// silence means the server is gone, and the console's watch and the
	// next request move to the next server of a highly available control
	// plane. (QUIC takes the shorter of the two sides' idle timeouts.)
	ClientIdleTimeout = 5 * time.Second
	clientKeepAlive   = time.Second
)

// quicConfig is shared by every listener and dialer: peers agree on the
// idle timeout and keep-alives, and a dead peer is noticed within
// idleTimeout.
var quicConfig = &quic.Config{
	HandshakeIdleTimeout:  handshakeTimeout,
	MaxIdleTimeout:        idleTimeout,
	KeepAlivePeriod:       keepAlive,
	MaxIncomingStreams:    1024,
	MaxIncomingUniStreams: -1,
	// Heartbeats travel as datagrams too: a datagram is never held
	// behind a stream's lost packets (Conn.SendDatagram).
	EnableDatagrams: true,
}

// clientQUICConfig is quicConfig with the client's shorter idle timeout.
var clientQUICConfig = func() *quic.Config {
	c := quicConfig.Clone()
	c.MaxIdleTimeout, c.KeepAlivePeriod = ClientIdleTimeout, clientKeepAlive
	return c
}()

// RefusedError is returned when the other side closed the connection with
// CodeRefused or refused a join; Reason is its explanation.
type RefusedError struct {
	Reason string
}

// Error says the server refused and why.
func (e *RefusedError) Error() string { return "refused by server: " + e.Reason }

// PeerClosedError is a connection the peer closed with a gpuctl code other
// than CodeRefused (busy, shutting down, protocol violation).
type PeerClosedError struct {
	Code   quic.ApplicationErrorCode
	Reason string
	err    *quic.ApplicationError
}

// Error says how and why the peer closed the connection.
func (e *PeerClosedError) Error() string {
	return fmt.Sprintf("peer closed the connection (%s): %s", codeName(e.Code), e.Reason)
}

// Unwrap returns the underlying *quic.ApplicationError.
func (e *PeerClosedError) Unwrap() error { return e.err }

func codeName(c quic.ApplicationErrorCode) string {
	switch c {
	case CodeNoError:
		return "no error"
	case CodeRefused:
		return "refused"
	case CodeProtocol:
		return "protocol violation"
	case CodeBusy:
		return "busy"
	case CodeShutdown:
		return "shutdown"
	}
	return fmt.Sprintf("code %#x", uint64(c))
}

// IsBusy reports whether err is the server turning a connection away for
// now (CodeBusy): worth retrying after a pause.
func IsBusy(err error) bool {
	var pc *PeerClosedError
	return errors.As(err, &pc) && pc.Code == CodeBusy
}

// peerError turns the close the peer sent into an error that reads well.
func peerError(err error) error {
	var app *quic.ApplicationError
	if errors.As(err, &app) && app.Remote {
		switch app.ErrorCode {
		case CodeRefused:
			return &RefusedError{Reason: app.ErrorMessage}
		case CodeBusy, CodeShutdown, CodeProtocol:
			return &PeerClosedError{Code: app.ErrorCode, Reason: app.ErrorMessage, err: app}
		}
	}
	return err
}

// serverTLS builds the listener's TLS configuration: the ALPN the client
// offers picks the client-certificate policy. Client certificates are
// checked against the cluster CA right after the handshake (see
// Listener.verify) rather than inside it, so a refused peer learns why in
// the CONNECTION_CLOSE instead of a bare TLS alert.
func serverTLS(a *Authority) *tls.Config {
	base := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.ServerCertificate()},
		NextProtos:   []string{ALPNNode, ALPNClient, ALPNJoin},
		// Without tickets every connection presents its certificate afresh.
		SessionTicketsDisabled: true,
	}
	perALPN := map[string]*tls.Config{}
	for _, p := range base.NextProtos {
		c := base.Clone()
		c.NextProtos = []string{p}
		c.ClientAuth = tls.RequireAnyClientCert
		if p == ALPNJoin {
			c.ClientAuth = tls.NoClientCert
		}
		perALPN[p] = c
	}
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		for _, p := range hello.SupportedProtos {
			if c, ok := perALPN[p]; ok {
				return c, nil
			}
		}
		// No protocol of ours: the base config fails ALPN negotiation with
		// no_application_protocol.
		return nil, nil
	}
	return base
}

// clientTLS builds a dialer's TLS configuration. The server certificate is
// verified by verifyServer: it must chain to roots (or, when roots is nil,
// to a CA in the presented chain whose SHA-256 is pin), carry the server
// role and cover host.
func clientTLS(alpn string, cert *tls.Certificate, roots *x509.CertPool, pin *[sha256.Size]byte, host string, now func() time.Time) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{alpn},
		// Standard verification is replaced, not skipped: VerifyPeerCertificate
		// below checks the chain, the role and the host.
		InsecureSkipVerify: true,
		ServerName:         host,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyServer(raw, roots, pin, host, now())
		},
	}
	if net.ParseIP(host) != nil {
		c.ServerName = "" // SNI carries names, not addresses
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// parseChain parses the certificates who presented, leaf first.
func parseChain(who string, raw [][]byte) ([]*x509.Certificate, error) {
	chain := make([]*x509.Certificate, 0, len(raw))
	for _, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, fmt.Errorf("%s sent an unparsable certificate: %w", who, err)
		}
		chain = append(chain, c)
	}
	return chain, nil
}

func verifyServer(raw [][]byte, roots *x509.CertPool, pin *[sha256.Size]byte, host string, now time.Time) error {
	chain, err := parseChain("server", raw)
	if err != nil {
		return err
	}
	if len(chain) == 0 {
		return errors.New("server sent no certificate")
	}
	if roots == nil {
		for _, c := range chain {
			if sha256.Sum256(c.Raw) == *pin && c.IsCA {
				roots = x509.NewCertPool()
				roots.AddCert(c)
				break
			}
		}
		if roots == nil {
			return fmt.Errorf("server's CA does not match the join token's CA hash %x: the token is for another cluster, or something between here and the server is intercepting the connection", pin[:6])
		}
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	leaf := chain[0]
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		DNSName:       host,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		var hostErr x509.HostnameError
		var unknown x509.UnknownAuthorityError
		var inv x509.CertificateInvalidError
		switch {
		case errors.As(err, &hostErr):
			return fmt.Errorf("server certificate is not valid for %q (it covers %v %v): dial one of those, or add %q to the server's names and restart it", host, leaf.DNSNames, leaf.IPAddresses, host)
		case errors.As(err, &unknown):
			return errors.New("server certificate was not issued by this cluster's CA: check the server address and the CA file")
		case errors.As(err, &inv) && inv.Reason == x509.Expired:
			return fmt.Errorf("server certificate valid %s to %s is not valid now (%s): check this host's clock, or restart the server to renew it",
				leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		return fmt.Errorf("verify server certificate: %w", err)
	}
	role, _, err := RoleOf(leaf)
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	if role != RoleServer {
		return fmt.Errorf("server presented a %s certificate, not a server certificate: check the server address", role)
	}
	return nil
}

// splitServer checks a host:port address.
func splitServer(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("server address %q: %w (want host:port, e.g. 10.0.0.1:7443)", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", 0, fmt.Errorf("server address %q: port %q must be a number from 1 to 65535", addr, port)
	}
	if host == "" {
		return "", 0, fmt.Errorf("server address %q: missing host (want host:port, e.g. 10.0.0.1:7443)", addr)
	}
	return host, p, nil
}
