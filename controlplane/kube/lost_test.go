package kube

import (
	"reflect"
	"testing"
)

func TestLostAttempts(t *testing.T) {
	nodes := []NodeView{
		{Name: "a", Ready: true},
		{Name: "b", Ready: false, NotReadyWhy: "NodeStatusUnknown Kubelet stopped posting node status."},
		{Name: "c", Ready: true, Unschedulable: true},
	}
	for _, tc := range []struct {
		name string
		r    Running
		want []Lost
	}{
		{name: "all Ready", r: Running{Job: "j", Attempt: 1, Nodes: []string{"a", "c"}, Started: true}},
		// Cordoned is not lost: what runs there keeps running.
		{name: "cordoned node", r: Running{Job: "j", Attempt: 1, Nodes: []string{"c"}}},
		{name: "a node NotReady", r: Running{Job: "j", Attempt: 2, Nodes: []string{"a", "b"}, Started: true},
			want: []Lost{{Job: "j", Attempt: 2, Nodes: []string{"b"}, Reason: "Kubernetes: Node b is not Ready (NodeStatusUnknown Kubelet stopped posting node status.)"}}},
		{name: "a node deleted", r: Running{Job: "j", Attempt: 1, Nodes: []string{"x", "a"}},
			want: []Lost{{Job: "j", Attempt: 1, Nodes: []string{"x"}, Reason: "Kubernetes: Node x is gone"}}},
		// The node's loss wins: the job recovers rather than fails.
		{name: "lost node and failed Job", r: Running{Job: "j", Attempt: 1, Nodes: []string{"b"}, JobFailed: "Job gpuctl-j-a1 failed"},
			want: []Lost{{Job: "j", Attempt: 1, Nodes: []string{"b"}, Reason: "Kubernetes: Node b is not Ready (NodeStatusUnknown Kubelet stopped posting node status.)"}}},
		{name: "Job failed before any rank", r: Running{Job: "j", Attempt: 1, Nodes: []string{"a"}, JobFailed: "Job gpuctl-j-a1 failed (PodFailurePolicy: exit code 127)"},
			want: []Lost{{Job: "j", Attempt: 1, Reason: "Kubernetes: Job gpuctl-j-a1 failed (PodFailurePolicy: exit code 127) before any rank started"}}},
		// Its ranks ran: nodemon reports how they ended.
		{name: "Job failed after its ranks started", r: Running{Job: "j", Attempt: 1, Nodes: []string{"a"}, Started: true, JobFailed: "Job failed"}},
	} {
		if got := LostAttempts([]Running{tc.r}, nodes); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	// Most Nodes NotReady at once is the control plane's trouble: nothing
	// is lost to readiness (a Node gone still is).
	disrupted := []NodeView{{Name: "a"}, {Name: "b"}, {Name: "c", Ready: true}}
	r := []Running{{Job: "j", Attempt: 1, Nodes: []string{"a", "c"}}, {Job: "k", Attempt: 1, Nodes: []string{"x"}}}
	want := []Lost{{Job: "k", Attempt: 1, Nodes: []string{"x"}, Reason: "Kubernetes: Node x is gone"}}
	if got := LostAttempts(r, disrupted); !reflect.DeepEqual(got, want) {
		t.Errorf("most Nodes NotReady: %+v, want %+v", got, want)
	}
}
