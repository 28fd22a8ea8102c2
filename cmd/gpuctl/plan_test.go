package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// runPlanCmd runs `gpuctl plan args…` in-process.
func runPlanCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newPlanCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.Execute()
	return out.String(), err
}

func TestPlanJSON(t *testing.T) {
	out, err := runPlanCmd(t, "--model", "gpt-1t", "--gpus", "3072", "--gpu", "h100", "--top", "3", "-o", "json")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	var doc struct {
		GPUs  int              `json:"gpus"`
		Plans []map[string]any `json:"plans"`
		Lost  map[string]int   `json:"rejected_counts"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if doc.GPUs != 3072 || len(doc.Plans) != 3 {
		t.Fatalf("gpus %d, %d plans", doc.GPUs, len(doc.Plans))
	}
	for _, key := range []string{"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "step_seconds", "tflops_per_gpu", "mfu", "mem_per_gpu_bytes"} {
		if _, ok := doc.Plans[0][key]; !ok {
			t.Errorf("plan JSON lacks %q", key)
		}
	}
	p := doc.Plans[0]
	tp, pp, dp := p["tp"].(float64), p["pp"].(float64), p["dp"].(float64)
	if tp > 8 || tp*pp*dp != 3072 {
		t.Errorf("best plan tp %v pp %v dp %v", tp, pp, dp)
	}
	if doc.Lost["slower"] == 0 || doc.Lost["tp exceeds node"] == 0 {
		t.Errorf("rejected counts %v", doc.Lost)
	}
}

func TestPlanTableAndErrors(t *testing.T) {
	out, err := runPlanCmd(t, "--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb")
	if err != nil || !strings.Contains(out, "why the others lost") || !strings.Contains(out, "TFLOP/S/GPU") {
		t.Fatalf("table: %v\n%s", err, out)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "8"}, "pass --model"},
		{[]string{"--model", "gpt3-175b"}, "pass --gpus"},
		{[]string{"--model", "gpt3-175b", "--gpus", "8"}, "no plan for gpt3-175b"},
		{[]string{"--model", "gpt3-175b", "--gpus", "64", "--gpu", "v100"}, `unknown gpu "v100"`},
		{[]string{"--model", "gpt3-175b", "--gpus", "64", "-o", "yaml"}, `unknown output "yaml"`},
		{[]string{"--model", "gpt3-175b", "--gpus", "64", "--set", "speed=1"}, `unknown key "speed"`},
		{[]string{"-f", "/nonexistent/job.yaml"}, "open job file"},
	}
	for _, tt := range tests {
		_, err := runPlanCmd(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("plan %v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

func TestPlanLaunchOutputs(t *testing.T) {
	for out, want := range map[string]string{
		"megatron":  "--tensor-model-parallel-size",
		"deepspeed": `"train_batch_size": 1024`,
		"torchrun":  "exec torchrun",
		"slurm":     "#SBATCH --nodelist=a,b,c,d,e,f,g,h",
		"k8s":       "completionMode: Indexed",
	} {
		got, err := runPlanCmd(t, "--model", "llama2-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "-o", out, "--nodelist", "a,b,c,d,e,f,g,h")
		if err != nil || !strings.Contains(got, want) {
			t.Errorf("-o %s: %v, want %q in\n%s", out, err, want, got)
		}
	}
}
