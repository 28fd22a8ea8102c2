package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
)

// TestControlPlaneAwayStopsNoRank stops the only server (bbolt) for 30 s
// (GPUCTL_AWAY_FOR; `make soak` runs 10 minutes), six times its 5 s lease, first with SIGSTOP and then with SIGKILL and a
// restart 30 s later, while ringtrain runs on two of three real nodemons.
// Nothing could start a newer attempt meanwhile, so no rank may stop: the
// nodes renew their ranks' leases from their witnesses (the job's other
// node and the third), and afterwards the job is attempt 1 with the same
// rank pids, no rank log saying its lease stopped it.
func TestControlPlaneAwayStopsNoRank(t *testing.T) {
	const lease = 5 * time.Second
	away := envDuration(t, "GPUCTL_AWAY_FOR", 30*time.Second)
	c := newProcCluster(t, 3, "--lease", lease.String())
	t.Logf("the server goes away for %s twice (GPUCTL_AWAY_FOR)", away)
	cl := c.dial(10 * time.Second)
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("away", 2), Source: "control plane away test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	if w := running.GetWitnesses(); len(w) != 3 {
		t.Fatalf("the attempt's witnesses are %v, want its two nodes and the third", w)
	}
	cl.Close()
	// alive fails the test as soon as a rank is gone.
	aliveFor := func(what string, d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			for rank, at := range rankPIDs(running) {
				if !alive(at.pid) {
					t.Fatalf("%s: rank %d (pid %d on %s) is gone\n%s", what, rank, at.pid, at.node, c.logs())
				}
			}
		}
	}

	if err := syscall.Kill(c.server.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	aliveFor("server stopped (SIGSTOP)", away)
	if err := syscall.Kill(c.server.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	cl = c.dial(10 * time.Second)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if err := c.checkSamePIDs(cl, running); err != nil {
			t.Fatalf("after SIGCONT: %v\n%s", err, c.logs())
		}
	}
	cl.Close()

	c.killServer()
	aliveFor("server killed (SIGKILL)", away)
	c.startServer()
	cl = c.dial(20 * time.Second)
	defer cl.Close()
	bound := 2*time.Second + jobs.DefaultReconnectGrace
	for end := time.Now().Add(bound + 3*time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if err := c.checkSamePIDs(cl, running); err != nil {
			t.Fatalf("%.1fs after the restart: %v\n%s", time.Since(c.serverStarted).Seconds(), err, c.logs())
		}
	}
	c.waitNodes(cl, 5*time.Second, 3)
	for rank, at := range rankPIDs(running) {
		b, err := os.ReadFile(filepath.Join(c.dir, "nodes", at.node, "logs", running.GetId(), fmt.Sprintf("rank-%d.log", rank)))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "lease expired") || strings.Count(string(b), "resume step=") != 1 {
			t.Errorf("rank %d's log:\n%s", rank, b)
		}
	}
	t.Logf("server away %s twice (SIGSTOP, then SIGKILL and a restart) under a %s lease: attempt 1 with pids %v throughout",
		away, lease, rankPIDs(running))
}
