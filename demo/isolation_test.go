package demo

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/client"
)

// TestTwoDemosOnOneHost runs two demo clusters side by side on this host,
// both with nodes named node-00 and node-01 and their NCCL probes on: each
// cluster's collectives name only its own job.
func TestTwoDemosOnOneHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters of real processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.ComputeMS, opts.Bytes = 2, 2, 30, "64K"
	opts.EBPF = ebpfMode()
	opts.MetricsBasePort = 0
	a, ca := startCluster(t, opts)
	b, cb := startCluster(t, opts)
	ctx := context.Background()
	check := func(name string, c *Cluster, other string, cl *client.Client) {
		t.Helper()
		poll(t, 20*time.Second, name+"'s job traced", func() error {
			cs, err := cl.Collectives(ctx, "", "")
			if err != nil {
				return err
			}
			own := 0
			for _, s := range cs {
				switch s.GetJob() {
				case c.JobID:
					own++
				case other:
					return fmt.Errorf("%s lists a collective of the other cluster's job %s (node %s pid %d)", name, other, s.GetNode(), s.GetPid())
				}
			}
			if own == 0 {
				return fmt.Errorf("%s: no collective of its job %s yet", name, c.JobID)
			}
			return nil
		})
	}
	check("cluster a", a, b.JobID, ca)
	check("cluster b", b, a.JobID, cb)
	// And after both have traced a while, still none of the other's.
	time.Sleep(2 * time.Second)
	check("cluster a", a, b.JobID, ca)
	check("cluster b", b, a.JobID, cb)
}
