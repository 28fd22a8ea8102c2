package nodes

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// recordingSink keeps what the registry told it, in order.
type recordingSink struct {
	mu   sync.Mutex
	seen []string
}

func (r *recordingSink) NodeUp(name string, _ *api.NodeRegistration, _ bool) { r.add("up " + name) }
func (r *recordingSink) NodeDown(name, _ string)                             { r.add("down " + name) }
func (r *recordingSink) NodeEvents(string, []*api.Event)                     {}
func (r *recordingSink) add(s string) {
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.mu.Unlock()
}

type clockAt struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clockAt) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clockAt) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestUpAndDownReachTheSinkInOrder drives one node through bursts of
// registrations, disconnects and silences from several goroutines at once,
// the way concurrent sessions and the detector race in a real server, and
// checks that what the sink heard is a history the registry really went
// through: never down twice in a row, and ending in the state the registry
// ends in.
func TestUpAndDownReachTheSinkInOrder(t *testing.T) {
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := &clockAt{t: time.Unix(1_800_000_000, 0)}
	sink := &recordingSink{}
	r, err := New(Config{Store: st, Sink: sink, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	reg := &api.NodeRegistration{Name: "n1", HeartbeatIntervalMs: 1000}
	for round := range 20 {
		var wg sync.WaitGroup
		sessions := make([]*session, 4)
		for i := range sessions {
			sessions[i] = &session{name: "n1", pending: map[uint64]chan *api.CommandAck{}}
		}
		// A burst: the old session's disconnect, new sessions registering
		// (one wins; a live one refuses the others), the detector.
		for i, sess := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.register(reg, fmt.Sprintf("127.0.0.1:%d", 4000+i), sess); err == nil && (round+i)%2 == 0 {
					r.disconnected("n1", sess, "burst")
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			clk.add(3 * time.Second)
			r.CheckHeartbeats()
		}()
		wg.Wait()
	}
	sink.mu.Lock()
	seen := append([]string(nil), sink.seen...)
	sink.mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("the sink heard nothing")
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] == "down n1" && seen[i-1] == "down n1" {
			t.Fatalf("down twice in a row at %d: %v", i, seen)
		}
	}
	n, err := r.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	last := seen[len(seen)-1]
	if up := n.GetState() == api.NodeState_NODE_STATE_READY; up != (last == "up n1") {
		t.Fatalf("registry ends %s, the sink last heard %q", n.GetState().Short(), last)
	}
}

// TestDownNodeIsDisconnectedAndStale checks the truthful node state: a node
// the detector declares down is not connected, its figures are stale, its
// cordon stays, and its session is closed.
func TestDownNodeIsDisconnectedAndStale(t *testing.T) {
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := &clockAt{t: time.Unix(1_800_000_000, 0)}
	r, err := New(Config{Store: st, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	sess := &session{name: "n1", pending: map[uint64]chan *api.CommandAck{}}
	if err := r.register(&api.NodeRegistration{Name: "n1", HeartbeatIntervalMs: 1000,
		Gpus: []*api.GPUInfo{{Index: 0, Uuid: "GPU-0"}}}, "127.0.0.1:1", sess); err != nil {
		t.Fatal(err)
	}
	r.ingest("n1", sess, &api.Telemetry{Gpus: []*api.GPUSample{{Index: 0, UtilGpuPercent: 97, PowerMw: 650_000}}})
	if _, err := r.SetCordon("n1", ActionCordon, "bad DIMM"); err != nil {
		t.Fatal(err)
	}
	clk.add(2100 * time.Millisecond)
	if down := r.CheckHeartbeats(); len(down) != 1 {
		t.Fatalf("down %v, want n1", down)
	}
	n, _ := r.Node("n1")
	if n.GetState() != api.NodeState_NODE_STATE_DOWN || n.GetConnected() || !n.GetStale() || !n.GetCordoned() ||
		n.GetCordonReason() != "bad DIMM" || n.GetDownReason() == "" {
		t.Fatalf("down node reads %v", n)
	}
	if r.Connected("n1") {
		t.Fatal("a down node still has a session")
	}
	// A batch the closed session still had in flight changes nothing.
	r.ingest("n1", sess, &api.Telemetry{Gpus: []*api.GPUSample{{Index: 0, UtilGpuPercent: 1}}})
	if n2, _ := r.Node("n1"); n2.GetGpus()[0].GetLast().GetUtilGpuPercent() != 97 || !n2.GetStale() {
		t.Fatalf("a stale session's batch was applied: %v", n2)
	}
	if _, err := r.Command(t.Context(), "n1", &api.Command{}); err == nil {
		t.Fatal("a command reached a down node")
	}
}
