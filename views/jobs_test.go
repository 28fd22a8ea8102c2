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
	// A job that recovered twice and shrank, with the history sacct shows.
	running.Step, running.Goodput, running.Restarts, running.LostSteps, running.DowntimeSeconds = 4410, 0.93, 2, 120, 95
	running.UsefulSeconds, running.EnergyJoules, running.Checkpoints, running.CheckpointSeconds = 3300, 9.5e6, 9, 12.5
	grams := 1187.5 // 2.639 kWh at 450 gCO2e/kWh
	running.Co2EGrams = &grams
	running.AdvisedCheckpointIntervalSeconds, running.AttainedGpuSeconds, running.FullGpus = 1800, 7200, 8
	running.FirstStartUnixNano, running.Attempt = now.Add(-2*time.Hour).UnixNano(), 3
	running.Plan.MeasuredStepSeconds = 0.42
	running.Exclude = []string{"node-02"}
	running.Attempts = []*api.JobAttempt{
		{Attempt: 1, StartUnixNano: now.Add(-2 * time.Hour).UnixNano(), EndUnixNano: now.Add(-90 * time.Minute).UnixNano(),
			EndReason: "node-02 down (no heartbeat for 2.1s)", Nodes: []string{"node-00", "node-02"}, Gpus: 8, Dp: 8, LastStep: 2100,
			LostSteps: 100, GpuSeconds: 14400, EnergyJoules: 5e6},
		{Attempt: 2, StartUnixNano: now.Add(-88 * time.Minute).UnixNano(), EndUnixNano: now.Add(-time.Minute).UnixNano(),
			EndReason: "shrink to dp4: no spare node", Nodes: []string{"node-00", "node-01"}, Gpus: 4, Dp: 4, ResumeStep: 2000,
			LastStep: 4320, LostSteps: 20, GpuSeconds: 21000, EnergyJoules: 4e6},
		{Attempt: 3, StartUnixNano: now.Add(-time.Minute).UnixNano(), Nodes: []string{"node-00", "node-01"}, Gpus: 4, Dp: 4,
			ResumeStep: 4300, LastStep: 4410, GpuSeconds: 240, EnergyJoules: 5e5},
	}
	moving := &api.Job{Id: "j-999999", Name: "packed", Tenant: "prod", State: api.JobState_JOB_STATE_RUNNING, Stopping: api.JobStop_JOB_STOP_MOVE,
		Plan:    &api.JobPlan{Tp: 8, Pp: 1, Dp: 2, Source: "plan", StepSeconds: 2.5, Mfu: 0.38, MemPerGpuBytes: 60 << 30, CalibrationNote: "measured 9.1s per step is 3.6× the prediction: check the model section"},
		Attempt: 1, Stalled: true, SubmitUnixNano: now.Add(-3 * time.Hour).UnixNano(), StartUnixNano: now.Add(-3 * time.Hour).UnixNano(),
		Reason:     "moving to node-04,node-05 for a tighter packing \x1b]0;owned\x07",
		Placement:  []*api.JobNode{{Node: "node-10", Gpus: []uint32{0, 1, 2, 3, 4, 5, 6, 7}}, {Node: "node-11", Gpus: []uint32{0, 1, 2, 3, 4, 5, 6, 7}}},
		MoveTarget: []*api.JobNode{{Node: "node-04", Gpus: []uint32{0, 1, 2, 3, 4, 5, 6, 7}}, {Node: "node-05", Gpus: []uint32{0, 1, 2, 3, 4, 5, 6, 7}}}}
	return []*api.Job{running, pending, failed, held, moving}
}

func TestJobsJSONContract(t *testing.T) {
	var b bytes.Buffer
	if err := Jobs(&b, Options{Format: JSON, Now: now}, sampleJobs()); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	j := doc["jobs"][0]
	for _, k := range []string{"id", "name", "state", "plan", "placement", "step", "last_checkpoint_step", "restarts", "goodput",
		"attempt", "attempts", "full_gpus", "submit_time", "start_time"} {
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
	if unstarted := j["placement"].([]any)[1].(map[string]any)["ranks"].([]any)[1].(map[string]any); unstarted["pid"] != nil {
		t.Errorf("a rank not started yet has pid %v, want null", unstarted["pid"])
	}
	if a := j["attempts"].([]any); len(a) != 3 || a[2].(map[string]any)["end_time"] != nil || a[0].(map[string]any)["lost_steps"] != 100.0 {
		t.Errorf("attempts = %v", a)
	}
	if j["gpus"] != 4.0 || j["full_gpus"] != 8.0 {
		t.Errorf("gpus %v of full_gpus %v, want 4 of 8", j["gpus"], j["full_gpus"])
	}
	if p := doc["jobs"][1]; p["pending_reason"] == nil || p["start_time"] != nil || len(p["placement"].([]any)) != 0 || p["step"] != nil || p["goodput"] != nil {
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
				if err := DryRun(&b, Options{Format: f, Now: now}, r); err != nil {
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
				if err := Rebalance(&b, Options{Format: f, Now: now}, r); err != nil {
					t.Fatal(err)
				}
				golden(t, b.Bytes())
			})
		}
	}
}
