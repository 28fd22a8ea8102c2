// Package etcdstore is store.Store and store.IdentityStore on etcd, for
// gpuctl serve running as several servers of which one, elected through
// etcd, leads. Every write the leader makes is fenced: one etcd transaction
// whose compare includes the creation revision of the leader's election
// key, so a deposed leader writes nothing (store.ErrNotLeader).
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// Options tune the store.
type Options struct {
	// Prefix is put before every key; default "/gpuctl/".
	Prefix string
	// EventsKept is how many of the newest events the log keeps (default
	// 200 000, as bbolt). The bound matters more here than on bbolt: etcd
	// holds its whole database in memory-mapped pages under a quota (2 GiB
	// by default) past which the cluster turns read-only, and every key
	// costs index memory on every member.
	EventsKept int
	// MaxTxnOps is etcd's --max-txn-ops (default 128): the most writes one
	// transaction may carry.
	MaxTxnOps int
	// MaxTxnBytes bounds the keys and values of one transaction (default
	// 1 MiB, under etcd's --max-request-bytes of 1.5 MiB).
	MaxTxnBytes int
	// Timeout bounds each request to etcd (default 5s).
	Timeout time.Duration
	// Log receives the store's own notes (pruning); default slog.Default().
	Log *slog.Logger
}

// Store is the etcd-backed store. Its methods are safe for concurrent use.
type Store struct {
	cli  *clientv3.Client
	opts Options
	ctx  context.Context
	stop context.CancelFunc
	k    keys

	mu         sync.Mutex
	fenceKey   string
	fenceRev   int64
	eventN     uint64 // orders events of one nanosecond written under one fence
	retryKeys  map[*api.Event]string
	eventCount int64 // events in the log; -1 until counted under this fence

	pruneMu sync.Mutex
	// away, when set, says the store is known to be unreachable: requests
	// then fail at once with its error instead of each waiting out
	// Timeout (see SetAway).
	away atomic.Pointer[func() error]
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.IdentityStore = (*Store)(nil)
)

// Open returns a store over cli (which the caller keeps and closes), after
// checking that etcd answers within opts.Timeout.
func Open(ctx context.Context, cli *clientv3.Client, opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = "/gpuctl/"
	}
	if opts.EventsKept == 0 {
		opts.EventsKept = store.DefaultMaxEvents
	}
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = 128
	}
	if opts.MaxTxnBytes <= 0 {
		opts.MaxTxnBytes = 1 << 20
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Store{cli: cli, opts: opts, k: keys{opts.Prefix}, eventCount: -1}
	s.ctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if _, err := cli.Get(rctx, s.k.meta("open"), clientv3.WithCountOnly()); err != nil {
		s.stop()
		return nil, fmt.Errorf("etcd store: reach etcd at %v: %w", cli.Endpoints(), err)
	}
	return s, nil
}

// Fence makes every later write carry the compare that leaderKey (the
// election key this server campaigned with) still exists with creation
// revision leaderRev. Before Fence, writes are refused with
// store.ErrNotLeader: a standby never writes.
func (s *Store) Fence(leaderKey string, leaderRev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if leaderRev != s.fenceRev {
		s.eventN = 0 // event keys of a new leadership sort after the old ones anyway
	}
	s.fenceKey, s.fenceRev = leaderKey, leaderRev
	s.eventCount = -1 // another leader wrote since we last counted
}

// SetMaxEvents changes EventsKept (as store.Bolt.SetMaxEvents).
func (s *Store) SetMaxEvents(n int) {
	s.mu.Lock()
	s.opts.EventsKept = n
	s.mu.Unlock()
}

// Close releases the store; the client stays open (the caller owns it).
func (s *Store) Close() error {
	s.stop()
	return nil
}

func (s *Store) reqCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, s.opts.Timeout)
}

// SetAway has every read and write fail at once with away's error while
// it returns one: a server that knows etcd is unreachable (its probe,
// Ping, failed) must not hold its locks and loops for Timeout on each
// request. Ping is not affected.
func (s *Store) SetAway(away func() error) { s.away.Store(&away) }

// unreachable is SetAway's error, nil when none is set or it is nil.
func (s *Store) unreachable() error {
	if f := s.away.Load(); f != nil {
		if err := (*f)(); err != nil {
			return fmt.Errorf("etcd unreachable: %w", err)
		}
	}
	return nil
}

// Ping reads one key with quorum (a linearizable read: a member cut off
// from the others does not answer it), so it succeeds only while writes
// could.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.cli.Get(ctx, s.k.meta("open"), clientv3.WithCountOnly())
	return err
}

// fence returns the compare of the leadership this store writes under.
func (s *Store) fence() (clientv3.Cmp, string, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenceKey == "" {
		return clientv3.Cmp{}, "", 0, fmt.Errorf("no leadership to write under (a standby): %w", store.ErrNotLeader)
	}
	return clientv3.Compare(clientv3.CreateRevision(s.fenceKey), "=", s.fenceRev), s.fenceKey, s.fenceRev, nil
}

// errConflict is a failed compare of a read-modify-write: read again.
var errConflict = errors.New("changed since read")

// txn commits ops under the fence and cmps. A failed compare is
// store.ErrNotLeader when the leadership is gone, else errConflict.
func (s *Store) txn(cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	f, key, rev, err := s.fence()
	if err != nil {
		return nil, err
	}
	if err := s.unreachable(); err != nil {
		return nil, err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(append([]clientv3.Cmp{f}, cmps...)...).Then(ops...).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		return resp, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 && kvs[0].CreateRevision == rev {
		return nil, errConflict
	}
	return nil, fmt.Errorf("leadership key %s (revision %d) is gone: %w", key, rev, store.ErrNotLeader)
}

// retry runs a read-modify-write until its compares hold.
func (s *Store) retry(fn func() error) error {
	for try := 0; ; try++ {
		err := fn()
		if !errors.Is(err, errConflict) || try == 100 {
			return err
		}
	}
}

func (s *Store) get(key string, m proto.Message) (int64, error) {
	if err := s.unreachable(); err != nil {
		return 0, err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, store.ErrNotFound
	}
	if err := proto.Unmarshal(resp.Kvs[0].Value, m); err != nil {
		return 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return resp.Kvs[0].ModRevision, nil
}

// list returns every record under prefix in key order, read in pages so
// no single response grows without bound, at one revision.
func list[M proto.Message](s *Store, prefix string, mk func() M) ([]M, int64, error) {
	var out []M
	var rev int64
	from := prefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	if err := s.unreachable(); err != nil {
		return nil, 0, err
	}
	for {
		ctx, cancel := s.reqCtx()
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(pageSize), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		cancel()
		if err != nil {
			return nil, 0, err
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			m := mk()
			if err := proto.Unmarshal(kv.Value, m); err != nil {
				return nil, 0, fmt.Errorf("decode %s: %w", kv.Key, err)
			}
			out = append(out, m)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

const pageSize = 1000

// PutNode stores n under its registration name.
func (s *Store) PutNode(n *api.NodeStatus) error {
	return s.write("put node "+n.GetRegistration().GetName(), func(tx store.Tx) error { return tx.PutNode(n) })
}

// Node returns the node called name, or store.ErrNotFound.
func (s *Store) Node(name string) (*api.NodeStatus, error) {
	n := &api.NodeStatus{}
	if _, err := s.get(s.k.node(name), n); err != nil {
		return nil, fmt.Errorf("etcd store: node %s: %w", name, err)
	}
	return n, nil
}

// Nodes returns every node sorted by name.
func (s *Store) Nodes() ([]*api.NodeStatus, error) {
	out, _, err := list(s, s.k.nodes(), func() *api.NodeStatus { return &api.NodeStatus{} })
	if err != nil {
		return nil, fmt.Errorf("etcd store: list nodes: %w", err)
	}
	return out, nil
}

// PutJob creates or replaces a job's record under its id.
func (s *Store) PutJob(j *api.Job) error {
	return s.write("put job "+j.GetId(), func(tx store.Tx) error { return tx.PutJob(j) })
}

// Job returns the job with id, or store.ErrNotFound.
func (s *Store) Job(id string) (*api.Job, error) {
	j := &api.Job{}
	if _, err := s.get(s.k.job(id), j); err != nil {
		return nil, fmt.Errorf("etcd store: job %s: %w", id, err)
	}
	return j, nil
}

// Jobs returns every job sorted by id.
func (s *Store) Jobs() ([]*api.Job, error) {
	out, _, err := list(s, s.k.jobs(), func() *api.Job { return &api.Job{} })
	if err != nil {
		return nil, fmt.Errorf("etcd store: list jobs: %w", err)
	}
	return out, nil
}

// ClaimTerm records holder as the leadership the store is written under,
// as the first write of a leadership, and returns the holder it replaced
// ("" the first time). A server that wins again and finds its own previous
// holder there knows that no other server led meanwhile, so what it holds
// in memory is still the store's state: every leader claims its term before
// it writes anything else, and the claim is fenced like every write.
func (s *Store) ClaimTerm(holder string) (string, error) {
	key := s.k.meta("term")
	resp, err := s.txn(nil, []clientv3.Op{clientv3.OpGet(key), clientv3.OpPut(key, holder)})
	if err != nil {
		return "", fmt.Errorf("etcd store: claim leadership term: %w", err)
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		return string(kvs[0].Value), nil
	}
	return "", nil
}
