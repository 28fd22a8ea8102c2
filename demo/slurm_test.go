package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/slurmtest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// slurmGpuctl is a real Slurm (internal/slurmtest: node1..node4), a real
// `gpuctl serve --executor slurm` and one nodemon per Slurm node, named
// as the node and watching its Slurm tasks (--slurm-node).
type slurmGpuctl struct {
	*procCluster
	slurm  *slurmtest.Cluster
	runDir string
	cl     *client.Client
}

func newSlurmGpuctl(t *testing.T, placement string) *slurmGpuctl {
	t.Helper()
	slurmtest.Require(t)
	sl := slurmtest.Start(t, slurmtest.Options{Nodes: 4, GPUs: 8})
	// The server's sbatch and squeue, and the tests', find this cluster.
	t.Setenv("SLURM_CONF", sl.Conf)
	nodemon, _ := binaries(t)
	dir := t.TempDir()
	runDir := filepath.Join(dir, "slurm-run")
	c, cl := executorCluster(t, dir, sl.Nodes, "--slurm-node", "--executor", "slurm", "--slurm-placement", placement,
		"--slurm-task", nodemon+" slurm-task", "--slurm-run-dir", runDir, "--slurm-poll", "250ms")
	return &slurmGpuctl{procCluster: c, slurm: sl, runDir: runDir, cl: cl}
}

// executorCluster starts `gpuctl serve` (its data dir in dir, on a free
// loopback port) with serveArgs, and one nodemon per node, named as the
// node and finding the ranks another system starts there (nodeFlag:
// --slurm-node, --kube-node); it returns the cluster and an admin client,
// both ended with the test.
func executorCluster(t *testing.T, dir string, nodes []string, nodeFlag string, serveArgs ...string) (*procCluster, *client.Client) {
	t.Helper()
	nodemon, ringtrain := binaries(t)
	c := &procCluster{t: t, dir: dir, gpuctl: testbin.Gpuctl(t), nodemon: nodemon, ringtain: ringtrain,
		nodes: map[string]*proc{}, nodeStarts: map[string]int{}}
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = udp.LocalAddr().String()
	udp.Close()
	c.serveArgs = append([]string{"serve", "--data-dir", filepath.Join(dir, "server"), "--listen", c.addr}, serveArgs...)
	c.startServer()
	cl := c.dial(20 * time.Second)
	t.Cleanup(func() { cl.Close() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpuctl logs:\n%s", c.logs())
			if keep := os.Getenv("GPUCTL_KEEP_LOGS"); keep != "" {
				logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
				for _, l := range logs {
					if b, err := os.ReadFile(l); err == nil {
						os.WriteFile(filepath.Join(keep, filepath.Base(l)), b, 0o644)
					}
				}
			}
		}
	})
	token, _, err := cl.CreateJoinToken(context.Background(), client.TokenOptions{TTL: time.Hour, Uses: len(nodes)})
	if err != nil {
		t.Fatal(err)
	}
	c.token = token
	for _, n := range nodes {
		c.nodeStarts[n]++
		c.nodes[n] = startProcess(t, filepath.Join(dir, n+"-1.log"), nodemon,
			"--server", c.addr, "--token", token, "--name", n, "--data-dir", filepath.Join(dir, "nodes", n),
			"--sim", "dgx-h100", "--ebpf", ebpfMode(), "--trace-scope", "node", "--allow-root-ranks", nodeFlag, n)
	}
	c.waitNodes(cl, 30*time.Second, len(nodes))
	return c, cl
}

// ringJob is ringtrain on two nodes, two GPUs (ranks) each.
func (s *slurmGpuctl) ringJob(name string, steps int) string {
	return fmt.Sprintf(`name: %s
nodes: 2
gpus_per_node: 2
command: [%q, --steps, "%d", --compute-ms, "30", --bytes, 64K]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, name, s.ringtain, steps, filepath.Join(s.dir, "ckpt", name))
}

func (s *slurmGpuctl) submit(spec string) string {
	s.t.Helper()
	r, err := s.cl.SubmitJob(context.Background(), &api.SubmitJobRequest{SpecYaml: spec, Source: "slurm test"})
	if err != nil {
		s.t.Fatal(err)
	}
	return r.GetJob().GetId()
}

// observed waits for NCCL calls of job traced by the nodemons' eBPF
// probes; where eBPF is not required and not available it says so and
// returns.
func (s *slurmGpuctl) observed(job string, ranks int) { observed(s.t, s.cl, job, ranks) }

// observed waits for NCCL calls of ranks ranks of job, traced by the
// nodemons' eBPF probes, through cl.
func observed(t *testing.T, cl *client.Client, job string, ranks int) {
	t.Helper()
	seen := map[int32]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && len(seen) < ranks {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := cl.Observe(ctx, &api.ObserveRequest{Filter: &api.ObserveFilter{Job: job, Collectives: true}, Last: 200},
			func(b *api.ObserveBatch) error {
				for _, it := range b.GetItems() {
					if c := it.GetCollective(); c != nil {
						seen[c.GetRank()] = true
					}
				}
				return nil
			})
		cancel()
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(seen) < ranks {
		if needs.EBPF.Required() {
			t.Fatalf("job %s: NCCL calls of %d of %d ranks traced (%v)", job, len(seen), ranks, seen)
		}
		t.Logf("job %s: NCCL calls of %d of %d ranks traced; eBPF not required here (GPUCTL_REQUIRE_EBPF unset)", job, len(seen), ranks)
		return
	}
	t.Logf("job %s: NCCL calls traced for ranks %v", job, slices.Sorted(func(yield func(int32) bool) {
		for r := range seen {
			if !yield(r) {
				return
			}
		}
	}))
}

// movedOff waits for a new attempt of job running all 4 ranks, none on
// lost.
func movedOff(t *testing.T, cl *client.Client, id, lost string, limit time.Duration) *api.Job {
	t.Helper()
	return waitFor(t, cl, id, limit, "a new attempt running without "+lost, func(j *api.Job) error {
		if j.GetAttempt() < 2 {
			return fmt.Errorf("attempt %d: %s", j.GetAttempt(), j.GetReason())
		}
		if err := runningWith(j, j.GetAttempt(), 4); err != nil {
			return err
		}
		if slices.Contains(nodesOf(j), lost) {
			return fmt.Errorf("attempt %d placed on %s, which is lost", j.GetAttempt(), lost)
		}
		return nil
	})
}

// cancelJob cancels a job and waits until it is cancelled.
func cancelJob(t *testing.T, cl *client.Client, id string) {
	t.Helper()
	if _, err := cl.CancelJob(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, cl, id, 30*time.Second, "cancelled", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_CANCELLED {
			return fmt.Errorf("%s: %s", j.GetState(), j.GetReason())
		}
		return nil
	})
}

// checkpointed waits for job's steps, asks for a checkpoint and returns
// the step of the one reported.
func checkpointed(t *testing.T, cl *client.Client, id string, limit time.Duration) int64 {
	t.Helper()
	waitFor(t, cl, id, limit, "steps reported", func(j *api.Job) error {
		if j.GetStep() < 10 {
			return fmt.Errorf("step %d", j.GetStep())
		}
		return nil
	})
	if _, err := cl.CheckpointJob(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	j := waitFor(t, cl, id, limit, "checkpoint reported", func(j *api.Job) error {
		if j.GetLastCheckpointStep() <= 0 {
			return fmt.Errorf("no checkpoint yet (step %d)", j.GetStep())
		}
		return nil
	})
	return j.GetLastCheckpointStep()
}

// resumedFrom waits for a rank log's resume line and checks that it
// resumed from ckpt or later.
func resumedFrom(t *testing.T, log string, ckpt int64) {
	t.Helper()
	poll(t, 20*time.Second, "rank 0 resumed from the checkpoint", func() error {
		b, err := os.ReadFile(log)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if m := resumeLine.FindStringSubmatch(line); m != nil {
				if n, _ := strconv.ParseInt(m[1], 10, 64); n >= ckpt {
					return nil
				}
				return fmt.Errorf("resumed from %s, before the checkpoint at %d", m[1], ckpt)
			}
		}
		return fmt.Errorf("no resume line in %s", log)
	})
}

func nodesOf(j *api.Job) []string {
	var out []string
	for _, jn := range j.GetPlacement() {
		out = append(out, jn.GetNode())
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestSlurmExecutor runs gpuctl's jobs through a real Slurm: ringtrain
// across two Slurm nodes with gpuctl's placement as --nodelist, its ranks
// reported and traced by the nodemons, a checkpoint through scancel
// --signal=USR1, a node set down in Slurm: the job is back on the others
// from its checkpoint and the node is out on both sides with the reason.
func TestSlurmExecutor(t *testing.T) {
	s := newSlurmGpuctl(t, "gpuctl")
	ctx := context.Background()

	// Submit → ranks running, a few times.
	var starts []time.Duration
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		id := s.submit(s.ringJob(fmt.Sprintf("warm%d", i), 0))
		waitFor(t, s.cl, id, 30*time.Second, "ranks running", func(j *api.Job) error { return runningWith(j, 1, 4) })
		starts = append(starts, time.Since(t0))
		cancelJob(t, s.cl, id)
	}
	t.Logf("gpuctl submit → 4 ranks running through Slurm: median %v of %v", median(starts), starts)

	id := s.submit(s.ringJob("rt", 0))
	j := waitFor(t, s.cl, id, 30*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	first := nodesOf(j)
	// gpuctl's placement went to Slurm: the Slurm job runs on those nodes.
	out := s.slurm.Run("squeue", "-h", "-o", "%k|%N")
	if !strings.Contains(out, "gpuctl:"+id+":1|") {
		t.Fatalf("squeue has no Slurm job for %s attempt 1:\n%s", id, out)
	}
	for _, n := range first {
		if !strings.Contains(out, n) && !strings.Contains(out, "node[") {
			t.Fatalf("squeue %q does not run on gpuctl's node %s", out, n)
		}
	}
	s.observed(id, 4)

	// A checkpoint through Slurm lands.
	ckpt := checkpointed(t, s.cl, id, 20*time.Second)
	t.Logf("checkpoint at step %d through scancel --signal=USR1", ckpt)

	// One of its nodes goes down in Slurm.
	lost := first[1]
	t0 := time.Now()
	s.slurm.Run("scontrol", "update", "nodename="+lost, "state=down", "reason=test")
	// Attempt 2, or 3 when the ranks' exits (Slurm stopped them) came in
	// before the poller saw the node down: attempt 2 then went to the
	// same nodes and was refused for the down one without being submitted.
	j = movedOff(t, s.cl, id, lost, 60*time.Second)
	requeue := time.Since(t0)
	if j.GetResumeStep() < ckpt {
		t.Fatalf("attempt 2 resumes from step %d, before the checkpoint at %d", j.GetResumeStep(), ckpt)
	}
	out = s.slurm.Run("squeue", "-h", "-o", "%k|%N")
	if !strings.Contains(out, fmt.Sprintf("gpuctl:%s:%d|", id, j.GetAttempt())) {
		t.Fatalf("squeue has no Slurm job for %s attempt %d:\n%s", id, j.GetAttempt(), out)
	}
	waitFor(t, s.cl, id, 20*time.Second, "steps past the checkpoint", func(j *api.Job) error {
		if j.GetStep() <= ckpt {
			return fmt.Errorf("step %d", j.GetStep())
		}
		return nil
	})
	// The ranks themselves resumed from the checkpoint: rank 0's log (the
	// shim's, under the run dir, by Slurm job id) says so.
	var sid string
	for _, line := range strings.Fields(s.slurm.Run("squeue", "-h", "-o", "%i|%k")) {
		if id2, c, _ := strings.Cut(line, "|"); c == fmt.Sprintf("gpuctl:%s:%d", id, j.GetAttempt()) {
			sid = id2
		}
	}
	resumedFrom(t, filepath.Join(s.runDir, sid, "rank-0.log"), ckpt)
	t.Logf("node %s down in Slurm → attempt %d running on %v from step %d in %v", lost, j.GetAttempt(), nodesOf(j), j.GetResumeStep(), requeue)

	// Out on both sides, with the reason.
	poll(t, 20*time.Second, lost+" cordoned in gpuctl and drained in Slurm", func() error {
		ns, err := s.cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if n.GetRegistration().GetName() == lost && (!n.GetCordoned() || !strings.Contains(n.GetCordonReason(), "Slurm")) {
				return fmt.Errorf("gpuctl: %s cordoned=%v reason %q", lost, n.GetCordoned(), n.GetCordonReason())
			}
		}
		out, err := s.slurm.Command("scontrol", "show", "node", lost).Output()
		if err != nil {
			return err
		}
		if !strings.Contains(string(out), "DRAIN") || !strings.Contains(string(out), "Reason=gpuctl: ") {
			return fmt.Errorf("Slurm: %s", strings.Join(strings.Fields(string(out)), " "))
		}
		return nil
	})
	t.Logf("Slurm submit → ranks running median %v; node down → requeued running %v", median(starts), requeue)
}

// TestSlurmNodeStatesFollowEachOther: a gpuctl cordon drains the node in
// Slurm with the reason, a Slurm drain cordons it in gpuctl saying Slurm
// did, and each side lifts what it took.
func TestSlurmNodeStatesFollowEachOther(t *testing.T) {
	s := newSlurmGpuctl(t, "gpuctl")
	ctx := context.Background()
	if _, err := s.cl.Cordon(ctx, "node2", "cordon", "fan failure"); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "node2 drained in Slurm", func() error {
		out := s.slurm.Run("sinfo", "-h", "-N", "-n", "node2", "-o", "%T|%E")
		if !strings.HasPrefix(out, "drain") || !strings.Contains(out, "gpuctl: fan failure") {
			return fmt.Errorf("sinfo: %s", out)
		}
		return nil
	})
	s.slurm.Run("scontrol", "update", "nodename=node3", "state=drain", "reason=bad dimm")
	poll(t, 10*time.Second, "node3 cordoned in gpuctl", func() error {
		ns, err := s.cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if n.GetRegistration().GetName() == "node3" && (!n.GetCordoned() || !strings.HasPrefix(n.GetCordonReason(), "Slurm: ") || !strings.Contains(n.GetCordonReason(), "bad dimm")) {
				return fmt.Errorf("node3 cordoned=%v reason %q", n.GetCordoned(), n.GetCordonReason())
			}
		}
		return nil
	})
	if _, err := s.cl.Cordon(ctx, "node2", "uncordon", ""); err != nil {
		t.Fatal(err)
	}
	s.slurm.Run("scontrol", "update", "nodename=node3", "state=resume")
	poll(t, 10*time.Second, "both back", func() error {
		out := s.slurm.Run("sinfo", "-h", "-N", "-n", "node2", "-o", "%T")
		if strings.TrimSpace(out) != "idle" {
			return fmt.Errorf("Slurm node2 %s", out)
		}
		ns, err := s.cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if n.GetCordoned() {
				return fmt.Errorf("%s still cordoned: %s", n.GetRegistration().GetName(), n.GetCordonReason())
			}
		}
		return nil
	})
}

// TestSlurmPlainSbatchJobShowsUp: a job submitted with sbatch, not through
// gpuctl, is listed by gpuctl with its ranks, found and traced by nodemon.
func TestSlurmPlainSbatchJobShowsUp(t *testing.T) {
	s := newSlurmGpuctl(t, "gpuctl")
	script := fmt.Sprintf(`#!/bin/sh
srun sh -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=127.0.0.1 MASTER_PORT=%d exec %s --steps 0 --compute-ms 30 --bytes 64K'
`, 29000+os.Getpid()%500, s.ringtain)
	path := filepath.Join(s.dir, "plain.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := s.slurm.Run("sbatch", "--parsable", "--job-name=plain", "-N2", "--ntasks-per-node=1", "--nodelist=node2,node4", "--gres=gpu:8",
		"--output="+filepath.Join(s.dir, "plain-%j.out"), path)
	sid := strings.TrimSpace(out)
	id := api.SlurmJobName(sid)
	j := waitFor(t, s.cl, id, 30*time.Second, "the plain sbatch job listed with its ranks", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetName() != "plain" {
			return fmt.Errorf("%s %q: %s", j.GetState(), j.GetName(), j.GetReason())
		}
		if n := len(rankPIDs(j)); n != 2 {
			return fmt.Errorf("%d of 2 ranks with pids (%v)", n, nodesOf(j))
		}
		return nil
	})
	if got := nodesOf(j); !slices.Equal(got, []string{"node2", "node4"}) {
		t.Fatalf("listed on %v, want node2, node4", got)
	}
	s.observed(id, 2)
	// Slurm gave it every GPU of node2 and node4: gpuctl's scheduler
	// counts them busy and places its own job on the others.
	j = waitFor(t, s.cl, id, 10*time.Second, "its GPUs from scontrol show job -d", func(j *api.Job) error {
		for _, jn := range j.GetPlacement() {
			if len(jn.GetGpus()) != 8 {
				return fmt.Errorf("%s: GPUs %v", jn.GetNode(), jn.GetGpus())
			}
		}
		return nil
	})
	mine := s.submit(s.ringJob("beside", 0))
	mj := waitFor(t, s.cl, mine, 30*time.Second, "gpuctl's job running beside it", func(j *api.Job) error { return runningWith(j, 1, 4) })
	if got := nodesOf(mj); slices.Contains(got, "node2") || slices.Contains(got, "node4") {
		t.Fatalf("gpuctl placed its job on %v, where Slurm's plain job holds every GPU", got)
	}
	s.slurm.Run("scancel", sid)
}

// TestSlurmPlacement: with --slurm-placement slurm, Slurm picks the
// nodes (here not gpuctl's choice: a plain sbatch job holds node1's GPUs,
// which gpuctl does not count), and gpuctl reads back where the ranks
// landed.
func TestSlurmPlacement(t *testing.T) {
	s := newSlurmGpuctl(t, "slurm")
	busy := strings.TrimSpace(s.slurm.Run("sbatch", "--parsable", "--job-name=busy", "-N1", "--nodelist=node1", "--gres=gpu:8", "--output=/dev/null", "--wrap", "sleep 120"))
	poll(t, 10*time.Second, "node1 busy", func() error {
		if out := s.slurm.Run("squeue", "-h", "-j", busy, "-o", "%T"); strings.TrimSpace(out) != "RUNNING" {
			return fmt.Errorf("busy job %s", out)
		}
		return nil
	})
	t0 := time.Now()
	id := s.submit(s.ringJob("placed", 0))
	j := waitFor(t, s.cl, id, 30*time.Second, "running where Slurm placed it", func(j *api.Job) error {
		if err := runningWith(j, 1, 4); err != nil {
			return err
		}
		if slices.Contains(nodesOf(j), "node1") {
			return fmt.Errorf("still on %v", nodesOf(j))
		}
		return nil
	})
	out := s.slurm.Run("squeue", "-h", "-o", "%k|%N")
	t.Logf("Slurm placed %s on %v in %v (squeue: %s)", id, nodesOf(j), time.Since(t0), strings.Join(strings.Fields(out), " "))
	waitFor(t, s.cl, id, 20*time.Second, "training", func(j *api.Job) error {
		if j.GetStep() < 5 {
			return fmt.Errorf("step %d", j.GetStep())
		}
		return nil
	})
	s.observed(id, 4)
	s.slurm.Run("scancel", busy)
}

// TestSlurmControllerDownLosesNothing: a job submitted while slurmctld is
// down waits in gpuctl's queue saying why, no node is blamed, and it runs
// once slurmctld is back.
func TestSlurmControllerDownLosesNothing(t *testing.T) {
	s := newSlurmGpuctl(t, "gpuctl")
	s.slurm.StopController()
	id := s.submit(s.ringJob("patient", 0))
	waitFor(t, s.cl, id, 60*time.Second, "back in the queue, saying why", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetReason(), "slurmctld is not answering") {
			return fmt.Errorf("%s: %s", j.GetState(), j.GetReason())
		}
		return nil
	})
	ns, err := s.cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.GetCordoned() {
			t.Fatalf("%s cordoned while slurmctld was down: %s", n.GetRegistration().GetName(), n.GetCordonReason())
		}
	}
	s.slurm.StartController()
	j := waitFor(t, s.cl, id, 90*time.Second, "running once slurmctld is back", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || len(rankPIDs(j)) != 4 {
			return fmt.Errorf("%s attempt %d, %d ranks: %s / %s", j.GetState(), j.GetAttempt(), len(rankPIDs(j)), j.GetReason(), j.GetPendingReason())
		}
		return nil
	})
	t.Logf("ran as attempt %d after slurmctld came back", j.GetAttempt())
}

// TestSlurmSlurmdKilled: a node's slurmd dies (the host as Slurm sees it
// is lost, its ranks may run on): Slurm sets it down after SlurmdTimeout,
// gpuctl moves the job to the other nodes, and no rank of the old attempt
// is left running anywhere.
func TestSlurmSlurmdKilled(t *testing.T) {
	s := newSlurmGpuctl(t, "gpuctl")
	id := s.submit(s.ringJob("rt", 0))
	j := waitFor(t, s.cl, id, 30*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	lost := nodesOf(j)[1]
	t0 := time.Now()
	s.slurm.StopNode(lost)
	j = movedOff(t, s.cl, id, lost, 90*time.Second)
	t.Logf("slurmd of %s killed → attempt %d running on %v in %v", lost, j.GetAttempt(), nodesOf(j), time.Since(t0))
	for _, r := range s.clusterRanks() {
		if r.job == id && r.attempt != j.GetAttempt() {
			t.Errorf("rank %d of attempt %d still runs on %s (pid %d)", r.rank, r.attempt, r.node, r.pid)
		}
	}
}
