package nodes

import (
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// slowStore holds every Update until released, as a store a millisecond
// or more away (etcd) does for a moment.
type slowStore struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (s *slowStore) Update(fn func(store.Tx) error) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Update(fn)
}

// A known node's registration writes its record outside the registry
// lock: while the store is slow, the registry still answers and judges
// other nodes. A cordon that lands meanwhile is kept, in the registry and
// in the store.
func TestRegisterWritesOutsideTheLock(t *testing.T) {
	bolt := newStore(t)
	c := &clock{t: time.Unix(1000, 0)}
	first := newRegistry(t, bolt, c, nil)
	registerIdle(t, first, reg("a", 2, 1000))
	registerIdle(t, first, reg("b", 2, 1000))

	// A restarted server: both nodes load down, and reconnect.
	st := &slowStore{Store: bolt, entered: make(chan struct{}), release: make(chan struct{})}
	sink := &recSink{}
	r := newRegistry(t, st, c, sink)
	done := make(chan error, 1)
	go func() { done <- r.register(reg("a", 2, 1000), "10.0.0.1:1", &session{r: r, name: "a"}) }()
	<-st.entered
	// The write is in flight: the registry is not held by it.
	answered := make(chan struct{})
	go func() {
		r.Nodes()
		r.CheckHeartbeats()
		if _, err := r.SetCordon("a", ActionCordon, "flaky NIC"); err != nil {
			t.Error(err)
		}
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the registry waited for a registration's store write")
	}
	close(st.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n := statusOf(t, r, "a")
	if n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("registered while cordoned: %s cordoned=%v %q", n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
	}
	stored, err := bolt.Node("a")
	if err != nil {
		t.Fatal(err)
	}
	if stored.GetState() != api.NodeState_NODE_STATE_READY || !stored.GetCordoned() || stored.GetRemoteAddr() != "10.0.0.1:1" {
		t.Errorf("stored: %s cordoned=%v from %q", stored.GetState().Short(), stored.GetCordoned(), stored.GetRemoteAddr())
	}
	if got := sink.lines(); len(got) != 1 || got[0] != "up a joined=false" {
		t.Errorf("the sink heard %q", got)
	}

	// Without anything in between, one write: record and event together.
	c.set(time.Unix(1001, 0))
	go func() { done <- r.register(reg("b", 2, 1000), "10.0.0.2:1", &session{r: r, name: "b"}) }()
	<-st.entered
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if stored, err := bolt.Node("b"); err != nil || stored.GetState() != api.NodeState_NODE_STATE_READY {
		t.Errorf("b stored: %v %v", stored.GetState(), err)
	}
	evs, err := bolt.Events(store.EventFilter{Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.GetKind() != api.EventKind_EVENT_KIND_NODE_UP || last.GetMessage() != "node connected from 10.0.0.2:1" {
		t.Errorf("b's last event: %v", last)
	}
}
