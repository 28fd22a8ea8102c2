package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/demo"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// waitJob polls the job until ok accepts it, failing with the last state.
func waitJob(t *testing.T, cl *client.Client, id string, limit time.Duration, what string, ok func(*api.Job) error) *api.Job {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		js, err := cl.Jobs(context.Background(), id)
		if err == nil && len(js) != 1 {
			err = fmt.Errorf("%d jobs match", len(js))
		}
		if err == nil {
			if err = ok(js[0]); err == nil {
				return js[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s %s: %v", id, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func inState(want api.JobState) func(*api.Job) error {
	return func(j *api.Job) error {
		if j.GetState() != want {
			return fmt.Errorf("state %s (%s%s)", j.GetState(), j.GetReason(), j.GetPendingReason())
		}
		return nil
	}
}

func pidsOf(j *api.Job) []int {
	var out []int
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			out = append(out, int(r.GetPid()))
		}
	}
	return out
}

func runningWithPIDs(j *api.Job) error {
	if j.GetState() != api.JobState_JOB_STATE_RUNNING {
		return fmt.Errorf("state %s (%s%s)", j.GetState(), j.GetReason(), j.GetPendingReason())
	}
	if slices.Contains(pidsOf(j), 0) {
		return fmt.Errorf("pids %v", pidsOf(j))
	}
	return nil
}

func nodeNames(j *api.Job) []string {
	var out []string
	for _, jn := range j.GetPlacement() {
		out = append(out, jn.GetNode())
	}
	return out
}

// TestJobsOnRealNodes runs jobs through a real server and three real
// nodemons (simulated DGX H100s): a 2×2 ringtrain runs to success, a job
// larger than the cluster is refused unless held (and then waits, held), a
// cancelled job's ranks are gone, and an assigned job lands on the named
// nodes.
func TestJobsOnRealNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	began := time.Now()
	c, cl := realCluster(t, 3, "off")
	ringtrain, dataDir := c.Options().Ringtrain, c.Options().DataDir

	submit := func(spec string, hold bool) string {
		t.Helper()
		r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "test", Hold: hold})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetJob().GetId()
	}
	train := func(steps int) string {
		return fmt.Sprintf("command: [%s, --steps, %q, --compute-ms, \"100\", --bytes, 64K]\n", ringtrain, fmt.Sprint(steps))
	}
	ring := submit("name: ring\nnodes: 2\ngpus_per_node: 2\n"+train(15), false)
	// Larger than the cluster as built: refused, unless held.
	if _, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: "name: huge\ngpus: 32\n" + train(15), Source: "test"}); err == nil ||
		!strings.Contains(err.Error(), "needs 32 GPUs") || !strings.Contains(err.Error(), "hold 24 GPUs in all") {
		t.Fatalf("submitting a job larger than the cluster: %v, want it refused saying why", err)
	}
	huge := submit("name: huge\ngpus: 32\n"+train(15), true)
	long := submit("name: long\nnodes: 1\ngpus_per_node: 2\n"+train(0), false)
	pinned := submit("name: pinned\nnodes: 2\ngpus_per_node: 1\n"+train(5), true)

	// The 2×2 job runs with real pids, then every rank finishes its steps.
	j := waitJob(t, cl, ring, 15*time.Second, "running with pids", runningWithPIDs)
	if len(j.GetPlacement()) != 2 || len(pidsOf(j)) != 4 || j.GetMasterAddr() != "127.0.0.1" {
		t.Fatalf("ring placed on %v with pids %v, master %s", nodeNames(j), pidsOf(j), j.GetMasterAddr())
	}
	j = waitJob(t, cl, ring, 20*time.Second, "succeeded", inState(api.JobState_JOB_STATE_SUCCEEDED))
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			log := filepath.Join(dataDir, "nodes", jn.GetNode(), "logs", ring, fmt.Sprintf("rank-%d.log", r.GetRank()))
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "stop step=15 reason=steps") {
				t.Errorf("rank %d did not finish its 15 steps:\n%s", r.GetRank(), b)
			}
		}
	}

	// Held, larger than the cluster: pending, saying why, and not in
	// anyone's way.
	waitJob(t, cl, huge, 5*time.Second, "pending with a reason", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetPendingReason(), "held: place it with `gpuctl assign "+huge) {
			return fmt.Errorf("state %s reason %q", j.GetState(), j.GetPendingReason())
		}
		return nil
	})

	// Cancel: the job ends cancelled and its rank processes are gone.
	j = waitJob(t, cl, long, 10*time.Second, "running with pids", runningWithPIDs)
	pids := pidsOf(j)
	if _, err := cl.CancelJob(ctx, long); err != nil {
		t.Fatal(err)
	}
	waitJob(t, cl, long, 15*time.Second, "cancelled with its ranks gone", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_CANCELLED || j.GetStopping() != api.JobStop_JOB_STOP_NONE {
			return fmt.Errorf("state %s stopping %s", j.GetState(), j.GetStopping())
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("rank pid %d still exists (%v)", pid, err)
			}
		}
		return nil
	})

	// Assign: the held job lands on exactly the named nodes.
	want := []string{c.NodeNames[1], c.NodeNames[2]}
	j, err := cl.AssignJob(ctx, pinned, []string{want[1], want[0]})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodeNames(j); !slices.Equal(got, want) {
		t.Fatalf("assigned to %v, want %v", got, want)
	}
	waitJob(t, cl, pinned, 15*time.Second, "succeeded", inState(api.JobState_JOB_STATE_SUCCEEDED))
	t.Logf("whole test %.1fs", time.Since(began).Seconds())
}

// realCluster starts a control plane in this process and nodes real
// nodemon processes on simulated DGX H100 hosts, with a client, all ended
// with the test.
func realCluster(t *testing.T, nodes int, ebpf string) (*demo.Cluster, *client.Client) {
	t.Helper()
	nodemon, ringtrain := testbin.Nodemon(t), testbin.Ringtrain(t)
	opts := demo.DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF = nodes, 0, ebpf
	opts.Nodemon, opts.Ringtrain, opts.DataDir = nodemon, ringtrain, t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := demo.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cl, err := client.Dial(ctx, c.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	t.Logf("cluster of %d nodes up in %.1fs", nodes, time.Since(began).Seconds())
	return c, cl
}
