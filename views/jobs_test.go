package views

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func sampleJobs() []*api.Job {
	running := &api.Job{Id: "j-1a2b3c", Name: "ring", Tenant: "research", Priority: 10, State: api.JobState_JOB_STATE_RUNNING,
		Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 4, Source: "gpus"}, Attempt: 1, MasterAddr: "127.0.0.1", MasterPort: 29734,
		CheckpointDir: "/var/lib/gpuctl/checkpoints/j-1a2b3c", LastCheckpointStep: 50, Reason: "attempt 1 started on node-00,node-01",
		SubmitUnixNano: now.Add(-2 * time.Minute).UnixNano(), StartUnixNano: now.Add(-time.Minute).UnixNano(),
		Placement: []*api.JobNode{
			{Node: "node-00", Gpus: []uint32{0, 1}, Ranks: []*api.JobRank{{Rank: 0, Gpu: 0, Pid: 4242}, {Rank: 1, LocalRank: 1, Gpu: 1, Pid: 4243}}},
			{Node: "node-01", Gpus: []uint32{0, 1}, Ranks: []*api.JobRank{{Rank: 2, Gpu: 0, Pid: 5150}, {Rank: 3, LocalRank: 1, Gpu: 1}}},
		}}
	pending := &api.Job{Id: "j-4d5e6f", Name: "huge", State: api.JobState_JOB_STATE_PENDING,
		Plan:          &api.JobPlan{Tp: 8, Pp: 4, Dp: 2, MicroBatch: 1, NumMicroBatches: 64, Source: "planner", StepSeconds: 12.5, Mfu: 0.41},
		PendingReason: "needs 64 GPUs on 8 nodes of 8; 3 nodes down, 1 node cordoned", SubmitUnixNano: now.Add(-30 * time.Second).UnixNano()}
	failed := &api.Job{Id: "j-777777", Name: "crash", State: api.JobState_JOB_STATE_FAILED, Stopping: api.JobStop_JOB_STOP_FAILED,
		Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 2, Source: "gpus"}, Attempt: 1, Reason: "rank 1 on node-02 (pid 77) exited with code 1",
		SubmitUnixNano: now.Add(-time.Hour).UnixNano(), StartUnixNano: now.Add(-59 * time.Minute).UnixNano(), EndUnixNano: now.Add(-58 * time.Minute).UnixNano(),
		Placement: []*api.JobNode{{Node: "node-02", Gpus: []uint32{6, 7}, Ranks: []*api.JobRank{
			{Rank: 0, Gpu: 6, Pid: 76}, {Rank: 1, LocalRank: 1, Gpu: 7, Pid: 77, Exited: true, ExitCode: 1}}}}}
	held := &api.Job{Id: "j-888888", Name: "pinned", State: api.JobState_JOB_STATE_PENDING, Hold: true,
		Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 2, Source: "gpus"}, PendingReason: "held: place it with `gpuctl assign j-888888 --nodes …`",
		SubmitUnixNano: now.Add(-5 * time.Second).UnixNano()}
	return []*api.Job{running, pending, failed, held}
}

func TestJobsFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Jobs(&b, f, sampleJobs(), now); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func TestJobsJSONContract(t *testing.T) {
	var b bytes.Buffer
	if err := Jobs(&b, JSON, sampleJobs(), now); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	j := doc["jobs"][0]
	for _, k := range []string{"id", "name", "state", "plan", "placement", "step", "last_checkpoint_step", "restarts", "goodput",
		"attempt", "submitted", "started"} {
		if _, ok := j[k]; !ok {
			t.Errorf("job lacks %q", k)
		}
	}
	plan := j["plan"].(map[string]any)
	for _, k := range []string{"tp", "pp", "dp", "micro_batch", "source"} {
		if _, ok := plan[k]; !ok {
			t.Errorf("plan lacks %q", k)
		}
	}
	node := j["placement"].([]any)[0].(map[string]any)
	rank := node["ranks"].([]any)[1].(map[string]any)
	if node["node"] != "node-00" || len(node["gpus"].([]any)) != 2 || rank["rank"] != 1.0 || rank["pid"] != 4243.0 || rank["exit_code"] != nil {
		t.Errorf("placement = %v", node)
	}
	if p := doc["jobs"][1]; p["pending_reason"] == "" || p["started"] != nil || len(p["placement"].([]any)) != 0 {
		t.Errorf("pending job = %v", p)
	}
	if f := doc["jobs"][2]; f["state"] != "failed" || f["stopping"] != "failed" {
		t.Errorf("failed job = %v", f)
	}
}

func TestDryRunFormats(t *testing.T) {
	fits := &api.SubmitJobResponse{Job: &api.Job{Id: "dry-run", Name: "ring", State: api.JobState_JOB_STATE_PENDING,
		Plan:      &api.JobPlan{Tp: 2, Pp: 1, Dp: 2, MicroBatch: 1, Source: "planner", StepSeconds: 1.25, Mfu: 0.42, MemPerGpuBytes: 40 << 30},
		Placement: sampleJobs()[0].GetPlacement()}}
	waits := &api.SubmitJobResponse{Job: sampleJobs()[1], QueuedAhead: 2}
	for _, f := range []Format{Table, JSON} {
		for name, r := range map[string]*api.SubmitJobResponse{"fits": fits, "waits": waits} {
			t.Run(string(f)+"_"+name, func(t *testing.T) {
				var b bytes.Buffer
				if err := DryRun(&b, f, r); err != nil {
					t.Fatal(err)
				}
				golden(t, b.Bytes())
			})
		}
	}
}

func TestRebalanceFormats(t *testing.T) {
	from := []*api.JobNode{{Node: "node-01", Gpus: []uint32{0, 1}}, {Node: "node-04", Gpus: []uint32{0, 1}}}
	to := []*api.JobNode{{Node: "node-00", Gpus: []uint32{2, 3}}, {Node: "node-01", Gpus: []uint32{0, 1}}}
	plan := &api.RebalanceResponse{
		Moves:  []*api.RebalanceMove{{Job: "j-1a2b3c", From: from, To: to, Before: &api.Packing{ExtraSwitches: 1, ExtraRacks: 1, FragmentedNodes: 2, Cost: 112}, After: &api.Packing{FragmentedNodes: 1, Cost: 1}}},
		Before: &api.Packing{ExtraSwitches: 1, ExtraRacks: 1, FragmentedNodes: 2, Cost: 112}, After: &api.Packing{FragmentedNodes: 1, Cost: 1},
	}
	applied := &api.RebalanceResponse{Moves: plan.Moves, Before: plan.Before, After: plan.After, Applied: true}
	none := &api.RebalanceResponse{Before: &api.Packing{FragmentedNodes: 1, Cost: 1}, After: &api.Packing{FragmentedNodes: 1, Cost: 1}}
	for _, f := range []Format{Table, JSON} {
		for name, r := range map[string]*api.RebalanceResponse{"plan": plan, "applied": applied, "none": none} {
			t.Run(string(f)+"_"+name, func(t *testing.T) {
				var b bytes.Buffer
				if err := Rebalance(&b, f, r); err != nil {
					t.Fatal(err)
				}
				golden(t, b.Bytes())
			})
		}
	}
}
