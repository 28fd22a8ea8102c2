package views

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func sampleStalls() []*api.Stall {
	return []*api.Stall{
		{Job: "j-1a2b3c", Comm: 0x55d0c0ffee00, SinceUnixNano: now.Add(-5200 * time.Millisecond).UnixNano(), ThresholdNs: int64(3 * time.Second),
			LaggingRanks: []*api.StalledRank{{Rank: 2, Node: "node-01", Pid: 4242, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Seq: 41, ProcState: "T"}},
			WaitingRanks: []*api.StalledRank{
				{Rank: 0, Node: "node-00", Pid: 4100, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Seq: 42, InCall: true, ProcState: "S"},
				{Rank: 1, Node: "node-00", Pid: 4101, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Seq: 42, InCall: true, ProcState: "S"},
				{Rank: 3, Node: "node-01", Pid: 4243, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Seq: 42, InCall: true, ProcState: "S"}},
			Diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 5.2s"},
		{Job: "j-4d5e6f", Comm: 0x7f00, SinceUnixNano: now.Add(-90 * time.Second).UnixNano(), ThresholdNs: int64(time.Minute),
			WaitingRanks: []*api.StalledRank{
				{Rank: 0, Node: "node-02", Pid: 77, Op: api.NCCLOp_NCCL_OP_ALL_GATHER, Seq: 7, InCall: true, ProcState: "S"},
				{Rank: 1, Node: "node-03", Pid: 78, Op: api.NCCLOp_NCCL_OP_ALL_GATHER, Seq: 7, InCall: true, ProcState: "S"}},
			Diagnosis: "all 2 ranks wait in allgather seq 7 for 1m30s and none is stopped or idle: suspect the network between them or a hung GPU"},
	}
}

func TestStallsJSONContract(t *testing.T) {
	var b bytes.Buffer
	if err := Stalls(&b, Options{Format: JSON, Now: now}, sampleStalls()); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stalls []map[string]any `json:"stalls"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Stalls) != 2 {
		t.Fatalf("%d stalls", len(doc.Stalls))
	}
	s := doc.Stalls[0]
	for _, k := range []string{"job", "comm", "lagging_ranks", "waiting_ranks", "since_time", "diagnosis", "threshold_seconds", "stalled_seconds"} {
		if _, ok := s[k]; !ok {
			t.Errorf("stall lacks %q", k)
		}
	}
	lag := s["lagging_ranks"].([]any)[0].(map[string]any)
	for k, want := range map[string]any{"rank": 2.0, "node": "node-01", "pid": 4242.0, "op": "allreduce", "seq": 41.0, "in_call": false, "proc_state": "T"} {
		if lag[k] != want {
			t.Errorf("lagging_ranks[0].%s = %v, want %v", k, lag[k], want)
		}
	}
	if w := s["waiting_ranks"].([]any); len(w) != 3 || w[2] != 3.0 {
		t.Errorf("waiting_ranks %v, want [0 1 3]", w)
	}
	if s["threshold_seconds"] != 3.0 || s["stalled_seconds"] != 5.2 {
		t.Errorf("threshold_seconds %v stalled_seconds %v", s["threshold_seconds"], s["stalled_seconds"])
	}
	// A job without stalls still gets a list, never null.
	b.Reset()
	if err := Stalls(&b, Options{Format: JSON, Now: now}, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "{\n  \"stalls\": []\n}\n" {
		t.Errorf("empty: %q", got)
	}
}

func sampleSlow() []*api.SlowFinding {
	return []*api.SlowFinding{
		{Job: "j-1a2b3c", Class: "compute-slow", Rank: 3, Node: "node-01", Comm: 0, SinceUnixNano: now.Add(-12 * time.Second).UnixNano(),
			LateNs: int64(42 * time.Millisecond), Slowdown: 1.396, Acked: true,
			Evidence: "rank 3 entered last in 7 of the last 10 collectives on communicator 0, 42ms after the median of its peers; its GPU's SM clock is 70% of its peers' (hw_slowdown)"},
		{Job: "j-4d5e6f", Class: "communication-slow", Rank: -1, Node: "node-02", Comm: 1, SinceUnixNano: now.Add(-40 * time.Second).UnixNano(),
			Slowdown: 2.1, SilencedUntilUnixNano: now.Add(29 * time.Minute).UnixNano(), Evidence: "the ranks enter together but collectives on communicator 1 take 2.10× their baseline (bus bandwidth 310 MB/s, 48% of its own)"},
		{Job: "j-777777", Class: "job-wide", Rank: -1, Comm: -1, SinceUnixNano: now.Add(-3 * time.Minute).UnixNano(), Slowdown: 1.15,
			Evidence: "every rank is slower: the step time is 1.15× its baseline of 110ms"},
	}
}

// Fail-slow findings follow the stalls: in JSON as "slow", in a table of
// their own; who is slow reads as rank@node, a node, or every rank.
func TestFindingsFormats(t *testing.T) {
	var b bytes.Buffer
	if err := Findings(&b, Options{Format: JSON, Now: now}, &api.ListStallsResponse{Slow: sampleSlow()}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stalls []map[string]any `json:"stalls"`
		Slow   []map[string]any `json:"slow"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Stalls == nil || len(doc.Slow) != 3 {
		t.Fatalf("stalls %v, %d slow findings", doc.Stalls, len(doc.Slow))
	}
	for k, want := range map[string]any{"job": "j-1a2b3c", "class": "compute-slow", "rank": 3.0, "node": "node-01", "comm": 0.0,
		"slow_seconds": 12.0, "late_seconds": 0.042, "slowdown": 1.4, "acked": true, "silenced_until_time": nil} {
		if got := doc.Slow[0][k]; got != want {
			t.Errorf("slow[0].%s = %v, want %v", k, got, want)
		}
	}
	if doc.Slow[1]["acked"] != false || doc.Slow[1]["silenced_until_time"] != now.Add(29*time.Minute).UTC().Format(time.RFC3339) {
		t.Errorf("silenced: acked %v until %v", doc.Slow[1]["acked"], doc.Slow[1]["silenced_until_time"])
	}
	if doc.Slow[2]["rank"] != nil || doc.Slow[2]["node"] != nil || doc.Slow[2]["comm"] != nil || doc.Slow[2]["late_seconds"] != nil {
		t.Errorf("job-wide: rank %v node %v comm %v late %v, want null", doc.Slow[2]["rank"], doc.Slow[2]["node"], doc.Slow[2]["comm"], doc.Slow[2]["late_seconds"])
	}
	for _, f := range []Format{Table, Wide} {
		t.Run(string(f), func(t *testing.T) {
			var out, errs bytes.Buffer
			if err := Findings(&out, Options{Format: f, Now: now, Width: 160, Stderr: &errs}, &api.ListStallsResponse{Stalls: sampleStalls(), Slow: sampleSlow()}); err != nil {
				t.Fatal(err)
			}
			golden(t, out.Bytes())
		})
	}
}
