package jobs

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
	predictor "github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/store"
)

// fakeNodes stands in for the node registry and the nodemons behind it: it
// serves node statuses and rank reports, records every command and cordon,
// and can refuse launches on chosen nodes. At each command it reads what
// the store holds, so tests can assert persist-before-act.
type fakeNodes struct {
	mu      sync.Mutex
	nodes   []*api.NodeStatus
	ranks   []nodes.NodeRanks
	cmds    []sentCmd
	cordons []string
	refuse  map[string]string
	// jobFault refuses launches on chosen nodes as nodemon refuses a
	// job's own mistake (a command it cannot find).
	jobFault map[string]string
	// nodePolicy refuses launches on chosen nodes as nodemon refuses by
	// its own policy (root ranks without --allow-root-ranks).
	nodePolicy map[string]string
	storeAt    func(job string) *api.Job
	// suspects: a suspicion (nodes.ActionSuspect) marks the node suspect
	// for a minute instead of cordoning it, and ActionVouch lifts it;
	// actions lists every cordon action as "action node".
	suspects bool
	now      func() time.Time
	actions  []string
	// deaf nodes answer no command, as nodes gone for good.
	deaf map[string]bool
}

type sentCmd struct {
	node string
	cmd  *api.Command
	// stored is the job's record in the store when the command went out.
	stored *api.Job
}

func (f *fakeNodes) Nodes() []*api.NodeStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.nodes)
}

func (f *fakeNodes) Ranks(job string) []nodes.NodeRanks {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []nodes.NodeRanks
	for _, nr := range f.ranks {
		keep := nodes.NodeRanks{Node: nr.Node}
		for _, r := range nr.Ranks {
			if job == "" || r.GetJob() == job {
				keep.Ranks = append(keep.Ranks, r)
			}
		}
		if len(keep.Ranks) > 0 {
			out = append(out, keep)
		}
	}
	return out
}

func (f *fakeNodes) Command(_ context.Context, node string, c *api.Command) (*api.CommandAck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var job string
	switch b := c.Body.(type) {
	case *api.Command_Launch:
		job = b.Launch.GetJob()
	case *api.Command_Signal:
		job = b.Signal.GetJob()
	}
	sc := sentCmd{node: node, cmd: c}
	if f.storeAt != nil {
		sc.stored = f.storeAt(job)
	}
	f.cmds = append(f.cmds, sc)
	if f.deaf[node] {
		return nil, fmt.Errorf("node %s is not connected", node)
	}
	if msg := f.refuse[node]; msg != "" && c.GetLaunch() != nil {
		return nil, fmt.Errorf("node %s: %s", node, msg)
	}
	if msg := f.jobFault[node]; msg != "" && c.GetLaunch() != nil {
		return nil, &nodes.CommandError{Node: node, Msg: msg, JobFault: true}
	}
	if msg := f.nodePolicy[node]; msg != "" && c.GetLaunch() != nil {
		return nil, &nodes.CommandError{Node: node, Msg: msg, NodeRefused: true}
	}
	return &api.CommandAck{Id: c.GetId()}, nil
}

// SetCordon cordons the fake node as the registry would: flags and reason
// on a new status, liveness untouched.
func (f *fakeNodes) SetCordon(node, action, reason string) (*api.NodeStatus, error) {
	var out *api.NodeStatus
	f.mu.Lock()
	suspects := f.suspects
	f.actions = append(f.actions, action+" "+node)
	f.mu.Unlock()
	found := f.update(node, func(n *api.NodeStatus) {
		switch {
		case suspects && action == nodes.ActionSuspect:
			n.SuspectUntilUnixNano, n.SuspectReason = f.now().Add(time.Minute).UnixNano(), reason
		case suspects && action == nodes.ActionVouch:
			n.SuspectUntilUnixNano, n.SuspectReason = 0, ""
		case action == nodes.ActionUncordon:
			n.Cordoned, n.Draining, n.CordonReason = false, false, ""
		default:
			n.Cordoned, n.Draining, n.CordonReason = true, action == nodes.ActionDrain, reason
		}
		out = n
	})
	if !found {
		return nil, fmt.Errorf("unknown node %q", node)
	}
	f.mu.Lock()
	f.cordons = append(f.cordons, node)
	f.mu.Unlock()
	return out, nil
}

// update replaces node's status with a changed copy (statuses handed out
// are never modified, as the registry's are not) and reports whether the
// node is known.
func (f *fakeNodes) update(node string, fn func(n *api.NodeStatus)) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, n := range f.nodes {
		if n.GetRegistration().GetName() == node {
			next := proto.Clone(n).(*api.NodeStatus)
			fn(next)
			f.nodes[i] = next
			return true
		}
	}
	return false
}

func (f *fakeNodes) setRanks(nrs []nodes.NodeRanks) {
	f.mu.Lock()
	f.ranks = nrs
	f.mu.Unlock()
}

func (f *fakeNodes) cordoned() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cordons)
}

// take returns and forgets the commands sent so far.
func (f *fakeNodes) take() []sentCmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.cmds
	f.cmds = nil
	return out
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// nodeSpec builds a node status: n GPUs, labels "rack/switch".
func nodeSpec(name string, n int, rack, sw string, st api.NodeState, connected bool) *api.NodeStatus {
	ns := &api.NodeStatus{
		Registration: &api.NodeRegistration{Name: name, Hostname: name + ".local", Labels: map[string]string{"rack": rack, "switch": sw}},
		State:        st, Connected: connected, RemoteAddr: "127.0.0.1:4" + strings.TrimPrefix(name, "n"),
	}
	for i := range n {
		ns.Gpus = append(ns.Gpus, &api.GPUStatus{Healthy: true,
			Info: &api.GPUInfo{Index: uint32(i), Uuid: fmt.Sprintf("GPU-%s-%d", name, i), Model: "NVIDIA H100 80GB HBM3"}})
	}
	return ns
}

func readyNode(name string, n int, rack, sw string) *api.NodeStatus {
	return nodeSpec(name, n, rack, sw, api.NodeState_NODE_STATE_READY, true)
}

// cordonedNode is a ready, connected node an operator cordoned.
func cordonedNode(name string, n int, rack, sw string) *api.NodeStatus {
	ns := readyNode(name, n, rack, sw)
	ns.Cordoned = true
	return ns
}

// harness steps a job owner by hand over a real store, the fake nodes and
// an injected clock; commands run inline and every transition is checked
// against the lifecycle table.
type harness struct {
	t     *testing.T
	m     *Manager
	nodes *fakeNodes
	clock *clock
	db    string
	st    *store.Bolt
	ckpt  string
	// lease is the owner's Config.Lease (0: no fencing waits).
	lease time.Duration
	// runtimes is the owner's Config.Runtimes.
	runtimes *predictor.Model
	// hetero, when set, adds type allocation to the policy.
	hetero scheduler.Objective
}

func newHarness(t *testing.T, policy string, nodes ...*api.NodeStatus) *harness {
	t.Helper()
	h := &harness{t: t, nodes: &fakeNodes{nodes: nodes, refuse: map[string]string{}},
		clock: &clock{t: time.Unix(1_800_000_000, 0)}, db: filepath.Join(t.TempDir(), "state.db"), ckpt: t.TempDir()}
	h.open(policy)
	return h
}

// open (re)starts the owner over the harness's store file.
func (h *harness) open(policy string) {
	h.t.Helper()
	st, err := store.OpenBolt(h.db)
	if err != nil {
		h.t.Fatal(err)
	}
	h.st = st
	h.t.Cleanup(func() { st.Close() })
	p, err := scheduler.PolicyByName(policy)
	if err != nil {
		h.t.Fatal(err)
	}
	if h.hetero != "" {
		p = scheduler.WithHetero(p, h.hetero)
	}
	h.nodes.mu.Lock()
	h.nodes.storeAt = func(job string) *api.Job {
		j, err := st.Job(job)
		if err != nil {
			return nil
		}
		return j
	}
	h.nodes.mu.Unlock()
	m, err := New(Config{Store: st, Nodes: h.nodes, Policy: p, CheckpointRoot: h.ckpt, KillAfter: 30 * time.Second,
		MoveGrace: time.Minute, Now: h.clock.now, Lease: h.lease, Runtimes: h.runtimes})
	if err != nil {
		h.t.Fatal(err)
	}
	m.disp.sync = true
	m.strict = true
	h.m = m
}

// restart closes the store and opens a new owner over the same file.
func (h *harness) restart(policy string) {
	h.t.Helper()
	if err := h.st.Close(); err != nil {
		h.t.Fatal(err)
	}
	h.open(policy)
}

// queued reports how many messages wait in the owner's inbox.
func (h *harness) queued() int {
	h.m.in.mu.Lock()
	defer h.m.in.mu.Unlock()
	return len(h.m.in.q)
}

// settle steps the owner until its inbox is empty.
func (h *harness) settle() {
	h.t.Helper()
	for i := 0; ; i++ {
		if i > 1000 {
			h.t.Fatal("the job owner keeps posting to itself")
		}
		h.m.step(false)
		if h.queued() == 0 {
			return
		}
	}
}

// reconcile runs one scheduling pass, then applies what it caused.
func (h *harness) reconcile() {
	h.t.Helper()
	h.m.step(true)
	h.settle()
}

// call makes a request the way a client does, stepping the owner until
// it answers.
func (h *harness) call(fn func(ctx context.Context) (any, error)) (any, error) {
	h.t.Helper()
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(context.Background())
		done <- result{v, err}
	}()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-done:
			h.settle()
			return r.v, r.err
		case <-h.m.in.sig:
			h.m.step(false)
		case <-timeout:
			h.t.Fatal("no answer from the job owner within 10s")
		}
	}
}

func (h *harness) submitReq(req *api.SubmitJobRequest) (*api.SubmitJobResponse, error) {
	h.t.Helper()
	v, err := h.call(func(ctx context.Context) (any, error) { return h.m.Submit(ctx, req, jobspec.RoleAdmin) })
	r, _ := v.(*api.SubmitJobResponse)
	return r, err
}

func (h *harness) submit(spec string, hold bool) string {
	h.t.Helper()
	r, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: spec, Source: "test.yaml", Hold: hold})
	if err != nil {
		h.t.Fatal(err)
	}
	h.clock.add(time.Second)
	return r.GetJob().GetId()
}

// jobCall runs a request that answers with a job.
func (h *harness) jobCall(fn func(ctx context.Context) (*api.Job, error)) (*api.Job, error) {
	h.t.Helper()
	v, err := h.call(func(ctx context.Context) (any, error) { return fn(ctx) })
	j, _ := v.(*api.Job)
	return j, err
}

func (h *harness) cancel(key, who string) (*api.Job, error) {
	return h.jobCall(func(ctx context.Context) (*api.Job, error) { return h.m.Cancel(ctx, key, who) })
}

func (h *harness) assign(key string, nodes []string) (*api.Job, error) {
	return h.jobCall(func(ctx context.Context) (*api.Job, error) { return h.m.Assign(ctx, key, nodes) })
}

func (h *harness) release(key string) (*api.Job, error) {
	return h.jobCall(func(ctx context.Context) (*api.Job, error) { return h.m.Release(ctx, key) })
}

func (h *harness) restartJob(key, from string, exclude []string, who string) (*api.Job, error) {
	return h.jobCall(func(ctx context.Context) (*api.Job, error) { return h.m.Restart(ctx, key, from, exclude, who) })
}

func (h *harness) checkpointJob(key string) (*api.Job, error) {
	return h.jobCall(func(ctx context.Context) (*api.Job, error) { return h.m.Checkpoint(ctx, key) })
}

func (h *harness) rebalance(req *api.RebalanceRequest) (*api.RebalanceResponse, error) {
	h.t.Helper()
	v, err := h.call(func(ctx context.Context) (any, error) { return h.m.Rebalance(ctx, req) })
	r, _ := v.(*api.RebalanceResponse)
	return r, err
}

func (h *harness) drain(node string) []*api.DrainedJob {
	h.t.Helper()
	v, err := h.call(func(ctx context.Context) (any, error) { return h.m.Drain(ctx, node) })
	if err != nil {
		h.t.Fatal(err)
	}
	return v.([]*api.DrainedJob)
}

// event delivers node events as the registry does once it stored them.
func (h *harness) event(node string, events ...*api.Event) {
	h.t.Helper()
	for _, e := range events {
		e.Node = node
	}
	h.m.NodeEvents(node, events)
	h.settle()
}

func (h *harness) nodeDown(node, reason string) {
	h.t.Helper()
	h.m.NodeDown(node, reason)
	h.settle()
}

func (h *harness) nodeUp(node string, reg *api.NodeRegistration) {
	h.t.Helper()
	h.m.NodeUp(node, reg, false)
	h.settle()
}

// job returns the committed job named by id (or name).
func (h *harness) job(id string) *api.Job {
	h.t.Helper()
	js, err := h.m.List(id)
	if err != nil || len(js) != 1 {
		h.t.Fatalf("job %s: %d matches (%v)", id, len(js), err)
	}
	return js[0]
}

// started reports a pid for every rank of the job, as nodemon would.
func (h *harness) started(id string) {
	h.t.Helper()
	for _, jn := range h.job(id).GetPlacement() {
		for _, r := range jn.GetRanks() {
			h.event(jn.GetNode(), &api.Event{Kind: api.EventKind_EVENT_KIND_JOB, Job: id, Rank: r.GetRank(), Pid: 1000 + uint32(r.GetRank())})
		}
	}
}

func (h *harness) exit(id, node string, rank int32, code int32, sig string) {
	h.t.Helper()
	r := findRank(h.job(id), node, rank)
	if r == nil {
		h.t.Fatalf("job %s has no rank %d on %s", id, rank, node)
	}
	h.event(node, &api.Event{Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Job: id, Rank: rank, Pid: r.GetPid(), ExitCode: code, Signal: sig})
}

func (h *harness) exitAll(id string, code int32) {
	h.t.Helper()
	for _, jn := range h.job(id).GetPlacement() {
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				h.exit(id, jn.GetNode(), r.GetRank(), code, "")
			}
		}
	}
}

// checkpointed reports a completed checkpoint of step as nodemon does: an
// event for rank 0 from the node running it, with the attempt.
func (h *harness) checkpointed(id string, step int64) {
	h.t.Helper()
	j := h.job(id)
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetRank() == 0 {
				h.event(jn.GetNode(), &api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: id, Rank: 0, Step: step,
					Attrs:   map[string]string{"attempt": fmt.Sprint(j.GetAttempt())},
					Message: fmt.Sprintf("checkpoint of job %s at step %d completed", id, step)})
				return
			}
		}
	}
	h.t.Fatalf("job %s has no rank 0", id)
}

func nodesOf(j *api.Job) []string {
	var out []string
	for _, jn := range j.GetPlacement() {
		out = append(out, jn.GetNode())
	}
	return out
}

func signals(cmds []sentCmd) []string {
	var out []string
	for _, c := range cmds {
		if s := c.cmd.GetSignal(); s != nil {
			out = append(out, c.node+":"+s.GetSignal())
		}
	}
	slices.Sort(out)
	return out
}

func launches(cmds []sentCmd) []sentCmd {
	var out []sentCmd
	for _, c := range cmds {
		if c.cmd.GetLaunch() != nil {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b sentCmd) int { return strings.Compare(a.node, b.node) })
	return out
}

func ringSpec(name string, nodes, perNode int, extra string) string {
	return fmt.Sprintf("name: %s\ncommand: [/bin/true, --steps, \"5\"]\nnodes: %d\ngpus_per_node: %d\n%s", name, nodes, perNode, extra)
}

func threeNodes() []*api.NodeStatus {
	return []*api.NodeStatus{readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r1", "s1")}
}

func TestSnapshotBuilder(t *testing.T) {
	unhealthy := readyNode("n3", 2, "r1", "s1")
	unhealthy.Gpus[1].Healthy = false
	unhealthy.Gpus[0].Last = &api.GPUSample{Processes: []*api.GPUProcess{{Pid: 999, Name: "python"}}}
	h := newHarness(t, "fifo",
		readyNode("n0", 2, "r0", "s0"),
		nodeSpec("n1", 2, "r0", "s0", api.NodeState_NODE_STATE_READY, false),
		cordonedNode("n2", 2, "r1", "s1"),
		unhealthy,
		nodeSpec("n4", 2, "r1", "s1", api.NodeState_NODE_STATE_DOWN, false),
	)
	run := h.submit(ringSpec("run", 1, 2, ""), false)
	held := h.submit(ringSpec("held", 1, 2, ""), true)
	waiting := h.submit(ringSpec("wait", 2, 2, ""), false)
	h.reconcile()
	if got := h.job(run).GetState(); got != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("run is %s", stateName(got))
	}
	snap := h.m.placer.snapshot(h.clock.now())

	byName := map[string]scheduler.Node{}
	for _, n := range snap.Nodes {
		byName[n.Name] = n
	}
	cases := []struct {
		node    string
		state   scheduler.NodeState
		healthy []bool
		jobs    []string
	}{
		{"n0", scheduler.NodeReady, []bool{true, true}, []string{run, run}},
		{"n1", scheduler.NodeDown, []bool{true, true}, []string{"", ""}},
		{"n2", scheduler.NodeCordoned, []bool{true, true}, []string{"", ""}},
		{"n3", scheduler.NodeReady, []bool{true, false}, []string{unmanaged, ""}},
		{"n4", scheduler.NodeDown, []bool{true, true}, []string{"", ""}},
	}
	for _, c := range cases {
		t.Run(c.node, func(t *testing.T) {
			n, ok := byName[c.node]
			if !ok {
				t.Fatal("missing from the snapshot")
			}
			if n.State != c.state {
				t.Errorf("state %s, want %s", n.State, c.state)
			}
			if n.GPUModel != "h100" || n.Rack() == "" || n.Switch() == "" {
				t.Errorf("model %q rack %q switch %q", n.GPUModel, n.Rack(), n.Switch())
			}
			for i, g := range n.GPUs {
				if g.Healthy != c.healthy[i] || g.Job != c.jobs[i] {
					t.Errorf("gpu %d: healthy %v job %q, want %v %q", i, g.Healthy, g.Job, c.healthy[i], c.jobs[i])
				}
			}
		})
	}
	if len(snap.Running) != 1 || snap.Running[0].Request.ID != run || len(snap.Running[0].Placement.Ranks) != 2 {
		t.Errorf("running = %+v", snap.Running)
	}
	if len(snap.Pending) != 1 || snap.Pending[0].ID != waiting || snap.Pending[0].GPUsPerNode != 2 {
		t.Errorf("pending = %+v (the held %s must stay out)", snap.Pending, held)
	}

	// Exited ranks free their GPUs.
	h.started(run)
	h.exitAll(run, 0)
	snap = h.m.placer.snapshot(h.clock.now())
	for _, n := range snap.Nodes {
		for _, g := range n.GPUs {
			if g.Job != "" && g.Job != unmanaged {
				t.Errorf("%s gpu %d still held by %s after every rank exited", n.Name, g.Index, g.Job)
			}
		}
	}
}

func TestStartPersistsThenLaunches(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	id := h.submit(ringSpec("ring", 2, 2, "env: {FOO: bar}\n"), false)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 1 {
		t.Fatalf("state %s attempt %d", stateName(j.GetState()), j.GetAttempt())
	}
	ls := launches(h.nodes.take())
	if len(ls) != 2 {
		t.Fatalf("%d launches, want 2", len(ls))
	}
	ranks := map[int32]bool{}
	nodeRanks := map[int32]bool{}
	for _, c := range ls {
		l := c.cmd.GetLaunch()
		if c.stored.GetState() != api.JobState_JOB_STATE_RUNNING || c.stored.GetAttempt() != 1 || len(c.stored.GetPlacement()) != 2 {
			t.Errorf("launch to %s went out before the placement was persisted: stored %v", c.node, c.stored)
		}
		if l.GetWorldSize() != 4 || l.GetAttempt() != 1 || l.GetMasterAddr() != "127.0.0.1" || l.GetEnv()["FOO"] != "bar" {
			t.Errorf("launch to %s: %v", c.node, l)
		}
		if p := l.GetMasterPort(); p < 29500 || p >= 30500 || p != j.GetMasterPort() {
			t.Errorf("master port %d", p)
		}
		if l.GetCheckpointDir() != filepath.Join(h.ckpt, id) || l.GetResumeStep() != 0 {
			t.Errorf("checkpoint dir %q resume %d", l.GetCheckpointDir(), l.GetResumeStep())
		}
		if len(l.GetRanks()) != 2 {
			t.Errorf("%s got %d ranks", c.node, len(l.GetRanks()))
		}
		for i, r := range l.GetRanks() {
			ranks[r.GetRank()] = true
			if r.GetLocalRank() != int32(i) || len(r.GetGpus()) != 1 {
				t.Errorf("%s rank %v", c.node, r)
			}
		}
		// Each node learns its place among the job's nodes (NODE_RANK).
		nodeRanks[l.GetNodeRank()] = true
		if l.GetNumNodes() != 2 {
			t.Errorf("%s: num nodes %d, want 2", c.node, l.GetNumNodes())
		}
	}
	if len(ranks) != 4 {
		t.Errorf("ranks launched: %v", ranks)
	}
	if !nodeRanks[0] || !nodeRanks[1] {
		t.Errorf("node ranks launched: %v, want 0 and 1", nodeRanks)
	}
	// Both nodes of the job share a switch: the placer packs them.
	if got := nodesOf(j); !slices.Equal(got, []string{"n0", "n1"}) {
		t.Errorf("placed on %v, want n0,n1", got)
	}
	// The port is a function of job and attempt.
	if again := h.m.launcher.port(id, 1); again != j.GetMasterPort() {
		t.Errorf("port %d then %d for the same attempt", j.GetMasterPort(), again)
	}
}

func TestExitTransitions(t *testing.T) {
	// restart_policy none: failures are final (recovery has its own tests).
	const noRestart = " (not restarted: restart_policy is none)"
	cases := []struct {
		name   string
		act    func(h *harness, id string)
		want   api.JobState
		reason string
		// signals expected to reach the other ranks
		term []string
	}{
		{"all exit 0", func(h *harness, id string) { h.exitAll(id, 0) }, api.JobState_JOB_STATE_SUCCEEDED, "all 4 ranks exited with code 0", nil},
		{"one exits 1", func(h *harness, id string) { h.exit(id, "n1", 3, 1, "") }, api.JobState_JOB_STATE_FAILED,
			"rank 3 on n1 (pid 1003) exited with code 1" + noRestart, []string{"n0:SIGTERM", "n1:SIGTERM"}},
		{"one killed", func(h *harness, id string) { h.exit(id, "n0", 0, -1, "SIGKILL") }, api.JobState_JOB_STATE_FAILED,
			"rank 0 on n0 (pid 1000) was killed by SIGKILL" + noRestart, []string{"n0:SIGTERM", "n1:SIGTERM"}},
		{"node down", func(h *harness, id string) {
			h.nodes.update("n1", func(n *api.NodeStatus) {
				n.State, n.Connected, n.Stale, n.DownReason = api.NodeState_NODE_STATE_DOWN, false, true, "no heartbeat for 3s"
			})
			h.nodeDown("n1", "no heartbeat for 3s")
		},
			api.JobState_JOB_STATE_FAILED, "node n1 went down (no heartbeat for 3s)" + noRestart, []string{"n0:SIGTERM"}},
		{"stale pid ignored", func(h *harness, id string) {
			h.event("n0", &api.Event{Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Job: id, Rank: 0, Pid: 77, ExitCode: 1})
		}, api.JobState_JOB_STATE_RUNNING, "attempt 1 started on n0,n1", nil},
		{"other job ignored", func(h *harness, id string) {
			h.event("n0", &api.Event{Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Job: "demo", Rank: 0, Pid: 1000, ExitCode: 1})
		}, api.JobState_JOB_STATE_RUNNING, "attempt 1 started on n0,n1", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
			id := h.submit(ringSpec("ring", 2, 2, "restart_policy: none\n"), false)
			h.reconcile()
			h.started(id)
			h.nodes.take()
			c.act(h, id)
			j := h.job(id)
			if j.GetState() != c.want || j.GetReason() != c.reason {
				t.Fatalf("state %s reason %q, want %s %q", stateName(j.GetState()), j.GetReason(), stateName(c.want), c.reason)
			}
			h.reconcile()
			if got := signals(h.nodes.take()); !slices.Equal(got, c.term) {
				t.Errorf("signals %v, want %v", got, c.term)
			}
			if c.name == "node down" {
				// The node returns: leftovers of the failed job are killed
				// there, and GPUs still showing them count as busy.
				h.nodes.update("n1", func(n *api.NodeStatus) {
					n.State, n.Connected, n.Stale, n.DownReason = api.NodeState_NODE_STATE_READY, true, false, ""
				})
				h.nodeUp("n1", &api.NodeRegistration{Name: "n1"})
				if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n1:SIGKILL"}) {
					t.Errorf("on return: signals %v", got)
				}
				h.nodes.update("n1", func(n *api.NodeStatus) {
					n.Gpus[0].Last = &api.GPUSample{Processes: []*api.GPUProcess{{Pid: 1002}}}
				})
				snap := h.m.placer.snapshot(h.clock.now())
				if g := snap.Nodes[1].GPUs[0]; g.Job != unmanaged {
					t.Errorf("GPU 0 of n1 still runs a lost rank but is held by %q", g.Job)
				}
			}
			if c.want == api.JobState_JOB_STATE_FAILED {
				h.exitAll(id, -1)
				h.reconcile()
				if j := h.job(id); j.GetStopping() != api.JobStop_JOB_STOP_NONE || j.GetState() != api.JobState_JOB_STATE_FAILED {
					t.Errorf("after the rest exited: state %s stopping %s", stateName(j.GetState()), j.GetStopping())
				}
			}
		})
	}
}

func TestLaunchRefusedFailsJob(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	h.nodes.refuse["n1"] = `command "/bin/true" not found`
	id := h.submit(ringSpec("ring", 2, 2, ""), false)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), `launch failed on n1: node n1: command "/bin/true" not found`) {
		t.Fatalf("state %s reason %q", stateName(j.GetState()), j.GetReason())
	}
	// The refusal's own pass already stops the ranks that did start; the
	// next pass sends nothing more.
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n0:SIGTERM"}) {
		t.Errorf("signals %v: the ranks that did start must be stopped", got)
	}
}

// TestLaunchErrorIsTheJobsFault: a command no node can find fails the job
// with the error; no node is cordoned and nothing is restarted.
func TestLaunchErrorIsTheJobsFault(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	h.nodes.jobFault = map[string]string{}
	for _, n := range []string{"n0", "n1", "n2"} {
		h.nodes.jobFault[n] = `launch: command "/nonexistent/train" not found on node ` + n
	}
	id := h.submit(ringSpec("typo", 2, 2, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), `command "/nonexistent/train" not found`) {
		t.Fatalf("state %s reason %q, want failed with the launch error", stateName(j.GetState()), j.GetReason())
	}
	if j.GetRestarts() != 0 || j.GetAttempt() != 1 {
		t.Errorf("restarts %d attempt %d: a job's own launch error must not be retried", j.GetRestarts(), j.GetAttempt())
	}
	h.nodes.mu.Lock()
	cordons := slices.Clone(h.nodes.cordons)
	h.nodes.mu.Unlock()
	if len(cordons) != 0 {
		t.Errorf("cordoned %v for a job's typo", cordons)
	}
	for _, n := range h.nodes.Nodes() {
		if n.GetCordoned() {
			t.Errorf("%s cordoned", n.GetRegistration().GetName())
		}
	}
}

func TestPendingReasons(t *testing.T) {
	nodes := threeNodes()
	nodes = append(nodes, nodeSpec("n3", 4, "r1", "s1", api.NodeState_NODE_STATE_DOWN, false),
		cordonedNode("n4", 4, "r1", "s1"))
	h := newHarness(t, scheduler.DefaultPolicy, nodes...)

	// A job that can never fit the cluster as built is refused, unless
	// held; a held one cannot be released into the queue.
	const hugeSpec = "name: huge\ncommand: [/bin/true]\ngpus: 64\n"
	_, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: hugeSpec, Source: "test.yaml"})
	if err == nil || !strings.Contains(err.Error(), "can never run on this cluster as built: needs 64 GPUs;") ||
		!strings.Contains(err.Error(), "the cluster's 5 nodes hold 20 GPUs in all, counting cordoned and down nodes") ||
		!strings.Contains(err.Error(), "submit with --hold") {
		t.Fatalf("submitting a job larger than the cluster: %v", err)
	}
	if js, _ := h.m.List(""); len(js) != 0 {
		t.Fatalf("a refused submit stored %d jobs", len(js))
	}
	heldHuge := h.submit(hugeSpec, true)
	if _, err := h.release(heldHuge); err == nil || !strings.Contains(err.Error(), "it stays held") {
		t.Fatalf("releasing a job larger than the cluster: %v", err)
	}
	// A job submitted while the cluster was larger waits aside once it
	// shrinks, without blocking the queue.
	h.nodes.mu.Lock()
	h.nodes.nodes = append(h.nodes.nodes, nodeSpec("n5", 44, "r2", "s2", api.NodeState_NODE_STATE_DOWN, false))
	h.nodes.mu.Unlock()
	huge := h.submit(hugeSpec, false)
	h.nodes.mu.Lock()
	h.nodes.nodes = h.nodes.nodes[:5]
	h.nodes.mu.Unlock()

	busy := h.submit(ringSpec("fill", 3, 4, ""), false)
	wide := h.submit(ringSpec("wide", 2, 4, ""), false)
	small := h.submit(ringSpec("small", 1, 1, ""), true)
	h.reconcile()
	if got := h.job(busy).GetState(); got != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("a job that can never fit blocked the queue: fill is %s", stateName(got))
	}
	cases := []struct {
		id   string
		want []string
	}{
		{huge, []string{"needs 64 GPUs", "the cluster's 5 nodes hold 20 GPUs in all, counting cordoned and down nodes, so it waits for nodes to join"}},
		{wide, []string{"needs 8 GPUs on 2 nodes of 4", "3 nodes busy", "1 node cordoned", "1 node down"}},
		{small, []string{"held: place it with `gpuctl assign " + small}},
		{heldHuge, []string{"held: place it with `gpuctl assign " + heldHuge}},
	}
	for _, c := range cases {
		j := h.job(c.id)
		if j.GetState() != api.JobState_JOB_STATE_PENDING {
			t.Errorf("%s is %s", j.GetName(), stateName(j.GetState()))
		}
		for _, w := range c.want {
			if !strings.Contains(j.GetPendingReason(), w) {
				t.Errorf("%s: pending reason %q lacks %q", j.GetName(), j.GetPendingReason(), w)
			}
		}
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	id := h.submit(ringSpec("long", 2, 2, ""), false)
	queued := h.submit(ringSpec("queued", 3, 4, ""), false)
	h.reconcile()
	h.started(id)
	h.nodes.take()

	if _, err := h.cancel(queued, "alice"); err != nil {
		t.Fatal(err)
	}
	if j := h.job(queued); j.GetState() != api.JobState_JOB_STATE_CANCELLED || j.GetStopping() != api.JobStop_JOB_STOP_NONE {
		t.Fatalf("queued job: %s %s", stateName(j.GetState()), j.GetStopping())
	}
	j, err := h.cancel("long", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if j.GetState() != api.JobState_JOB_STATE_CANCELLED || j.GetStopping() != api.JobStop_JOB_STOP_CANCEL || j.GetReason() != "cancelled by alice" {
		t.Fatalf("state %s stopping %s reason %q", stateName(j.GetState()), j.GetStopping(), j.GetReason())
	}
	if stored, _ := h.st.Job(id); stored.GetState() != api.JobState_JOB_STATE_CANCELLED {
		t.Fatal("cancel answered before it was persisted")
	}
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n0:SIGTERM", "n1:SIGTERM"}) {
		t.Fatalf("signals %v", got)
	}
	// Ranks that ignore SIGTERM are killed after the grace.
	h.exit(id, "n0", 0, 0, "")
	h.clock.add(31 * time.Second)
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n0:SIGKILL", "n1:SIGKILL"}) {
		t.Fatalf("signals %v", got)
	}
	h.exitAll(id, -1)
	h.reconcile()
	if j := h.job(id); j.GetStopping() != api.JobStop_JOB_STOP_NONE || liveRanks(j) != 0 {
		t.Errorf("stopping %s live %d", j.GetStopping(), liveRanks(j))
	}
	if _, err := h.cancel(id, "alice"); err == nil || !strings.Contains(err.Error(), "already cancelled") {
		t.Errorf("second cancel: %v", err)
	}
}

func TestAssign(t *testing.T) {
	nodes := threeNodes()
	nodes = append(nodes, nodeSpec("n3", 4, "r1", "s1", api.NodeState_NODE_STATE_DOWN, false))
	h := newHarness(t, scheduler.DefaultPolicy, nodes...)
	id := h.submit(ringSpec("pinned", 2, 2, ""), true)
	h.reconcile()
	if got := h.job(id).GetState(); got != api.JobState_JOB_STATE_PENDING {
		t.Fatalf("a held job was started: %s", stateName(got))
	}
	errs := []struct {
		name  string
		job   string
		nodes []string
		want  string
	}{
		{"unknown node", id, []string{"n0", "nx"}, "unknown nodes nx"},
		{"down node", id, []string{"n0", "n3"}, "n3: node down"},
		{"too few nodes", id, []string{"n0"}, "does not fit on n0: needs 4 GPUs on 2 nodes of 2"},
		{"more nodes than it uses", id, []string{"n0", "n1", "n2"}, "would leave n2 unused: name exactly the nodes it should run on"},
		{"unknown job", "nope", []string{"n0"}, `unknown job "nope"`},
	}
	for _, c := range errs {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.assign(c.job, c.nodes)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to contain %q", err, c.want)
			}
			if got := h.job(id).GetState(); got != api.JobState_JOB_STATE_PENDING {
				t.Fatalf("a refused assign left the job %s", stateName(got))
			}
		})
	}
	j, err := h.assign("pinned", []string{"n2", "n0"})
	if err != nil {
		t.Fatal(err)
	}
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || !slices.Equal(nodesOf(j), []string{"n0", "n2"}) || j.GetHold() {
		t.Fatalf("assigned: state %s nodes %v hold %v", stateName(j.GetState()), nodesOf(j), j.GetHold())
	}
	if got := len(launches(h.nodes.take())); got != 2 {
		t.Errorf("%d launches", got)
	}
	if _, err := h.assign(id, []string{"n1", "n2"}); err == nil || !strings.Contains(err.Error(), "checkpoint-restart it first") {
		t.Errorf("assigning a running job: %v", err)
	}
}

func TestPersistAcrossRestart(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	id := h.submit(ringSpec("ring", 2, 2, ""), false)
	waiting := h.submit(ringSpec("big", 3, 4, ""), false)
	h.reconcile()
	h.started(id)
	before := h.job(id)

	h.restart(scheduler.DefaultPolicy)
	after := h.job(id)
	if after.GetState() != api.JobState_JOB_STATE_RUNNING || after.GetAttempt() != 1 || after.GetMasterPort() != before.GetMasterPort() {
		t.Fatalf("after restart: %s attempt %d port %d", stateName(after.GetState()), after.GetAttempt(), after.GetMasterPort())
	}
	for _, jn := range after.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetPid() != 1000+uint32(r.GetRank()) {
				t.Errorf("rank %d pid %d lost across restart", r.GetRank(), r.GetPid())
			}
		}
	}
	if got := h.job(waiting).GetState(); got != api.JobState_JOB_STATE_PENDING {
		t.Errorf("waiting job is %s", stateName(got))
	}
	// The reloaded owner keeps tracking: exits finish the job and free
	// the GPUs for the waiting one.
	h.exitAll(id, 0)
	if got := h.job(id).GetState(); got != api.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("after exits: %s", stateName(got))
	}
	h.nodes.take()
	h.reconcile()
	if got := h.job(waiting).GetState(); got != api.JobState_JOB_STATE_RUNNING {
		t.Errorf("waiting job did not start on the freed GPUs: %s (%s)", stateName(got), h.job(waiting).GetPendingReason())
	}
}

func TestPreemptCheckpointsThenRequeues(t *testing.T) {
	h := newHarness(t, "priority", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"))
	ckpt := filepath.Join(h.ckpt, "low")
	low := h.submit(ringSpec("low", 2, 4, "checkpoint: {dir: "+ckpt+"}\n"), false)
	h.reconcile()
	h.started(low)
	h.checkpointed(low, 10)
	h.nodes.take()

	high := h.submit(ringSpec("high", 2, 4, "priority: 500\n"), false)
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n0:SIGUSR1", "n1:SIGUSR1"}) {
		t.Fatalf("preemption signals %v, want a checkpoint request first", got)
	}
	j := h.job(low)
	if j.GetStopping() != api.JobStop_JOB_STOP_PREEMPT || !strings.Contains(j.GetReason(), "preempted for "+high) {
		t.Fatalf("low: stopping %s reason %q", j.GetStopping(), j.GetReason())
	}
	// No checkpoint yet: no SIGTERM. Only the node running rank 0 reports
	// checkpoints; a report from another node is not one.
	h.event("n1", &api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: low, Rank: 0, Step: 12})
	h.reconcile()
	if got := signals(h.nodes.take()); len(got) != 0 {
		t.Fatalf("signals before the checkpoint landed: %v", got)
	}
	h.checkpointed(low, 12)
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n0:SIGTERM", "n1:SIGTERM"}) {
		t.Fatalf("signals after the checkpoint %v", got)
	}
	h.exitAll(low, 0)
	if got := h.job(low).GetState(); got == api.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("a preempted job's clean exit counted as %s", stateName(got))
	}
	h.reconcile()
	j = h.job(low)
	if j.GetState() != api.JobState_JOB_STATE_PENDING || j.GetPreemptions() != 1 || j.GetAttainedGpuSeconds() <= 0 {
		t.Fatalf("low after stop: %s preemptions %d attained %g", stateName(j.GetState()), j.GetPreemptions(), j.GetAttainedGpuSeconds())
	}
	if got := h.job(high).GetState(); got != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("high is %s", stateName(got))
	}
	// When high is done, low resumes from its checkpoint.
	h.started(high)
	h.nodes.take()
	h.exitAll(high, 0)
	h.reconcile()
	j = h.job(low)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || j.GetResumeStep() != 12 {
		t.Fatalf("low restarted: %s attempt %d resume %d", stateName(j.GetState()), j.GetAttempt(), j.GetResumeStep())
	}
	ls := launches(h.nodes.take())
	if len(ls) != 2 {
		t.Fatalf("%d relaunches of low, want 2", len(ls))
	}
	for _, c := range ls {
		if c.cmd.GetLaunch().GetResumeStep() != 12 {
			t.Errorf("relaunch on %s without GPUCTL_RESUME_STEP 12", c.node)
		}
	}
}

func TestRebalanceMovesOneJob(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r1", "s1"))
	ckpt := filepath.Join(h.ckpt, "spread")
	id := h.submit(ringSpec("spread", 2, 2, "checkpoint: {dir: "+ckpt+"}\n"), true)
	if _, err := h.assign(id, []string{"n1", "n2"}); err != nil {
		t.Fatal(err)
	}
	h.started(id)
	h.nodes.take()

	plan, err := h.rebalance(&api.RebalanceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.GetMoves()) != 1 || plan.GetApplied() || plan.GetAfter().GetCost() >= plan.GetBefore().GetCost() {
		t.Fatalf("plan: %v", plan)
	}
	mv := plan.GetMoves()[0]
	var to []string
	for _, jn := range mv.GetTo() {
		to = append(to, jn.GetNode())
	}
	if mv.GetJob() != id || plan.GetBefore().GetExtraSwitches() != 1 || plan.GetAfter().GetExtraSwitches() != 0 {
		t.Fatalf("move %v to %v", mv, to)
	}
	if got := h.job(id).GetStopping(); got != api.JobStop_JOB_STOP_NONE {
		t.Fatalf("a dry-run rebalance touched the job: %s", got)
	}

	if _, err := h.rebalance(&api.RebalanceRequest{Apply: true}); err != nil {
		t.Fatal(err)
	}
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n1:SIGUSR1", "n2:SIGUSR1"}) {
		t.Fatalf("move signals %v", got)
	}
	if _, err := h.rebalance(&api.RebalanceRequest{Apply: true}); err == nil {
		t.Error("a second rebalance started while one was moving")
	}
	h.checkpointed(id, 7)
	h.reconcile()
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{"n1:SIGTERM", "n2:SIGTERM"}) {
		t.Fatalf("signals after the checkpoint %v", got)
	}
	h.exitAll(id, 0)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || j.GetResumeStep() != 7 || !slices.Equal(nodesOf(j), to) {
		t.Fatalf("after move: %s attempt %d resume %d on %v, want on %v", stateName(j.GetState()), j.GetAttempt(), j.GetResumeStep(), nodesOf(j), to)
	}
	ls := launches(h.nodes.take())
	if len(ls) != len(to) || ls[0].cmd.GetLaunch().GetResumeStep() != 7 {
		t.Fatalf("relaunches %v", ls)
	}
}

func TestPlanFor(t *testing.T) {
	cases := []struct {
		name       string
		spec       string
		tp, pp, dp int32
		source     string
		err        string
	}{
		{"gpus only", "name: a\ncommand: [x]\ngpus: 16\n", 1, 1, 16, planGPUs, ""},
		{"fixed", "name: a\ncommand: [x]\ngpus: 16\nplan: {tp: 4, pp: 2}\n", 4, 2, 2, planFixed, ""},
		{"planner", "name: a\ncommand: [x]\ngpus: 64\ngpu_model: h100\nmodel: {preset: llama2-70b}\n", 0, 0, 0, planPlanner, ""},
		// Context parallelism takes its share of the GPUs: dp is what is left.
		{"fixed cp", "name: a\ncommand: [x]\ngpus: 64\nmodel: {preset: llama2-70b}\nplan: {tp: 8, cp: 2, pp: 2}\n", 8, 2, 2, planFixed, ""},
		{"no plan fits", "name: a\ncommand: [x]\ngpus: 1\nmodel: {preset: gpt3-175b}\n", 0, 0, 0, "", "no parallel plan of model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, scheduler.DefaultPolicy)
			r, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: c.spec, DryRun: true})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p := r.GetJob().GetPlan()
			if p.GetSource() != c.source {
				t.Errorf("source %q", p.GetSource())
			}
			if c.tp > 0 && (p.GetTp() != c.tp || p.GetPp() != c.pp || p.GetDp() != c.dp) {
				t.Errorf("plan tp%d pp%d dp%d", p.GetTp(), p.GetPp(), p.GetDp())
			}
			if c.source == planPlanner && (p.GPUs() != 64 || p.GetStepSeconds() <= 0) {
				t.Errorf("planner plan %v", p)
			}
			if j := r.GetJob(); j.GetFullGpus() != p.GPUs() || shapeOf(j).Size() != int(p.GPUs()) {
				t.Errorf("full GPUs %d, placement shape %s, plan %v", j.GetFullGpus(), shapeOf(j), p)
			}
		})
	}
}

func TestDryRunPlacesWithoutQueueing(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	r, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: ringSpec("try", 2, 2, ""), DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(r.GetJob()); !slices.Equal(got, []string{"n0", "n1"}) || r.GetJob().GetPendingReason() != "" {
		t.Errorf("dry run placed on %v, reason %q", got, r.GetJob().GetPendingReason())
	}
	if js, _ := h.m.List(""); len(js) != 0 {
		t.Errorf("dry run queued %d jobs", len(js))
	}
	if n, _ := h.st.Jobs(); len(n) != 0 {
		t.Errorf("dry run stored %d jobs", len(n))
	}
	r, err = h.submitReq(&api.SubmitJobRequest{SpecYaml: "name: big\ncommand: [x]\ngpus: 16\n", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetJob().GetPlacement()) != 0 || !strings.Contains(r.GetJob().GetPendingReason(), "needs 16 GPUs") {
		t.Errorf("oversized dry run: placement %v reason %q", r.GetJob().GetPlacement(), r.GetJob().GetPendingReason())
	}
	// Larger than the cluster as built: the dry run says a submit would
	// be refused.
	if !strings.Contains(r.GetJob().GetPendingReason(), "it would be refused") {
		t.Errorf("dry run of a job larger than the cluster: reason %q, want it to say a submit is refused", r.GetJob().GetPendingReason())
	}
}

func TestGPUProfile(t *testing.T) {
	cases := map[string]string{
		"NVIDIA H100 80GB HBM3": "h100",
		"NVIDIA A100-SXM4-80GB": "a100-80gb",
		"NVIDIA A100-SXM4-40GB": "a100-40gb",
		"NVIDIA H200":           "h200",
		"Tesla V100-SXM2-32GB":  "Tesla V100-SXM2-32GB",
		"":                      "",
	}
	for in, want := range cases {
		if got := gpuProfile(in); got != want {
			t.Errorf("gpuProfile(%q) = %q, want %q", in, got, want)
		}
	}
}

// A deferrable job waits, with why, for the cleaner hour; one that is not
// deferrable starts at once; at the hour the deferrable one starts.
func TestDeferrableJobWaitsForCleanerHour(t *testing.T) {
	nodes := threeNodes()
	for _, n := range nodes {
		n.Registration.Labels["site"] = "eu"
	}
	h := newHarness(t, "fifo", nodes...)
	// The harness's clock starts at 08:00 UTC; the curve dips at 12:00.
	in, err := carbon.Parse(strings.NewReader("site=eu"+strings.Repeat(" 400", 12)+" 100"+strings.Repeat(" 400", 11)), "test")
	if err != nil {
		t.Fatal(err)
	}
	h.m.cfg.Policy = scheduler.WithCarbon(scheduler.FIFO{}, in)
	late := h.submit(ringSpec("late", 1, 4, "estimated_runtime: 1h\ndeferrable: {until: 24h}\n"), false)
	now := h.submit(ringSpec("now", 1, 4, "estimated_runtime: 1h\n"), false)
	h.reconcile()
	if st := h.job(now).GetState(); st != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("a job that is not deferrable is %s", st)
	}
	j := h.job(late)
	if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetPendingReason(), "cleaner window at site=eu") ||
		!strings.Contains(j.GetPendingReason(), "T12:00:00Z") {
		t.Fatalf("deferrable job %s: %q", j.GetState(), j.GetPendingReason())
	}
	h.clock.add(4 * time.Hour)
	h.reconcile()
	if st := h.job(late).GetState(); st != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("at the cleaner hour the deferrable job is %s: %q", st, h.job(late).GetPendingReason())
	}
}
