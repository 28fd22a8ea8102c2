package transport

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"
)

// StreamKind is the first byte of every stream; it tells the receiver what
// the stream carries, so a burst of telemetry never queues behind a command.
type StreamKind byte

// Stream kinds.
const (
	StreamControl   StreamKind = 1 // Hello/Welcome, registration, heartbeats, commands and acks
	StreamTelemetry StreamKind = 2 // GPU samples, bulk and lossy in spirit
	StreamEvents    StreamKind = 3 // events that must be acknowledged
	StreamRequest   StreamKind = 4 // one client request and its answer
)

// String returns the kind's name.
func (k StreamKind) String() string {
	switch k {
	case StreamControl:
		return "control"
	case StreamTelemetry:
		return "telemetry"
	case StreamEvents:
		return "events"
	case StreamRequest:
		return "request"
	}
	return fmt.Sprintf("StreamKind(%d)", byte(k))
}

// Valid reports whether k is a known stream kind.
func (k StreamKind) Valid() bool { return k >= StreamControl && k <= StreamRequest }

// priority is the RFC 9218 urgency (lower first) and incrementalness of a
// kind's data: commands go before events, events before telemetry.
func (k StreamKind) priority() (int8, bool) {
	switch k {
	case StreamControl:
		return 0, false
	case StreamEvents:
		return 1, false
	case StreamRequest:
		return 2, true
	}
	return 5, true
}

// streamHeaderTimeout bounds the wait for a new stream's kind byte when the
// caller's context has no deadline.
const streamHeaderTimeout = 10 * time.Second

// Conn is a QUIC connection whose peer has been authenticated: its role and
// name come from a verified certificate.
type Conn struct {
	qc   *quic.Conn
	role Role
	name string
	alpn string
	cert *x509.Certificate
}

// Role returns the peer's role.
func (c *Conn) Role() Role { return c.role }

// Name returns the peer's name (node name, client name, or the server's
// certificate name on a dialed connection).
func (c *Conn) Name() string { return c.name }

// Certificate returns the peer's verified leaf certificate.
func (c *Conn) Certificate() *x509.Certificate { return c.cert }

// Serial returns the serial number of the peer's certificate (see Serial).
func (c *Conn) Serial() string { return Serial(c.cert) }

// ALPN returns the application protocol the connection speaks.
func (c *Conn) ALPN() string { return c.alpn }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.qc.RemoteAddr() }

// Context is canceled when the connection closes.
func (c *Conn) Context() context.Context { return c.qc.Context() }

// QUIC returns the underlying connection, for statistics and datagrams.
func (c *Conn) QUIC() *quic.Conn { return c.qc }

// CloseWithError closes the connection, sending code and msg to the peer.
func (c *Conn) CloseWithError(code quic.ApplicationErrorCode, msg string) error {
	return c.qc.CloseWithError(code, msg)
}

// Close closes the connection with CodeNoError.
func (c *Conn) Close() error { return c.qc.CloseWithError(CodeNoError, "closed") }

// Datagrams reports whether both sides take QUIC datagrams (RFC 9221);
// a peer of an older release does not, and hears only its streams.
func (c *Conn) Datagrams() bool {
	st := c.qc.ConnectionState().SupportsDatagrams
	return st.Local && st.Remote
}

// SendDatagram sends m in one QUIC datagram: unreliable and unordered,
// but never held behind a stream's lost packets, which is what liveness
// needs from a connection that also carries bulk telemetry. m must fit
// in one packet (a heartbeat or a lease renewal does).
func (c *Conn) SendDatagram(m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("datagram to %s: %w", c.name, err)
	}
	if err := c.qc.SendDatagram(b); err != nil {
		return fmt.Errorf("datagram to %s: %w", c.name, peerError(err))
	}
	return nil
}

// ReceiveDatagram waits for the peer's next datagram and decodes it into
// m. It fails once ctx ends or the connection closes; a datagram that
// does not decode is a *BadDatagramError, after which the connection
// still carries the next (the caller decides).
func (c *Conn) ReceiveDatagram(ctx context.Context, m proto.Message) error {
	b, err := c.qc.ReceiveDatagram(ctx)
	if err != nil {
		return fmt.Errorf("datagram from %s: %w", c.name, peerError(err))
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return &BadDatagramError{Peer: c.name, err: err}
	}
	return nil
}

// BadDatagramError is a datagram from the peer that did not decode.
type BadDatagramError struct {
	Peer string
	err  error
}

func (e *BadDatagramError) Error() string { return fmt.Sprintf("datagram from %s: %v", e.Peer, e.err) }
func (e *BadDatagramError) Unwrap() error { return e.err }

// Err returns why the connection closed, or nil while it is open.
func (c *Conn) Err() error {
	if c.qc.Context().Err() == nil {
		return nil
	}
	return peerError(context.Cause(c.qc.Context()))
}

// OpenStream opens a stream of the given kind and announces it to the peer.
func (c *Conn) OpenStream(ctx context.Context, kind StreamKind) (*Stream, error) {
	if !kind.Valid() {
		return nil, fmt.Errorf("open stream: unknown kind %d", kind)
	}
	ctx, cancel := withDefaultTimeout(ctx, streamHeaderTimeout)
	defer cancel()
	s, err := c.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("open %s stream to %s: %w", kind, c.name, peerError(err))
	}
	s.SetPriority(kind.priority())
	// Writing the kind makes the stream visible to the peer at once; QUIC
	// announces a stream only when it carries data.
	if _, err := s.Write([]byte{byte(kind)}); err != nil {
		s.CancelWrite(quic.StreamErrorCode(CodeProtocol))
		s.CancelRead(quic.StreamErrorCode(CodeProtocol))
		return nil, fmt.Errorf("open %s stream to %s: %w", kind, c.name, peerError(err))
	}
	return newStream(kind, s), nil
}

// AcceptStream waits for the peer to open a stream and reads its kind. A
// stream of unknown kind breaks the protocol: the connection is closed with
// CodeProtocol and an error returned.
func (c *Conn) AcceptStream(ctx context.Context) (*Stream, error) {
	s, err := c.qc.AcceptStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("accept stream from %s: %w", c.name, peerError(err))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(streamHeaderTimeout)
	}
	s.SetReadDeadline(deadline)
	var b [1]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		s.CancelRead(quic.StreamErrorCode(CodeProtocol))
		s.CancelWrite(quic.StreamErrorCode(CodeProtocol))
		return nil, fmt.Errorf("accept stream from %s: read stream kind: %w", c.name, peerError(err))
	}
	s.SetReadDeadline(time.Time{})
	kind := StreamKind(b[0])
	if !kind.Valid() {
		msg := fmt.Sprintf("unknown stream kind %d", b[0])
		c.qc.CloseWithError(CodeProtocol, msg)
		return nil, fmt.Errorf("accept stream from %s: %s", c.name, msg)
	}
	s.SetPriority(kind.priority())
	return newStream(kind, s), nil
}

// Stream carries length-prefixed protobuf messages (api.WriteFrame) of one
// kind. Send may be called from several goroutines; Recv from one.
type Stream struct {
	kind StreamKind
	s    *quic.Stream
	fr   *api.FrameReader
	wmu  sync.Mutex
}

func newStream(kind StreamKind, s *quic.Stream) *Stream {
	return &Stream{kind: kind, s: s, fr: api.NewFrameReader(s)}
}

// Kind returns what the stream carries.
func (s *Stream) Kind() StreamKind { return s.kind }

// Send writes one message.
func (s *Stream) Send(m proto.Message) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := api.WriteFrame(s.s, m); err != nil {
		return fmt.Errorf("send on %s stream: %w", s.kind, peerError(err))
	}
	return nil
}

// Recv reads the next message into m. It returns io.EOF when the peer
// closed its side cleanly between messages.
func (s *Stream) Recv(m proto.Message) error {
	err := s.fr.Read(m)
	if err == nil || err == io.EOF {
		return err
	}
	return fmt.Errorf("receive on %s stream: %w", s.kind, peerError(err))
}

// Skip reads past the next message without decoding it.
func (s *Stream) Skip() error {
	err := s.fr.Skip()
	if err == nil || err == io.EOF {
		return err
	}
	return fmt.Errorf("receive on %s stream: %w", s.kind, peerError(err))
}

// CloseWrite ends the sending side; the peer's Recv returns io.EOF after
// the messages already sent.
func (s *Stream) CloseWrite() error { return s.s.Close() }

// StopReading tells the peer nothing more will be read. A stream the peer
// opened returns its slot in the peer's stream limit only once both
// directions are done, so one that reads a single message must say so.
func (s *Stream) StopReading() { s.s.CancelRead(0) }

// Cancel abandons both directions of the stream with code.
func (s *Stream) Cancel(code quic.StreamErrorCode) {
	s.s.CancelWrite(code)
	s.s.CancelRead(code)
}

// SetDeadline sets the read and write deadlines.
func (s *Stream) SetDeadline(t time.Time) error { return s.s.SetDeadline(t) }

// SetReadDeadline sets the deadline for Recv.
func (s *Stream) SetReadDeadline(t time.Time) error { return s.s.SetReadDeadline(t) }

// SetWriteDeadline sets the deadline for Send.
func (s *Stream) SetWriteDeadline(t time.Time) error { return s.s.SetWriteDeadline(t) }

// Context is canceled when the sending side of the stream is closed or reset.
func (s *Stream) Context() context.Context { return s.s.Context() }

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
