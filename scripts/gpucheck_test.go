// Package scripts tests the scripts that run gpuctl's binaries as a user
// would: gpu-check.sh end to end on simulated GPUs and the reference NCCL.
package scripts

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// fakeSMI answers `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
// with what the server says of the simulated GPUs, in nvidia-smi's units,
// with GPU_CHECK_SKEW_MIB added to each memory total.
const fakeSMI = `#!/usr/bin/env bash
set -euo pipefail
case "$*" in *--query-gpu=*) ;; *) echo "fake nvidia-smi: unsupported: $*" >&2; exit 2 ;; esac
"$GPU_CHECK_TEST_GPUCTL" gpus -o json | python3 -c '
import json, os, sys
skew = int(os.environ.get("GPU_CHECK_SKEW_MIB", "0"))
na = lambda v, f=lambda x: x: "[N/A]" if v is None else str(f(v))
for g in json.load(sys.stdin)["gpus"]:
    print(", ".join([str(g["index"]), g["uuid"], g["model"], str(g["mem_total_bytes"] // 2**20 + skew),
        na(g["mem_used_bytes"], lambda b: b // 2**20), na(g["temperature_celsius"]), na(g["power_watts"]),
        na(g["power_limit_watts"]), na(g["util_percent"]), na(g["sm_clock_mhz"])]))
'
`

type report struct {
	Mode      string `json:"mode"`
	Simulated bool   `json:"simulated"`
	Seconds   int    `json:"seconds"`
	Passed    bool   `json:"passed"`
	Steps     []struct {
		Step, Status, Detail string
	} `json:"steps"`
}

func (r report) step(name string) (status, detail string) {
	for _, s := range r.Steps {
		if s.Step == name {
			return s.Status, s.Detail
		}
	}
	return "", ""
}

// TestGPUCheckSimulated runs scripts/gpu-check.sh --simulate as `make
// gpu-check` would on a machine without a GPU: a real server and nodemon
// on simulated GPUs, their counters compared with an nvidia-smi that
// reports them, ringtrain's NCCL calls traced from the reference
// libnccl.so.2, completing asynchronously, and their completions reported
// by gpuctl's profiler plugin; then the comparison must catch a GPU whose memory total
// disagrees.
func TestGPUCheckSimulated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real server, nodemon and ringtrain")
	}
	root := testbin.Root(t)
	bin, ringtrain := testbin.Dir(t), testbin.Ringtrain(t)
	tmp := t.TempDir()
	smi := filepath.Join(tmp, "nvidia-smi")
	if err := os.WriteFile(smi, []byte(fakeSMI), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "out")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "gpu-check.sh"), "--simulate",
		"--bin", bin, "--workload", filepath.Dir(ringtrain), "--out", out, "--seconds", "5")
	cmd.Env = append(os.Environ(), "GPU_CHECK_NVIDIA_SMI="+smi, "GPU_CHECK_TEST_GPUCTL="+filepath.Join(bin, "gpuctl"), "OUT=")
	cmd.WaitDelay = 10 * time.Second
	log, err := cmd.CombinedOutput()
	t.Logf("gpu-check.sh (exit %v):\n%s", err, log)

	b, rerr := os.ReadFile(filepath.Join(out, "gpu-check-report.json"))
	if rerr != nil {
		t.Fatalf("no JSON report: %v", rerr)
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, b)
	}
	if txt, err := os.ReadFile(filepath.Join(out, "gpu-check-report.txt")); err != nil || !strings.Contains(string(txt), "mode: simulated GPUs") {
		t.Errorf("text report: %v\n%s", err, txt)
	}
	if !r.Simulated || !strings.Contains(r.Mode, "simulated GPUs") || !strings.Contains(r.Mode, "--simulate") {
		t.Errorf("mode %q (simulated %v): the report must say the GPUs were simulated and why", r.Mode, r.Simulated)
	}
	want := map[string]string{"host": "pass", "binaries": "pass", "server": "pass", "node": "pass", "gpus": "pass", "ebpf": "pass", "nccl": "pass", "profiler": "pass"}
	if status, detail := r.step("ebpf"); status == "skip" {
		// Only where eBPF may be missing; the NCCL step then cannot run.
		needs.EBPF.Skip(t, "gpu-check ran, but eBPF was refused: %s", detail)
	}
	for name, status := range want {
		if got, detail := r.step(name); got != status {
			t.Errorf("step %s: %s (%s), want %s", name, got, detail, status)
		}
	}
	if _, detail := r.step("nccl"); !strings.Contains(detail, "libnccl.so.2") || !strings.Contains(detail, "allreduce") {
		t.Errorf("nccl step does not name the traced library and op: %s", detail)
	}
	if err != nil || !r.Passed {
		t.Fatalf("gpu-check failed (exit %v, passed %v)", err, r.Passed)
	}
	for _, f := range []string{"nodemon.log", "server.log", "gpus.json", "collectives.json", "nvidia-smi.csv"} {
		if _, err := os.Stat(filepath.Join(out, "gpu-check-logs", f)); err != nil {
			t.Errorf("the report's logs lack %s: %v", f, err)
		}
	}
	t.Logf("gpu-check took %ds: %s", r.Seconds, b)

	// The comparison on its own: a memory total 1 GiB off is a failure
	// that names the GPU and the figure.
	gpus := filepath.Join(out, "gpu-check-logs", "gpus.json")
	skewed := filepath.Join(tmp, "skewed.csv")
	c := exec.CommandContext(ctx, smi, "--query-gpu=index", "--format=csv,noheader,nounits")
	c.Env = append(os.Environ(), "GPU_CHECK_SKEW_MIB=1024", "GPU_CHECK_TEST_GPUCTL="+filepath.Join(tmp, "cat-gpus"))
	if err := os.WriteFile(filepath.Join(tmp, "cat-gpus"), []byte("#!/bin/sh\nexec cat "+gpus+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	csv, err := c.Output()
	if err != nil {
		t.Fatalf("fake nvidia-smi: %v", err)
	}
	if err := os.WriteFile(skewed, csv, 0o644); err != nil {
		t.Fatal(err)
	}
	cmp := exec.CommandContext(ctx, "python3", filepath.Join(root, "scripts", "gpu-check.py"), "compare", "--gpus", gpus, "--smi", skewed)
	got, err := cmp.CombinedOutput()
	if err == nil || !strings.Contains(string(got), "memory total MiB") || !strings.Contains(string(got), "GPU 0 (") {
		t.Errorf("compare with a memory total 1 GiB off: exit %v, %s; want a failure naming GPU 0's memory total", err, got)
	}
}
