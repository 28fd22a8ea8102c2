package nodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// batch is a telemetry batch as nodemon sends it: a sample of every GPU
// and the NCCL calls since the last batch.
func batch(gpus, calls int, seq *uint64) *api.Telemetry {
	t := &api.Telemetry{}
	now := time.Now().UnixNano()
	for g := range gpus {
		t.Gpus = append(t.Gpus, &api.GPUSample{Index: uint32(g), TimeUnixNano: now, UtilGpuPercent: 90})
	}
	for range calls {
		*seq++
		t.Collectives = append(t.Collectives, &api.CollectiveRecord{Pid: 7, Comm: 0xc0ffee, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE,
			Seq: *seq, StartUnixNano: now, DurationNs: 1000, Bytes: 4 << 20, Job: "j"})
	}
	return t
}

// A server whose telemetry ingest stands still (its budget: 4 batches
// waiting) sheds the node's telemetry, GPU samples first, and counts what
// it shed; the node's telemetry stream is read at its own pace
// meanwhile, and its heartbeats, by datagram and on the control stream,
// keep it up and are answered with lease renewals. Over real QUIC.
func TestShedTelemetryKeepsTheNodeUp(t *testing.T) {
	sink := &recSink{}
	r, err := New(Config{Store: newStore(t), Sink: sink, Lease: 5 * time.Second, IngestQueue: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Detect(ctx, 20*time.Millisecond)
	l := newLoopback(t, r)
	const heartbeat = 100 * time.Millisecond
	nc := l.connect(reg("a", 8, uint32(heartbeat/time.Millisecond)))
	if !nc.conn.Datagrams() {
		t.Fatal("the node's connection does not take datagrams")
	}

	// The ingest stands still: its one drainer is taken.
	r.queue.mu.Lock()
	r.queue.draining = true
	r.queue.mu.Unlock()

	var streamRenewals, datagramRenewals atomic.Int64
	go func() {
		for {
			var m api.ServerMessage
			if err := nc.control.Recv(&m); err != nil {
				return
			}
			if m.GetLease() != nil {
				streamRenewals.Add(1)
			}
		}
	}()
	go func() {
		for {
			var m api.ServerMessage
			if err := nc.conn.ReceiveDatagram(ctx, &m); err != nil {
				return
			}
			if m.GetLease() != nil {
				datagramRenewals.Add(1)
			}
		}
	}()
	tel, err := nc.conn.OpenStream(ctx, transport.StreamTelemetry)
	if err != nil {
		t.Fatal(err)
	}
	// Ten heartbeat intervals (five times the detector's bound) of
	// heartbeats and a flood of telemetry: 20 batches of 100 calls
	// (about 10 kB each) per heartbeat, more than a stream's flow
	// control window holds unread.
	const calls = 100
	var seq uint64
	beats := 0
	for end := time.Now().Add(10 * heartbeat); time.Now().Before(end); {
		beats++
		hb := &api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{Seq: uint64(beats), TimeUnixNano: time.Now().UnixNano()}}}
		if err := nc.conn.SendDatagram(hb); err != nil {
			t.Fatal(err)
		}
		nc.control.SetWriteDeadline(time.Now().Add(heartbeat))
		if err := nc.control.Send(hb); err != nil {
			t.Fatalf("heartbeat %d: %v", beats, err)
		}
		for range 20 {
			// A server that stopped reading would block this write:
			// nodemon ends a session whose batch waits 5 s.
			tel.SetWriteDeadline(time.Now().Add(heartbeat))
			if err := tel.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: batch(8, calls, &seq)}}); err != nil {
				t.Fatalf("telemetry after %d batches: %v", seq/calls, err)
			}
			time.Sleep(heartbeat / 20)
		}
	}
	sent := seq / calls
	waitFor(t, "every batch read", func() bool {
		sh := r.Shed()
		r.queue.mu.Lock()
		defer r.queue.mu.Unlock()
		return uint64(len(r.queue.waiting))+sh.Batches == sent
	})
	sh := r.Shed()
	// Two batches whole, two without their samples, the rest shed
	// unread.
	if want := (Shed{Batches: sent - 4, GPUSamples: 8 * 2}); sh != want {
		t.Errorf("shed %+v of %d batches, want %+v", sh, sent, want)
	}
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetConnected() {
		t.Fatalf("a node whose telemetry was shed is %s (%s)", n.GetState().Short(), n.GetDownReason())
	}
	for _, line := range sink.lines() {
		if strings.HasPrefix(line, "down ") {
			t.Fatalf("the node was declared down: %s", line)
		}
	}
	waitFor(t, "every heartbeat answered", func() bool { return streamRenewals.Load()+datagramRenewals.Load() == int64(beats) })
	if datagramRenewals.Load() == 0 {
		t.Errorf("no heartbeat answered by datagram (%d on the stream)", streamRenewals.Load())
	}

	// The ingest resumes: what was kept is applied, in order.
	go r.drain()
	waitFor(t, "the kept batches applied", func() bool {
		return len(r.Collectives("j", "a")) == 1 && r.Collectives("j", "a")[0].GetCalls() == 4*calls
	})
	if g := statusOf(t, r, "a").GetGpus()[0].GetLast(); g == nil {
		t.Error("the GPU samples of the first batches were not applied")
	}
	if sh := r.Shed(); sh.Batches != sent-4 {
		t.Errorf("shed %d batches after the ingest resumed, want %d", sh.Batches, sent-4)
	}
}

// The queue's bound holds at every size: an ingest that keeps up sheds
// nothing, and one that falls behind sheds GPU samples before calls.
func TestOfferShedsGPUSamplesFirst(t *testing.T) {
	for _, limit := range []int{1, 2, 7} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			r, err := New(Config{Store: store.Store(newStore(t)), IngestQueue: limit})
			if err != nil {
				t.Fatal(err)
			}
			sess := registerIdle(t, r, reg("a", 8, 1000))
			r.queue.draining = true // stands still
			var seq uint64
			for range 10 {
				r.offer("a", sess, batch(8, 8, &seq))
			}
			kept := 0
			for _, q := range r.queue.waiting {
				if len(q.t.GetGpus()) > 0 {
					kept++
				}
				if len(q.t.GetCollectives()) != 8 || !q.sampled {
					t.Errorf("a queued batch lost its calls or its sets: %d calls, sampled %v", len(q.t.GetCollectives()), q.sampled)
				}
			}
			if len(r.queue.waiting) != limit || kept != limit/2 {
				t.Errorf("%d batches queued, %d with samples; want %d and %d", len(r.queue.waiting), kept, limit, limit/2)
			}
			if sh := r.Shed(); sh.Batches != uint64(10-limit) || sh.GPUSamples != 8*uint64(10-limit/2) {
				t.Errorf("shed %+v", sh)
			}
		})
	}
}

// A server whose receive path is behind credits its nodes the lag before
// it takes their silence for a failure, up to MaxLagCredit.
func TestReceiveLagCredit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	var lag atomic.Int64
	r, err := New(Config{Store: newStore(t), Now: c.now, ReceiveLag: func() time.Duration { return time.Duration(lag.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	registerIdle(t, r, reg("a", 1, 1000))
	c.set(t0.Add(4 * time.Second))
	lag.Store(int64(3 * time.Second))
	if down := r.CheckHeartbeats(); len(down) != 0 {
		t.Fatalf("4s silent with the receive path 3s behind: %v down", down)
	}
	// So far behind, the telemetry pace is raised: up to 8 heartbeats
	// are allowed past the credit.
	c.set(t0.Add(MaxLagCredit + 8500*time.Millisecond))
	lag.Store(int64(time.Hour))
	if down := r.CheckHeartbeats(); len(down) != 1 {
		t.Fatalf("silent past the most lag credited: %v down (pace %d)", down, r.Pace())
	}
	if n := statusOf(t, r, "a"); !strings.Contains(n.GetDownReason(), "(the server 15s behind)") {
		t.Errorf("down reason %q", n.GetDownReason())
	}
}

// When most nodes' heartbeats reach the server late, the server is
// behind: a node silent that long is not declared down. One silent node
// among punctual ones is.
func TestLateHeartbeatsCredit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		late     time.Duration // of the others' heartbeats at 3 s
		wantDown []string
	}{
		{"punctual", 0, []string{"quiet"}},
		{"late", 3 * time.Second, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			c := &clock{t: t0}
			r := newRegistry(t, newStore(t), c, nil)
			var sess []*session
			for i := range 10 {
				sess = append(sess, registerIdle(t, r, reg(fmt.Sprint("n", i), 1, 1000)))
			}
			sess = append(sess, registerIdle(t, r, reg("quiet", 1, 1000)))
			// Each node's first heartbeat takes 2 ms: the floor of its gap.
			for _, s := range sess {
				s.heartbeat(&api.Heartbeat{Seq: 1, TimeUnixNano: t0.Add(-2 * time.Millisecond).UnixNano()})
			}
			c.set(t0.Add(3 * time.Second))
			for _, s := range sess[:10] {
				s.heartbeat(&api.Heartbeat{Seq: 2, TimeUnixNano: c.now().Add(-2*time.Millisecond - tc.late).UnixNano()})
			}
			if down := r.CheckHeartbeats(); !slices.Equal(down, tc.wantDown) {
				t.Fatalf("3 s silent, the others' heartbeats %s late: %v down, want %v", tc.late, down, tc.wantDown)
			}
			if got := r.late.median(c.now()); got != tc.late {
				t.Errorf("median lateness %s, want %s", got, tc.late)
			}
		})
	}
}
