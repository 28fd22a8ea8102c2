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
}

// ErrLostLeadership ends a leader whose etcd session expired: it may no
// longer act (its writes are refused already), and it starts again as a
// standby when its supervisor restarts it.
var ErrLostLeadership = errors.New("lost leadership: this server's etcd session expired (cut off from etcd longer than its TTL); another server leads now; restart it to serve as a standby")

// Options is one server of a highly available control plane.
type Options struct {
	// Server configures the control plane this server runs when it
	// leads; its Store, Authority and Status are set by Run.
	Server controlplane.Config
	Store  Store
	Member Config
	// OnStandby and OnLeader, when set, are told when this server starts
	// to wait and when it leads (to print its address, start metrics…).
	OnStandby func(addr net.Addr)
	OnLeader  func(ctx context.Context, srv *controlplane.Server) error
}

// Run serves as a standby until this server wins the election, then leads
// until ctx ends (nil) or the leadership is lost (ErrLostLeadership).
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
	cfg.Store, cfg.Authority = o.Store, auth
	if cfg.Jobs.ReconnectGrace == 0 {
		cfg.Jobs.ReconnectGrace = ReconnectGrace(len(strings.Split(cfg.AdvertiseAddr, ",")))
	}
	cfg.Status = func(ctx context.Context) *api.StatusResponse { return Status(ctx, m, o.Store) }

	lead, err := standBy(ctx, cfg, m, o.OnStandby)
	if err != nil || ctx.Err() != nil {
		return err
	}
	o.Store.Fence(lead.Key, lead.Rev)
	log := o.Member.Log
	if log != nil {
		log.Info("leading the control plane", "server", o.Member.Name, "election_rev", lead.Rev)
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	if err := o.Store.AppendEvent(&api.Event{TimeUnixNano: now().UnixNano(), Kind: api.EventKind_EVENT_KIND_LEADER,
		Severity: api.Severity_SEVERITY_INFO,
		Message:  fmt.Sprintf("server %s leads the control plane at %s", o.Member.Name, o.Member.Addr),
		Attrs:    map[string]string{"server": o.Member.Name, "addr": o.Member.Addr, "election_rev": fmt.Sprint(lead.Rev)}}); err != nil {
		return fmt.Errorf("serve: record leadership: %w", err)
	}
	srv, err := controlplane.New(cfg)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan struct{})
	go func() {
		select {
		case <-m.Lost():
			close(lost)
			cancel()
		case <-lctx.Done():
		}
	}()
	if err := srv.Listen(lctx); err != nil {
		return err
	}
	if o.OnLeader != nil {
		if err := o.OnLeader(lctx, srv); err != nil {
			return err
		}
	}
	err = srv.Serve(lctx)
	select {
	case <-lost:
		return ErrLostLeadership
	default:
	}
	return err
}

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
