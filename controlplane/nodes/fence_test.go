package nodes

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// TestReconnectFencesSupersededRanksBeforeReady connects a node that
// still runs a rank of a superseded attempt: the server has it killed
// before the node counts as ready, the job owner hears only of the ranks
// left, and from then on every heartbeat is answered with a lease renewal.
func TestReconnectFencesSupersededRanksBeforeReady(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	r.cfg.Lease = 5 * time.Second
	r.cfg.Superseded = func(node string, running []*api.RankStatus) []*api.RankStatus {
		var out []*api.RankStatus
		for _, rk := range running {
			if rk.GetJob() == "j" && rk.GetAttempt() < 2 {
				out = append(out, rk)
			}
		}
		return out
	}
	l := newLoopback(t, r)
	rg := reg("a", 2, 1000)
	rg.Running = []*api.RankStatus{{Job: "j", Attempt: 1, Rank: 0, Pid: 10}, {Job: "j", Attempt: 2, Rank: 1, Pid: 20}, {Job: "k", Attempt: 1, Rank: 0, Pid: 30}}
	nc := l.dial(rg)
	if got := nc.welcome.GetLeaseMs(); got != 5000 {
		t.Errorf("welcome lease %d ms, want 5000", got)
	}
	var m api.ServerMessage
	nc.control.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := nc.control.Recv(&m); err != nil {
		t.Fatal(err)
	}
	sig := m.GetCommand().GetSignal()
	if sig.GetJob() != "j" || sig.GetAttempt() != 1 || !sig.GetFence() || sig.GetSignal() != "SIGKILL" {
		t.Fatalf("first message after registering: %v, want a fence of j attempt 1", &m)
	}
	// A heartbeat before the answer renews nothing: the node is not ready.
	// The control stream is read in order, so the server handles this
	// heartbeat before the answer that follows it; had it renewed the
	// lease, that renewal would come back before heartbeat 7's (checked
	// below), with no sleep to guess how long handling takes.
	if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{Seq: 1}}}); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Node("a"); r.Connected("a") || err == nil && n.GetState() == api.NodeState_NODE_STATE_READY {
		t.Fatal("node ready before its superseded ranks were fenced")
	}
	if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: &api.CommandAck{
		Id: m.GetCommand().GetId(), Killed: []*api.RankStatus{{Job: "j", Attempt: 1, Rank: 0, Pid: 10}}}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready", func() bool { return r.Connected("a") })
	var ranks []string
	for _, nr := range r.Ranks("") {
		for _, rk := range nr.Ranks {
			ranks = append(ranks, fmt.Sprintf("%s/%d/%d", rk.GetJob(), rk.GetAttempt(), rk.GetRank()))
		}
	}
	if !slices.Equal(ranks, []string{"j/2/1", "k/1/0"}) {
		t.Errorf("ranks after the fence %v, want j/2/1 and k/1/0", ranks)
	}
	evs, err := r.cfg.Store.Events(store.EventFilter{Node: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e *api.Event) bool {
		return e.GetJob() == "j" && strings.Contains(e.GetMessage(), "killed attempt 1 rank 0 (pid 10) of superseded attempts")
	}) {
		t.Errorf("no event names the fenced rank: %v", evs)
	}
	if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{Seq: 7}}}); err != nil {
		t.Fatal(err)
	}
	for {
		var m api.ServerMessage
		if err := nc.control.Recv(&m); err != nil {
			t.Fatal(err)
		}
		if l := m.GetLease(); l != nil {
			if l.GetHeartbeatSeq() == 1 {
				t.Fatal("the heartbeat sent before the node was ready was answered with a lease")
			}
			if l.GetHeartbeatSeq() != 7 || l.GetLeaseMs() != 5000 {
				t.Fatalf("renewal %v, want heartbeat 7 and 5000 ms", l)
			}
			break
		}
	}
}

// TestServerPauseIsNotBlamedOnNodes stops the detector's clock-keeping
// for 10 s, as a SIGSTOP of the server would: no node is declared down
// for the silence, and one that stays silent after is, with its last
// contact (the pause credited) as the time its lease counts from. A pause
// that long made nodemon give its session up and wait in its reconnect
// backoff, so the node has transport.NodeReconnectWithin from the
// server's return to be heard again.
func TestServerPauseIsNotBlamedOnNodes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	r := newRegistry(t, newStore(t), c, nil)
	registerIdle(t, r, reg("a", 1, 1000))
	const every = 100 * time.Millisecond
	r.detect(every)
	c.set(t0.Add(10 * time.Second))
	if down := r.detect(every); len(down) != 0 {
		t.Fatalf("after a 10 s pause of the server: %v down", down)
	}
	// Ticks come on time from here on, so the silence that follows is the
	// node's: down once it passes twice its heartbeat after the credit.
	var downAt time.Duration
	for at := 10*time.Second + every; at <= 30*time.Second && downAt == 0; at += every {
		c.set(t0.Add(at))
		if len(r.detect(every)) > 0 {
			downAt = at
		}
	}
	if want := 10*time.Second + transport.NodeReconnectWithin; downAt < want-every || downAt > want+every {
		t.Errorf("a down at %s, want about %s (its reconnect bound after the pause)", downAt, want)
	}
	n := statusOf(t, r, "a")
	if n.GetState() != api.NodeState_NODE_STATE_DOWN {
		t.Fatalf("a silent 2.5 s after the pause is %s", n.GetState().Short())
	}
	if seen := time.Unix(0, n.GetLastSeenUnixNano()); seen.Before(t0.Add(9 * time.Second)) {
		t.Errorf("last seen %s after start, want the pause credited (about 9.9 s)", seen.Sub(t0))
	}
}
