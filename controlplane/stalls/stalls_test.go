package stalls_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/controlplane/stalls"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// ownerSink hands node happenings to the job owner once it exists.
type ownerSink struct {
	mu sync.Mutex
	m  *jobs.Manager
}

func (s *ownerSink) get() *jobs.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

func (s *ownerSink) NodeUp(name string, reg *api.NodeRegistration, joined bool) {
	if m := s.get(); m != nil {
		m.NodeUp(name, reg, joined)
	}
}

func (s *ownerSink) NodeDown(name, reason string) {
	if m := s.get(); m != nil {
		m.NodeDown(name, reason)
	}
}

func (s *ownerSink) NodeEvents(name string, events []*api.Event) {
	if m := s.get(); m != nil {
		m.NodeEvents(name, events)
	}
}

// plane is a control plane without a client API: a real store, node
// registry serving nodemons over loopback QUIC, job owner running its loop
// and the stall detector, all on one injected clock.
type plane struct {
	t     *testing.T
	clock *clock
	st    *store.Bolt
	reg   *nodes.Registry
	jobs  *jobs.Manager
	det   *stalls.Detector
	auth  *transport.Authority
	addr  string
	ctx   context.Context
}

func newPlane(t *testing.T) *plane {
	t.Helper()
	p := &plane{t: t, clock: &clock{t: time.Unix(1_800_000_000, 0)}}
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	p.st = st
	sink := &ownerSink{}
	if p.reg, err = nodes.New(nodes.Config{Store: st, Sink: sink, Now: p.clock.now}); err != nil {
		t.Fatal(err)
	}
	policy, err := scheduler.PolicyByName("fifo")
	if err != nil {
		t.Fatal(err)
	}
	if p.jobs, err = jobs.New(jobs.Config{Store: st, Nodes: p.reg, Policy: policy, Every: 20 * time.Millisecond,
		CheckpointRoot: t.TempDir(), Now: p.clock.now}); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	sink.m = p.jobs
	sink.mu.Unlock()
	p.det = stalls.New(p.jobs, p.reg, nil, p.clock.now, nil)
	if p.auth, err = transport.OpenAuthority(t.TempDir(), transport.AuthorityOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx = ctx
	ln, err := transport.Listen(ctx, "127.0.0.1:0", p.auth, transport.ListenConfig{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.jobs.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.reg.Serve(ctx, conn)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
		st.Close()
	})
	return p
}

// nodemon is a node speaking the protocol by hand: it registers, acks
// every command, reports a pid for every rank it is told to launch, and
// sends the telemetry the test makes up.
type nodemon struct {
	t         *testing.T
	name      string
	conn      *transport.Conn
	telemetry *transport.Stream
	events    *transport.Stream

	mu  sync.Mutex
	seq uint64
}

func (p *plane) startNode(name string, gpus int, rack, sw string) *nodemon {
	t := p.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, _, err := p.auth.CreateToken(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, err := transport.Join(ctx, p.addr, tok, name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := transport.DialNode(ctx, p.addr, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	control, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion()}}}); err != nil {
		t.Fatal(err)
	}
	var m api.ServerMessage
	if err := control.Recv(&m); err != nil || m.GetWelcome().GetError() != "" {
		t.Fatalf("welcome: %v %q", err, m.GetWelcome().GetError())
	}
	reg := &api.NodeRegistration{Name: name, Hostname: name, HeartbeatIntervalMs: 60_000, Labels: map[string]string{"rack": rack, "switch": sw}}
	for i := range gpus {
		reg.Gpus = append(reg.Gpus, &api.GPUInfo{Index: uint32(i), Uuid: fmt.Sprintf("GPU-%s-%d", name, i), Model: "NVIDIA H100 80GB HBM3"})
	}
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg}}); err != nil {
		t.Fatal(err)
	}
	n := &nodemon{t: t, name: name, conn: conn, seq: m.GetWelcome().GetLastEventSeq()}
	if n.telemetry, err = conn.OpenStream(ctx, transport.StreamTelemetry); err != nil {
		t.Fatal(err)
	}
	if n.events, err = conn.OpenStream(ctx, transport.StreamEvents); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Event acks: nothing to keep, the test reads the store.
		for {
			var ack api.ServerMessage
			if n.events.Recv(&ack) != nil {
				return
			}
		}
	}()
	go n.serveCommands(control)
	poll(t, name+" registered", func() error {
		if !p.reg.Connected(name) {
			return fmt.Errorf("not connected")
		}
		return nil
	})
	return n
}

// serveCommands acks every command; a launch's ranks start with pid
// 1000+rank.
func (n *nodemon) serveCommands(control *transport.Stream) {
	for {
		var m api.ServerMessage
		if err := control.Recv(&m); err != nil {
			return
		}
		c := m.GetCommand()
		if c == nil {
			continue
		}
		if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: &api.CommandAck{Id: c.GetId()}}}); err != nil {
			return
		}
		if l := c.GetLaunch(); l != nil {
			for _, r := range l.GetRanks() {
				n.event(&api.Event{Kind: api.EventKind_EVENT_KIND_JOB, Job: l.GetJob(), Rank: r.GetRank(), Pid: 1000 + uint32(r.GetRank()),
					Message: fmt.Sprintf("rank %d started", r.GetRank())})
			}
		}
	}
}

func (n *nodemon) event(e *api.Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	e.Seq, e.Node, e.TimeUnixNano = n.seq, n.name, time.Now().UnixNano()
	n.events.Send(&api.AgentMessage{Body: &api.AgentMessage_Event{Event: e}})
}

// report sends the node's telemetry: its ranks of job (rank → pid, proc
// state), each with two communicators created in order (the training one
// at a higher address, so only creation order aligns them), and where
// each rank is on the first: done seq, or inside done+1.
func (n *nodemon) report(job string, attempt uint32, ranks map[int32]uint32, state map[int32]string, done map[int32]uint64, in map[int32]bool) {
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
	if err := n.telemetry.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: t}}); err != nil {
		n.t.Fatal(err)
	}
}

func poll(t *testing.T, what string, ok func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ok()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *plane) job(id string) *api.Job {
	p.t.Helper()
	j, err := p.jobs.Lookup(id)
	if err != nil {
		p.t.Fatal(err)
	}
	return j
}

func (p *plane) pass(at time.Time) {
	p.t.Helper()
	p.clock.set(at)
	if err := p.det.Pass(context.Background()); err != nil {
		p.t.Fatal(err)
	}
}

func (p *plane) events(kind api.EventKind, job string) []*api.Event {
	p.t.Helper()
	evs, err := p.st.Events(store.EventFilter{})
	if err != nil {
		p.t.Fatal(err)
	}
	var out []*api.Event
	for _, e := range evs {
		if e.GetKind() == kind && e.GetJob() == job {
			out = append(out, e)
		}
	}
	return out
}

// TestStallEventsAndJobFlag drives the detector over a real registry fed
// by nodemons' telemetry and the real job owner: a stopped rank of a
// running job is declared, with an event and Job.stalled (stored), and
// either advice (stall_recovery manual) or a recovery without the lagging
// node (auto), once; progress, or the job no longer running, clears it.
func TestStallEventsAndJobFlag(t *testing.T) {
	for _, mode := range []string{"manual", "auto"} {
		t.Run(mode, func(t *testing.T) {
			p := newPlane(t)
			nms := map[string]*nodemon{}
			for i, rack := range []string{"r0", "r0", "r1"} {
				name := fmt.Sprintf("n%d", i)
				nms[name] = p.startNode(name, 4, rack, "s"+rack[1:])
			}
			spec := "name: ring\ncommand: [/bin/true]\nnodes: 2\ngpus_per_node: 2\nstall_threshold: 2s\nrestart_policy: replace-node\nstall_recovery: " + mode + "\n"
			r, err := p.jobs.Submit(context.Background(), &api.SubmitJobRequest{SpecYaml: spec, Source: "test.yaml"}, "admin")
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetJob().GetId()
			var j *api.Job
			poll(t, "job running on two nodes with pids", func() error {
				j = p.job(id)
				if j.GetState() != api.JobState_JOB_STATE_RUNNING || len(j.GetPlacement()) != 2 {
					return fmt.Errorf("state %s on %d nodes (%s%s)", j.GetState(), len(j.GetPlacement()), j.GetReason(), j.GetPendingReason())
				}
				for _, jn := range j.GetPlacement() {
					for _, r := range jn.GetRanks() {
						if r.GetPid() == 0 {
							return fmt.Errorf("rank %d has no pid yet", r.GetRank())
						}
					}
				}
				return nil
			})
			pidOf := map[int32]uint32{}
			nodeOf := map[int32]string{}
			for _, jn := range j.GetPlacement() {
				for _, r := range jn.GetRanks() {
					pidOf[r.GetRank()], nodeOf[r.GetRank()] = r.GetPid(), jn.GetNode()
				}
			}
			// feed reports every rank inside allreduce 42 of the training
			// communicator, but rank 2 as told, and waits until the
			// registry shows it.
			feed := func(lagDone uint64, lagState string, lagIn bool) {
				t.Helper()
				for _, jn := range j.GetPlacement() {
					ranks, state, done, in := map[int32]uint32{}, map[int32]string{}, map[int32]uint64{}, map[int32]bool{}
					for _, r := range jn.GetRanks() {
						ranks[r.GetRank()], state[r.GetRank()], done[r.GetRank()], in[r.GetRank()] = r.GetPid(), "S", 41, true
						if r.GetRank() == 2 {
							state[2], done[2], in[2] = lagState, lagDone, lagIn
						}
					}
					nms[jn.GetNode()].report(id, j.GetAttempt(), ranks, state, done, in)
				}
				poll(t, "telemetry applied", func() error {
					rps := p.reg.Progress(map[string]uint32{id: j.GetAttempt()})[id]
					if len(rps) != 4 {
						return fmt.Errorf("%d ranks in progress", len(rps))
					}
					for _, rp := range rps {
						if rp.Status.GetRank() != 2 {
							continue
						}
						if rp.Status.GetProcState() != lagState {
							return fmt.Errorf("rank 2 is %q", rp.Status.GetProcState())
						}
						for _, c := range rp.Comms {
							if c.Handle == 0x9002 && (c.In != nil) == lagIn && c.Done == lagDone {
								return nil
							}
						}
					}
					return fmt.Errorf("rank 2's training communicator not as reported yet")
				})
			}
			t0 := p.clock.now()
			feed(41, "T", false)
			p.pass(t0)
			p.pass(t0.Add(time.Second))
			if st := p.det.List(""); len(st) != 0 || p.job(id).GetStalled() {
				t.Fatalf("declared before the threshold: %v", st)
			}
			p.pass(t0.Add(2100 * time.Millisecond))
			listed := p.det.List(id)
			if len(listed) != 1 || len(listed[0].GetLaggingRanks()) != 1 {
				t.Fatalf("stalls %v", listed)
			}
			lag := listed[0].GetLaggingRanks()[0]
			if lag.GetRank() != 2 || lag.GetPid() != pidOf[2] || lag.GetNode() != nodeOf[2] || lag.GetSeq() != 41 || lag.GetInCall() {
				t.Errorf("lagging rank %v, want rank 2 pid %d on %s after seq 41", lag, pidOf[2], nodeOf[2])
			}
			// The training communicator (created first) stalls; rank 0's handle names it.
			if listed[0].GetComm() != 0x9000 {
				t.Errorf("comm %#x, want rank 0's training communicator 0x9000", listed[0].GetComm())
			}
			// Listed only once stored: the event and the job's flag are
			// there when the pass returns.
			if got := p.job(id); !got.GetStalled() && mode == "manual" {
				t.Error("Job.stalled not set")
			}
			if stored, _ := p.st.Job(id); !stored.GetStalled() {
				t.Error("Job.stalled not persisted")
			}
			if evs := p.events(api.EventKind_EVENT_KIND_STALL, id); len(evs) != 1 {
				t.Errorf("%d stall events stored when the stall is listed, want 1", len(evs))
			}

			if mode == "auto" {
				// Auto recovery: the job restarts without the lagging node,
				// and the stall ends with the attempt.
				poll(t, "recovering without the lagging node", func() error {
					got := p.job(id)
					if got.GetState() != api.JobState_JOB_STATE_RECOVERING || !slices.Equal(got.GetExclude(), []string{nodeOf[2]}) ||
						!strings.Contains(got.GetReason(), "NCCL stall on communicator 0x9000, lagging nodes "+nodeOf[2]) {
						return fmt.Errorf("%s exclude %v (%s)", got.GetState(), got.GetExclude(), got.GetReason())
					}
					return nil
				})
				p.pass(t0.Add(3 * time.Second))
				if st := p.det.List(""); len(st) != 0 || p.job(id).GetStalled() {
					t.Fatalf("still stalled once the job stopped running: %v", st)
				}
				var detected int
				for _, e := range p.events(api.EventKind_EVENT_KIND_RECOVERY, id) {
					if strings.HasPrefix(e.GetMessage(), "failure detected") {
						detected++
					}
				}
				if detected != 1 {
					t.Errorf("%d recoveries started, want one", detected)
				}
				got := stallEvents(p, id)
				if len(got) != 2 || !strings.HasPrefix(got[0], "critical "+nodeOf[2]+" NCCL stall: rank 2 ") ||
					!strings.HasPrefix(got[1], "info "+nodeOf[2]+" NCCL stall cleared after 3s: the job is no longer running") {
					t.Errorf("stall events:\n%s", strings.Join(got, "\n"))
				}
				return
			}

			p.pass(t0.Add(3 * time.Second))
			if st := p.det.List(id); len(st) != 1 || !p.job(id).GetStalled() {
				t.Fatalf("a stall still in place: listed %v, stalled %v", st, p.job(id).GetStalled())
			}
			advice := p.events(api.EventKind_EVENT_KIND_RECOVERY, id)
			if len(advice) != 1 || !strings.Contains(advice[0].GetMessage(), "stall_recovery is manual: `gpuctl restart "+id+" --exclude NODE`") {
				t.Errorf("advice %v, want one recovery event", advice)
			}
			if got := p.job(id).GetState(); got != api.JobState_JOB_STATE_RUNNING {
				t.Errorf("manual stall recovery changed the job: %s", got)
			}

			// SIGCONT: rank 2 enters the allreduce; the stall clears.
			feed(41, "R", true)
			p.pass(t0.Add(3200 * time.Millisecond))
			if st := p.det.List(""); len(st) != 0 || p.job(id).GetStalled() {
				t.Fatalf("still stalled after progress: %v", st)
			}
			if stored, _ := p.st.Job(id); stored.GetStalled() {
				t.Error("cleared Job.stalled not persisted")
			}
			if n := len(p.events(api.EventKind_EVENT_KIND_RECOVERY, id)); n != 1 {
				t.Errorf("%d recovery events, want the one advice", n)
			}
			got := stallEvents(p, id)
			if len(got) != 2 || !strings.HasPrefix(got[0], "critical "+nodeOf[2]+" NCCL stall: rank 2 ") ||
				!strings.HasPrefix(got[1], "info "+nodeOf[2]+" NCCL stall cleared after 3.2s: the ranks progress again") {
				t.Errorf("stall events:\n%s", strings.Join(got, "\n"))
			}
		})
	}
}

func stallEvents(p *plane, id string) []string {
	var out []string
	for _, e := range p.events(api.EventKind_EVENT_KIND_STALL, id) {
		out = append(out, e.GetSeverity().Short()+" "+e.GetNode()+" "+e.GetMessage())
	}
	return out
}
