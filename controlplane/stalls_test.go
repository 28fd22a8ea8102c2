package controlplane

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// done is a communicator whose rank completed allreduce seq and sits
// between calls.
func done(handle, seq uint64) stallComm {
	return stallComm{handle: handle, done: seq, doneOp: api.NCCLOp_NCCL_OP_ALL_REDUCE}
}

// inside is a communicator whose rank completed seq and is inside seq+1.
func inside(handle, seq uint64) stallComm {
	c := done(handle, seq)
	c.in = &api.CollectiveRecord{Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: handle, Seq: seq + 1, InProgress: true}
	return c
}

func rk(rank int32, node string, pid uint32, state string, cpu float64, comms ...stallComm) stallRank {
	return stallRank{rank: rank, node: node, pid: pid, procState: state, cpu: cpu, comms: comms}
}

// ring4 is a 2-node × 2-rank job: rank 2 at c2, the others at c.
func ring4(cpu float64, st2 string, c, c2 stallComm) []stallRank {
	return []stallRank{
		rk(0, "node-00", 100, "S", cpu, c), rk(1, "node-00", 101, "S", cpu, c),
		rk(2, "node-01", 4242, st2, 1, c2), rk(3, "node-01", 4243, "S", cpu, c),
	}
}

type stallStep struct {
	at    time.Duration
	ranks []stallRank
	// gone: the job is no longer running.
	gone bool
}

func TestStallDetector(t *testing.T) {
	healthy := func(k uint64) []stallRank {
		// A fast rank already inside the next allreduce, the rest done.
		return []stallRank{rk(0, "node-00", 100, "R", float64(k), inside(0xa0, k)), rk(1, "node-00", 101, "R", float64(k), done(0xb0, k)),
			rk(2, "node-01", 200, "R", float64(k), done(0xc0, k)), rk(3, "node-01", 201, "R", float64(k), inside(0xd0, k))}
	}
	cases := []struct {
		name      string
		threshold time.Duration
		steps     []stallStep
		// changes are "STEP:declared" or "STEP:cleared: WHY".
		changes []string
		// lagging and waiting of the stall listed after the last step.
		lagging, waiting []int32
		diagnosis        string
		comm             uint64
	}{
		{
			name: "stopped rank in compute", threshold: 3 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{time.Second, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{3100 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{4 * time.Second, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
			},
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 4s",
		},
		{
			name: "threshold not yet passed", threshold: 3 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{2900 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
			},
		},
		{
			name: "all healthy", threshold: time.Second,
			steps: []stallStep{
				{0, healthy(1), false}, {600 * time.Millisecond, healthy(2), false}, {1200 * time.Millisecond, healthy(3), false},
				{1800 * time.Millisecond, healthy(4), false}, {2400 * time.Millisecond, healthy(5), false},
			},
		},
		{
			name: "all between calls is not a stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", done(0xa0, 7), done(0xc0, 7)), false},
				{5 * time.Second, ring4(1, "T", done(0xa0, 7), done(0xc0, 7)), false},
			},
		},
		{
			name: "stopped rank inside the call", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(1, "T", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) inside allreduce seq 10; ranks 0,1,3 wait in allreduce seq 10 for 2.5s",
		},
		{
			name: "idle rank inside the call while the others spin", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{time.Second, ring4(2, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(3, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) makes no CPU progress inside allreduce seq 10; ranks 0,1,3 wait in allreduce seq 10 for 2.5s",
		},
		{
			name: "all inside and none stopped blames the network", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"1:declared"}, waiting: []int32{0, 1, 2, 3}, comm: 0xa0,
			diagnosis: "all 4 ranks wait in allreduce seq 10 for 2.5s and none is stopped or idle: suspect the network between them or a hung GPU",
		},
		{
			name: "lagging ranks on several nodes", threshold: time.Second,
			steps: []stallStep{
				{0, []stallRank{rk(0, "node-00", 10, "R", 1, inside(1, 5)), rk(1, "node-00", 11, "D", 1, done(2, 5)),
					rk(2, "node-01", 20, "R", 1, inside(3, 5)), rk(3, "node-02", 30, "T", 1, done(4, 5))}, false},
				{1500 * time.Millisecond, []stallRank{rk(0, "node-00", 10, "R", 1, inside(1, 5)), rk(1, "node-00", 11, "D", 1, done(2, 5)),
					rk(2, "node-01", 20, "R", 1, inside(3, 5)), rk(3, "node-02", 30, "T", 1, done(4, 5))}, false},
			},
			changes: []string{"1:declared"}, lagging: []int32{1, 3}, waiting: []int32{0, 2}, comm: 1,
			diagnosis: "rank 1 (node-00 pid 11) is blocked in the kernel (state D) after allreduce seq 5; " +
				"rank 3 (node-02 pid 30) is stopped (SIGSTOP?) after allreduce seq 5; ranks 0,2 wait in allreduce seq 6 for 1.5s",
		},
		{
			name: "two communicators where only one stalls", threshold: time.Second,
			steps: []stallStep{
				{0, []stallRank{
					rk(0, "node-00", 100, "S", 1, done(0xa0, 30), inside(0xa1, 30)), rk(1, "node-00", 101, "S", 1, done(0xb0, 30), inside(0xb1, 30)),
					rk(2, "node-01", 200, "T", 1, done(0xc0, 30), done(0xc1, 30)), rk(3, "node-01", 201, "S", 1, done(0xd0, 30), inside(0xd1, 30))}, false},
				{2 * time.Second, []stallRank{
					rk(0, "node-00", 100, "S", 1, done(0xa0, 30), inside(0xa1, 30)), rk(1, "node-00", 101, "S", 1, done(0xb0, 30), inside(0xb1, 30)),
					rk(2, "node-01", 200, "T", 1, done(0xc0, 30), done(0xc1, 30)), rk(3, "node-01", 201, "S", 1, done(0xd0, 30), inside(0xd1, 30))}, false},
			},
			changes: []string{"1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa1,
			diagnosis: "rank 2 (node-01 pid 200) is stopped (SIGSTOP?) after allreduce seq 30; ranks 0,1,3 wait in allreduce seq 31 for 2s",
		},
		{
			name: "progress clears the stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{1500 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				// SIGCONT: rank 2 enters the allreduce the others wait in.
				{1750 * time.Millisecond, ring4(1, "R", inside(0xa0, 41), inside(0xc0, 41)), false},
				{2 * time.Second, ring4(1, "R", done(0xa0, 42), done(0xc0, 42)), false},
			},
			changes: []string{"1:declared", "2:cleared: the ranks progress again"},
		},
		{
			name: "the job ending clears the stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{1500 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{2 * time.Second, nil, true},
			},
			changes: []string{"1:declared", "2:cleared: the job is no longer running"},
		},
		{
			name: "a lone rank cannot disagree", threshold: time.Second,
			steps: []stallStep{
				{0, []stallRank{rk(0, "node-00", 1, "T", 1, inside(1, 3))}, false},
				{5 * time.Second, []stallRank{rk(0, "node-00", 1, "T", 1, inside(1, 3))}, false},
			},
		},
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newStallDetector()
			var got []string
			var last *api.Stall
			for i, st := range tc.steps {
				var jobs []stallJob
				if !st.gone {
					jobs = []stallJob{{id: "j-1", attempt: 1, threshold: tc.threshold, ranks: st.ranks}}
				}
				for _, ch := range d.update(t0.Add(st.at), jobs) {
					if ch.cleared {
						got = append(got, fmt.Sprintf("%d:cleared: %s", i, ch.why))
					} else {
						got = append(got, fmt.Sprintf("%d:declared", i))
					}
				}
				if l := d.list(""); len(l) > 0 {
					last = l[0]
				} else {
					last = nil
				}
			}
			if !slices.Equal(got, tc.changes) {
				t.Fatalf("changes %q, want %q", got, tc.changes)
			}
			if tc.diagnosis == "" {
				return
			}
			if last == nil {
				t.Fatal("no stall listed after the last step")
			}
			if last.GetDiagnosis() != tc.diagnosis {
				t.Errorf("diagnosis\n got %q\nwant %q", last.GetDiagnosis(), tc.diagnosis)
			}
			ranks := func(rs []*api.StalledRank) []int32 {
				out := []int32{}
				for _, r := range rs {
					out = append(out, r.GetRank())
				}
				return out
			}
			if got := ranks(last.GetLaggingRanks()); !slices.Equal(got, append([]int32{}, tc.lagging...)) {
				t.Errorf("lagging %v, want %v", got, tc.lagging)
			}
			if got := ranks(last.GetWaitingRanks()); !slices.Equal(got, tc.waiting) {
				t.Errorf("waiting %v, want %v", got, tc.waiting)
			}
			if last.GetComm() != tc.comm || last.GetJob() != "j-1" || last.GetThresholdNs() != int64(tc.threshold) ||
				last.GetSinceUnixNano() != t0.UnixNano() {
				t.Errorf("stall %v", last)
			}
		})
	}
}

// stallServer is a control plane without listeners: real state and store,
// the harness's job manager.
func stallServer(t *testing.T, h *harness, nodes ...string) *Server {
	t.Helper()
	st, err := newState(slog.New(slog.DiscardHandler), h.st, 10, 100)
	if err != nil {
		t.Fatal(err)
	}
	now := h.clock.now()
	for _, n := range nodes {
		if err := st.register(&api.NodeRegistration{Name: n}, "127.0.0.1:1", nil, now); err != nil {
			t.Fatal(err)
		}
		st.nodes[n].session = &nodeSession{name: n}
	}
	return &Server{cfg: Config{Now: h.clock.now}, log: slog.New(slog.DiscardHandler), store: h.st, st: st, jobs: h.m, stalls: newStallDetector()}
}

// report feeds node's telemetry: its ranks of job (rank → pid, proc
// state), each with two communicators created in order (the training one
// at a higher address, so only creation order aligns them), and where
// each rank is on the first: done seq, or inside done+1.
func report(s *Server, node, job string, attempt uint32, now time.Time, ranks map[int32]uint32, state map[int32]string, done map[int32]uint64, in map[int32]bool) {
	t := &api.Telemetry{Ranks: []*api.RankStatus{}, InFlight: []*api.CollectiveRecord{}}
	for rank, pid := range ranks {
		t.Ranks = append(t.Ranks, &api.RankStatus{Job: job, Attempt: attempt, Rank: rank, Pid: pid, ProcState: state[rank]})
		train, ctrl := uint64(0x9000+rank), uint64(0x1000+rank)
		t.Collectives = append(t.Collectives,
			&api.CollectiveRecord{Pid: pid, Op: api.NCCLOp_NCCL_OP_COMM_INIT_RANK, Comm: train, StartUnixNano: 1, DurationNs: 1},
			&api.CollectiveRecord{Pid: pid, Op: api.NCCLOp_NCCL_OP_COMM_INIT_RANK, Comm: ctrl, StartUnixNano: 5, DurationNs: 1},
			&api.CollectiveRecord{Pid: pid, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: ctrl, Seq: 3},
		)
		if done[rank] > 0 {
			t.Collectives = append(t.Collectives, &api.CollectiveRecord{Pid: pid, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: train, Seq: done[rank]})
		}
		if in[rank] {
			t.InFlight = append(t.InFlight, &api.CollectiveRecord{Pid: pid, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: train,
				Seq: done[rank] + 1, InProgress: true})
		}
	}
	s.st.ingest(node, t, now)
}

// TestStallEventsAndJobFlag drives the detector through the server: a
// stopped rank of a running job is declared with an event, Job.stalled
// and one call of the recovery hook; its progress clears all three.
func TestStallEventsAndJobFlag(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	id := h.submit(ringSpec("ring", 2, 2, "stall_threshold: 2s\n"), false)
	h.reconcile()
	h.started(id)
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || len(j.GetPlacement()) != 2 {
		t.Fatalf("job %s not running on two nodes: %v", id, j)
	}
	s := stallServer(t, h, "n0", "n1", "n2")
	hooked := make(chan *api.Stall, 4)
	s.onStall = func(st *api.Stall) { hooked <- st }

	pidOf := map[int32]uint32{}
	nodeOf := map[int32]string{}
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			pidOf[r.GetRank()], nodeOf[r.GetRank()] = r.GetPid(), jn.GetNode()
		}
	}
	feed := func(now time.Time, lagDone uint64, lagState string, lagIn bool) {
		for _, jn := range j.GetPlacement() {
			ranks, state, done, in := map[int32]uint32{}, map[int32]string{}, map[int32]uint64{}, map[int32]bool{}
			for _, r := range jn.GetRanks() {
				ranks[r.GetRank()], state[r.GetRank()], done[r.GetRank()], in[r.GetRank()] = r.GetPid(), "S", 41, true
				if r.GetRank() == 2 {
					state[2], done[2], in[2] = lagState, lagDone, lagIn
				}
			}
			report(s, jn.GetNode(), id, j.GetAttempt(), now, ranks, state, done, in)
		}
	}
	t0 := h.clock.now()
	feed(t0, 41, "T", false)
	s.checkStalls(t0)
	s.checkStalls(t0.Add(time.Second))
	if st, _ := s.Stalls(""); len(st) != 0 || h.job(id).GetStalled() {
		t.Fatalf("declared before the threshold: %v", st)
	}
	s.checkStalls(t0.Add(2100 * time.Millisecond))
	stalls, err := s.Stalls("ring")
	if err != nil {
		t.Fatal(err)
	}
	if len(stalls) != 1 || len(stalls[0].GetLaggingRanks()) != 1 {
		t.Fatalf("stalls %v", stalls)
	}
	lag := stalls[0].GetLaggingRanks()[0]
	if lag.GetRank() != 2 || lag.GetPid() != pidOf[2] || lag.GetNode() != nodeOf[2] || lag.GetSeq() != 41 || lag.GetInCall() {
		t.Errorf("lagging rank %v, want rank 2 pid %d on %s after seq 41", lag, pidOf[2], nodeOf[2])
	}
	// The training communicator (created first) stalls; rank 0's handle names it.
	if stalls[0].GetComm() != 0x9000 {
		t.Errorf("comm %#x, want rank 0's training communicator 0x9000", stalls[0].GetComm())
	}
	if !h.job(id).GetStalled() {
		t.Error("Job.stalled not set")
	}
	select {
	case st := <-hooked:
		if st.GetJob() != id {
			t.Errorf("hook got %v", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("onStall not called")
	}
	s.checkStalls(t0.Add(3 * time.Second))
	if stored, _ := h.st.Job(id); !stored.GetStalled() {
		t.Error("Job.stalled not persisted")
	}

	// SIGCONT: rank 2 enters the allreduce; the stall clears.
	feed(t0.Add(3100*time.Millisecond), 41, "R", true)
	s.checkStalls(t0.Add(3200 * time.Millisecond))
	if st, _ := s.Stalls(""); len(st) != 0 || h.job(id).GetStalled() {
		t.Fatalf("still stalled after progress: %v", st)
	}
	select {
	case st := <-hooked:
		t.Errorf("hook called again: %v", st)
	default:
	}
	evs, err := h.st.Events(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_STALL {
			got = append(got, e.GetSeverity().Short()+" "+e.GetNode()+" "+e.GetMessage())
		}
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "critical "+nodeOf[2]+" NCCL stall: rank 2 ") ||
		!strings.HasPrefix(got[1], "info "+nodeOf[2]+" NCCL stall cleared after 3.2s: the ranks progress again") {
		t.Errorf("stall events:\n%s", strings.Join(got, "\n"))
	}
	if _, err := s.Stalls("no-such-job"); err == nil {
		t.Error("Stalls of an unknown job: no error")
	}
}
