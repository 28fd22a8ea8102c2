package slurmtest

import (
	"strings"
	"testing"
	"time"
)

// TestClusterRunsAJobAcrossNodes starts the cluster and runs one srun'd
// task per node on two nodes, with GPUs.
func TestClusterRunsAJobAcrossNodes(t *testing.T) {
	t0 := time.Now()
	c := Start(t, Options{})
	t.Logf("Slurm with %d nodes up in %v", len(c.Nodes), time.Since(t0))
	out := c.Run("srun", "-N2", "--nodelist=node1,node3", "--ntasks-per-node=1", "--gres=gpu:2", "sh", "-c", "echo $SLURMD_NODENAME $SLURM_PROCID $CUDA_VISIBLE_DEVICES")
	for _, want := range []string{"node1 0 0,1", "node3 1 0,1"} {
		if !strings.Contains(out, want) {
			t.Errorf("srun printed %q, want a line %q", out, want)
		}
	}
}
