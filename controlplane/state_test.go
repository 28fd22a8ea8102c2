package controlplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

func newTestState(t testing.TB) (*state, *store.Bolt) {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := newState(slog.New(slog.DiscardHandler), st, 16, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func reg(name string, gpus int, hbMs uint32) *api.NodeRegistration {
	r := &api.NodeRegistration{Name: name, HeartbeatIntervalMs: hbMs}
	for i := 0; i < gpus; i++ {
		r.Gpus = append(r.Gpus, &api.GPUInfo{Index: uint32(i), Uuid: fmt.Sprintf("GPU-%s-%d", name, i), Model: "H100"})
	}
	return r
}

func stateOf(t *testing.T, s *state, name string) api.NodeState {
	t.Helper()
	for _, n := range s.listNodes() {
		if n.GetRegistration().GetName() == name {
			return n.GetState()
		}
	}
	t.Fatalf("node %s not listed", name)
	return 0
}

func TestHeartbeatDetector(t *testing.T) {
	s, _ := newTestState(t)
	t0 := time.Unix(1000, 0)
	sess := &nodeSession{}
	if err := s.register(reg("a", 2, 1000), "127.0.0.1:1", sess, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.register(reg("b", 2, 250), "127.0.0.1:2", &nodeSession{}, t0); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		at       time.Duration
		beatA    bool
		wantDown []string
		wantA    api.NodeState
	}{
		{at: 600 * time.Millisecond, wantDown: []string{"b"}, wantA: api.NodeState_NODE_STATE_READY},
		{at: 1900 * time.Millisecond, beatA: true, wantA: api.NodeState_NODE_STATE_READY},
		{at: 3800 * time.Millisecond, wantA: api.NodeState_NODE_STATE_READY},
		{at: 3950 * time.Millisecond, wantDown: []string{"a"}, wantA: api.NodeState_NODE_STATE_DOWN},
		{at: 4000 * time.Millisecond, beatA: true, wantA: api.NodeState_NODE_STATE_READY},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		if st.beatA {
			s.heartbeat("a", now)
		}
		down := s.checkHeartbeats(now)
		if fmt.Sprint(down) != fmt.Sprint(st.wantDown) && !(len(down) == 0 && len(st.wantDown) == 0) {
			t.Fatalf("at %s: down %v, want %v", st.at, down, st.wantDown)
		}
		if got := stateOf(t, s, "a"); got != st.wantA {
			t.Fatalf("at %s: a is %s, want %s", st.at, got.Short(), st.wantA.Short())
		}
	}
}

func TestRestartKeepsCordonAndMarksNodesDown(t *testing.T) {
	s, st := newTestState(t)
	t0 := time.Unix(1000, 0)
	if err := s.register(reg("a", 1, 1000), "x", &nodeSession{}, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.register(reg("c", 1, 1000), "x", &nodeSession{}, t0); err != nil {
		t.Fatal(err)
	}
	n, _ := st.Node("c")
	n.State, n.CordonReason = api.NodeState_NODE_STATE_CORDONED, "XID 79"
	if err := st.PutNode(n); err != nil {
		t.Fatal(err)
	}
	// A new control plane over the same store: nobody is connected yet.
	s2, err := newState(slog.New(slog.DiscardHandler), st, 16, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, s2, "a"); got != api.NodeState_NODE_STATE_DOWN {
		t.Fatalf("a after restart: %s, want down until it reconnects", got.Short())
	}
	if err := s2.register(reg("c", 1, 1000), "x", &nodeSession{}, t0); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, s2, "c"); got != api.NodeState_NODE_STATE_CORDONED {
		t.Fatalf("c after reconnect: %s, want its cordon kept", got.Short())
	}
}

func TestGPUFaultEventsMarkGPUUnhealthy(t *testing.T) {
	s, _ := newTestState(t)
	if err := s.register(reg("a", 4, 1000), "x", &nodeSession{}, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	events := []*api.Event{
		{Seq: 1, Kind: api.EventKind_EVENT_KIND_XID, GpuIndex: 0, Xid: 13, XidClass: api.XIDClass_XID_CLASS_RESTART_APP},
		{Seq: 2, Kind: api.EventKind_EVENT_KIND_XID, GpuIndex: 1, Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE},
		{Seq: 3, Kind: api.EventKind_EVENT_KIND_ECC, GpuIndex: 2, Severity: api.Severity_SEVERITY_CRITICAL},
		{Seq: 4, Kind: api.EventKind_EVENT_KIND_THROTTLE, GpuIndex: 3, Severity: api.Severity_SEVERITY_WARNING},
	}
	top, err := s.nodeEvents("a", events)
	if err != nil || top != 4 {
		t.Fatalf("nodeEvents = %d, %v", top, err)
	}
	want := []bool{true, false, false, true}
	for i, g := range s.listNodes()[0].GetGpus() {
		if g.GetHealthy() != want[i] {
			t.Errorf("GPU %d healthy=%v (%s), want %v", i, g.GetHealthy(), g.GetUnhealthyReason(), want[i])
		}
	}
}

func TestIngestAggregatesCollectives(t *testing.T) {
	s, _ := newTestState(t)
	if err := s.register(reg("a", 1, 1000), "x", &nodeSession{}, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	call := func(seq uint64, op api.NCCLOp, comm uint64) *api.CollectiveRecord {
		return &api.CollectiveRecord{Pid: 7, Job: "j", Rank: 1, Op: op, Comm: comm, Seq: seq, Bytes: 100, DurationNs: 1e6, StartUnixNano: int64(seq)}
	}
	s.ingest("a", &api.Telemetry{Collectives: []*api.CollectiveRecord{
		call(1, api.NCCLOp_NCCL_OP_ALL_REDUCE, 1), call(2, api.NCCLOp_NCCL_OP_ALL_REDUCE, 1),
		call(1, api.NCCLOp_NCCL_OP_ALL_REDUCE, 2), {Pid: 7, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 1, Seq: 3, InProgress: true},
	}}, time.Unix(2, 0))
	s.ingest("ghost", &api.Telemetry{Collectives: []*api.CollectiveRecord{call(9, api.NCCLOp_NCCL_OP_SEND, 1)}}, time.Unix(2, 0))
	cs := s.listCollectives("j", "")
	if len(cs) != 2 {
		t.Fatalf("%d aggregates, want 2 (one per communicator): %v", len(cs), cs)
	}
	if c := cs[0]; c.Calls != 2 || c.Seq != 2 || c.Bytes != 200 || c.InCallSeconds != 0.002 {
		t.Fatalf("comm 1 aggregate = %v", c)
	}
	if got := s.listCollectives("other", ""); len(got) != 0 {
		t.Fatalf("job filter leaked %v", got)
	}
}

func TestObserveFilter(t *testing.T) {
	coll := func(node, job string, rank int32, op api.NCCLOp, bytes uint64, dur int64) *api.ObserveItem {
		return &api.ObserveItem{Node: node, Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{
			Job: job, Rank: rank, Op: op, Bytes: bytes, DurationNs: dur, Comm: 5}}}
	}
	flow := &api.ObserveItem{Node: "n1", Body: &api.ObserveItem_Flow{Flow: &api.NetFlowSample{Job: "j", Rank: 0, TxBytes: 10, RxBytes: 5}}}
	ar := api.NCCLOp_NCCL_OP_ALL_REDUCE
	tests := []struct {
		name string
		f    *api.ObserveFilter
		it   *api.ObserveItem
		want bool
	}{
		{"nil filter", nil, flow, true},
		{"node match", &api.ObserveFilter{Node: "n1"}, coll("n1", "j", 0, ar, 1, 1), true},
		{"node mismatch", &api.ObserveFilter{Node: "n2"}, coll("n1", "j", 0, ar, 1, 1), false},
		{"rank 0 set", &api.ObserveFilter{Rank: 0, HasRank: true}, coll("n1", "j", 1, ar, 1, 1), false},
		{"op mismatch", &api.ObserveFilter{Op: api.NCCLOp_NCCL_OP_SEND}, coll("n1", "j", 0, ar, 1, 1), false},
		{"op excludes flows", &api.ObserveFilter{Op: ar}, flow, false},
		{"min bytes", &api.ObserveFilter{MinBytes: 100}, coll("n1", "j", 0, ar, 99, 1), false},
		{"min bytes flow", &api.ObserveFilter{MinBytes: 15}, flow, true},
		{"slower than", &api.ObserveFilter{SlowerThanNs: 10}, coll("n1", "j", 0, ar, 1, 9), false},
		{"slower than ok", &api.ObserveFilter{SlowerThanNs: 10}, coll("n1", "j", 0, ar, 1, 10), true},
		{"flows only", &api.ObserveFilter{Flows: true}, coll("n1", "j", 0, ar, 1, 1), false},
		{"calls only", &api.ObserveFilter{Collectives: true}, flow, false},
		{"comm", &api.ObserveFilter{Comm: 6}, coll("n1", "j", 0, ar, 1, 1), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := matches(tc.f, tc.it); got != tc.want {
				t.Fatalf("matches = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBrokerCountsWhatASlowObserverMisses(t *testing.T) {
	b := newBroker(10)
	sub, past := b.subscribe(nil, 0, 0, true)
	if len(past) != 0 {
		t.Fatalf("history before any publish: %v", past)
	}
	items := make([]*api.ObserveItem, subscriberBuffer+5)
	for i := range items {
		items[i] = &api.ObserveItem{Node: "n", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{Seq: uint64(i), StartUnixNano: int64(i)}}}
	}
	b.publish(items, 3)
	if got := sub.lost.Load(); got != 5 {
		t.Fatalf("lost = %d, want 5", got)
	}
	_, last := b.subscribe(nil, 3, 0, false)
	if len(last) != 3 || last[2].GetCollective().GetSeq() != uint64(len(items)-1) {
		t.Fatalf("--last 3 = %v", last)
	}
	_, since := b.subscribe(nil, 0, int64(len(items)-2), false)
	if len(since) != 2 {
		t.Fatalf("--since = %d items, want 2", len(since))
	}
	if b.nodeLosses() != 3 {
		t.Fatalf("node losses = %d", b.nodeLosses())
	}
}

// BenchmarkIngest measures the server's cost to decode and apply one
// node's telemetry batch (8 GPU samples and 20 traced calls) arriving from
// many nodes, on one core.
func BenchmarkIngest(b *testing.B) {
	const nodes = 1000
	s, _ := newTestState(b)
	for i := 0; i < nodes; i++ {
		if err := s.register(reg(fmt.Sprintf("n%04d", i), 8, 1000), "x", &nodeSession{}, time.Unix(1, 0)); err != nil {
			b.Fatal(err)
		}
	}
	t := &api.Telemetry{}
	for g := 0; g < 8; g++ {
		t.Gpus = append(t.Gpus, &api.GPUSample{Index: uint32(g), Uuid: "GPU-x", UtilGpuPercent: 90, MemUsedBytes: 1 << 34,
			PowerMw: 650000, EnergyMj: 1 << 40, TempC: 70, SmClockMhz: 1980, ThrottleNames: []string{"sw_power_cap"},
			Ecc: &api.ECCCounts{}, Processes: []*api.GPUProcess{{Pid: 100, UsedMemBytes: 1 << 34, Name: "python"}}})
	}
	for c := 0; c < 20; c++ {
		t.Collectives = append(t.Collectives, &api.CollectiveRecord{Pid: 100, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 1, Seq: uint64(c), Bytes: 1 << 20, DurationNs: 1e6})
	}
	var frame bytes.Buffer
	if err := api.WriteFrame(&frame, &api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: t}}); err != nil {
		b.Fatal(err)
	}
	raw := frame.Bytes()
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("n%04d", i)
	}
	// decode alone is the baseline: the cost any server pays to read the
	// batch off the wire; apply adds what gpuctl serve does with it.
	for _, apply := range []bool{false, true} {
		name := "decode"
		if apply {
			name = "decode+apply"
		}
		b.Run(name, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var m api.AgentMessage
				if err := api.NewFrameReader(bytes.NewReader(raw)).Read(&m); err != nil {
					b.Fatal(err)
				}
				if apply {
					s.ingest(names[i%nodes], m.GetTelemetry(), time.Unix(2, 0))
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(b.N*8)/el, "gpu_samples/s")
			b.ReportMetric(float64(b.N)/el, "nodes_at_1Hz/core")
		})
	}
}
