package nodes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func withInstance(rg *api.NodeRegistration, id string) *api.NodeRegistration {
	rg.InstanceId = id
	return rg
}

// TestRestartSupersedesItsOldSession: a nodemon that restarts presents
// the instance id kept in its data dir; its new session takes over at once
// from the old one, which is still heard from (its process died a moment
// ago), and the node is never down.
func TestRestartSupersedesItsOldSession(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	l := newLoopback(t, r)
	const id = "0123456789abcdef0123456789abcdef"
	old := l.connect(withInstance(reg("a", 1, 1000), id))
	l.connect(withInstance(reg("a", 1, 1000), id))
	if reason := old.closedReason(t); !strings.Contains(reason, "superseded: nodemon restarted") {
		t.Errorf("the old session closed with %q", reason)
	}
	// The old session's end arrives after the new one registered and must
	// not take the node down.
	waitFor(t, "the old session's end handled", func() bool {
		r.mu.RLock()
		defer r.mu.RUnlock()
		return r.nodes["a"].session != nil && old.conn.Context().Err() != nil
	})
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetConnected() {
		t.Errorf("after the restart: %s connected %v (%s)", n.GetState().Short(), n.GetConnected(), n.GetDownReason())
	}
	if got, want := sink.lines(), []string{"up a joined=true", "up a joined=false"}; !slices.Equal(got, want) {
		t.Errorf("the job owner heard %q, want %q (never down)", got, want)
	}
	if ev := eventsOf(t, r.cfg.Store, api.EventKind_EVENT_KIND_NODE_UP); len(ev) != 1 || !strings.Contains(ev[0], "nodemon restarted") {
		t.Errorf("node-up events %q, want one saying nodemon restarted", ev)
	}
}

// TestImpostorIsRefused: a second live host under the same node identity
// presents another instance id (or none) and is refused while the
// established session is heard from; that session keeps the node.
func TestImpostorIsRefused(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	l := newLoopback(t, r)
	l.connect(withInstance(reg("a", 1, 1000), "0123456789abcdef0123456789abcdef"))
	r.mu.RLock()
	held := r.nodes["a"].session
	r.mu.RUnlock()
	for _, other := range []string{"fedcba9876543210fedcba9876543210", ""} {
		nc := l.dial(withInstance(reg("a", 1, 1000), other))
		reason := nc.closedReason(t)
		if !strings.Contains(reason, "two hosts cannot share one node identity") {
			t.Errorf("instance %q: closed with %q, want a refusal", other, reason)
		}
		if other != "" && !strings.Contains(reason, "not this one's "+other) {
			t.Errorf("instance %q: the refusal %q does not name the two instances", other, reason)
		}
	}
	r.mu.RLock()
	still := r.nodes["a"].session
	r.mu.RUnlock()
	if still != held {
		t.Error("an impostor took the node's session")
	}
	if got, want := sink.lines(), []string{"up a joined=true"}; !slices.Equal(got, want) {
		t.Errorf("the job owner heard %q, want %q", got, want)
	}
}

// TestLaunchInFlightOutlivesARestart: a launch is sent, and nodemon
// restarts before answering; the new session supersedes the old one, and
// the launch, safe to send again (a launch of a running attempt is a no-op
// on the node), goes to the new session, whose answer is the command's.
// A signal, which is not, fails with the session's end.
func TestLaunchInFlightOutlivesARestart(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	r := newRegistry(t, newStore(t), c, &recSink{})
	l := newLoopback(t, r)
	const id = "0123456789abcdef0123456789abcdef"
	old := l.connect(withInstance(reg("a", 1, 1000), id))
	type result struct {
		ack *api.CommandAck
		err error
	}
	send := func(cmd *api.Command) chan result {
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ack, err := r.Command(ctx, "a", cmd)
			done <- result{ack, err}
		}()
		return done
	}
	// recv reads the next command nc is sent.
	recv := func(nc *nodeConn) *api.Command {
		t.Helper()
		for {
			var m api.ServerMessage
			nc.control.SetReadDeadline(time.Now().Add(10 * time.Second))
			if err := nc.control.Recv(&m); err != nil {
				t.Fatalf("read command: %v", err)
			}
			if cmd := m.GetCommand(); cmd != nil {
				return cmd
			}
		}
	}
	launch := send(&api.Command{Body: &api.Command_Launch{Launch: &api.LaunchRanks{Job: "j-1", Attempt: 1}}})
	recv(old) // it arrives, and nodemon dies before answering
	signal := send(&api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: "j-1", Signal: "SIGUSR1"}}})
	recv(old)
	restarted := l.connect(withInstance(reg("a", 1, 1000), id))
	got := recv(restarted)
	if got.GetLaunch().GetJob() != "j-1" {
		t.Fatalf("the new session was sent %v, want the launch again", got)
	}
	if err := restarted.control.Send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: &api.CommandAck{Id: got.GetId()}}}); err != nil {
		t.Fatal(err)
	}
	if res := <-launch; res.err != nil {
		t.Errorf("the launch failed across the restart: %v", res.err)
	}
	var ended *SessionEndedError
	if res := <-signal; !errors.As(res.err, &ended) || !strings.Contains(res.err.Error(), "superseded") {
		t.Errorf("the signal: %v, want the session's end", res.err)
	}
}
