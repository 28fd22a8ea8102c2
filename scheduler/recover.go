package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// FailureKind is what broke a running job.
type FailureKind int

// Failure kinds, as the control plane's detectors see them.
const (
	// FailRankExit is a rank that exited non-zero or was killed while its
	// node stayed healthy: the program crashed, not the hardware.
	FailRankExit FailureKind = iota
	// FailNodeDown is a node that stopped answering.
	FailNodeDown
	// FailGPUFault is a GPU fault (XID, uncorrectable ECC, GPU lost) on a
	// node of the job.
	FailGPUFault
	// FailStall is an NCCL stall; Nodes are the lagging ranks' nodes.
	FailStall
	// FailManual is an operator's restart request.
	FailManual
	// FailRefused is a launch Nodes refused by a policy of their own
	// (root ranks not allowed there): the job runs without them, and
	// the nodes are fine for other jobs.
	FailRefused
	// FailSlow is a fail-slow finding acted on (slow_recovery auto);
	// Nodes is the slow node.
	FailSlow
)

var failureNames = [...]string{"rank exit", "node down", "GPU fault", "stall", "operator restart", "refused the launch", "fail-slow"}

// String names the failure kind.
func (k FailureKind) String() string {
	if k >= 0 && int(k) < len(failureNames) {
		return failureNames[k]
	}
	return fmt.Sprintf("FailureKind(%d)", int(k))
}

// RestartPolicy is what a job asks for when it fails.
type RestartPolicy int

// Restart policies, mirroring the job file's restart_policy.
const (
	// RestartInPlace restarts every rank on the same GPUs; it gives up
	// when one of them is no longer usable.
	RestartInPlace RestartPolicy = iota
	// RestartReplace keeps the healthy nodes and swaps each failed node for
	// a free one (hot spares first), then restarts every rank.
	RestartReplace
	// RestartShrink replaces failed nodes when free ones exist, else runs
	// at the largest allowed smaller data-parallel size that fits.
	RestartShrink
	// RestartNone never restarts.
	RestartNone
)

// Failure is one failure of a running job.
type Failure struct {
	Kind FailureKind
	// Nodes are the failed nodes (down, faulty or lagging); the job must
	// not run there again.
	Nodes []string
	// Exclude are further nodes the operator asked the restart to avoid.
	Exclude []string
}

// RecoverRequest is a failed job and what it allows.
type RecoverRequest struct {
	// Job is the job as the placer sees it (shape, GPUs per node, model,
	// elastic sizes).
	Job JobRequest
	// Placement is where the failed attempt ran.
	Placement Placement
	Policy    RestartPolicy
	// Restarts is how many automatic restarts the job has had; MaxRestarts
	// bounds them. A manual restart is not bounded.
	Restarts, MaxRestarts int
	Failure               Failure
}

// RecoveryAction is what Recover decided.
type RecoveryAction int

// Recovery actions.
const (
	GiveUp RecoveryAction = iota
	RestartSame
	ReplaceNodes
	ShrinkDP
	// Replan is a restart on a new placement found from scratch, used
	// when the failed nodes cannot be swapped one for one.
	Replan
)

var actionNames = [...]string{"give up", "restart in place", "replace nodes", "shrink", "re-place"}

// String names the action.
func (a RecoveryAction) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("RecoveryAction(%d)", int(a))
}

// Recovery is Recover's decision.
type Recovery struct {
	Action RecoveryAction
	// Placement is where the next attempt runs (not for GiveUp).
	Placement Placement
	// Removed are the nodes of the failed attempt the next one leaves;
	// Added the nodes it gains.
	Removed, Added []string
	// Reason says why, in one line an operator can act on.
	Reason string
}

// Recover decides what to do about a failed job: restart it in place when
// a rank crashed on healthy nodes, swap failed nodes for free ones (hot
// spares first) keeping the healthy ones, shrink to an allowed smaller
// data-parallel size, or give up, with the reason. The job's own GPUs in
// the snapshot count as free (its ranks are being stopped); failed,
// excluded, cordoned, draining and down nodes are never used.
func Recover(s *Snapshot, r *RecoverRequest) Recovery {
	manual := r.Failure.Kind == FailManual
	switch {
	case r.Policy == RestartNone && !manual:
		return Recovery{Action: GiveUp, Reason: "restart_policy is none"}
	case r.Restarts >= r.MaxRestarts && !manual:
		return Recovery{Action: GiveUp, Reason: fmt.Sprintf("max_restarts %d reached", r.MaxRestarts)}
	case len(r.Placement.Ranks) == 0:
		return Recovery{Action: GiveUp, Reason: "the failed attempt has no placement to recover from"}
	}
	if err := r.Job.Validate(); err != nil {
		return Recovery{Action: GiveUp, Reason: err.Error()}
	}
	bad := map[string]string{}
	for _, n := range r.Failure.Nodes {
		bad[n] = r.Failure.Kind.String()
	}
	for _, n := range r.Failure.Exclude {
		if _, ok := bad[n]; !ok {
			bad[n] = "excluded"
		}
	}
	view := recoveryView(s, r.Job.ID, bad)
	// A node of the attempt that is no longer usable counts as failed too,
	// whatever the report said: a rank "crash" on a GPU that just faulted
	// is a GPU fault.
	byName := map[string]*Node{}
	for i := range view.Nodes {
		byName[view.Nodes[i].Name] = &view.Nodes[i]
	}
	// A surviving GPU another job took while this one stopped does not
	// fail its node: the ranks move to free GPUs of the same node.
	taken := map[string][]int{}
	for i, sl := range r.Placement.Ranks {
		if _, ok := bad[sl.Node]; ok {
			continue
		}
		n := byName[sl.Node]
		switch {
		case n == nil:
			bad[sl.Node] = "gone from the cluster"
		case n.State != NodeReady:
			bad[sl.Node] = "node " + n.State.String()
		default:
			for _, g := range n.GPUs {
				if g.Index == sl.GPU && !g.Healthy {
					bad[sl.Node] = fmt.Sprintf("GPU %d unhealthy", sl.GPU)
				} else if g.Index == sl.GPU && g.Job != "" {
					taken[sl.Node] = append(taken[sl.Node], i)
				}
			}
		}
	}
	old := clonePlacement(&r.Placement)
	moved := regainTaken(byName, &old, taken, bad)
	view = recoveryView(s, r.Job.ID, bad)
	failed := failedNodes(&old, bad)
	if len(failed) == 0 {
		why := fmt.Sprintf("%s on healthy nodes: restarting every rank in place%s", r.Failure.Kind, moved)
		return Recovery{Action: RestartSame, Placement: old, Reason: why}
	}
	what := describeBad(failed, bad) + moved
	if r.Policy == RestartInPlace && !manual {
		return Recovery{Action: GiveUp, Reason: what + "; restart_policy restart-in-place needs the same nodes (replace-node swaps in spares)"}
	}
	req := r.Job
	req.UseSpares = true
	if p, ok := replaceOneForOne(&view, &req, &old, failed); ok {
		added := newNodes(&old, &p)
		return Recovery{Action: ReplaceNodes, Placement: p, Removed: failed, Added: added,
			Reason: fmt.Sprintf("%s; replacing with %s, keeping the other nodes", what, strings.Join(added, ","))}
	}
	full := req
	full.ElasticDP = nil
	st := newState(&view)
	if p, err := st.place(&full, placeOpts{quiet: true}); err == nil {
		return Recovery{Action: Replan, Placement: p, Removed: goneNodes(&old, &p), Added: newNodes(&old, &p),
			Reason: fmt.Sprintf("%s; no one-for-one swap fits, re-placed on %s", what, strings.Join(p.Nodes(), ","))}
	}
	if r.Policy == RestartShrink || (manual && len(req.ElasticDP) > 0) {
		if p, ok := shrink(&view, &req, &old, failed); ok {
			return Recovery{Action: ShrinkDP, Placement: p, Removed: goneNodes(&old, &p), Added: newNodes(&old, &p),
				Reason: fmt.Sprintf("%s; no spare fits, shrinking data parallelism %d → %d on %s", what, req.shape().DP, p.Shape.DP, strings.Join(p.Nodes(), ","))}
		}
		return Recovery{Action: GiveUp, Reason: fmt.Sprintf("%s; no spare fits and no allowed data-parallel size %v fits the healthy nodes", what, req.ElasticDP)}
	}
	return Recovery{Action: GiveUp, Reason: what + "; no free node can replace it: add or uncordon nodes, then `gpuctl restart " + r.Job.ID + "`"}
}

// RecoversBefore orders jobs recovering at the same time (a negative
// result puts a first): the job that decides first has the free capacity
// first, so the higher priority goes first, then the earlier submitted,
// then the lower id.
func RecoversBefore(a, b *JobRequest) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Submit, b.Submit); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// regainTaken moves the ranks of p whose GPU another job holds (taken:
// node → rank indices) onto free healthy GPUs of the same node, which
// p's other ranks do not use. A node without enough of them is bad. It
// returns what moved, as a clause for the reason ("" when nothing did).
func regainTaken(byName map[string]*Node, p *Placement, taken map[string][]int, bad map[string]string) string {
	var notes []string
	for _, name := range slices.Sorted(maps.Keys(taken)) {
		if _, ok := bad[name]; ok {
			continue
		}
		ranks := taken[name]
		inUse := map[int]bool{}
		for _, sl := range p.Ranks {
			if sl.Node == name {
				inUse[sl.GPU] = true
			}
		}
		var free []int
		for _, g := range byName[name].GPUs {
			if g.Healthy && g.Job == "" && !inUse[g.Index] {
				free = append(free, g.Index)
			}
		}
		first := p.Ranks[ranks[0]].GPU
		holder := ""
		for _, g := range byName[name].GPUs {
			if g.Index == first {
				holder = g.Job
			}
		}
		if len(free) < len(ranks) {
			bad[name] = fmt.Sprintf("GPU %d taken by %s and %d free GPUs left for %d ranks", first, holder, len(free), len(ranks))
			continue
		}
		slices.Sort(free)
		var from, to []string
		for k, i := range ranks {
			from = append(from, strconv.Itoa(p.Ranks[i].GPU))
			to = append(to, strconv.Itoa(free[k]))
			p.Ranks[i].GPU = free[k]
		}
		notes = append(notes, fmt.Sprintf("%s GPU %s taken by %s, using GPU %s", name, strings.Join(from, ","), holder, strings.Join(to, ",")))
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}

// recoveryView copies the snapshot with the job's own GPUs free and the
// bad nodes down, so the placer neither keeps nor picks them.
func recoveryView(s *Snapshot, job string, bad map[string]string) Snapshot {
	v := *s
	v.Running, v.Pending = nil, nil
	v.Nodes = make([]Node, len(s.Nodes))
	for i, n := range s.Nodes {
		gpus := make([]GPU, len(n.GPUs))
		for k, g := range n.GPUs {
			if g.Job == job {
				g.Job = ""
			}
			gpus[k] = g
		}
		n.GPUs = gpus
		if _, ok := bad[n.Name]; ok {
			n.State = NodeDown
		}
		v.Nodes[i] = n
	}
	return v
}

func failedNodes(p *Placement, bad map[string]string) []string {
	var out []string
	for _, n := range p.Nodes() {
		if _, ok := bad[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

func describeBad(nodes []string, bad map[string]string) string {
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = n + " (" + bad[n] + ")"
	}
	if len(parts) == 1 {
		return "failed node " + parts[0]
	}
	return "failed nodes " + strings.Join(parts, ", ")
}

func clonePlacement(p *Placement) Placement {
	c := *p
	c.Ranks = slices.Clone(p.Ranks)
	return c
}

func newNodes(old, p *Placement) []string {
	was := map[string]bool{}
	for _, n := range old.Nodes() {
		was[n] = true
	}
	var out []string
	for _, n := range p.Nodes() {
		if !was[n] {
			out = append(out, n)
		}
	}
	return out
}

func goneNodes(old, p *Placement) []string { return newNodes(p, old) }

// replaceOneForOne keeps every slot on a healthy node and moves the ranks
// of each failed node onto one free node that holds them all, preferring
// the failed node's switch, then its rack, then hot spares, then topology
// order. Tensor-parallel groups stay whole since a node's ranks move
// together.
func replaceOneForOne(view *Snapshot, req *JobRequest, old *Placement, failed []string) (Placement, bool) {
	st := newState(view)
	keep := map[string]bool{}
	for _, n := range old.Nodes() {
		if !slices.Contains(failed, n) {
			keep[n] = true
		}
	}
	model := ""
	for _, n := range old.Nodes() {
		if keep[n] {
			model = st.nodes[st.byName[n]].node.GPUModel
			break
		}
	}
	out := clonePlacement(old)
	used := map[string]bool{}
	for _, f := range failed {
		var ranks []int
		for r, sl := range old.Ranks {
			if sl.Node == f {
				ranks = append(ranks, r)
			}
		}
		fi, known := st.byName[f]
		var fnode *Node
		if known {
			fnode = st.nodes[fi].node
		}
		best := -1
		for i := range st.nodes {
			ns := &st.nodes[i]
			n := ns.node
			if keep[n.Name] || used[n.Name] || slices.Contains(failed, n.Name) {
				continue
			}
			if st.filter(ns, req, len(ranks), placeOpts{}) != "" {
				continue
			}
			if req.GPUsPerNode > 0 && len(ns.free) < req.GPUsPerNode {
				continue
			}
			if !req.AllowMixed && model != "" && n.GPUModel != model {
				continue
			}
			if best < 0 || betterSpare(ns, &st.nodes[best], fnode) {
				best = i
			}
		}
		if best < 0 {
			return Placement{}, false
		}
		ns := &st.nodes[best]
		used[ns.node.Name] = true
		for k, r := range ranks {
			out.Ranks[r] = Slot{Node: ns.node.Name, GPU: ns.free[k]}
		}
	}
	out.Score = Score{}
	return out, true
}

// betterSpare orders replacement candidates for failed node f.
func betterSpare(a, b *nodeState, f *Node) bool {
	key := func(ns *nodeState) []int {
		n := ns.node
		k := []int{1, 1, 1}
		if f != nil && n.Switch() == f.Switch() {
			k[0] = 0
		}
		if f != nil && n.Switch() == f.Switch() && n.Rack() == f.Rack() {
			k[1] = 0
		}
		if ns.spare {
			k[2] = 0
		}
		return append(k, ns.order)
	}
	return slices.Compare(key(a), key(b)) < 0
}

// shrink runs the job at the largest allowed data-parallel size below its
// own that fits: on the healthy nodes it already holds when they are
// enough, else anywhere.
func shrink(view *Snapshot, req *JobRequest, old *Placement, failed []string) (Placement, bool) {
	full := req.shape()
	dps := slices.Clone(req.ElasticDP)
	sort.Sort(sort.Reverse(sort.IntSlice(dps)))
	keep := map[string]bool{}
	for _, n := range old.Nodes() {
		if !slices.Contains(failed, n) {
			keep[n] = true
		}
	}
	for _, dp := range dps {
		if dp >= full.DP {
			continue
		}
		sh := full
		sh.DP = dp
		r := *req
		r.Shape, r.GPUs, r.ElasticDP = sh, 0, nil
		if r.GPUsPerNode > 0 && sh.Size()%r.GPUsPerNode != 0 {
			continue
		}
		if len(keep) > 0 {
			if p, err := newState(view).placeShape(&r, sh, placeOpts{only: keep, quiet: true}); err == nil {
				return p, true
			}
		}
		if p, err := newState(view).placeShape(&r, sh, placeOpts{quiet: true}); err == nil {
			return p, true
		}
	}
	return Placement{}, false
}

// Grow places an elastic job at data-parallel size dp with its own GPUs
// counting as free: where a job that shrank after a failure runs once it
// grows back. ok is false when that size does not fit now.
func Grow(s *Snapshot, req *JobRequest, dp int) (Placement, bool) {
	view := recoveryView(s, req.ID, nil)
	r := *req
	sh := r.shape()
	sh.DP = dp
	r.Shape, r.GPUs, r.ElasticDP = sh, 0, nil
	if r.GPUsPerNode > 0 && sh.Size()%r.GPUsPerNode != 0 {
		return Placement{}, false
	}
	p, err := newState(&view).placeShape(&r, sh, placeOpts{quiet: true})
	return p, err == nil
}
