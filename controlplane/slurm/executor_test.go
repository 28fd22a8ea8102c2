package slurm

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/internal/slurmtest"
)

func launches() ([]string, map[string]*api.LaunchRanks) {
	nodes := []string{"node3", "node1"}
	l := map[string]*api.LaunchRanks{
		"node3": {Job: "j-1", Attempt: 2, Command: []string{"/bin/train", "--lr", "3e-4 x"}, NodeRank: 0,
			Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{0}}, {Rank: 1, LocalRank: 1, Gpus: []uint32{1}}}},
		"node1": {Job: "j-1", Attempt: 2, Command: []string{"/bin/train", "--lr", "3e-4 x"}, NodeRank: 1,
			Ranks: []*api.RankSpec{{Rank: 2, Gpus: []uint32{4}}, {Rank: 3, LocalRank: 1, Gpus: []uint32{5}}}},
	}
	return nodes, l
}

func TestBatchKeepsGpuctlPlacement(t *testing.T) {
	x := New(Config{RunDir: t.TempDir(), Task: []string{"/opt/nodemon", "slurm-task"}})
	nodes, l := launches()
	args, script, env, err := x.Batch(jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: nodes, Ranks: l})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--parsable", "--nodelist=node3,node1", "--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2", "--comment=gpuctl:j-1:2", "--no-requeue"} {
		if !slices.Contains(args, want) {
			t.Errorf("sbatch args %v lack %s", args, want)
		}
	}
	if !strings.Contains(script, "exec srun --kill-on-bad-exit=1 /opt/nodemon slurm-task --run-dir ") || !strings.Contains(script, "-- /bin/train --lr '3e-4 x'\n") {
		t.Errorf("script:\n%s", script)
	}
	parts, err := api.DecodeLaunch(api.SlurmLaunchEnv, strings.TrimPrefix(env[0], api.SlurmLaunchEnv+"="))
	if err != nil || len(parts) != 2 || parts[0].Node != "node3" || parts[1].Launch.GetRanks()[0].GetRank() != 2 {
		t.Errorf("launch env %v: %v", parts, err)
	}
	l["node3"].RunAsUser, l["node3"].RunAsGroup = "alice", "ml"
	args, _, _, _ = x.Batch(jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: nodes, Ranks: l, Exclude: []string{"node2"}})
	for _, want := range []string{"--uid=alice", "--gid=ml", "--exclude=node2"} {
		if !slices.Contains(args, want) {
			t.Errorf("sbatch args %v lack %s", args, want)
		}
	}
	// Slurm places: no --nodelist, parts by node index.
	x.cfg.Placement = PlaceSlurm
	args, _, env, _ = x.Batch(jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: nodes, Ranks: l})
	parts, _ = api.DecodeLaunch(api.SlurmLaunchEnv, strings.TrimPrefix(env[0], api.SlurmLaunchEnv+"="))
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--nodelist") }) || parts[0].Node != "" {
		t.Errorf("slurm placement: args %v, parts %v", args, parts)
	}
	l["node1"].Ranks = l["node1"].Ranks[:1]
	if _, _, _, err := x.Batch(jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: nodes, Ranks: l}); err == nil || !strings.Contains(err.Error(), "--ntasks-per-node") {
		t.Errorf("uneven ranks per node: err = %v", err)
	}
}

func TestComment(t *testing.T) {
	for _, tc := range []struct {
		in      string
		job     string
		attempt uint32
		ok      bool
	}{
		{in: Comment("j-1", 3), job: "j-1", attempt: 3, ok: true},
		{in: "gpuctl:a:b:7", job: "a:b", attempt: 7, ok: true},
		{in: "gpuctl:j-1", ok: false},
		{in: "gpuctl::1", ok: false},
		{in: "mine", ok: false},
		{in: "gpuctl:j:x", ok: false},
	} {
		job, attempt, ok := ParseComment(tc.in)
		if ok != tc.ok || ok && (job != tc.job || attempt != tc.attempt) {
			t.Errorf("ParseComment(%q) = %q %d %v", tc.in, job, attempt, ok)
		}
	}
}

func FuzzParseComment(f *testing.F) {
	f.Add("gpuctl:j-1:3")
	f.Fuzz(func(t *testing.T, s string) {
		job, attempt, ok := ParseComment(s)
		if !ok {
			return
		}
		if j2, a2, ok2 := ParseComment(Comment(job, attempt)); !ok2 || j2 != job || a2 != attempt {
			t.Fatalf("%q → %q %d does not round-trip", s, job, attempt)
		}
	})
}

func node(name string, cordoned bool, reason string) *api.NodeStatus {
	return &api.NodeStatus{Registration: &api.NodeRegistration{Name: name}, Cordoned: cordoned, CordonReason: reason}
}

func TestSyncNodes(t *testing.T) {
	gpuctl := []*api.NodeStatus{
		node("n1", false, ""),                          // both fine
		node("n2", true, "fan"),                        // gpuctl cordoned → drain
		node("n3", false, ""),                          // Slurm down → cordon
		node("n4", true, "Slurm: n4 is drained (x)"),   // Slurm resumed → uncordon
		node("n5", false, ""),                          // gpuctl uncordoned its drain → resume
		node("n6", true, "fan"),                        // already drained by gpuctl
		node("n7", true, "recovering job j: Slurm: x"), // gpuctl's (a recovery), Slurm down → drain too
		node("n8", true, "Slurm: n8 is down (t)"),      // Slurm's, down: drained too, so it stays out when back
		node("n9", false, ""),                          // not in Slurm
	}
	slurm := []NodeState{
		{Name: "n1", State: "idle"},
		{Name: "n2", State: "mixed"},
		{Name: "n3", State: "down", Reason: "Not responding", NotResponding: true},
		{Name: "n4", State: "idle"},
		{Name: "n5", State: "drained", Reason: "gpuctl: fan"},
		{Name: "n6", State: "draining", Reason: "gpuctl: fan"},
		{Name: "n7", State: "down", Reason: "test"},
		{Name: "n8", State: "down", Reason: "t"},
	}
	got := SyncNodes(gpuctl, slurm)
	want := []NodeAction{
		{Node: "n2", Do: "drain", Reason: "gpuctl: fan"},
		{Node: "n3", Do: nodes.ActionCordon, Reason: "Slurm: n3 is down (Not responding)"},
		{Node: "n4", Do: nodes.ActionUncordon},
		{Node: "n5", Do: "resume"},
		{Node: "n7", Do: "drain", Reason: "gpuctl: recovering job j: Slurm: x"},
		{Node: "n8", Do: "drain", Reason: "gpuctl: Slurm: n8 is down (t)"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("SyncNodes =\n%+v\nwant\n%+v", got, want)
	}
	// Applied, the states agree: nothing more to do.
	after := []NodeState{
		{Name: "n1", State: "idle"}, {Name: "n2", State: "draining", Reason: "gpuctl: fan"},
		{Name: "n3", State: "down", Reason: "Not responding"}, {Name: "n4", State: "idle"}, {Name: "n5", State: "idle"},
		{Name: "n6", State: "draining", Reason: "gpuctl: fan"}, {Name: "n7", State: "drained", Reason: "gpuctl: recovering job j: Slurm: x"},
		{Name: "n8", State: "down", Reason: "gpuctl: Slurm: n8 is down (t)"},
	}
	after[2].Reason = "gpuctl: Slurm: n3 is down (Not responding)"
	gpuctl[2] = node("n3", true, "Slurm: n3 is down (Not responding)")
	gpuctl[3] = node("n4", false, "")
	if got := SyncNodes(gpuctl, after); len(got) != 0 {
		t.Errorf("after syncing, SyncNodes = %+v, want nothing", got)
	}
}

func TestExternalJob(t *testing.T) {
	q := QueueJob{ID: "42", State: "RUNNING", NumNodes: 2, Nodes: []string{"node2", "node4"}, Name: "mine"}
	ranks := []nodes.NodeRanks{
		{Node: "node4", Ranks: []*api.RankStatus{{Job: "slurm-42", Rank: 1, Pid: 11, Step: 7}}},
		{Node: "node2", Ranks: []*api.RankStatus{{Job: "slurm-42", Rank: 0, Pid: 10, Step: 9}}},
	}
	info := &JobInfo{Fields: map[string]string{"JobId": "42", "UserId": "alice(1000)", "Restarts": "1"},
		Details: []map[string]string{{"Nodes": "node2", "GRES": "gpu:2(IDX:0-1)"}, {"Nodes": "node4", "GRES": "gpu:a100:2(IDX:3,5)"}}}
	j := ExternalJob(q, ranks, info)
	if j.GetId() != "slurm-42" || j.GetName() != "mine" || j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStep() != 9 ||
		len(j.GetPlacement()) != 2 || j.GetPlacement()[0].GetNode() != "node2" || j.GetPlacement()[1].GetRanks()[0].GetPid() != 11 {
		t.Errorf("ExternalJob = %v", j)
	}
	if !slices.Equal(j.GetPlacement()[0].GetGpus(), []uint32{0, 1}) || !slices.Equal(j.GetPlacement()[1].GetGpus(), []uint32{3, 5}) ||
		j.GetAttempt() != 2 || !strings.Contains(j.GetReason(), "user alice") {
		t.Errorf("from scontrol: gpus %v %v attempt %d reason %q", j.GetPlacement()[0].GetGpus(), j.GetPlacement()[1].GetGpus(), j.GetAttempt(), j.GetReason())
	}
	if j := ExternalJob(QueueJob{ID: "43", State: "PENDING", Reason: "Resources"}, nil, nil); j.GetState() != api.JobState_JOB_STATE_PENDING || j.GetPendingReason() != "Slurm: Resources" {
		t.Errorf("pending ExternalJob = %v", j)
	}
}

type fakeRegistry struct {
	nodes   []*api.NodeStatus
	cordons []string
}

func (f *fakeRegistry) Nodes() []*api.NodeStatus       { return f.nodes }
func (f *fakeRegistry) Ranks(string) []nodes.NodeRanks { return nil }
func (f *fakeRegistry) SetCordon(n, a, r string) (*api.NodeStatus, error) {
	f.cordons = append(f.cordons, n+" "+a+" "+r)
	return nil, nil
}

type fakeOwner struct {
	jobs     []*api.Job
	failed   []string
	external [][]*api.Job
	placed   []string
}

func (f *fakeOwner) List(string) ([]*api.Job, error) { return f.jobs, nil }
func (f *fakeOwner) ExecutorFailed(job string, attempt uint32, nodes []string, reason string) {
	f.failed = append(f.failed, job+" "+strings.Join(nodes, ",")+" "+reason)
}
func (f *fakeOwner) ExternalJobs(jobs []*api.Job) { f.external = append(f.external, jobs) }
func (f *fakeOwner) ExecutorPlaced(job string, attempt uint32, nodes []string) {
	f.placed = append(f.placed, job+" "+strings.Join(nodes, ","))
}

// TestBadSlurm: a missing sbatch, and a slurmctld that is down, are clear
// errors; the poller changes nothing while Slurm does not answer, and
// picks up again once it does.
func TestBadSlurm(t *testing.T) {
	targets, l := launches()
	x := New(Config{CLI: CLI{Bin: t.TempDir()}, RunDir: t.TempDir()})
	errs := x.Launch(context.Background(), jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: targets, Ranks: l})
	if err := errs["node3"]; err == nil || !strings.Contains(err.Error(), "Slurm's sbatch is not installed here") || !strings.Contains(err.Error(), "--executor nodemon") ||
		!errors.Is(err, jobs.ErrExecutorUnavailable) {
		t.Errorf("sbatch missing: %v", err)
	}

	c := slurmtest.Start(t, slurmtest.Options{Nodes: 2, GPUs: 2})
	x = New(Config{CLI: CLI{Env: []string{"SLURM_CONF=" + c.Conf}}, RunDir: t.TempDir()})
	reg := &fakeRegistry{nodes: []*api.NodeStatus{node("node1", false, ""), node("node2", false, "")}}
	owner := &fakeOwner{}
	p := &Poller{X: x, Registry: reg, Owner: owner}
	p.Once(context.Background())
	if len(owner.external) != 1 || len(reg.cordons) != 0 {
		t.Fatalf("first poll: external %v, cordons %v", owner.external, reg.cordons)
	}
	// Slurm refuses the job itself: the job's fault, not retried.
	bad := New(Config{CLI: CLI{Env: []string{"SLURM_CONF=" + c.Conf}}, RunDir: t.TempDir(), Partition: "nope"})
	_, l3 := launches()
	errs = bad.Launch(context.Background(), jobs.AttemptLaunch{Job: "j-2", Attempt: 1, Nodes: []string{"node1"}, Ranks: map[string]*api.LaunchRanks{"node1": l3["node3"]}})
	var ce *nodes.CommandError
	if err := errs["node1"]; !errors.As(err, &ce) || !ce.JobFault || !strings.Contains(err.Error(), "partition") {
		t.Errorf("bad partition: %v", err)
	}

	c.StopController()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, l2 := launches()
	errs = x.Launch(ctx, jobs.AttemptLaunch{Job: "j-1", Attempt: 2, Nodes: []string{"node1", "node2"}, Ranks: map[string]*api.LaunchRanks{"node1": l2["node3"], "node2": l2["node1"]}})
	if err := errs["node1"]; err == nil || !strings.Contains(err.Error(), "slurmctld is not answering") || !errors.Is(err, jobs.ErrExecutorUnavailable) {
		t.Errorf("slurmctld down: %v", err)
	}
	p.Once(ctx)
	if len(owner.external) != 1 || len(reg.cordons) != 0 || len(owner.failed) != 0 || !strings.Contains(p.warned, "slurmctld is not answering") {
		t.Errorf("poll with slurmctld down changed something: external %v cordons %v failed %v (warned %q)", owner.external, reg.cordons, owner.failed, p.warned)
	}
	c.StartController()
	deadline := time.Now().Add(20 * time.Second)
	for p.warned != "" && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		p.Once(ctx)
	}
	if p.warned != "" || len(owner.external) < 2 {
		t.Errorf("Slurm back: warned %q, %d external updates", p.warned, len(owner.external))
	}
}

// TestCheckJobs: a Slurm node down under a running attempt is reported
// once with the nodes; a batch that ended before any rank started fails
// the job (no nodes to blame) after three polls.
func TestCheckJobs(t *testing.T) {
	x := New(Config{RunDir: t.TempDir()})
	running := func(id string, pid uint32, nodes ...string) *api.Job {
		j := &api.Job{Id: id, Attempt: 1, State: api.JobState_JOB_STATE_RUNNING}
		for _, n := range nodes {
			j.Placement = append(j.Placement, &api.JobNode{Node: n, Ranks: []*api.JobRank{{Rank: 0, Pid: pid}}})
		}
		return j
	}
	owner := &fakeOwner{jobs: []*api.Job{running("a", 10, "n1", "n2"), running("b", 0, "n3")}}
	p := &Poller{X: x, Owner: owner, Log: slog.New(slog.DiscardHandler)}
	p.failed, p.ended = map[string]bool{}, map[string]int{}
	x.remember("a", 1, "5")
	x.remember("b", 1, "6")
	states := []NodeState{{Name: "n1", State: "idle"}, {Name: "n2", State: "down", Reason: "test"}, {Name: "n3", State: "idle"}}
	for i := 0; i < 3; i++ {
		p.checkJobs([]QueueJob{{ID: "5", State: "RUNNING"}}, states)
	}
	if len(owner.failed) != 2 || owner.failed[0] != "a n2 Slurm: n2 is down (test)" || !strings.HasPrefix(owner.failed[1], "b  Slurm job 6 ended (gone from squeue) before any rank started") {
		t.Errorf("failures reported: %q", owner.failed)
	}
}

func TestGRESGPUs(t *testing.T) {
	for in, want := range map[string][]uint32{
		"gpu:2(IDX:0-1)":            {0, 1},
		"gpu:a100:3(IDX:0,2-3)":     {0, 2, 3},
		"gpu:1(IDX:7),nic:1(IDX:0)": {7},
		"":                          nil,
		"gpu:2":                     nil,
		"gpu:2(IDX:x)":              nil,
		"gpu:1(IDX:5-2)":            nil,
	} {
		if got := GRESGPUs(in); !slices.Equal(got, want) {
			t.Errorf("GRESGPUs(%q) = %v, want %v", in, got, want)
		}
	}
}

func FuzzGRESGPUs(f *testing.F) {
	f.Add("gpu:a100:3(IDX:0,2-3)")
	f.Fuzz(func(t *testing.T, s string) {
		if n := len(GRESGPUs(s)); n > 1025*len(s) {
			t.Fatalf("%d GPUs from %q", n, s)
		}
	})
}
