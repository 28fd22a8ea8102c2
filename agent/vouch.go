package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler/fencing"
	"github.com/gpuctl/gpuctl/transport"
)

// voucher runs this node's rounds of vouches (peer lease, witness.go):
// one owner, one goroutine, holding a connection per witness.
type voucher struct {
	id    *transport.Identity
	d     *transport.Dialer
	exec  leaseHolder
	book  *witnessBook
	log   *slog.Logger
	every time.Duration

	conns map[string]*witnessConn // by witness name
	// told remembers the attempts a witness said were superseded, so the
	// warning is logged once.
	told map[attemptKey]bool
}

// leaseHolder is what the voucher needs of the executor: the attempts
// witnesses may renew, renewing one, and fencing one a witness calls
// superseded.
type leaseHolder interface {
	PeerAttempts() []PeerAttempt
	RenewPeerLease(job string, attempt uint32, deadline time.Time)
	Fence(s *api.SignalRanks) ([]*api.RankStatus, error)
}

type witnessConn struct {
	addr string
	conn *transport.Conn
}

// run asks for vouches every interval until ctx ends.
func (v *voucher) run(ctx context.Context) {
	t := time.NewTicker(v.every)
	defer t.Stop()
	defer func() {
		for _, c := range v.conns {
			c.conn.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			v.round(ctx)
		}
	}
}

// ask is what one round asks of one witness.
type ask struct {
	addr string
	req  *api.VouchRequest
}

// round asks every witness of every attempt running here, at once, and
// renews the lease of each attempt a quorum vouched for. An attempt a
// witness calls superseded is fenced at once: its server is unreachable
// from here, but the witness heard that a newer attempt may start.
func (v *voucher) round(ctx context.Context) {
	attempts := v.exec.PeerAttempts()
	asks := map[string]*ask{}
	for _, a := range attempts {
		for _, w := range a.Witnesses {
			q := asks[w.GetName()]
			if q == nil {
				q = &ask{addr: w.GetAddr(), req: &api.VouchRequest{}}
				asks[w.GetName()] = q
			}
			q.req.Attempts = append(q.req.Attempts, &api.JobAttemptRef{Job: a.Job, Attempt: a.Attempt})
		}
	}
	for name, c := range v.conns {
		if asks[name] == nil {
			c.conn.Close()
			delete(v.conns, name)
		}
	}
	if len(asks) == 0 {
		return
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, v.every)
	defer cancel()
	// Every witness is dialled (when it has no live connection) and asked
	// in a goroutine of its own: a dead one must not spend the round the
	// others need. The connections are this goroutine's to keep.
	type reply struct {
		name  string
		conn  *witnessConn
		votes map[attemptKey]*api.Vouch
	}
	replies := make(chan reply, len(asks))
	for name, q := range asks {
		cached := v.conns[name]
		go func() {
			r := reply{name: name}
			defer func() { replies <- r }()
			c, err := v.connect(rctx, name, q.addr, cached)
			if err != nil {
				v.log.Debug("dial witness", "witness", name, "addr", q.addr, "err", err)
				return
			}
			r.conn = c
			resp, err := vouchFrom(rctx, c.conn, q.req)
			if err != nil {
				v.log.Debug("witness did not answer", "witness", name, "err", err)
				return
			}
			r.votes = map[attemptKey]*api.Vouch{}
			for _, vo := range resp.GetVouches() {
				r.votes[attemptKey{vo.GetJob(), vo.GetAttempt()}] = vo
			}
		}()
	}
	answers := map[string]map[attemptKey]*api.Vouch{}
	for range asks {
		r := <-replies
		answers[r.name] = r.votes
		if old := v.conns[r.name]; old != nil && old != r.conn {
			old.conn.Close()
		}
		switch {
		case r.conn == nil || r.conn.conn.Err() != nil:
			delete(v.conns, r.name)
		default:
			v.conns[r.name] = r.conn
		}
	}
	for _, a := range attempts {
		k := attemptKey{a.Job, a.Attempt}
		yes, by := 0, ""
		for _, w := range a.Witnesses {
			vo := answers[w.GetName()][k]
			switch {
			case vo.GetSuperseded():
				by = w.GetName()
			case vo.GetVouched():
				yes++
			}
		}
		if by != "" {
			v.fence(a, by)
			continue
		}
		if v.book.isSuperseded(a.Job, a.Attempt) {
			continue // this node heard it is superseded: no renewal of its own
		}
		if yes >= fencing.Quorum(len(a.Witnesses)) {
			v.exec.RenewPeerLease(a.Job, a.Attempt, start.Add(a.Lease))
		}
	}
}

// connect returns cached when it is a live connection to addr, else a new
// one to the witness; an address the server did not know gives none.
func (v *voucher) connect(ctx context.Context, name, addr string, cached *witnessConn) (*witnessConn, error) {
	if cached != nil && cached.addr == addr && cached.conn.Err() == nil {
		return cached, nil
	}
	if addr == "" {
		return nil, errors.New("the server knew no address for it at launch")
	}
	conn, err := v.d.DialPeer(ctx, addr, name, v.id)
	if err != nil {
		return nil, err
	}
	return &witnessConn{addr: addr, conn: conn}, nil
}

// vouchFrom sends one request on its own stream and reads the answer.
func vouchFrom(ctx context.Context, conn *transport.Conn, req *api.VouchRequest) (*api.VouchResponse, error) {
	st, err := conn.OpenStream(ctx, transport.StreamRequest)
	if err != nil {
		return nil, err
	}
	defer st.CloseWrite()
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
	if err := st.Send(req); err != nil {
		return nil, err
	}
	var resp api.VouchResponse
	err = st.Recv(&resp)
	st.StopReading()
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// fence stops the ranks of an attempt a witness says is superseded.
func (v *voucher) fence(a PeerAttempt, by string) {
	k := attemptKey{a.Job, a.Attempt}
	if !v.told[k] {
		v.told[k] = true
		v.log.Warn("a witness says this attempt is superseded; stopping its ranks", "job", a.Job, "attempt", a.Attempt, "witness", by)
	}
	if _, err := v.book.supersede(a.Job, a.Attempt); err != nil {
		v.log.Error("record superseded attempt", "err", err)
	}
	go func() {
		if _, err := v.exec.Fence(&api.SignalRanks{Job: a.Job, Attempt: a.Attempt, Signal: "SIGKILL", Fence: true}); err != nil {
			v.log.Error("fence superseded attempt; its lease stops it", "job", a.Job, "attempt", a.Attempt, "err", err)
		}
	}()
}

// peerAdvertise is the address other nodes reach this node's peer
// listener at: the listener's own host when it names one, otherwise the
// address this host sends from toward the server (no packet is sent).
func peerAdvertise(listen net.Addr, server string) string {
	ua, ok := listen.(*net.UDPAddr)
	if !ok {
		return listen.String()
	}
	if !ua.IP.IsUnspecified() {
		return ua.String()
	}
	c, err := net.Dial("udp", server)
	if err != nil {
		return ""
	}
	defer c.Close()
	host, _, err := net.SplitHostPort(c.LocalAddr().String())
	if err != nil {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(ua.Port))
}
