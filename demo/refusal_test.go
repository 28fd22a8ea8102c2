package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// TestNodeRefusingRootRanksIsAvoided runs a job whose ranks run as root
// (it names no user, and nodemon runs as root) on a cluster where node-00's
// nodemon was started without --allow-root-ranks. node-00 refuses the
// launch by its own policy: the job runs on the other nodes, node-00 is
// excluded for it and flagged with an event, and stays ready and
// uncordoned for other jobs.
func TestNodeRefusingRootRanksIsAvoided(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	needs.RootUser(t, "start a nodemon as root, which alone has root ranks to refuse")
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF, opts.NoRootRanks = 3, 0, "off", []string{"node-00"}
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	spec := fmt.Sprintf(`name: rootjob
nodes: 2
gpus_per_node: 1
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "5"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "rootjob"))
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "refusal test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	j := waitFor(t, cl, id, 30*time.Second, "running without node-00", func(j *api.Job) error {
		if j.GetState() == api.JobState_JOB_STATE_FAILED {
			t.Fatalf("the job failed: %s\nrecovery events:\n  %s", j.GetReason(), strings.Join(recoveryEvents(t, cl, id), "\n  "))
		}
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || slices.Contains(nodeSet(j), "node-00") || len(rankPIDs(j)) != 2 {
			return fmt.Errorf("%s attempt %d on %v: %s", j.GetState(), j.GetAttempt(), nodeSet(j), j.GetReason())
		}
		return nil
	})
	if len(j.GetAttempts()) < 2 || !slices.Contains(j.GetAttempts()[0].GetNodes(), "node-00") {
		t.Fatalf("attempts %v: the test wants the first placed on node-00", j.GetAttempts())
	}
	if !slices.Contains(j.GetExclude(), "node-00") {
		t.Errorf("exclude %v, want node-00 excluded for the job", j.GetExclude())
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{Node: "node-00"})
	if err != nil {
		t.Fatal(err)
	}
	flag := ""
	for _, e := range evs {
		if e.GetJob() == id && strings.Contains(e.GetMessage(), "node-00 refused job "+id+" by its own policy") {
			flag = e.GetMessage()
		}
	}
	if !strings.Contains(flag, "--allow-root-ranks") {
		t.Errorf("no event on node-00 flags the refusal with its reason; node-00's events: %v", evs)
	}
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.GetCordoned() || n.GetState() != api.NodeState_NODE_STATE_READY {
			t.Errorf("%s is %s cordoned=%v (%s): a node's policy refusal suspects no node", n.GetRegistration().GetName(), n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
		}
	}
	poll(t, 10*time.Second, "the job trains", func() error {
		if s := maxStep(t, c, j); s < 3 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	t.Logf("attempt %d runs on %v; node-00 flagged: %s", j.GetAttempt(), nodeSet(j), flag)
}
