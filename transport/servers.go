package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// ParseServers reads the addresses of a control plane's servers: each
// entry is one host:port or several separated by commas (nodemon --server
// a,b,c; the client config's server: or servers:). Space around an address
// is dropped, a repeated address counts once, and the order is kept: it is
// the order the servers are tried in.
func ParseServers(entries ...string) ([]string, error) {
	var out []string
	for _, e := range entries {
		parts := strings.Split(e, ",")
		for i, p := range parts {
			addr := strings.TrimSpace(p)
			if addr == "" {
				if len(parts) == 1 {
					continue
				}
				return nil, fmt.Errorf("server list %q: address %d of %d is empty: separate host:port addresses with single commas", e, i+1, len(parts))
			}
			if _, _, err := splitServer(addr); err != nil {
				if len(parts) > 1 || len(entries) > 1 {
					return nil, fmt.Errorf("server list %q: %w", e, err)
				}
				return nil, err
			}
			if !slices.Contains(out, addr) {
				out = append(out, addr)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no server address: give host:port (several separated by commas for a highly available control plane), e.g. 10.0.0.1:7443,10.0.0.2:7443")
	}
	return out, nil
}

// NotLeaderError is a standby's answer: what was asked needs the leader of
// a highly available control plane, which is at Leader ("" while none is
// elected). Nothing was done, so it may be asked again of the leader. A
// server's join hook (ListenConfig.OnJoin) returns one to send the join on.
type NotLeaderError struct {
	// Server is the standby that answered, when the caller knows it.
	Server string
	Leader string
	// Reason is the standby's own words.
	Reason string
}

// Error says which server is a standby and where the leader is.
func (e *NotLeaderError) Error() string {
	who := "the server"
	if e.Server != "" {
		who = e.Server
	}
	if e.Leader == "" {
		return fmt.Sprintf("%s is a standby and no leader is elected now (%s): try again in a few seconds", who, e.Reason)
	}
	return fmt.Sprintf("%s is a standby (%s): the leader is %s", who, e.Reason, e.Leader)
}

// Servers is the one owner of which server of a control plane to try
// next, for a node or a client given every server's address. It starts
// with the first address, stays with the one that last answered, goes at
// once to a leader a standby names, and otherwise moves round the list;
// Failed says when a whole round has failed, which is when to pause. It is
// safe for concurrent use.
type Servers struct {
	mu    sync.Mutex
	addrs []string
	// next is the address to try next: an address of the list, or a
	// leader a standby named that the list may not hold.
	next string
	// pos is where in addrs the round goes on after next fails.
	pos int
	// redirected: next is a leader a standby named, so its failure goes
	// on with the round where the standby left it.
	redirected bool
	// failed counts attempts failed since one succeeded; redirects counts
	// redirects followed since an attempt succeeded or failed.
	failed, redirects int
}

// NewServers returns the rotation over addrs (from ParseServers; at least
// one).
func NewServers(addrs []string) *Servers {
	return &Servers{addrs: slices.Clone(addrs), next: addrs[0], pos: 1 % len(addrs)}
}

// Prefer makes addr, when it is one of the listed addresses, the one
// tried first (a server remembered from an earlier run), as if it had
// just answered; an address off the list is ignored.
func (s *Servers) Prefer(addr string) {
	if slices.Contains(s.addrs, addr) {
		s.Succeeded(addr)
	}
}

// Addrs returns the configured addresses, in order.
func (s *Servers) Addrs() []string { return slices.Clone(s.addrs) }

// String lists the addresses for logs and errors.
func (s *Servers) String() string { return strings.Join(s.addrs, ",") }

// Next returns the address to try now.
func (s *Servers) Next() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// Round returns the addresses to try, in order, for one full round from
// Next: each configured address once, and the leader named last if the list
// lacks it.
func (s *Servers) Round() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	round := []string{s.next}
	for i := range s.addrs {
		if a := s.addrs[(s.pos+i)%len(s.addrs)]; !slices.Contains(round, a) {
			round = append(round, a)
		}
	}
	return round
}

// Succeeded records that addr answered (a node welcomed, a client
// connected): it is tried first from now on.
func (s *Servers) Succeeded(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next, s.failed, s.redirects, s.redirected = addr, 0, 0, false
	s.advancePast(addr)
}

// Failed records that addr could not be reached, refused without naming a
// leader, or dropped a session: the next address of the list is tried. It
// reports whether every address has now failed once more since the last
// success (a full round), when the caller should pause before going on.
func (s *Servers) Failed(addr string) (roundDone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.redirected {
		s.advancePast(addr)
	}
	s.next = s.addrs[s.pos]
	s.pos = (s.pos + 1) % len(s.addrs)
	if s.next == addr && len(s.addrs) > 1 {
		// A listed leader that failed where the round would go on.
		s.next = s.addrs[s.pos]
		s.pos = (s.pos + 1) % len(s.addrs)
	}
	s.failed++
	s.redirects, s.redirected = 0, false
	return s.failed%len(s.addrs) == 0
}

// maxRedirectsPerRound bounds the redirects followed between two attempts
// that succeed or fail, beyond the number of servers: standbys that name
// each other (an election in flux) must not keep a node spinning.
const maxRedirectsPerRound = 1

// Redirect records that from is a standby naming to as the leader: to is
// tried next, at once. It returns false, changing nothing, when the
// redirects since the last attempt that succeeded or failed exceed the
// servers' number (standbys naming each other): count it as a failure.
func (s *Servers) Redirect(from, to string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.redirects >= len(s.addrs)+maxRedirectsPerRound {
		return false
	}
	s.redirects++
	if !s.redirected {
		s.advancePast(from)
	}
	s.next, s.redirected = to, true
	return true
}

// advancePast makes the round go on after addr when addr is in the list
// (an address off the list, a leader named by a standby, leaves the round
// where it was).
func (s *Servers) advancePast(addr string) {
	if i := slices.Index(s.addrs, addr); i >= 0 {
		s.pos = (i + 1) % len(s.addrs)
	}
}

// DialStagger is how long a dial to one server of a round goes unanswered
// before the next server is dialled beside it (happy eyeballs, RFC 8305's
// connection attempt delay). A killed or stopped server answers nothing,
// so waiting out its dial timeout would hold every new connection that
// long; a live one answers a QUIC handshake well within it.
const DialStagger = 250 * time.Millisecond

// DialRound dials one round of servers (Round), happy-eyeballs style: the
// first at once, each next one DialStagger after the one before or as soon
// as the one before failed, and returns the first connection made and its
// address. The dials still in flight are cancelled and what they connect
// is closed. dial must end when its context does: ctx's end fails the
// dials in flight and starts no more. The winner is recorded as Succeeded; when every dial fails,
// each is recorded as Failed and the error names them all. A refusal
// (*RefusedError) ends the round at once: a revoked certificate is revoked
// at every server.
func DialRound[C io.Closer](ctx context.Context, s *Servers, dial func(ctx context.Context, addr string) (C, error)) (C, string, error) {
	return dialRound(ctx, s, DialStagger, dial)
}

func dialRound[C io.Closer](ctx context.Context, s *Servers, stagger time.Duration, dial func(context.Context, string) (C, error)) (C, string, error) {
	round := s.Round()
	dctx, cancel := context.WithCancel(ctx)
	type result struct {
		i    int
		conn C
		err  error
	}
	results := make(chan result, len(round))
	started, pending := 0, 0
	start := func() {
		i := started
		started++
		pending++
		go func() {
			c, err := dial(dctx, round[i])
			results <- result{i, c, err}
		}()
	}
	// lose closes what the dials still in flight connect, without making
	// the winner wait for them.
	lose := func(n int) {
		cancel()
		go func() {
			for range n {
				if r := <-results; r.err == nil {
					r.conn.Close()
				}
			}
		}()
	}
	start()
	next := time.NewTimer(stagger)
	defer next.Stop()
	errs := make([]error, len(round))
	var zero C
	for pending > 0 {
		select {
		case <-next.C:
			if started < len(round) && ctx.Err() == nil {
				start()
				next.Reset(stagger)
			}
		case r := <-results:
			pending--
			if r.err == nil {
				lose(pending)
				s.Succeeded(round[r.i])
				return r.conn, round[r.i], nil
			}
			errs[r.i] = r.err
			var refused *RefusedError
			if errors.As(r.err, &refused) {
				lose(pending)
				s.Failed(round[r.i])
				return zero, round[r.i], r.err
			}
			if started < len(round) && ctx.Err() == nil {
				start()
				next.Reset(stagger)
			}
		}
	}
	// Every dial started failed; ctx's end fails those in flight and
	// starts no more.
	cancel()
	for _, addr := range round[:started] {
		s.Failed(addr)
	}
	if started == 1 {
		return zero, round[0], errs[0]
	}
	return zero, "", fmt.Errorf("no server of %s answered: %w", s, errors.Join(errs[:started]...))
}
