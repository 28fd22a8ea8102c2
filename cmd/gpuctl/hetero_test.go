package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
)

// TestGPUModelsLive: on a real server with a simulated DGX H100 and a DGX
// A100 (40 GB) joined over QUIC, with type allocation on, a job allowing
// both models waits for neither: with the H100s taken it runs on the
// A100s, with the plan chosen for them, and `gpuctl describe job` says
// which type it got and why.
func TestGPUModelsLive(t *testing.T) {
	c := startClusterOf(t, controlplane.Config{Hetero: "max-throughput"}, "dgx-h100", "dgx-a100")
	dir := t.TempDir()
	write := func(name, spec string) string {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Every rank sleeps: a bounded process that needs no GPU.
	busy := write("busy", "name: busy\ncommand: [sleep, '120']\ngpus: 8\ngpu_model: h100\n")
	either := write("either", fmt.Sprintf(`name: either
command: [sleep, '120']
gpus: 8
gpu_models: [h100, a100-40gb]
model: {layers: 24, hidden: 2048, heads: 16, seq_len: 2048, vocab: 50257, global_batch: 64}
checkpoint: {dir: %s, reshardable: true}
`, filepath.Join(dir, "ckpt")))

	submit := func(path string) string {
		out, errOut, err := c.gpuctl(t, "submit", "-f", path)
		if err != nil {
			t.Fatalf("submit %s: %v\n%s", path, err, errOut)
		}
		return strings.TrimSpace(out)
	}
	job := func(id string) *api.Job {
		for _, j := range c.srv.Jobs() {
			if j.GetId() == id {
				return j
			}
		}
		return nil
	}
	running := func(id string) bool { return job(id).GetState() == api.JobState_JOB_STATE_RUNNING }
	defer func() {
		for _, j := range c.srv.Jobs() {
			c.gpuctl(t, "cancel", j.GetId())
		}
		eventually(t, "jobs cancelled", 30*time.Second, func() bool {
			for _, j := range c.srv.Jobs() {
				if !j.GetState().Ended() {
					return false
				}
			}
			return true
		})
	}()

	b := submit(busy)
	eventually(t, "busy runs on the H100s", 30*time.Second, func() bool { return running(b) })
	e := submit(either)
	eventually(t, "either runs", 30*time.Second, func() bool { return running(e) })

	j := job(e)
	if got := j.GetPlacement()[0].GetNode(); got != "node-01" || j.GetGpuType() != "a100-40gb" {
		t.Fatalf("either on %s as %q, want node-01 (the DGX A100) as a100-40gb", got, j.GetGpuType())
	}
	var a100, h100 *api.JobPlan
	for _, tp := range j.GetTypePlans() {
		switch tp.GetGpuModel() {
		case "a100-40gb":
			a100 = tp.GetPlan()
		case "h100":
			h100 = tp.GetPlan()
		}
	}
	p := j.GetPlan()
	if a100 == nil || h100 == nil || p.GetTp() != a100.GetTp() || p.GetPp() != a100.GetPp() || p.GetMicroBatch() != a100.GetMicroBatch() ||
		p.GetStepSeconds() != a100.GetStepSeconds() {
		t.Fatalf("either runs %v; plans by type %v", p, j.GetTypePlans())
	}
	out, errOut, err := c.gpuctl(t, "describe", "job", e)
	if err != nil {
		t.Fatalf("describe: %v\n%s", err, errOut)
	}
	want := fmt.Sprintf("a100-40gb: %.2f× its h100 throughput; max-throughput, no h100 free", h100.GetStepSeconds()/a100.GetStepSeconds())
	if !strings.Contains(out, want) {
		t.Fatalf("describe job does not say %q:\n%s", want, out)
	}
	t.Logf("either: %s; plan on h100 %v, on a100-40gb %v", j.GetGpuTypeReason(), h100, a100)
}
