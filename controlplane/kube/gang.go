package kube

import (
	"fmt"
	"slices"
)

// A gang's pods are bound one by one (the binding subresource takes one
// pod), so the rule that makes that safe lives here, apart from the API:
// bind nothing until every rank's pod exists and every placed node still
// holds, then bind each unbound pod to its rank's node; a pod already on
// another node, or a placed node gone, undoes the attempt.

// GangPod is what the binder knows of one pod of an attempt.
type GangPod struct {
	Name string
	// Rank is the pod's completion index.
	Rank int
	// Node is where it is bound; "" while unbound.
	Node string
	// Deleting: the pod is going (a stop, or the Job controller's).
	Deleting bool
}

// Binding is one pod to bind.
type Binding struct {
	Pod, Node string
}

// GangDecision is what to do now for one attempt.
type GangDecision struct {
	Bind []Binding
	// Wait says why nothing is bound yet ("" once all are bound).
	Wait string
	// Undo says why the attempt must be deleted; Bind is then empty.
	Undo string
	// Unusable are the placed nodes that no longer hold, when that is
	// why.
	Unusable []string
}

// DecideGang decides an attempt's bindings: placement[r] is rank r's
// node; usable says whether a node may still take ranks.
func DecideGang(placement []string, pods []GangPod, usable func(node string) bool) GangDecision {
	byRank := make(map[int]GangPod, len(pods))
	for _, p := range pods {
		if p.Rank < 0 || p.Rank >= len(placement) {
			return GangDecision{Undo: fmt.Sprintf("pod %s has rank %d, the attempt has %d", p.Name, p.Rank, len(placement))}
		}
		if q, dup := byRank[p.Rank]; dup && !q.Deleting && !p.Deleting {
			return GangDecision{Undo: fmt.Sprintf("pods %s and %s both run rank %d", q.Name, p.Name, p.Rank)}
		}
		if p.Node != "" && p.Node != placement[p.Rank] {
			return GangDecision{Undo: fmt.Sprintf("pod %s (rank %d) is on %s, placed on %s", p.Name, p.Rank, p.Node, placement[p.Rank])}
		}
		if p.Deleting {
			return GangDecision{Undo: fmt.Sprintf("pod %s (rank %d) is being deleted", p.Name, p.Rank)}
		}
		byRank[p.Rank] = p
	}
	var gone []string
	for _, n := range placement {
		if !usable(n) && !slices.Contains(gone, n) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		return GangDecision{Undo: fmt.Sprintf("placed nodes no longer usable: %v", gone), Unusable: gone}
	}
	if len(byRank) < len(placement) {
		return GangDecision{Wait: fmt.Sprintf("%d of %d pods exist", len(byRank), len(placement))}
	}
	var d GangDecision
	for r := range placement {
		if p := byRank[r]; p.Node == "" {
			d.Bind = append(d.Bind, Binding{Pod: p.Name, Node: placement[r]})
		}
	}
	return d
}

// OldPod is a pod of an earlier attempt of the job an attempt is about to
// start.
type OldPod struct {
	Name    string
	Attempt uint32
	Node    string
	// Ended: Succeeded or Failed; NodeReady: bound to a Node that is Ready.
	Ended, NodeReady bool
}

// StillRunning are the old pods that may still run a rank: not ended,
// and on a Node that is Ready (a pod not bound runs nothing; one on a lost
// Node is out of reach, its ranks counted lost with it). While any
// remains, the next attempt must not start beside them.
func StillRunning(pods []OldPod) []OldPod {
	var out []OldPod
	for _, p := range pods {
		if !p.Ended && p.Node != "" && p.NodeReady {
			out = append(out, p)
		}
	}
	return out
}
