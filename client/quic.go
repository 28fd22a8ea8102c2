package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// maxRedirects bounds how often one request is sent on to a leader a
// standby names: a second redirect means the servers disagree about who
// leads (an election in flux), and a third would only go round.
const maxRedirects = 2

// quicTransport is a Transport over QUIC to the servers of a control
// plane: one connection, one stream per request. It alone decides which
// server the client talks to, through its transport.Servers:
//
//   - a connection that closed is dialled again by the next request, the
//     servers raced from the one that last answered (transport.DialRound:
//     a dead or stopped server holds the dial a moment, not its timeout),
//     so a long-lived client (a watch, the console) outlives a server
//     restart and a failover;
//   - a standby's answer naming the leader (nothing was done) moves the
//     client to the leader and the request is sent again there, at most
//     maxRedirects times;
//   - a request that could not be sent because the connection was dead
//     goes to the next server; one that was sent and lost its connection
//     before the answer fails (it may have been carried out), and the next
//     request goes to the next server.
type quicTransport struct {
	servers *transport.Servers
	dial    func(ctx context.Context, addr string) (*transport.Conn, error)

	mu     sync.Mutex
	cur    *link
	closed bool
	// last keeps the server that last answered a request across runs
	// (nil: not kept); remembered is what it holds.
	last       *lastServer
	remembered string
}

// link is one connection and its server. Calls hold it while in flight,
// so one retired (a standby left for the leader, or lost) closes once its
// last call ends rather than under a call still being answered.
type link struct {
	conn    *transport.Conn
	addr    string
	calls   int
	retired bool
}

func newQUICTransport(addrs []string, dial func(context.Context, string) (*transport.Conn, error)) *quicTransport {
	return &quicTransport{servers: transport.NewServers(addrs), dial: dial}
}

// remember starts with the server last holds, and keeps there each server
// that answers a request from now on.
func (q *quicTransport) remember(last *lastServer) {
	if last == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.last, q.remembered = last, last.load()
	if q.remembered != "" {
		q.servers.Prefer(q.remembered)
	}
}

// answered records that addr answered a request (not a standby's
// redirect).
func (q *quicTransport) answered(addr string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.last == nil || q.remembered == addr {
		return
	}
	q.remembered = addr
	q.last.save(addr)
}

// acquire returns the live connection, held for one call, dialling the
// servers in turn when there is none or it closed.
func (q *quicTransport) acquire(ctx context.Context) (*link, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, errors.New("client closed")
	}
	if l := q.cur; l != nil {
		if l.conn.Err() == nil {
			l.calls++
			return l, nil
		}
		q.retireLocked(l, true)
	}
	conn, addr, err := transport.DialRound(ctx, q.servers, q.dial)
	if err != nil {
		return nil, err
	}
	q.cur = &link{conn: conn, addr: addr, calls: 1}
	return q.cur, nil
}

// release ends a call's hold on l.
func (q *quicTransport) release(l *link) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l.calls--
	if l.retired && l.calls == 0 {
		l.conn.Close()
	}
}

// retireLocked stops new calls from using l; lost says its server failed,
// so the next connection goes to the next server.
func (q *quicTransport) retireLocked(l *link, lost bool) {
	if q.cur == l {
		q.cur = nil
	}
	if l.retired {
		return
	}
	l.retired = true
	if lost {
		q.servers.Failed(l.addr)
	}
	if l.calls == 0 {
		l.conn.Close()
	}
}

func (q *quicTransport) retire(l *link, lost bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.retireLocked(l, lost)
}

// redirect moves the client from the standby l to leader; false when the
// servers keep naming each other.
func (q *quicTransport) redirect(l *link, leader string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.servers.Redirect(l.addr, leader) {
		return false
	}
	q.retireLocked(l, false)
	return true
}

func (q *quicTransport) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.cur == nil {
		return nil
	}
	err := q.cur.conn.Close()
	q.cur = nil
	return err
}

func (q *quicTransport) Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	redirects, resent := 0, false
	for {
		l, err := q.acquire(ctx)
		if err != nil {
			return err
		}
		answered := false
		sent, err := call(ctx, l.conn, req, func(r *api.ClientResponse) error {
			answered = true
			return fn(r)
		})
		if answered {
			q.answered(l.addr)
		}
		var nl *transport.NotLeaderError
		switch {
		case errors.As(err, &nl):
			nl.Server = l.addr
			if redirects == maxRedirects || !q.redirect(l, nl.Leader) {
				q.release(l)
				return fmt.Errorf("%w, after %d redirects already: the servers disagree about who leads (an election in progress?): try again in a few seconds", err, redirects)
			}
			redirects++
		case err != nil && ctx.Err() == nil && l.conn.Err() != nil:
			// The connection died under the request.
			q.retire(l, true)
			if sent || resent {
				q.release(l)
				return fmt.Errorf("lost the connection to %s before the answer ended (a change asked for may or may not have been made; the next request goes to the next server): %w", l.addr, err)
			}
			resent = true
		default:
			q.release(l)
			return err
		}
		q.release(l)
	}
}

// call sends req on a stream of its own over conn and hands each answer
// to fn. sent says whether the request may have reached the server. A
// standby's answer naming the leader is a *transport.NotLeaderError, not
// handed to fn.
func call(ctx context.Context, conn *transport.Conn, req *api.ClientRequest, fn func(*api.ClientResponse) error) (sent bool, err error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.OpenStream(cctx, transport.StreamRequest)
	if err != nil {
		return false, fmt.Errorf("open request stream: %w", err)
	}
	defer st.CloseWrite()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	if err := st.Send(req); err != nil {
		return false, fmt.Errorf("send request: %w", err)
	}
	stop := context.AfterFunc(cctx, func() { st.Cancel(0) })
	defer stop()
	for first := true; ; first = false {
		var resp api.ClientResponse
		if err := st.Recv(&resp); err != nil {
			if errors.Is(err, io.EOF) {
				return true, nil
			}
			if ctx.Err() != nil {
				return true, ctx.Err()
			}
			return true, fmt.Errorf("read answer: %w", err)
		}
		if leader := resp.GetLeaderAddr(); first && leader != "" {
			return true, &transport.NotLeaderError{Leader: leader, Reason: resp.GetError()}
		}
		if err := fn(&resp); err != nil {
			st.Cancel(0)
			return true, err
		}
	}
}
