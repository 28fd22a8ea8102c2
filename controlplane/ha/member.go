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

// Member is this server's session in the control plane.
type Member struct {
	cfg      Config
	session  *concurrency.Session
	election *concurrency.Election
	self     *api.ServerStatus

	mu     sync.Mutex
	leader *api.ServerStatus // as last observed; nil while none leads
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
	ttl := int(cfg.TTL.Round(time.Second) / time.Second)
	if ttl < 1 {
		ttl = 1
	}
	session, err := concurrency.NewSession(cfg.Client, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("ha: open etcd session: %w (check --etcd-endpoints and that etcd has quorum)", err)
	}
	m := &Member{cfg: cfg, session: session, election: concurrency.NewElection(session, cfg.key("leader"))}
	standby, err := m.entry(RoleStandby)
	if err != nil {
		session.Close()
		return nil, err
	}
	m.self = standby.status
	if err := m.list(ctx); err != nil {
		session.Close()
		return nil, err
	}
	go m.observe(ctx)
	return m, nil
}

// list writes this server's entry under its session's lease.
func (m *Member) list(ctx context.Context) error {
	b, err := proto.Marshal(m.self)
	if err != nil {
		return fmt.Errorf("ha: encode server entry: %w", err)
	}
	if _, err := m.cfg.Client.Put(ctx, m.cfg.key("servers/", m.cfg.Name), string(b), clientv3.WithLease(m.session.Lease())); err != nil {
		return fmt.Errorf("ha: list server %s: %w", m.cfg.Name, err)
	}
	return nil
}

// observe keeps the latest leader, so that a standby can redirect nodes
// without asking etcd for each.
func (m *Member) observe(ctx context.Context) {
	for ctx.Err() == nil {
		for resp := range m.election.Observe(ctx) {
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
// written when it began to wait, so it is proclaimed again.
func (m *Member) Campaign(ctx context.Context) (Leadership, error) {
	waiting, err := m.entry(RoleLeader)
	if err != nil {
		return Leadership{}, err
	}
	if err := m.election.Campaign(ctx, waiting.value); err != nil {
		return Leadership{}, fmt.Errorf("ha: campaign: %w", err)
	}
	leading, err := m.entry(RoleLeader)
	if err != nil {
		return Leadership{}, err
	}
	if err := m.election.Proclaim(ctx, leading.value); err != nil {
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
	return Leadership{Key: m.election.Key(), Rev: m.election.Rev()}, nil
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

// Lost is closed when this server's session ends: its lease expired (cut
// off from etcd longer than the TTL) or was revoked. A leader that sees it
// must stop acting at once; its writes are refused by then anyway.
func (m *Member) Lost() <-chan struct{} { return m.session.Done() }

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
	if m.Self().GetRole() == RoleLeader {
		if err := m.election.Resign(ctx); err != nil {
			m.cfg.Log.Warn("resign leadership", "err", err)
		}
	}
	return m.session.Close()
}
