package controlplane

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// unmanaged is the job the scheduler sees on a GPU that runs processes
// gpuctl did not launch.
const unmanaged = "(unmanaged)"

func splitHost(addr string) (string, string, error) { return net.SplitHostPort(addr) }

// schedNodeState maps a node's status to the scheduler's view: only a
// connected ready node takes work; a disconnected one counts as down.
func schedNodeState(n *api.NodeStatus) scheduler.NodeState {
	switch n.GetState() {
	case api.NodeState_NODE_STATE_CORDONED:
		return scheduler.NodeCordoned
	case api.NodeState_NODE_STATE_DRAINING:
		return scheduler.NodeDraining
	case api.NodeState_NODE_STATE_READY:
		if n.GetConnected() {
			return scheduler.NodeReady
		}
	}
	return scheduler.NodeDown
}

// gpuProfile maps an NVML model name ("NVIDIA H100 80GB HBM3") to the cost
// model's hardware profile (h100) whose name parts it contains, longest
// match first, so nodes and job files name models the same way. Unknown
// models keep their NVML name.
func gpuProfile(model string) string {
	low := strings.ToLower(model)
	best := ""
	for _, name := range costmodel.HardwareNames() {
		all := true
		for _, part := range strings.Split(name, "-") {
			if !strings.Contains(low, part) {
				all = false
				break
			}
		}
		if all && len(name) > len(best) {
			best = name
		}
	}
	if best == "" {
		return model
	}
	return best
}

// snapshotLocked builds the scheduler's view: every known node with its
// state, rack/switch labels and healthy GPUs; a GPU belongs to a job while
// a rank of it lives there (whatever the job's state) or a move is about
// to land there; running jobs and the queue.
func (m *jobManager) snapshotLocked(now time.Time) scheduler.Snapshot {
	alloc := map[string]map[uint32]string{}
	hold := func(node string, gpu uint32, id string) {
		if alloc[node] == nil {
			alloc[node] = map[uint32]string{}
		}
		alloc[node][gpu] = id
	}
	// ours holds every pid gpuctl launched, live or not (a GPU sample may
	// still list a rank that has just exited), except ranks given up with
	// their node: if those still run when it returns, their GPUs are busy.
	ours := map[string]map[uint32]bool{}
	entries := m.sortedLocked()
	for _, en := range entries {
		j := en.job
		for _, jn := range j.GetPlacement() {
			if ours[jn.GetNode()] == nil {
				ours[jn.GetNode()] = map[uint32]bool{}
			}
			for _, r := range jn.GetRanks() {
				if r.GetSignal() != lostRank {
					ours[jn.GetNode()][r.GetPid()] = true
				}
				if !r.GetExited() {
					hold(jn.GetNode(), r.GetGpu(), j.GetId())
				}
			}
		}
		for _, jn := range j.GetMoveTarget() {
			for _, r := range jn.GetRanks() {
				hold(jn.GetNode(), r.GetGpu(), j.GetId())
			}
		}
	}
	snap := scheduler.Snapshot{Now: now.Unix()}
	for _, n := range m.nodes() {
		name := n.GetRegistration().GetName()
		node := scheduler.Node{Name: name, State: schedNodeState(n), Labels: n.GetRegistration().GetLabels()}
		for _, g := range n.GetGpus() {
			if node.GPUModel == "" {
				node.GPUModel = gpuProfile(g.GetInfo().GetModel())
			}
			idx := g.GetInfo().GetIndex()
			job := alloc[name][idx]
			if job == "" {
				// A process gpuctl did not start (a job launched around it)
				// makes the GPU busy all the same.
				for _, p := range g.GetLast().GetProcesses() {
					if !ours[name][p.GetPid()] {
						job = unmanaged
						break
					}
				}
			}
			node.GPUs = append(node.GPUs, scheduler.GPU{Index: int(idx), Healthy: g.GetHealthy(), Job: job})
		}
		snap.Nodes = append(snap.Nodes, node)
	}
	grace := int64(m.preemptGrace() / time.Second)
	for _, en := range entries {
		j := en.job
		if en.spec == nil {
			continue
		}
		switch j.GetState() {
		case api.JobState_JOB_STATE_RUNNING:
			if len(j.GetPlacement()) == 0 {
				continue
			}
			rj := scheduler.RunningJob{Request: m.request(en), Placement: placementOf(j.GetPlacement(), shapeOf(j)),
				Start: j.GetStartUnixNano() / 1e9, Stopping: j.GetStopping() != api.JobStop_JOB_STOP_NONE}
			if rj.Stopping {
				rj.StopBy = j.GetStopSinceUnixNano()/1e9 + grace
			}
			snap.Running = append(snap.Running, rj)
		case api.JobState_JOB_STATE_PENDING:
			if !j.GetHold() {
				snap.Pending = append(snap.Pending, m.request(en))
			}
		}
	}
	return snap
}

// idleCopy is the snapshot's cluster with every known node ready, every
// GPU healthy and free: what a job could ever get without the cluster
// growing.
func idleCopy(s *scheduler.Snapshot) scheduler.Snapshot {
	out := scheduler.Snapshot{Now: s.Now, Nodes: make([]scheduler.Node, len(s.Nodes))}
	for i, n := range s.Nodes {
		n.State = scheduler.NodeReady
		gpus := make([]scheduler.GPU, len(n.GPUs))
		for k, g := range n.GPUs {
			gpus[k] = scheduler.GPU{Index: g.Index, Healthy: true}
		}
		n.GPUs = gpus
		out.Nodes[i] = n
	}
	return out
}

// request is the job as the scheduler sees it. A job that checkpoints
// (its file names a checkpoint dir) can be stopped and resumed, so it is
// preemptible and movable; others are never stopped by the scheduler.
func (m *jobManager) request(en *jobEntry) scheduler.JobRequest {
	j, s := en.job, en.spec
	ckpt := s.Checkpoint.Dir != ""
	r := scheduler.JobRequest{
		ID: j.GetId(), Tenant: s.Tenant, Priority: s.Priority, Submit: j.GetSubmitUnixNano() / 1e9,
		Shape: shapeOf(j), AllowMixed: s.AllowMixed, Estimate: int64(s.EstimatedRuntime / time.Second),
		Attained: j.GetAttainedGpuSeconds(), Preemptible: ckpt, Checkpoint: ckpt,
	}
	if s.GPUModel != "" {
		if hw, err := costmodel.LookupHardware(s.GPUModel); err == nil {
			r.GPUModel = hw.Name
		}
	}
	if per := s.GPUsPerNode; per > 0 && s.TotalGPUs()%per == 0 && s.TotalGPUs() >= per {
		r.GPUsPerNode = per
	}
	if s.Elastic != nil {
		r.ElasticDP = slices.Clone(s.Elastic.DataParallel)
	}
	return r
}

func shapeOf(j *api.Job) scheduler.Shape {
	p := j.GetPlan()
	return scheduler.Shape{TP: int(p.GetTp()), PP: int(p.GetPp()), DP: int(p.GetDp())}
}

// placementOf rebuilds the scheduler's placement from a job's nodes.
func placementOf(nodes []*api.JobNode, shape scheduler.Shape) scheduler.Placement {
	n := 0
	for _, jn := range nodes {
		n += len(jn.GetRanks())
	}
	pl := scheduler.Placement{Shape: shape, Ranks: make([]scheduler.Slot, n)}
	for _, jn := range nodes {
		for _, r := range jn.GetRanks() {
			if k := int(r.GetRank()); k >= 0 && k < n {
				pl.Ranks[k] = scheduler.Slot{Node: jn.GetNode(), GPU: int(r.GetGpu())}
			}
		}
	}
	return pl
}

// jobNodes lays a placement out per node, local ranks in rank order (the
// torchrun convention LaunchEnv follows).
func jobNodes(pl *scheduler.Placement) []*api.JobNode {
	var out []*api.JobNode
	for _, nl := range scheduler.LaunchEnv(pl, 0, nil) {
		jn := &api.JobNode{Node: nl.Node}
		for _, re := range nl.Ranks {
			jn.Gpus = append(jn.Gpus, uint32(re.GPU))
			jn.Ranks = append(jn.Ranks, &api.JobRank{Rank: int32(re.Rank), LocalRank: int32(re.LocalRank), Gpu: uint32(re.GPU)})
		}
		out = append(out, jn)
	}
	return out
}

// explainLocked sets every waiting job's pending reason.
func (m *jobManager) explainLocked(now time.Time, started map[string]bool, never map[string]string, reserve *scheduler.Reserve, preempting []string) {
	var snap scheduler.Snapshot
	built := false
	explained := 0
	for _, en := range m.sortedLocked() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_PENDING || started[j.GetId()] || en.spec == nil {
			continue
		}
		var why string
		switch {
		case j.GetHold():
			why = fmt.Sprintf("held: place it with `gpuctl assign %s --nodes …`", j.GetId())
		case never[j.GetId()] != "":
			why = never[j.GetId()]
		case explained >= m.cfg.MaxExplained:
			why = "queued"
		default:
			explained++
			if !built {
				snap, built = m.snapshotLocked(now), true
			}
			why = m.waitReason(&snap, en, reserve, preempting)
		}
		if why != j.GetPendingReason() {
			j.PendingReason = why
			m.persistLocked(en)
		}
	}
}

// waitReason says why a queued job is not running: the placer's reasons
// when it does not fit, else which job it waits behind.
func (m *jobManager) waitReason(snap *scheduler.Snapshot, en *jobEntry, reserve *scheduler.Reserve, preempting []string) string {
	r := m.request(en)
	_, err := scheduler.Place(snap, &r)
	mine := reserve != nil && reserve.Job == r.ID
	var pe *scheduler.PlacementError
	switch {
	case err == nil && mine && len(preempting) > 0:
		return "starts once preempted " + strings.Join(preempting, ", ") + " stop"
	case err == nil && reserve != nil && !mine:
		return fmt.Sprintf("fits now, but waits behind %s, first in the %s order", reserve.Job, m.cfg.Policy.Name())
	case err == nil:
		return "fits now; starting on the next scheduling pass"
	case errors.As(err, &pe):
		why := placementReason(pe, &r)
		if mine && len(preempting) > 0 {
			why += "; preempting " + strings.Join(preempting, ", ")
		} else if mine && reserve.Known {
			why += fmt.Sprintf("; next in line, expected to start in %s", time.Duration(max(reserve.At-snap.Now, 0))*time.Second)
		}
		return why
	}
	return err.Error()
}

// neverFitReason explains a job the idle cluster cannot hold.
func neverFitReason(err error, r *scheduler.JobRequest, idle *scheduler.Snapshot) string {
	var pe *scheduler.PlacementError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	total := 0
	for _, n := range idle.Nodes {
		total += len(n.GPUs)
	}
	return fmt.Sprintf("%s; the cluster's %d nodes hold %d GPUs in all, so it waits for nodes to join", placementReason(pe, r), len(idle.Nodes), total)
}

// reasonPhrase words a filter reason for a count of nodes.
var reasonPhrase = map[scheduler.Reason]string{
	scheduler.ReasonDown:          "down",
	scheduler.ReasonCordoned:      "cordoned",
	scheduler.ReasonDraining:      "draining",
	scheduler.ReasonGPUModel:      "with another GPU model",
	scheduler.ReasonHotSpare:      "held as hot spares",
	scheduler.ReasonNodeTooSmall:  "with fewer GPUs than one group",
	scheduler.ReasonUnhealthyGPUs: "with too few healthy GPUs",
	scheduler.ReasonAllocated:     "busy",
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// placementReason turns a PlacementError into one line: what the job
// needs, how many nodes each filter turned away, and what the rest hold,
// e.g. "needs 16 GPUs on 2 nodes of 8; 3 nodes down, 1 node cordoned".
func placementReason(pe *scheduler.PlacementError, r *scheduler.JobRequest) string {
	var b strings.Builder
	switch {
	case r.GPUsPerNode > 0:
		fmt.Fprintf(&b, "needs %d GPUs on %s of %d", pe.GPUs, plural(pe.GPUs/r.GPUsPerNode, "node", "nodes"), r.GPUsPerNode)
	case pe.Group > 1:
		fmt.Fprintf(&b, "needs %d GPUs in groups of %d inside one node", pe.GPUs, pe.Group)
	default:
		fmt.Fprintf(&b, "needs %d GPUs", pe.GPUs)
	}
	reasons := make([]scheduler.Reason, 0, len(pe.Counts))
	for rsn := range pe.Counts {
		if _, ok := reasonPhrase[rsn]; ok {
			reasons = append(reasons, rsn)
		}
	}
	slices.SortFunc(reasons, func(a, c scheduler.Reason) int {
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
		fmt.Fprintf(&b, "; the %s that %s %d free GPUs", plural(pe.Passing, "node", "nodes"), pick(pe.Passing == 1, "passes has", "pass have"), pe.FitGroups)
	default:
		fmt.Fprintf(&b, "; the %s that %s room for %d of %d groups", plural(pe.Passing, "node", "nodes"), pick(pe.Passing == 1, "passes has", "pass have"), pe.FitGroups, groups)
	}
	return b.String()
}

func pick(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

// assignError says, node by node, why the named nodes cannot hold the job.
func assignError(pe *scheduler.PlacementError, r *scheduler.JobRequest, nodes []string) error {
	var parts []string
	for _, v := range pe.Nodes {
		switch v.Reason {
		case scheduler.ReasonAllocated, scheduler.ReasonUnhealthyGPUs, scheduler.ReasonNodeTooSmall:
			parts = append(parts, fmt.Sprintf("%s: %s (%d usable free GPUs)", v.Node, v.Reason, v.Free))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s", v.Node, v.Reason))
		}
	}
	what := placementReason(pe, r)
	if len(parts) > 0 {
		what += "; " + strings.Join(parts, "; ")
	}
	return fmt.Errorf("job %s does not fit on %s: %s", r.ID, strings.Join(nodes, ","), what)
}
