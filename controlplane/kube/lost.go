package kube

import (
	"fmt"
	"slices"
	"strings"
)

// Running is one running attempt of gpuctl's as the lost-attempt rule
// reads it.
type Running struct {
	Job     string
	Attempt uint32
	Nodes   []string
	// Started: a rank of it was reported (running, or exited).
	Started bool
	// JobFailed is why its Kubernetes Job failed; "" while it has not.
	JobFailed string
}

// Lost is an attempt Kubernetes lost: on Nodes (the job recovers as from
// lost nodes), or, with none, before any rank started (the job's own
// fault: an image that is not there, a command the image lacks).
type Lost struct {
	Job     string
	Attempt uint32
	Nodes   []string
	Reason  string
}

// LostAttempts decides which running attempts Kubernetes lost: those
// placed on a Node that is gone or not Ready (its kubelet stopped
// reporting: whatever runs there is out of reach), and those whose Job
// failed with no rank ever reported (nodemon would have reported them had
// they started). When most Nodes are not Ready at once, the trouble is
// the control plane's (an API server back from an outage marks every
// Node NotReady until the kubelets report again), not the nodes': as
// Kubernetes' own node controller stops evicting then, no attempt is
// lost to a Node's readiness.
func LostAttempts(running []Running, nodes []NodeView) []Lost {
	byName := make(map[string]NodeView, len(nodes))
	notReady := 0
	for _, n := range nodes {
		byName[n.Name] = n
		if !n.Ready {
			notReady++
		}
	}
	disrupted := len(nodes) > 1 && 2*notReady > len(nodes)
	var out []Lost
	for _, r := range running {
		var gone, why []string
		for _, n := range r.Nodes {
			v, ok := byName[n]
			switch {
			case !ok:
				gone, why = append(gone, n), append(why, fmt.Sprintf("Kubernetes: Node %s is gone", n))
			case !v.Ready && !disrupted:
				gone, why = append(gone, n), append(why, fmt.Sprintf("Kubernetes: Node %s is not Ready (%s)", n, v.NotReadyWhy))
			}
		}
		switch {
		case len(gone) > 0:
			out = append(out, Lost{Job: r.Job, Attempt: r.Attempt, Nodes: slices.Clone(gone), Reason: strings.Join(why, "; ")})
		case r.JobFailed != "" && !r.Started:
			out = append(out, Lost{Job: r.Job, Attempt: r.Attempt, Reason: "Kubernetes: " + r.JobFailed + " before any rank started"})
		}
	}
	return out
}
