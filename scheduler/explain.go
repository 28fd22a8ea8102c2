package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// NeverFits says why a job could not fit even the idle cluster as built:
// every known node ready, every GPU healthy and free, cordoned and down
// nodes counted. Such a job would block the queue forever; it is refused
// at submit or waits aside until the cluster grows.
func NeverFits(s *Snapshot, r *JobRequest) (string, bool) {
	idle := IdleCopy(s)
	_, err := Place(&idle, r)
	if err == nil {
		return "", false
	}
	var pe *PlacementError
	if !errors.As(err, &pe) {
		return err.Error(), true
	}
	total, model := 0, 0
	for _, n := range idle.Nodes {
		total += len(n.GPUs)
		if r.GPUModel == "" || n.GPUModel == r.GPUModel {
			model += len(n.GPUs)
		}
	}
	what := fmt.Sprintf("the cluster's %s hold %d GPUs in all", plural(len(idle.Nodes), "node", "nodes"), total)
	if r.GPUModel != "" && model != total {
		what += fmt.Sprintf(" (%d of them %s)", model, r.GPUModel)
	}
	return fmt.Sprintf("%s; %s, counting cordoned and down nodes", pe.Explain(r), what), true
}

// IdleCopy is the snapshot's cluster with every known node ready, every
// GPU healthy and free: what a job could ever get without the cluster
// growing.
func IdleCopy(s *Snapshot) Snapshot {
	out := Snapshot{Now: s.Now, Nodes: make([]Node, len(s.Nodes))}
	for i, n := range s.Nodes {
		n.State = NodeReady
		gpus := make([]GPU, len(n.GPUs))
		for k, g := range n.GPUs {
			gpus[k] = GPU{Index: g.Index, Healthy: true}
		}
		n.GPUs = gpus
		out.Nodes[i] = n
	}
	return out
}

// reasonPhrase words a filter reason for a count of nodes.
var reasonPhrase = map[Reason]string{
	ReasonDown:          "down",
	ReasonCordoned:      "cordoned",
	ReasonDraining:      "draining",
	ReasonGPUModel:      "with another GPU model",
	ReasonHotSpare:      "held as hot spares",
	ReasonExcluded:      "avoided by the job",
	ReasonNodeTooSmall:  "with fewer GPUs than one group",
	ReasonUnhealthyGPUs: "with too few healthy GPUs",
	ReasonAllocated:     "busy",
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// Explain turns a PlacementError into one line: what the job
// needs, how many nodes each filter turned away, and what the rest hold,
// e.g. "needs 16 GPUs on 2 nodes of 8; 3 nodes down, 1 node cordoned".
func (pe *PlacementError) Explain(r *JobRequest) string {
	var b strings.Builder
	switch {
	case r.GPUsPerNode > 0:
		fmt.Fprintf(&b, "needs %d GPUs on %s of %d", pe.GPUs, plural(pe.GPUs/r.GPUsPerNode, "node", "nodes"), r.GPUsPerNode)
	case pe.Group > 1:
		fmt.Fprintf(&b, "needs %d GPUs in groups of %d inside one node", pe.GPUs, pe.Group)
	default:
		fmt.Fprintf(&b, "needs %d GPUs", pe.GPUs)
	}
	reasons := make([]Reason, 0, len(pe.Counts))
	for rsn := range pe.Counts {
		if _, ok := reasonPhrase[rsn]; ok {
			reasons = append(reasons, rsn)
		}
	}
	slices.SortFunc(reasons, func(a, c Reason) int {
		if d := pe.Counts[c] - pe.Counts[a]; d != 0 {
			return d
		}
		return strings.Compare(string(a), string(c))
	})
	for i, rsn := range reasons {
		if i == 0 {
			b.WriteString("; ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(plural(pe.Counts[rsn], "node", "nodes") + " " + reasonPhrase[rsn])
	}
	groups := pe.GPUs / max(pe.Group, 1)
	switch {
	case pe.Passing == 0 && len(reasons) == 0:
		b.WriteString("; no nodes have registered")
	case pe.Passing == 0:
	case pe.Group == 1:
		fmt.Fprintf(&b, "; the %s that %s %d free GPUs", plural(pe.Passing, "node", "nodes"), choose(pe.Passing == 1, "passes has", "pass have"), pe.FitGroups)
	default:
		fmt.Fprintf(&b, "; the %s that %s room for %d of %d groups", plural(pe.Passing, "node", "nodes"), choose(pe.Passing == 1, "passes has", "pass have"), pe.FitGroups, groups)
	}
	return b.String()
}

func choose(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

// AssignError says, node by node, why the named nodes cannot hold the job.
func (pe *PlacementError) AssignError(r *JobRequest, nodes []string) error {
	var parts []string
	for _, v := range pe.Nodes {
		switch v.Reason {
		case ReasonAllocated, ReasonUnhealthyGPUs, ReasonNodeTooSmall:
			parts = append(parts, fmt.Sprintf("%s: %s (%d usable free GPUs)", v.Node, v.Reason, v.Free))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s", v.Node, v.Reason))
		}
	}
	what := pe.Explain(r)
	if len(parts) > 0 {
		what += "; " + strings.Join(parts, "; ")
	}
	return fmt.Errorf("job %s does not fit on %s: %s", r.ID, strings.Join(nodes, ","), what)
}
