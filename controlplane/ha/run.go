package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// Store is what a highly available server needs of its shared store: the
// control plane's records, the cluster's secrets, and writes fenced by a
// leadership.
type Store interface {
	store.Store
	store.IdentityStore
	SecretStore
	// Fence makes every later write conditional on the leadership: once
	// another server leads, they fail with store.ErrNotLeader.
	Fence(leaderKey string, leaderRev int64)
	// ClaimTerm records holder as the leadership written under now and
	// returns the one it replaced (etcdstore.Store.ClaimTerm).
	ClaimTerm(holder string) (string, error)
	// Ping succeeds while the store could commit a write; SetAway has
	// every request fail at once while away returns an error.
	Ping(ctx context.Context) error
	SetAway(away func() error)
}

// readOnlyLost is the read-only cause of a leader whose election key
// vanished, until it wins again or another server leads.
const readOnlyLost = "leadership"

// Options is one server of a highly available control plane.
type Options struct {
	// Server configures the control plane this server runs when it
	// leads; its Store, Authority, Status and ReadOnly are set by Run.
	Server controlplane.Config
	Store  Store
	Member Config
	// StoreName names the store in the read-only reason, e.g. "etcd at
	// http://10.0.0.1:2379".
	StoreName string
	// OnStandby and OnLeader, when set, are told when this server starts
	// to wait and when it leads (to print its address, start metrics…).
	OnStandby func(addr net.Addr)
	OnLeader  func(ctx context.Context, srv *controlplane.Server) error
}

// Run serves as a standby until this server wins the election, then leads
// until ctx ends. While the store is away the control plane is read-only
// (controlplane.ReadOnly); a leader whose election key vanished (etcd away
// longer than the session's TTL) keeps serving, read-only, and campaigns
// again: when it wins and no other server led meanwhile it carries on with
// its node sessions; when another wins it stops its server, killing
// nothing (its nodes move to the new leader with their ranks), and stands
// by.
func Run(ctx context.Context, o Options) error {
	cfg := o.Server
	auth, err := OpenSharedAuthority(o.Store, controlplane.PKIDir(cfg.DataDir), controlplane.AuthorityOptions(cfg))
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	m, err := Join(ctx, o.Member)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer m.Close()
	log := m.cfg.Log
	ro := &controlplane.ReadOnly{What: o.StoreName, Now: cfg.Now, Log: log}
	if ro.What == "" {
		ro.What = "etcd"
	}
	o.Store.SetAway(ro.StoreAway)
	go ro.Watch(ctx, o.Store.Ping)
	// Each leadership's server closes its store when it stops; the store
	// outlives them.
	cfg.Store, cfg.Authority, cfg.ReadOnly = keepOpen{o.Store}, auth, ro
	if cfg.Jobs.ReconnectGrace == 0 {
		cfg.Jobs.ReconnectGrace = ReconnectGrace(len(strings.Split(cfg.AdvertiseAddr, ",")))
	}
	status := &statusView{m: m, st: o.Store, ro: ro}
	cfg.Status = status.Status
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}

	var cur *leading
	var term string // the term this server last claimed
	defer func() { cur.stop() }()
	for {
		var lead Leadership
		if cur == nil {
			lead, err = standBy(ctx, cfg, m, o.OnStandby)
		} else {
			lead, err = m.campaignServing(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errAnotherLeads):
			log.Warn("another server leads now: this server stops leading, killing nothing, and stands by", "leader", m.Leader().GetName())
			ro.Release(readOnlyLost)
			if err := cur.stop(); err != nil {
				log.Warn("stop leading", "err", err)
			}
			cur = nil
			continue
		case err != nil:
			return err
		}
		o.Store.Fence(lead.Key, lead.Rev)
		holder := fmt.Sprintf("%s rev %d", o.Member.Name, lead.Rev)
		prev, err := o.Store.ClaimTerm(holder)
		if err != nil {
			// The key vanished again already, or etcd went: campaign again.
			log.Warn("claim the leadership term", "err", err)
			continue
		}
		again := cur != nil && prev == term
		if cur != nil && !again {
			log.Warn("another server led meanwhile: this server starts its leadership over from the store", "term_before", prev)
			cur.stop()
			cur = nil
		}
		term = holder
		ro.Release(readOnlyLost)
		log.Info("leading the control plane", "server", o.Member.Name, "election_rev", lead.Rev, "carried_on", again)
		msg := fmt.Sprintf("server %s leads the control plane at %s", o.Member.Name, o.Member.Addr)
		if again {
			msg = fmt.Sprintf("server %s leads the control plane again at %s (its election key had vanished; no other server led meanwhile)", o.Member.Name, o.Member.Addr)
		}
		if err := o.Store.AppendEvent(&api.Event{TimeUnixNano: now().UnixNano(), Kind: api.EventKind_EVENT_KIND_LEADER,
			Severity: api.Severity_SEVERITY_INFO, Message: msg,
			Attrs: map[string]string{"server": o.Member.Name, "addr": o.Member.Addr, "election_rev": fmt.Sprint(lead.Rev)}}); err != nil {
			log.Warn("record leadership", "err", err)
		}
		if cur == nil {
			if cur, err = startLeading(ctx, cfg, o.OnLeader); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-cur.done:
			cur = nil
			return err
		case <-m.Lost():
			ro.Hold(readOnlyLost, fmt.Sprintf("this server's election key vanished at %s (its etcd session expired: etcd was away longer than --leader-ttl): the control plane is read-only while it campaigns again; retry in a few seconds",
				now().UTC().Format(time.RFC3339)))
		}
	}
}

// leading is the control plane server of one leadership.
type leading struct {
	srv    *controlplane.Server
	cancel context.CancelFunc
	done   chan error
}

// startLeading starts a server over the shared store (loading nodes and
// jobs as after a restart) on this server's address.
func startLeading(ctx context.Context, cfg controlplane.Config, onLeader func(context.Context, *controlplane.Server) error) (*leading, error) {
	srv, err := controlplane.New(cfg)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	if err := srv.Listen(lctx); err != nil {
		cancel()
		return nil, err
	}
	if onLeader != nil {
		if err := onLeader(lctx, srv); err != nil {
			cancel()
			return nil, err
		}
	}
	l := &leading{srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { l.done <- srv.Serve(lctx) }()
	return l, nil
}

// stop ends the server and waits for it; its nodes' ranks run on.
func (l *leading) stop() error {
	if l == nil {
		return nil
	}
	l.cancel()
	return <-l.done
}

// keepOpen is the shared store without Close: a leadership's server
// stops, the store stays for the next.
type keepOpen struct{ Store }

func (keepOpen) Close() error { return nil }

// ReconnectGrace bounds how long a new leader waits for the nodes of a
// control plane of servers: a node first takes its old leader's silence
// for death (agent.MinSilenceLimit, 3 s), may then meet every other dead
// server's dial timeout on its way round the list, and pauses at most once
// after a whole round.
func ReconnectGrace(servers int) time.Duration {
	return 3*time.Second + time.Duration(max(servers-1, 0))*transport.NodeDialTimeout + transport.NodeReconnectWithin
}

// standBy answers as a standby on cfg.Listen while campaigning, and frees
// the address once this server leads.
func standBy(ctx context.Context, cfg controlplane.Config, m *Member, told func(net.Addr)) (Leadership, error) {
	sb, err := controlplane.NewStandby(cfg, m.Leader)
	if err != nil {
		return Leadership{}, err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := sb.Listen(sctx); err != nil {
		return Leadership{}, err
	}
	if told != nil {
		told(sb.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- sb.Serve(sctx) }()
	lead, err := m.Campaign(ctx)
	stop()
	if serr := <-served; serr != nil && err == nil {
		err = serr
	}
	if ctx.Err() != nil {
		return Leadership{}, nil
	}
	return lead, err
}
