package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/predict"
)

// TestSimulateTrain learns a model from the Philly trace (reporting its
// held-out accuracy) and from a `gpuctl jobs -o json` document, and
// refuses what it cannot learn from.
func TestSimulateTrain(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "runtimes.json")
	out, err := runSimulateCmd(t, "train", "--trace", phillyTrace, "--train-fraction", "0.6", "-o", model)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"learned on 1820 jobs, tested on the 1214 after them", "model:", "one mean runtime:", "wrote " + model} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if m, err := readRuntimeModel(model); err != nil || m.Predict(predict.Features{GPUs: 8, Hour: 3}).Seconds < 1 {
		t.Fatalf("the written model: %v", err)
	}
	// The learned policy's weights, reported against sjf on the rest, and
	// run by simulate.
	weights := filepath.Join(dir, "weights.json")
	out, err = runSimulateCmd(t, "train", "--trace", phillyTrace, "--train-fraction", "0.6", "-o", model,
		"--policy-out", weights, "--learn-iterations", "1", "--learn-samples", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"policy learned+backfill: mean JCT on the jobs it learned from", "learned+backfill mean JCT",
		"sjf+backfill     mean JCT", "wrote " + weights + ": weights for learned+backfill"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if out, err := runSimulateCmd(t, "--trace", phillyTrace, "--policy", "learned+backfill", "--policy-weights", weights, "--nodes", "40"); err != nil ||
		!strings.Contains(out, "learned+backfill") {
		t.Errorf("simulate with the learned weights: %v\n%s", err, out)
	}
	if _, err := runSimulateCmd(t, "--trace", phillyTrace, "--policy", "learned"); err == nil || !strings.Contains(err.Error(), "--policy-weights FILE") {
		t.Errorf("simulate --policy learned without weights: %v", err)
	}

	jobs := filepath.Join(dir, "jobs.json")
	doc := `{"jobs": [
 {"id": "j-1", "name": "bert-run1", "tenant": "nlp", "state": "succeeded", "gpus": 8, "submit_time": "2026-11-01T10:00:00Z",
  "attempts": [{"attempt": 1, "start_time": "2026-11-01T10:01:00Z", "end_time": "2026-11-01T11:01:00Z"}]},
 {"id": "j-2", "name": "bert-run2", "tenant": "nlp", "state": "succeeded", "gpus": 8, "submit_time": "2026-11-02T10:00:00Z",
  "attempts": [{"attempt": 1, "start_time": "2026-11-02T10:00:00Z", "end_time": "2026-11-02T10:30:00Z"},
               {"attempt": 2, "start_time": "2026-11-02T10:40:00Z", "end_time": "2026-11-02T11:10:00Z"}]},
 {"id": "j-3", "name": "bert-run3", "tenant": "nlp", "state": "failed", "gpus": 8, "submit_time": "2026-11-03T10:00:00Z",
  "attempts": [{"attempt": 1, "start_time": "2026-11-03T10:00:00Z", "end_time": "2026-11-03T10:01:00Z"}]}
]}`
	if err := os.WriteFile(jobs, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runSimulateCmd(t, "train", "--jobs", jobs, "--min-support", "2", "-o", model); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m, err := readRuntimeModel(model)
	if err != nil {
		t.Fatal(err)
	}
	// Two succeeded jobs of an hour each (the failed one is not learned
	// from), the second over two attempts.
	if p := m.Predict(predict.Features{Name: "bert-run9", Tenant: "nlp", GPUs: 8, Hour: 10}); p.Seconds != 3600 || p.Support != 2 {
		t.Errorf("learned from the jobs document: %+v, want 3600 s from 2 jobs", p)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "-o", model}, "give one of --trace FILE or --jobs FILE"},
		{[]string{"train", "--trace", phillyTrace}, "-o FILE is required"},
		{[]string{"train", "--trace", phillyTrace, "--train-fraction", "1.5", "-o", model}, "--train-fraction 1.5"},
		{[]string{"train", "--jobs", model, "-o", model}, "no succeeded job to learn from"},
	} {
		if out, err := runSimulateCmd(t, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("simulate %s: %v (%s), want an error saying %q", strings.Join(bad.args, " "), err, out, bad.want)
		}
	}
}

// TestServeRefusesABadRuntimeModel: a model gpuctl cannot use stops
// serve before it starts, saying which file and what to do.
func TestServeRefusesABadRuntimeModel(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "runtimes.json")
	if err := os.WriteFile(bad, []byte(`{"version": 9, "min_support": 3, "groups": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := newServeCmd()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--runtime-model", bad})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "--runtime-model: "+bad+": runtime model: format version 9") ||
		!strings.Contains(err.Error(), "train it again") {
		t.Fatalf("serve with a bad runtime model: %v", err)
	}
	cmd = newServeCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--policy", "learned", "--policy-weights", bad})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--policy-weights: "+bad+": policy weights: json: unknown field") {
		t.Fatalf("serve with bad policy weights: %v", err)
	}
}
