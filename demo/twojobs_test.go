package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestTwoJobsRecoverFromOneNodeLoss kills the nodemon and the ranks of a
// node two jobs share: the demo job (2 nodes × 2 GPUs) and a 4-node
// ringtrain job. Both recover at once and compete for the same free GPUs;
// with a whole spare node free, both must run again from their
// checkpoints, neither counting the other's surviving GPUs against it.
func TestTwoJobsRecoverFromOneNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.EBPF, opts.ComputeMS, opts.Bytes, opts.CkptInterval = 5, "off", 30, "64K", 10
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	demoJob := waitFor(t, cl, c.JobID, 20*time.Second, "demo job running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	spec := fmt.Sprintf(`name: ring4
nodes: 4
gpus_per_node: 1
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "20"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "ring4"))
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "two-job recovery test"})
	if err != nil {
		t.Fatal(err)
	}
	ring := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "ring4 attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	var shared []string
	for _, n := range nodeSet(demoJob) {
		if slices.Contains(nodeSet(ring), n) {
			shared = append(shared, n)
		}
	}
	if len(shared) == 0 {
		t.Fatalf("the jobs share no node (demo on %v, ring4 on %v)", nodeSet(demoJob), nodeSet(ring))
	}
	victim := shared[len(shared)-1]
	// Both jobs have a complete checkpoint to resume from.
	ckpt := map[string]int64{}
	for _, id := range []string{demoJob.GetId(), ring.GetId()} {
		j := waitFor(t, cl, id, 30*time.Second, id+" checkpointed", func(j *api.Job) error {
			if j.GetLastCheckpointStep() < 20 {
				return fmt.Errorf("last checkpoint step %d", j.GetLastCheckpointStep())
			}
			return nil
		})
		ckpt[id] = j.GetLastCheckpointStep()
	}
	old := map[string]*api.Job{}
	for _, id := range []string{demoJob.GetId(), ring.GetId()} {
		js, err := cl.Jobs(ctx, id)
		if err != nil || len(js) != 1 {
			t.Fatalf("jobs %s: %v %v", id, js, err)
		}
		old[id] = js[0]
	}
	killed := time.Now()
	syscall.Kill(c.NodemonPID(victim), syscall.SIGKILL)
	for _, j := range old {
		for _, at := range rankPIDs(j) {
			if at.node == victim {
				syscall.Kill(-int(at.pid), syscall.SIGKILL)
				syscall.Kill(int(at.pid), syscall.SIGKILL)
			}
		}
	}
	t.Logf("killed %s (nodemon and ranks); demo on %v, ring4 on %v", victim, nodeSet(old[demoJob.GetId()]), nodeSet(old[ring.GetId()]))
	for _, id := range []string{demoJob.GetId(), ring.GetId()} {
		ranks := len(rankPIDs(old[id]))
		now := waitFor(t, cl, id, 60*time.Second, id+" attempt 2 running", func(j *api.Job) error {
			if j.GetState() == api.JobState_JOB_STATE_FAILED {
				t.Fatalf("%s failed: %s\nrecovery events:\n  %s", id, j.GetReason(), strings.Join(recoveryEvents(t, cl, id), "\n  "))
			}
			return runningWith(j, 2, ranks)
		})
		if slices.Contains(nodeSet(now), victim) {
			t.Errorf("%s attempt 2 runs on the lost node %s: %v", id, victim, nodeSet(now))
		}
		for rank, at := range rankPIDs(old[id]) {
			if alive(at.pid) {
				t.Errorf("%s rank %d of attempt 1 (pid %d on %s) still runs", id, rank, at.pid, at.node)
			}
		}
		if now.GetResumeStep() < ckpt[id] {
			t.Errorf("%s resumed from step %d, before its checkpoint at step %d", id, now.GetResumeStep(), ckpt[id])
		}
		// Rank 0's log says where the new attempt began.
		at := rankPIDs(now)[0]
		var rs []string
		poll(t, 10*time.Second, id+" rank 0 printed its resume line", func() error {
			_, rs = rankLog(t, c, at.node, id, 0)
			if len(rs) == 0 || !strings.HasSuffix(rs[len(rs)-1], "GPUCTL_RESUME_STEP") {
				return fmt.Errorf("resume lines %v", rs)
			}
			return nil
		})
		if want := fmt.Sprintf("%d GPUCTL_RESUME_STEP", now.GetResumeStep()); rs[len(rs)-1] != want {
			t.Errorf("%s rank 0 resumed with %q, the server says step %d", id, rs[len(rs)-1], now.GetResumeStep())
		}
		t.Logf("%s: checkpoint %d before the loss, attempt 2 on %v from step %d after %.2fs", id, ckpt[id], nodeSet(now),
			now.GetResumeStep(), time.Since(killed).Seconds())
		t.Logf("%s recovery events:\n  %s", id, strings.Join(recoveryEvents(t, cl, id), "\n  "))
	}
}
