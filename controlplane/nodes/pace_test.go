package nodes

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// A server whose ingest falls behind asks the nodes that honour it to send
// telemetry less often (TelemetryPace), says so in its status, and asks a
// node that connects meanwhile at once; a node without the feature is
// never sent the message. Over real QUIC.
func TestIngestBehindPacesTheNodes(t *testing.T) {
	r, err := New(Config{Store: newStore(t), IngestQueue: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Detect(ctx, 20*time.Millisecond)
	l := newLoopback(t, r)
	register := func(name string, features []string) *nodeConn {
		nc := l.hello(name, &api.Hello{Version: api.CurrentVersion(), Features: features})
		if nc.refusal != "" {
			t.Fatalf("%s: welcome: %q", name, nc.refusal)
		}
		if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg(name, 8, 1000)}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, name+" connected", func() bool { return r.Connected(name) })
		return nc
	}
	paces := func(nc *nodeConn) <-chan uint32 {
		ch := make(chan uint32, 16)
		go func() {
			for {
				var m api.ServerMessage
				if err := nc.control.Recv(&m); err != nil {
					return
				}
				if p := m.GetPace(); p != nil {
					ch <- p.GetFactor()
				}
			}
		}()
		return ch
	}
	paced := register("paced", []string{api.FeatureTelemetryPace})
	old := register("old", nil)
	pacedCh, oldCh := paces(paced), paces(old)
	if f := r.Pace(); f != 1 {
		t.Fatalf("pace %d before any load, want 1", f)
	}

	// The ingest stands still and the node floods it: batches are shed.
	r.queue.mu.Lock()
	r.queue.draining = true
	r.queue.mu.Unlock()
	tel, err := paced.conn.OpenStream(ctx, transport.StreamTelemetry)
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	for range 10 {
		if err := tel.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: batch(8, 10, &seq)}}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case f := <-pacedCh:
		if f != 2 {
			t.Fatalf("first pace %d, want 2", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no pace sent within 10 s of shedding %+v", r.Shed())
	}
	if f := r.Pace(); f < 2 {
		t.Errorf("status pace %d after it was sent, want 2 or more", f)
	}
	late := register("late", []string{api.FeatureTelemetryPace})
	select {
	case f := <-paces(late):
		if f < 2 {
			t.Errorf("a node connecting while paced was sent %d", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a node connecting while paced was not sent the pace")
	}
	select {
	case f := <-oldCh:
		t.Fatalf("a node without the telemetry-pace feature was sent pace %d", f)
	default:
	}
}

// While the telemetry pace is raised (ingest behind), a silent node is
// given up to four times as many heartbeats before it is declared down,
// and the reason says so; at its own pace, two.
func TestPacedServerWaitsLongerForHeartbeats(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	l := newLoopback(t, r)
	l.connect(reg("a", 1, 1000))
	l.connect(reg("b", 1, 1000))
	r.pacing.judged = t0.Add(time.Hour) // no judgment moves the pace here
	r.paceFactor.Store(8)
	c.set(t0.Add(7 * time.Second))
	if down := r.CheckHeartbeats(); len(down) != 0 {
		t.Fatalf("down %v after 7 s of silence while paced 8x, want none before 8 heartbeats", down)
	}
	c.set(t0.Add(8100 * time.Millisecond))
	down := r.CheckHeartbeats()
	if len(down) != 2 {
		t.Fatalf("down %v after 8.1 s of silence while paced, want both", down)
	}
	if n := statusOf(t, r, "a"); !strings.Contains(n.GetDownReason(), "8 heartbeats allowed: ingest is behind, telemetry paced 8×") {
		t.Errorf("down reason %q does not say why it waited", n.GetDownReason())
	}

	r2 := newRegistry(t, newStore(t), c, sink)
	l2 := newLoopback(t, r2)
	c.set(t0)
	l2.connect(reg("c", 1, 1000))
	r2.pacing.judged = t0.Add(time.Hour)
	c.set(t0.Add(2100 * time.Millisecond))
	if down := r2.CheckHeartbeats(); len(down) != 1 {
		t.Fatalf("down %v after 2.1 s at its own pace, want c", down)
	}
}
