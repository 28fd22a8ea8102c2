package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
)

// phillyTrace is the Philly trace committed in the repository.
var phillyTrace = filepath.Join("..", "..", "scheduler", "trace", "testdata", "philly-multigpu-3034.json")

func runSimulateCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newSimulateCmd()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

func TestSimulateDefaultPolicy(t *testing.T) {
	// simulate and serve queue jobs the same way unless told otherwise.
	f := newSimulateCmd().Flags().Lookup("policy")
	if f == nil || f.DefValue != scheduler.DefaultPolicy {
		t.Fatalf("simulate --policy defaults to %v, want %s", f, scheduler.DefaultPolicy)
	}
	if _, err := scheduler.PolicyByName(scheduler.DefaultPolicy); err != nil {
		t.Fatal(err)
	}
}

func TestSimulateTraceJSON(t *testing.T) {
	out, err := runSimulateCmd(t, "--trace", phillyTrace, "--policy", "fifo", "--nodes", "40", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var doc simulate.TraceDocument
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Jobs != 3034 || doc.Nodes != 40 || len(doc.Policies) != 1 || doc.Policies[0].Policy != "fifo" ||
		doc.Policies[0].MeanJCTSeconds <= 0 || doc.Policies[0].Restarts == 0 {
		t.Fatalf("document %+v", doc)
	}
}

func TestSimulateRunUnderFailures(t *testing.T) {
	// A month of Llama 2 70B on 256 H100s with an interruption every two
	// hours: the replay lands near the cost model's expectation.
	out, err := runSimulateCmd(t, "--model", "llama2-70b", "--gpus", "256", "--gpu", "h100", "--mtbf", "2h", "--steps", "300000", "--seed", "3", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var doc simulate.RunDocument
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Simulated.Interruptions < 100 || doc.Cluster.JobNodes != 32 || doc.Cluster.Steps != 300000 {
		t.Fatalf("document %+v", doc)
	}
	if math.Abs(doc.DifferencePercent) > 5 {
		t.Errorf("simulated %.0f s against predicted %.0f s (%+.1f%%)", doc.Simulated.WallSeconds, doc.Predicted.EffectiveSeconds, doc.DifferencePercent)
	}
	table, err := runSimulateCmd(t, "--model", "llama2-70b", "--gpus", "256", "--gpu", "h100", "--mtbf", "2h", "--steps", "300000", "--seed", "3")
	if err != nil || !strings.Contains(table, "predicted") || !strings.Contains(table, "simulated") {
		t.Fatalf("table: %v\n%s", err, table)
	}
}

func TestSimulateErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--model", "llama2-70b", "--gpus", "256", "--steps", "10"}, "needs a failure rate"},
		{[]string{"--model", "llama2-70b", "--gpus", "256", "--mtbf", "2h"}, "how long is the run"},
		{[]string{"--model", "llama2-70b", "--gpus", "250", "--mtbf", "2h", "--steps", "10"}, "whole 8-GPU nodes"},
		{[]string{"--model", "llama2-70b", "--trace", phillyTrace}, "not both"},
		{[]string{"--model", "llama2-70b", "--gpus", "256", "--mtbf", "2h", "--steps", "10", "--set", "speed=1"}, "unknown"},
		{[]string{"--model", "gpt5", "--gpus", "256", "--mtbf", "2h", "--steps", "10"}, "unknown model preset"},
	}
	for _, tt := range tests {
		if _, err := runSimulateCmd(t, tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("simulate %v: error %v, want %q", tt.args, err, tt.want)
		}
	}
	t.Setenv("GPUCTL_TRACE", "")
	if _, err := runSimulateCmd(t); err == nil || !strings.Contains(err.Error(), "scheduler/trace/testdata/philly-multigpu-3034.json") {
		t.Errorf("no trace: %v should name the committed trace", err)
	}
}
