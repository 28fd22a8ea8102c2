// Package storetest is the conformance suite every store implementation
// passes: the semantics of store.Store and store.IdentityStore as the
// control plane relies on them (sort orders, ErrNotFound, per-node seq
// dedup, the event log's order, filters and bound, atomic updates).
package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// Store is what the suite drives.
type Store interface {
	store.Store
	store.IdentityStore
	// SetMaxEvents bounds the event log.
	SetMaxEvents(n int)
}

// Run runs every case against a fresh, empty, writable store from open.
func Run(t *testing.T, open func(t *testing.T) Store) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"Nodes", testNodes},
		{"Jobs", testJobs},
		{"AppendNodeEventsDeduplicates", testDedup},
		{"AppendNodeEventsConcurrent", testDedupConcurrent},
		{"EventsFilterLimitAndPrune", testFilterLimitPrune},
		{"EventsInTimeOrderAcrossNodes", testTimeOrder},
		{"EventsOfOneNanosecondInArrivalOrder", testSameNanosecond},
		{"EventsPagedFilters", testPaged},
		{"UpdateAllOrNothing", testUpdateAtomic},
		{"UpdateRewritesAKey", testUpdateRewrite},
		{"UpdateLargeBatch", testUpdateLarge},
		{"IdentitiesAndDenyList", testIdentities},
		{"RemoveNode", testRemoveNode},
		{"UpdateTokenIsAtomic", testTokens},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open(t)) })
	}
}

func node(name string, state api.NodeState) *api.NodeStatus {
	return &api.NodeStatus{Registration: &api.NodeRegistration{Name: name}, State: state}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func times(evs []*api.Event) []int64 {
	var out []int64
	for _, e := range evs {
		out = append(out, e.GetTimeUnixNano())
	}
	return out
}

func testNodes(t *testing.T, s Store) {
	if nodes, err := s.Nodes(); err != nil || len(nodes) != 0 {
		t.Fatalf("empty store: %v, %v", nodes, err)
	}
	for _, n := range []*api.NodeStatus{node("b", api.NodeState_NODE_STATE_READY), node("a", api.NodeState_NODE_STATE_READY), node("a/x", api.NodeState_NODE_STATE_DOWN)} {
		must(t, s.PutNode(n))
	}
	must(t, s.PutNode(node("a", api.NodeState_NODE_STATE_CORDONED)))
	nodes, err := s.Nodes()
	must(t, err)
	var names []string
	for _, n := range nodes {
		names = append(names, n.GetRegistration().GetName())
	}
	if !slices.Equal(names, []string{"a", "a/x", "b"}) {
		t.Fatalf("nodes %v, want sorted by name [a a/x b]", names)
	}
	if nodes[0].GetState() != api.NodeState_NODE_STATE_CORDONED {
		t.Errorf("a replaced node kept its old state: %v", nodes[0])
	}
	if n, err := s.Node("b"); err != nil || n.GetState() != api.NodeState_NODE_STATE_READY {
		t.Errorf("Node(b) = %v, %v", n, err)
	}
	if _, err := s.Node("zz"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Node(zz) err = %v, want ErrNotFound", err)
	}
	if err := s.PutNode(&api.NodeStatus{}); err == nil {
		t.Error("PutNode without a name succeeded")
	}
}

func testJobs(t *testing.T, s Store) {
	if js, err := s.Jobs(); err != nil || len(js) != 0 {
		t.Fatalf("empty store: %v, %v", js, err)
	}
	if _, err := s.Job("j-000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing job: %v, want ErrNotFound", err)
	}
	if err := s.PutJob(&api.Job{Name: "no-id"}); err == nil {
		t.Fatal("a job without an id was stored")
	}
	jobs := []*api.Job{
		{Id: "j-bbbbbb", Name: "b", State: api.JobState_JOB_STATE_PENDING, SpecYaml: "name: b\n", PendingReason: "needs 16 GPUs"},
		{Id: "j-aaaaaa", Name: "a", State: api.JobState_JOB_STATE_RUNNING, Attempt: 2,
			Placement: []*api.JobNode{{Node: "node-00", Gpus: []uint32{0, 1}, Ranks: []*api.JobRank{{Rank: 0, Pid: 42}, {Rank: 1, LocalRank: 1, Gpu: 1, Pid: 43}}}}},
	}
	for _, j := range jobs {
		must(t, s.PutJob(j))
	}
	jobs[1].State = api.JobState_JOB_STATE_SUCCEEDED
	must(t, s.PutJob(jobs[1]))
	got, err := s.Jobs()
	must(t, err)
	if len(got) != 2 || got[0].GetId() != "j-aaaaaa" || got[1].GetId() != "j-bbbbbb" {
		t.Fatalf("jobs sorted by id: %v", got)
	}
	if !proto.Equal(got[0], jobs[1]) || !proto.Equal(got[1], jobs[0]) {
		t.Errorf("round trip changed the records:\n%v\n%v", got, jobs)
	}
	if one, err := s.Job("j-aaaaaa"); err != nil || one.GetState() != api.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("Job = %v, %v", one, err)
	}
}

func testDedup(t *testing.T, s Store) {
	ev := func(seq uint64) *api.Event { return &api.Event{Seq: seq, Node: "n1", TimeUnixNano: int64(seq)} }
	tests := []struct {
		name    string
		batch   []*api.Event
		wantTop uint64
		wantLen int
	}{
		{"first batch", []*api.Event{ev(1), ev(2), ev(3)}, 3, 3},
		{"resend overlapping", []*api.Event{ev(2), ev(3), ev(4)}, 4, 4},
		{"pure resend", []*api.Event{ev(1), ev(4)}, 4, 4},
		{"empty", nil, 4, 4},
		{"out of order inside a batch", []*api.Event{ev(6), ev(5), ev(7)}, 7, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			top, err := s.AppendNodeEvents("n1", tc.batch)
			must(t, err)
			if top != tc.wantTop {
				t.Errorf("top = %d, want %d", top, tc.wantTop)
			}
			if last, err := s.LastNodeEventSeq("n1"); err != nil || last != tc.wantTop {
				t.Errorf("LastNodeEventSeq = %d, %v; want %d", last, err, tc.wantTop)
			}
			got, err := s.Events(store.EventFilter{})
			must(t, err)
			if len(got) != tc.wantLen {
				t.Errorf("len = %d, want %d", len(got), tc.wantLen)
			}
		})
	}
	if last, err := s.LastNodeEventSeq("other"); err != nil || last != 0 {
		t.Errorf("LastNodeEventSeq of a node without events = %d, %v", last, err)
	}
}

// testDedupConcurrent resends overlapping batches of one node at once:
// every seq is stored exactly once.
func testDedupConcurrent(t *testing.T, s Store) {
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var batch []*api.Event
			for seq := uint64(1); seq <= 10+uint64(w)*3; seq++ {
				batch = append(batch, &api.Event{Seq: seq, Node: "n1", TimeUnixNano: int64(seq)})
			}
			if _, err := s.AppendNodeEvents("n1", batch); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := s.Events(store.EventFilter{})
	must(t, err)
	var seqs []uint64
	for _, e := range got {
		seqs = append(seqs, e.GetSeq())
	}
	want := make([]uint64, 19)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(seqs, want) {
		t.Fatalf("seqs stored %v, want 1..19 once each", seqs)
	}
}

func testFilterLimitPrune(t *testing.T, s Store) {
	s.SetMaxEvents(5)
	for i := 1; i <= 8; i++ {
		n := "a"
		if i%2 == 0 {
			n = "b"
		}
		must(t, s.AppendEvent(&api.Event{Node: n, TimeUnixNano: int64(i)}))
	}
	all, err := s.Events(store.EventFilter{})
	must(t, err)
	if got := times(all); !slices.Equal(got, []int64{4, 5, 6, 7, 8}) {
		t.Fatalf("after prune to 5: %v", got)
	}
	tests := []struct {
		name string
		f    store.EventFilter
		want []int64
	}{
		{"node b", store.EventFilter{Node: "b"}, []int64{4, 6, 8}},
		{"since 6", store.EventFilter{SinceUnixNano: 6}, []int64{6, 7, 8}},
		{"newest 2", store.EventFilter{Limit: 2}, []int64{7, 8}},
		{"node a newest 1", store.EventFilter{Node: "a", Limit: 1}, []int64{7}},
		{"since after all", store.EventFilter{SinceUnixNano: 9}, nil},
		{"unknown node", store.EventFilter{Node: "c"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Events(tc.f)
			must(t, err)
			if !slices.Equal(times(got), tc.want) {
				t.Fatalf("got %v, want %v", times(got), tc.want)
			}
		})
	}
}

func testTimeOrder(t *testing.T, s Store) {
	// node-b delivers late (a resend after a reconnect): its events are
	// older than node-a's but arrive after them.
	_, err := s.AppendNodeEvents("node-a", []*api.Event{{Seq: 1, Node: "node-a", TimeUnixNano: 30}, {Seq: 2, Node: "node-a", TimeUnixNano: 50}})
	must(t, err)
	_, err = s.AppendNodeEvents("node-b", []*api.Event{{Seq: 1, Node: "node-b", TimeUnixNano: 10}, {Seq: 2, Node: "node-b", TimeUnixNano: 40}})
	must(t, err)
	must(t, s.AppendEvent(&api.Event{Job: "j-1", TimeUnixNano: 20}))
	must(t, s.AppendEvent(&api.Event{Job: "j-0", TimeUnixNano: -5})) // a clock before 1970 sorts first
	tests := []struct {
		name string
		f    store.EventFilter
		want []int64
	}{
		{"all", store.EventFilter{}, []int64{-5, 10, 20, 30, 40, 50}},
		{"newest two", store.EventFilter{Limit: 2}, []int64{40, 50}},
		{"since", store.EventFilter{SinceUnixNano: 25}, []int64{30, 40, 50}},
		{"one node", store.EventFilter{Node: "node-b"}, []int64{10, 40}},
		{"one job", store.EventFilter{Job: "j-1"}, []int64{20}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := s.Events(tc.f)
			must(t, err)
			if !slices.Equal(times(evs), tc.want) {
				t.Fatalf("times %v, want %v", times(evs), tc.want)
			}
		})
	}
}

func testSameNanosecond(t *testing.T, s Store) {
	must(t, s.Update(func(tx store.Tx) error {
		for i := range 3 {
			if err := tx.AppendEvent(&api.Event{TimeUnixNano: 7, Message: fmt.Sprint("tx", i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, s.AppendEvent(&api.Event{TimeUnixNano: 7, Message: "last"}))
	evs, err := s.Events(store.EventFilter{})
	must(t, err)
	var got []string
	for _, e := range evs {
		got = append(got, e.GetMessage())
	}
	if want := []string{"tx0", "tx1", "tx2", "last"}; !slices.Equal(got, want) {
		t.Fatalf("events of one nanosecond in order %v, want arrival order %v", got, want)
	}
}

// testPaged fills a log larger than one read page, with sparse matches.
func testPaged(t *testing.T, s Store) {
	const n = 2500
	must(t, s.Update(func(tx store.Tx) error {
		for i := range n {
			e := &api.Event{TimeUnixNano: int64(i + 1), Node: "busy"}
			if i%500 == 0 {
				e.Node = "rare"
			}
			if err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		return nil
	}))
	tests := []struct {
		name string
		f    store.EventFilter
		want []int64
	}{
		{"rare", store.EventFilter{Node: "rare"}, []int64{1, 501, 1001, 1501, 2001}},
		{"rare newest 2", store.EventFilter{Node: "rare", Limit: 2}, []int64{1501, 2001}},
		{"rare since", store.EventFilter{Node: "rare", SinceUnixNano: 1001}, []int64{1001, 1501, 2001}},
		{"newest 3", store.EventFilter{Limit: 3}, []int64{2498, 2499, 2500}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := s.Events(tc.f)
			must(t, err)
			if !slices.Equal(times(evs), tc.want) {
				t.Fatalf("times %v, want %v", times(evs), tc.want)
			}
		})
	}
	all, err := s.Events(store.EventFilter{})
	must(t, err)
	if len(all) != n || all[0].GetTimeUnixNano() != 1 || all[n-1].GetTimeUnixNano() != n {
		t.Fatalf("all %d events: got %d", n, len(all))
	}
}

func testUpdateAtomic(t *testing.T, s Store) {
	boom := errors.New("boom")
	err := s.Update(func(tx store.Tx) error {
		if err := tx.PutJob(&api.Job{Id: "j-1"}); err != nil {
			return err
		}
		if err := tx.AppendEvent(&api.Event{Job: "j-1", TimeUnixNano: 1}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update err = %v, want boom", err)
	}
	if _, err := s.Job("j-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed transaction's job was kept: %v", err)
	}
	if evs, _ := s.Events(store.EventFilter{}); len(evs) != 0 {
		t.Fatalf("a failed transaction's event was kept: %v", evs)
	}
	if err := s.Update(func(tx store.Tx) error { return tx.PutJob(&api.Job{}) }); err == nil {
		t.Error("Update stored a job without an id")
	}
	must(t, s.Update(func(tx store.Tx) error {
		if err := tx.PutJob(&api.Job{Id: "j-2"}); err != nil {
			return err
		}
		return tx.PutNode(node("n1", api.NodeState_NODE_STATE_READY))
	}))
	if _, err := s.Job("j-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node("n1"); err != nil {
		t.Fatal(err)
	}
}

// testUpdateRewrite writes one job twice in a transaction: the last wins.
func testUpdateRewrite(t *testing.T, s Store) {
	must(t, s.Update(func(tx store.Tx) error {
		if err := tx.PutJob(&api.Job{Id: "j-1", State: api.JobState_JOB_STATE_PENDING}); err != nil {
			return err
		}
		if err := tx.PutNode(node("n1", api.NodeState_NODE_STATE_READY)); err != nil {
			return err
		}
		return tx.PutJob(&api.Job{Id: "j-1", State: api.JobState_JOB_STATE_RUNNING})
	}))
	if j, err := s.Job("j-1"); err != nil || j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("job written twice in one Update = %v, %v; want the last write", j, err)
	}
}

// testUpdateLarge commits a pass bigger than etcd's default 128 ops.
func testUpdateLarge(t *testing.T, s Store) {
	must(t, s.Update(func(tx store.Tx) error {
		for i := range 300 {
			if err := tx.PutJob(&api.Job{Id: fmt.Sprintf("j-%03d", i), SpecYaml: strings.Repeat("x", 2000)}); err != nil {
				return err
			}
			if err := tx.AppendEvent(&api.Event{Job: fmt.Sprintf("j-%03d", i), TimeUnixNano: int64(i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	jobs, err := s.Jobs()
	must(t, err)
	evs, err := s.Events(store.EventFilter{})
	must(t, err)
	if len(jobs) != 300 || len(evs) != 300 {
		t.Fatalf("a 600-write Update stored %d jobs and %d events", len(jobs), len(evs))
	}
}

func serials(ids []*api.Identity) string {
	var out []string
	for _, id := range ids {
		out = append(out, id.GetSerial())
	}
	return strings.Join(out, " ")
}

var (
	user     = api.IdentityKind_IDENTITY_KIND_USER
	nodeKind = api.IdentityKind_IDENTITY_KIND_NODE
)

func testIdentities(t *testing.T, s Store) {
	for i, id := range []*api.Identity{
		{Kind: user, Name: "bob", Role: "viewer", Serial: "b1", IssuedUnixNano: 2},
		{Kind: user, Name: "alice", Role: "admin", Serial: "a1", IssuedUnixNano: 1},
		{Kind: user, Name: "bob", Role: "operator", Serial: "b0", IssuedUnixNano: 3},
		{Kind: nodeKind, Name: "node-01", Role: "node", Serial: "n1", IssuedUnixNano: 4},
	} {
		if err := s.PutIdentity(id); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := s.PutIdentity(&api.Identity{Name: "x"}); err == nil {
		t.Error("an identity without a serial was stored")
	}
	users, err := s.Identities(user)
	must(t, err)
	if got := serials(users); got != "a1 b1 b0" {
		t.Fatalf("users in order: %s, want a1 b1 b0 (by name, then issue time)", got)
	}
	if all, err := s.Identities(api.IdentityKind_IDENTITY_KIND_UNSPECIFIED); err != nil || serials(all) != "a1 b1 b0 n1" {
		t.Fatalf("every identity: %s, %v", serials(all), err)
	}
	if id, err := s.Identity("n1"); err != nil || id.GetName() != "node-01" {
		t.Errorf("Identity(n1) = %v, %v", id, err)
	}
	if _, err := s.Identity("zz"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Identity(zz): %v, want ErrNotFound", err)
	}
	r := &api.Revocation{RevokedUnixNano: 10, RevokedBy: "alice", Reason: "left"}
	revoked, err := s.RevokeIdentities(user, "bob", r)
	if err != nil || serials(revoked) != "b0 b1" {
		t.Fatalf("RevokeIdentities = %v, %v; want b0 b1 (by serial)", revoked, err)
	}
	if id, err := s.Identity("b1"); err != nil || id.GetRevokedUnixNano() != 10 || id.GetRevokeReason() != "left" {
		t.Errorf("revoked record = %v, %v", id, err)
	}
	if _, err := s.RevokeIdentities(user, "bob", r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking bob twice: %v, want ErrNotFound", err)
	}
	for _, serial := range []string{"b0", "b1"} {
		e, err := s.Revocation(serial)
		if err != nil || e.GetName() != "bob" || e.GetKind() != user || e.GetRevokedBy() != "alice" || e.GetReason() != "left" {
			t.Errorf("deny-list entry %s = %v, %v", serial, e, err)
		}
	}
	if _, err := s.Revocation("a1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("alice is on the deny-list: %v", err)
	}
	if err := s.RevokeSerial(&api.Revocation{}); err == nil {
		t.Error("RevokeSerial without a serial succeeded")
	}
	must(t, s.RevokeSerial(&api.Revocation{Serial: "stray", Reason: "lost laptop"}))
	if e, err := s.Revocation("stray"); err != nil || e.GetReason() != "lost laptop" {
		t.Errorf("Revocation(stray) = %v, %v", e, err)
	}
}

func testRemoveNode(t *testing.T, s Store) {
	must(t, s.PutIdentity(&api.Identity{Kind: nodeKind, Name: "node-01", Serial: "n1", IssuedUnixNano: 1}))
	must(t, s.PutIdentity(&api.Identity{Kind: nodeKind, Name: "node-01", Serial: "n2", IssuedUnixNano: 2}))
	must(t, s.PutIdentity(&api.Identity{Kind: user, Name: "node-01", Serial: "u1"})) // a user of the same name stays
	must(t, s.PutIdentity(&api.Identity{Kind: nodeKind, Name: "node-03", Serial: "n3"}))
	must(t, s.PutNode(node("node-01", api.NodeState_NODE_STATE_READY)))
	must(t, s.PutNode(node("node-02", api.NodeState_NODE_STATE_DOWN)))
	r := &api.Revocation{RevokedUnixNano: 10, RevokedBy: "alice", Reason: "decommissioned"}
	if revoked, err := s.RemoveNode("node-01", r); err != nil || serials(revoked) != "n1 n2" {
		t.Fatalf("RemoveNode(node-01) = %v, %v", revoked, err)
	}
	// A node known only by its record (it joined before identities were kept).
	if revoked, err := s.RemoveNode("node-02", r); err != nil || len(revoked) != 0 {
		t.Fatalf("RemoveNode(node-02) = %v, %v", revoked, err)
	}
	// A node known only by its certificate.
	if revoked, err := s.RemoveNode("node-03", r); err != nil || serials(revoked) != "n3" {
		t.Fatalf("RemoveNode(node-03) = %v, %v", revoked, err)
	}
	if _, err := s.RemoveNode("node-04", r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RemoveNode of an unknown node: %v", err)
	}
	if _, err := s.RemoveNode("node-01", r); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RemoveNode twice: %v, want ErrNotFound", err)
	}
	if nodes, _ := s.Nodes(); len(nodes) != 0 {
		t.Errorf("nodes left after removal: %v", nodes)
	}
	for _, serial := range []string{"n1", "n2", "n3"} {
		if _, err := s.Revocation(serial); err != nil {
			t.Errorf("%s not on the deny-list: %v", serial, err)
		}
	}
	if _, err := s.Revocation("u1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the user of the node's name was revoked: %v", err)
	}
}

func testTokens(t *testing.T, s Store) {
	must(t, s.PutToken(&api.JoinToken{Id: "t1", Uses: 3, CreatedUnixNano: 1}))
	must(t, s.PutToken(&api.JoinToken{Id: "t2", Uses: 1, CreatedUnixNano: 2}))
	if err := s.PutToken(&api.JoinToken{}); err == nil {
		t.Error("a token without an id was stored")
	}
	spent := errors.New("spent")
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for i := range 10 {
		wg.Go(func() {
			_, err := s.UpdateToken("t1", func(tok *api.JoinToken) error {
				if len(tok.GetUsed()) >= int(tok.GetUses()) {
					return spent
				}
				tok.Used = append(tok.Used, &api.JoinTokenUse{Node: fmt.Sprint("n", i), TimeUnixNano: time.Now().UnixNano()})
				return nil
			})
			if err == nil {
				mu.Lock()
				taken++
				mu.Unlock()
			} else if !errors.Is(err, spent) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if taken != 3 {
		t.Fatalf("%d uses taken of a 3-use token", taken)
	}
	rec, err := s.UpdateToken("nope", func(tok *api.JoinToken) error {
		if tok != nil {
			return errors.New("found a token that was never stored")
		}
		return spent
	})
	if rec != nil || !errors.Is(err, spent) {
		t.Fatalf("UpdateToken(unknown) = %v, %v", rec, err)
	}
	if rec, err := s.UpdateToken("nope", func(*api.JoinToken) error { return nil }); rec != nil || err != nil {
		t.Fatalf("UpdateToken(unknown) accepting nil = %v, %v; want nothing stored", rec, err)
	}
	toks, err := s.Tokens()
	if err != nil || len(toks) != 2 || toks[0].GetId() != "t2" || len(toks[1].GetUsed()) != 3 {
		t.Fatalf("Tokens = %v, %v", toks, err)
	}
}
