package demo

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/procfs"
)

// TestDemoGPUsBusyCPUsIdle: in the default demo the job's simulated GPUs
// are busy while its ranks leave the CPUs nearly idle: a rank sleeps
// through its compute phase and reports kernel time, which the simulated
// GPUs count as utilization. Before, each rank spun a core for it.
func TestDemoGPUsBusyCPUsIdle(t *testing.T) {
	opts := DefaultOptions()
	opts.EBPF = ebpfMode()
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	pids := map[uint32]bool{}
	busy := 0
	poll(t, 15*time.Second, "the job's GPUs busy", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		busy = 0
		for _, n := range nodes {
			for _, g := range n.GetGpus() {
				if len(g.GetLast().GetProcesses()) == 0 {
					continue
				}
				for _, p := range g.GetLast().GetProcesses() {
					pids[p.GetPid()] = true
				}
				if g.GetLast().GetUtilGpuPercent() >= 50 {
					busy++
				}
			}
		}
		if want := opts.JobNodes * opts.RanksPerNode; busy < want {
			return fmt.Errorf("%d of the job's %d GPUs at 50 %% or more", busy, want)
		}
		return nil
	})
	if len(pids) != opts.JobNodes*opts.RanksPerNode {
		t.Fatalf("processes on GPUs %v, want one per rank of %s", pids, c.JobID)
	}
	cpu := func() float64 {
		var s float64
		for pid := range pids {
			st, err := procfs.ReadStat("/proc", int(pid))
			if err != nil {
				t.Fatalf("rank pid %d: %v", pid, err)
			}
			s += st.CPUSeconds()
		}
		return s
	}
	const window = 3 * time.Second
	before := cpu()
	time.Sleep(window) // measuring a rate over real time, not waiting for a result
	used := (cpu() - before) / window.Seconds()
	t.Logf("%d ranks: %.3f cores; %d GPUs busy", len(pids), used, busy)
	if used > 0.5 {
		t.Fatalf("the job's %d ranks used %.2f cores (want under 0.5: simulated compute must not spin)", len(pids), used)
	}
}
