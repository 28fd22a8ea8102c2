// Package ha makes gpuctl serve one of several servers sharing an etcd
// store: each joins with an etcd session, lists itself, and campaigns
// through concurrency.Election. The leader owns the job loop, the
// scheduler and recovery, with every store write fenced by its election
// key; the others are warm standbys that answer reads and point nodes and
// clients at the leader.
package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// Roles a server reports in gpuctl status.
const (
	RoleLeader  = "leader"
	RoleStandby = "standby"
)

// DefaultTTL is how long a server's etcd session outlives its last
// keep-alive. A killed leader is replaced after at most this long, so it
// bounds failover; it must outlast an etcd leader election (about a
// second with etcd's defaults), or an etcd failover would depose a
// healthy gpuctl leader.
const DefaultTTL = 3 * time.Second

// Config is one server's place in the control plane.
type Config struct {
	Client *clientv3.Client
	// Prefix is the etcd key prefix the cluster's servers share, default
	// "/gpuctl/".
	Prefix string
	// Name and Addr identify this server to the others and to the nodes
	// and clients they redirect (Addr is what they dial).
	Name, Addr string
	// TTL of the etcd session, default DefaultTTL; whole seconds, at
	// least one (etcd's unit).
	TTL time.Duration
	Now func() time.Time
	Log *slog.Logger
}

// Leadership is a won election: every write the leader makes compares
// the creation revision of Key with Rev.
type Leadership struct {
	Key string
	Rev int64
}

// Member is this server's session in the control plane. The session is
// replaced when it expires (etcd away longer than the TTL): the server
// lists itself and campaigns again rather than giving up.
type Member struct {
	cfg Config
	// ctx is the server's: every session lives as long as it (or until
	// etcd expires it), whatever asked for it.
	ctx context.Context

	mu       sync.Mutex
	session  *concurrency.Session
	election *concurrency.Election
	self     *api.ServerStatus
	leader   *api.ServerStatus // as last observed; nil while none leads
}

func (c Config) key(parts ...string) string {
	k := c.Prefix
	for _, p := range parts {
		k += p
	}
	return k
}

// Join opens this server's etcd session and lists it as a standby. The
// listing lives as long as the session: a killed server drops out of
// gpuctl status once its TTL has passed.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Client == nil {
		return nil, errors.New("ha: no etcd client")
	}
	if cfg.Name == "" || cfg.Addr == "" {
		return nil, errors.New("ha: a server needs a name and an address nodes can dial (--advertise)")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/gpuctl/"
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Member{cfg: cfg, ctx: ctx}
	standby, err := m.entry(RoleStandby)
	if err != nil {
		return nil, err
	}
	m.self = standby.status
	if err := m.open(ctx); err != nil {
		return nil, err
	}
	go m.observe(ctx)
	return m, nil
}

// open starts a new etcd session and lists this server under it; ctx
// bounds the opening, the session lives with the server (m.ctx).
func (m *Member) open(ctx context.Context) error {
	ttl := int64(m.cfg.TTL.Round(time.Second) / time.Second)
	if ttl < 1 {
		ttl = 1
	}
	lease, err := m.cfg.Client.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("ha: open etcd session: %w (check --etcd-endpoints and that etcd has quorum)", err)
	}
	session, err := concurrency.NewSession(m.cfg.Client, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)), concurrency.WithContext(m.ctx))
	if err != nil {
		return fmt.Errorf("ha: open etcd session: %w (check --etcd-endpoints and that etcd has quorum)", err)
	}
	m.mu.Lock()
	m.session, m.election = session, concurrency.NewElection(session, m.cfg.key("leader"))
	m.mu.Unlock()
	if err := m.list(ctx); err != nil {
		session.Close()
		return err
	}
	return nil
}

// current is the session and election in use now.
func (m *Member) current() (*concurrency.Session, *concurrency.Election) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.session, m.election
}

// renewEvery paces the tries to open a new session while etcd is away.
const renewEvery = 500 * time.Millisecond

// renew opens a new session once the current one has expired, trying
// until etcd answers or ctx ends.
func (m *Member) renew(ctx context.Context) error {
	s, _ := m.current()
	select {
	case <-s.Done():
	default:
		return nil
	}
	// Until it wins again this server is listed as waiting.
	standby, err := m.entry(RoleStandby)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.self = standby.status
	m.mu.Unlock()
	for {
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := m.open(octx)
		cancel()
		if err == nil {
			m.cfg.Log.Info("new etcd session: listed and campaigning again")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(renewEvery):
		}
	}
}

// list writes this server's entry under its session's lease.
func (m *Member) list(ctx context.Context) error {
	b, err := proto.Marshal(m.Self())
	if err != nil {
		return fmt.Errorf("ha: encode server entry: %w", err)
	}
	s, _ := m.current()
	if _, err := m.cfg.Client.Put(ctx, m.cfg.key("servers/", m.cfg.Name), string(b), clientv3.WithLease(s.Lease())); err != nil {
		return fmt.Errorf("ha: list server %s: %w", m.cfg.Name, err)
	}
	return nil
}

// observe keeps the latest leader, so that a standby can redirect nodes
// without asking etcd for each.
func (m *Member) observe(ctx context.Context) {
	for ctx.Err() == nil {
		_, election := m.current()
		for resp := range election.Observe(ctx) {
			if len(resp.Kvs) == 0 {
				continue
			}
			st := &api.ServerStatus{}
			if err := proto.Unmarshal(resp.Kvs[0].Value, st); err != nil {
				m.cfg.Log.Warn("leader entry unreadable", "key", string(resp.Kvs[0].Key), "err", err)
				continue
			}
			m.mu.Lock()
			m.leader = st
			m.mu.Unlock()
		}
		// Observe ends when its watch breaks (an etcd failover); until it
		// is back the last leader seen is the best guess.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Campaign blocks until this server leads (or ctx ends), then lists it as
// the leader, since the moment it won: the entry it campaigned with was
// written when it began to wait, so it is proclaimed again. A session
// that expires meanwhile (etcd away longer than the TTL) is replaced and
// the campaign starts over, so a server never gives up for an outage.
func (m *Member) Campaign(ctx context.Context) (Leadership, error) {
	for {
		lead, err := m.campaign(ctx)
		if err == nil || ctx.Err() != nil {
			return lead, err
		}
		if !errors.Is(err, errSessionGone) {
			m.cfg.Log.Warn("campaign failed; trying again", "err", err)
			select {
			case <-ctx.Done():
				return Leadership{}, ctx.Err()
			case <-time.After(renewEvery):
			}
		}
		if err := m.renew(ctx); err != nil {
			return Leadership{}, err
		}
	}
}

// errSessionGone ends a campaign whose session expired before or while it
// waited: etcd deleted its key, so a win it reports is not one.
var errSessionGone = errors.New("etcd session expired")

// campaign is one campaign under the current session.
func (m *Member) campaign(ctx context.Context) (Leadership, error) {
	session, election := m.current()
	select {
	case <-session.Done():
		return Leadership{}, errSessionGone
	default:
	}
	waiting, err := m.entry(RoleLeader)
	if err != nil {
		return Leadership{}, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-session.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	if err := election.Campaign(cctx, waiting.value); err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return Leadership{}, errSessionGone
		}
		return Leadership{}, fmt.Errorf("ha: campaign: %w", err)
	}
	// Campaign returns as soon as the keys before this one are gone,
	// which they also are when etcd expired this session's lease with
	// them: the win stands only while this key is still there.
	gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := m.cfg.Client.Get(gctx, election.Key())
	gcancel()
	if err != nil {
		return Leadership{}, fmt.Errorf("ha: check the won election key: %w", err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != election.Rev() {
		return Leadership{}, errSessionGone
	}
	leading, err := m.entry(RoleLeader)
	if err != nil {
		return Leadership{}, err
	}
	if err := election.Proclaim(ctx, leading.value); err != nil {
		// It leads all the same; status shows when it began to wait.
		m.cfg.Log.Warn("record when this server began to lead", "err", err)
		leading = waiting
	}
	m.mu.Lock()
	m.self = leading.status
	m.leader = leading.status
	m.mu.Unlock()
	if err := m.list(ctx); err != nil {
		m.cfg.Log.Warn("list server as leader", "err", err)
	}
	return Leadership{Key: election.Key(), Rev: election.Rev()}, nil
}

// serverEntry is this server's entry in a role from now, and its encoding.
type serverEntry struct {
	status *api.ServerStatus
	value  string
}

func (m *Member) entry(role string) (serverEntry, error) {
	st := &api.ServerStatus{Name: m.cfg.Name, Addr: m.cfg.Addr, Role: role, SinceUnixNano: m.cfg.Now().UnixNano()}
	b, err := proto.Marshal(st)
	if err != nil {
		return serverEntry{}, fmt.Errorf("ha: encode %s entry: %w", role, err)
	}
	return serverEntry{status: st, value: string(b)}, nil
}

// Lost is closed when this server's current session ends: its lease
// expired (cut off from etcd longer than the TTL) or was revoked. A leader
// that sees it may no longer write (its writes are refused by then
// anyway) and campaigns again.
func (m *Member) Lost() <-chan struct{} {
	s, _ := m.current()
	return s.Done()
}

// Self is this server's entry.
func (m *Member) Self() *api.ServerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.self
}

// Leader is the leader last observed, nil when none is known. A leader
// of this server's name that is not this session is this server's
// previous run (killed, its session not yet expired): nobody to send
// nodes to, and it is gone within a TTL.
func (m *Member) Leader() *api.ServerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leader.GetName() == m.cfg.Name && m.self.GetRole() != RoleLeader {
		return nil
	}
	return m.leader
}

// Servers reads every listed server, the leader first, then by name.
func (m *Member) Servers(ctx context.Context) ([]*api.ServerStatus, error) {
	resp, err := m.cfg.Client.Get(ctx, m.cfg.key("servers/"), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("ha: list servers: %w", err)
	}
	var out []*api.ServerStatus
	for _, kv := range resp.Kvs {
		st := &api.ServerStatus{}
		if err := proto.Unmarshal(kv.Value, st); err != nil {
			return nil, fmt.Errorf("ha: server entry %s unreadable: %w", kv.Key, err)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].GetRole() == RoleLeader) != (out[j].GetRole() == RoleLeader) {
			return out[i].GetRole() == RoleLeader
		}
		return out[i].GetName() < out[j].GetName()
	})
	return out, nil
}

// Close resigns (so a standby takes over at once, not a TTL later) and
// ends the session.
func (m *Member) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	session, election := m.current()
	if m.Self().GetRole() == RoleLeader {
		if err := election.Resign(ctx); err != nil {
			m.cfg.Log.Warn("resign leadership", "err", err)
		}
	}
	return session.Close()
}

// errAnotherLeads ends campaignServing: another server won meanwhile.
var errAnotherLeads = errors.New("another server leads")

// campaignServing campaigns again while this server's leadership still
// serves (read-only, its key gone), and gives up as soon as another server
// is seen leading: then this one must stop and stand by.
func (m *Member) campaignServing(ctx context.Context) (Leadership, error) {
	type result struct {
		lead Leadership
		err  error
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	won := make(chan result, 1)
	go func() {
		l, err := m.Campaign(cctx)
		won <- result{l, err}
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case r := <-won:
			return r.lead, r.err
		case <-t.C:
			if l := m.Leader(); l != nil && l.GetName() != m.cfg.Name {
				cancel()
				<-won
				return Leadership{}, errAnotherLeads
			}
		}
	}
}
