package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestSlowQuietSurvivesFailover runs a job on two nodes traced with eBPF
// under the highly available control plane and slows one rank's GPU: the
// finding is acknowledged (`gpuctl stalls ack JOB --rank 3`) and the job
// silenced (`gpuctl stalls silence JOB --for 30m`) through the real CLI,
// and `gpuctl stalls -o json` shows both. The leader is killed: the new
// leader finds the slow rank again from the nodes' calls, and lists it
// still acknowledged and silenced, which it read from the store.
func TestSlowQuietSurvivesFailover(t *testing.T) {
	c := newHAServers(t)
	c.ebpf = ebpfMode()
	c.joinNodes(2)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	spec := fmt.Sprintf("name: slowha\nnodes: 2\ngpus_per_node: 2\ncommand: [%q, --steps, \"0\", --compute-ms, \"100\", --bytes, 4M]\n", c.ringtain)
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "slow ha test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	job := waitFor(t, cl, id, 30*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	requireTraced(t, cl, id, 15*time.Second, "the fail-slow analysis")
	node, gpu := rankGPU(t, job, 3)
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}); err != nil {
		t.Fatal(err)
	}
	listed := func(cl interface {
		ListFindings(context.Context, string) (*api.ListStallsResponse, error)
	}) (*api.SlowFinding, error) {
		r, err := cl.ListFindings(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, f := range r.GetSlow() {
			if f.GetClass() == "compute-slow" && f.GetRank() == 3 {
				return f, nil
			}
		}
		return nil, fmt.Errorf("not listed: %v", r.GetSlow())
	}
	poll(t, 45*time.Second, "rank 3 found compute-slow", func() error { _, err := listed(cl); return err })

	cache := t.TempDir()
	for _, args := range [][]string{{"stalls", "ack", id, "--rank", "3"}, {"stalls", "silence", id, "--for", "30m"}} {
		_, out, err := c.cli(cache, args...)
		if err != nil || !strings.Contains(string(out), "1 standing now") {
			t.Fatalf("gpuctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	silenced := time.Now()
	_, out, err := c.cli(cache, "stalls", "--job", id, "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var doc struct {
		Slow []struct {
			Class         string     `json:"class"`
			Rank          *int32     `json:"rank"`
			Acked         bool       `json:"acked"`
			SilencedUntil *time.Time `json:"silenced_until_time"`
		} `json:"slow"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Slow) != 1 || !doc.Slow[0].Acked || doc.Slow[0].SilencedUntil == nil || doc.Slow[0].SilencedUntil.Before(silenced.Add(29*time.Minute)) {
		t.Fatalf("gpuctl stalls -o json after ack and silence:\n%s", out)
	}

	standby := c.dialOnly(c.addrs[1])
	defer standby.Close()
	killed := time.Now()
	c.killServer(0)
	c.waitLeader(standby, serverName(1), 10*time.Second)
	var again time.Duration
	poll(t, 60*time.Second, "the new leader lists rank 3 acknowledged and silenced", func() error {
		f, err := listed(standby)
		if err != nil {
			return err
		}
		if !f.GetAcked() || time.Unix(0, f.GetSilencedUntilUnixNano()).Before(silenced.Add(29*time.Minute)) {
			return errors.New("listed, but neither acknowledged nor silenced")
		}
		again = time.Since(killed)
		return nil
	})
	t.Logf("leader killed: rank 3 on %s found slow again by %s, acknowledged and silenced, %.1fs later", node, serverName(1), again.Seconds())
}
