package demo

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// binaries returns nodemon and ringtrain.
func binaries(t testing.TB) (nodemon, ringtrain string) {
	t.Helper()
	return testbin.Nodemon(t), testbin.Ringtrain(t)
}

// ebpfMode is required in CI (GPUCTL_REQUIRE_EBPF=1), else auto.
func ebpfMode() string {
	if needs.EBPF.Required() {
		return "required"
	}
	return "auto"
}

// startCluster starts a demo cluster with opts (binaries and data dir
// filled in) and a client of it, both ended with the test.
func startCluster(t *testing.T, opts Options) (*Cluster, *client.Client) {
	t.Helper()
	opts.Nodemon, opts.Ringtrain = binaries(t)
	opts.DataDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cl, err := client.Dial(ctx, c.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return c, cl
}

// poll retries f until it returns nil or the limit passes.
func poll(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	if err := waitUntil(limit, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitUntil retries f until it returns nil or the limit passes, and
// returns its last error.
func waitUntil(limit time.Duration, f func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDemoClusterEndToEnd(t *testing.T) {
	opts := DefaultOptions()
	opts.ComputeMS = 30
	opts.Bytes = "256K"
	opts.EBPF = ebpfMode()
	c, cl := startCluster(t, opts)
	ctx := context.Background()

	// Four ready nodes of eight GPUs each, with counters that move.
	first, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 4 {
		t.Fatalf("%d nodes, want 4", len(first))
	}
	for _, n := range first {
		if n.GetState() != api.NodeState_NODE_STATE_READY || len(n.GetGpus()) != 8 {
			t.Fatalf("node %s: state %s, %d GPUs", n.GetRegistration().GetName(), n.GetState().Short(), len(n.GetGpus()))
		}
	}
	poll(t, 10*time.Second, "GPU counters change", func() error {
		now, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		a, b := first[0].GetGpus()[0].GetLast(), now[0].GetGpus()[0].GetLast()
		if a.GetTimeUnixNano() == b.GetTimeUnixNano() || a.GetEnergyMj() == b.GetEnergyMj() {
			return fmt.Errorf("GPU 0 of node-00 unchanged: energy %d → %d", a.GetEnergyMj(), b.GetEnergyMj())
		}
		return nil
	})

	// Let the job train, stop it cleanly, and compare the steps every rank
	// printed with the all-reduce calls eBPF counted on its training
	// communicator.
	time.Sleep(3 * time.Second)
	jobs, err := cl.Jobs(ctx, c.JobID)
	if err != nil || len(jobs) != 1 || len(jobs[0].GetPlacement()) != opts.JobNodes {
		t.Fatalf("demo job: %v, %v", jobs, err)
	}
	job := jobs[0]
	for _, jn := range job.GetPlacement() {
		if err := c.Server.Command(ctx, jn.GetNode(), &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: c.JobID, Signal: "SIGTERM"}}}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 20*time.Second, "ranks exit", func() error {
		evs, err := cl.Events(ctx, &api.ListEventsRequest{})
		if err != nil {
			return err
		}
		exits := 0
		for _, e := range evs {
			if e.GetKind() == api.EventKind_EVENT_KIND_PROCESS_EXIT && e.GetJob() == c.JobID {
				if e.GetExitCode() != 0 {
					return fmt.Errorf("rank %d exited %d %s", e.GetRank(), e.GetExitCode(), e.GetSignal())
				}
				exits++
			}
		}
		if exits < opts.JobNodes*opts.RanksPerNode {
			return fmt.Errorf("%d ranks exited", exits)
		}
		return nil
	})
	steps := map[int32]uint64{}
	for _, jn := range job.GetPlacement() {
		for _, r := range jn.GetRanks() {
			rank := r.GetRank()
			steps[rank] = countSteps(t, filepath.Join(c.opts.DataDir, "nodes", jn.GetNode(), "logs", c.JobID, fmt.Sprintf("rank-%d.log", rank)))
			if steps[rank] < 5 {
				t.Fatalf("rank %d printed only %d steps", rank, steps[rank])
			}
		}
	}
	if ebpfMode() == "auto" && os.Geteuid() != 0 {
		t.Log("not root: eBPF tracing is off, collective counts not checked")
	} else {
		poll(t, 5*time.Second, "traced all-reduces equal printed steps", func() error {
			for _, key := range []string{c.JobID, JobName} { // by id and by name
				cs, err := cl.Collectives(ctx, key, "")
				if err != nil {
					return err
				}
				if err := checkTrainingCalls(cs, steps); err != nil {
					return fmt.Errorf("--job %s: %w", key, err)
				}
			}
			return nil
		})
	}

	// A killed nodemon turns its node down within 3 s.
	victim := c.NodeNames[3]
	killed := time.Now()
	syscall.Kill(c.NodemonPID(victim), syscall.SIGKILL)
	poll(t, 3*time.Second, victim+" down", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.GetRegistration().GetName() == victim && n.GetState() != api.NodeState_NODE_STATE_DOWN {
				return fmt.Errorf("state %s", n.GetState().Short())
			}
		}
		return nil
	})
	t.Logf("node down %.2fs after its nodemon was killed", time.Since(killed).Seconds())
}

// checkTrainingCalls finds, per rank, the communicator whose all-reduce
// count matches what the rank printed. The training communicator carries
// one all-reduce per step; control traffic goes on another communicator.
func checkTrainingCalls(cs []*api.CollectiveStat, steps map[int32]uint64) error {
	for rank, want := range steps {
		var seen []string
		ok := false
		for _, s := range cs {
			if s.GetRank() != rank || s.GetOp() != api.NCCLOp_NCCL_OP_ALL_REDUCE {
				continue
			}
			seen = append(seen, fmt.Sprintf("comm %#x: %d calls", s.GetComm(), s.GetCalls()))
			if s.GetCalls() == want && s.GetSeq() == want {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("rank %d printed %d steps; traced all-reduces: %v", rank, want, seen)
		}
	}
	return nil
}

func countSteps(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "step ") {
			n++
		}
	}
	return n
}
