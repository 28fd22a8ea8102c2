package views

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/jsoncontract"
)

// TestJSONDocumented checks every field the views emit, on fixtures that
// set every field, against the README's JSON output section.
func TestJSONDocumented(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsoncontract.Parse(readme)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Format: JSON, Now: now}
	docs := map[string]func(w *bytes.Buffer) error{
		"nodes":       func(w *bytes.Buffer) error { return Nodes(w, o, sampleNodes()) },
		"gpus":        func(w *bytes.Buffer) error { return GPUs(w, o, sampleNodes()) },
		"events":      func(w *bytes.Buffer) error { return Events(w, o, sampleEvents()) },
		"collectives": func(w *bytes.Buffer) error { return Collectives(w, o, sampleCollectives()) },
		"jobs":        func(w *bytes.Buffer) error { return Jobs(w, o, sampleJobs()) },
		"stalls": func(w *bytes.Buffer) error {
			return Findings(w, o, &api.ListStallsResponse{Stalls: sampleStalls(), Slow: sampleSlow()})
		},
		"submit": func(w *bytes.Buffer) error {
			return DryRun(w, o, &api.SubmitJobResponse{Job: sampleJobs()[0], QueuedAhead: 2})
		},
		"drain": func(w *bytes.Buffer) error {
			return NodeAction(w, &api.CordonResponse{Node: sampleNodes()[2], Jobs: []*api.DrainedJob{
				{Job: "j-1a2b3c", Moving: true, To: []string{"node-03"}}, {Job: "j-4d5e6f", Reason: "names no checkpoint dir"}}})
		},
		"rebalance": func(w *bytes.Buffer) error {
			from := []*api.JobNode{{Node: "node-01", Gpus: []uint32{0}, Ranks: []*api.JobRank{{Rank: 0, Pid: 7}}}}
			return Rebalance(w, o, &api.RebalanceResponse{Moves: []*api.RebalanceMove{{Job: "j-1a2b3c", From: from, To: from,
				Before: &api.Packing{Cost: 2}, After: &api.Packing{Cost: 1}}}, Before: &api.Packing{Cost: 2}, After: &api.Packing{Cost: 1}})
		},
		"status": func(w *bytes.Buffer) error {
			leader := &api.ServerStatus{Name: "head-1", Addr: "10.0.0.1:7443", Role: "leader", SinceUnixNano: 1}
			return Status(w, o, &api.StatusResponse{Self: leader, Leader: leader, Store: "etcd", StoreHealthy: true,
				Servers:      []*api.ServerStatus{leader, {Name: "head-2", Addr: "10.0.0.2:7443", Role: "standby"}},
				StoreMembers: []*api.StoreMember{{Name: "etcd-1", Endpoint: "10.0.0.1:2379", Leader: true, Healthy: true}, {Name: "etcd-2", Error: "down"}},
				Leadership:   []*api.Event{{TimeUnixNano: 1, Message: "server head-1 leads", Attrs: map[string]string{"server": "head-1"}}}})
		},
		"version": func(w *bytes.Buffer) error {
			return Versions(w, o, []VersionJSON{{Component: "client", Version: ptr("0.1.0")}, {Component: "server", Error: ptr("down")}})
		},
	}
	for cmd, render := range docs {
		t.Run(cmd, func(t *testing.T) {
			var b bytes.Buffer
			if err := render(&b); err != nil {
				t.Fatal(err)
			}
			missing, err := c.Undocumented(cmd, b.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if len(missing) > 0 {
				t.Errorf("README's JSON output does not document, for gpuctl %s: %s", cmd, strings.Join(missing, ", "))
			}
		})
	}
	// The observe stream, line by line.
	var b bytes.Buffer
	w := NewObserveWriter(&b, JSONLines)
	w.Batch(&api.ObserveBatch{Items: []*api.ObserveItem{
		{Node: "node-00", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{Job: "j", Peer: 1}}},
		{Node: "node-00", Body: &api.ObserveItem_Flow{Flow: &api.NetFlowSample{Job: "j"}}}}, LostByServer: 1})
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		missing, err := c.Undocumented("observe", []byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if len(missing) > 0 {
			t.Errorf("README does not document, for gpuctl observe: %s", strings.Join(missing, ", "))
		}
	}
	// And a field that is not there is caught.
	if missing, _ := c.Undocumented("jobs", []byte(`{"jobs":[{"id":"x","energy_j":1}]}`)); len(missing) != 1 || missing[0] != "jobs[].energy_j" {
		t.Errorf("an undocumented field went unnoticed: %v", missing)
	}
}
