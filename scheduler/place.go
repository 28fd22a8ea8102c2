package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// ErrInvalidRequest marks a request that can never be placed as written.
var ErrInvalidRequest = errors.New("invalid job request")

// ErrUnschedulable marks a valid request that does not fit the snapshot.
var ErrUnschedulable = errors.New("job does not fit")

// Reason says why the Filter stage rejected a node for a job.
type Reason string

// Filter reasons, shown by `gpuctl plan` and the TUI.
const (
	ReasonCordoned      Reason = "node cordoned"
	ReasonDraining      Reason = "node draining"
	ReasonDown          Reason = "node down"
	ReasonNotSelected   Reason = "node not in the requested set"
	ReasonGPUModel      Reason = "GPU model differs"
	ReasonHotSpare      Reason = "held back as hot spare"
	ReasonExcluded      Reason = "the job avoids it (failed or refused there)"
	ReasonNodeTooSmall  Reason = "node has fewer GPUs than one group"
	ReasonUnhealthyGPUs Reason = "unhealthy GPUs leave too few"
	ReasonAllocated     Reason = "too few free GPUs"
	// ReasonTopology is not a per-node verdict: the nodes that passed the
	// filters together hold too few groups, or no single GPU model does.
	ReasonTopology Reason = "passing nodes hold too few groups together"
)

// Slot is one GPU of a placement.
type Slot struct {
	Node string
	GPU  int
}

// Placement maps ranks to GPUs: Ranks[r] is where rank r runs.
type Placement struct {
	Job   string
	Shape Shape
	Ranks []Slot
	Score Score
	// Model is the type chosen for a job allowing several models; empty
	// otherwise.
	Model string
}

// Nodes returns the distinct nodes of the placement in rank order.
func (p *Placement) Nodes() []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range p.Ranks {
		if !seen[s.Node] {
			seen[s.Node] = true
			out = append(out, s.Node)
		}
	}
	return out
}

// ScoreComponent is one named term of a placement's score.
type ScoreComponent struct {
	Name   string
	Value  float64
	Weight float64
}

// Score is a placement's quality; higher is better. Total is the sum of
// Value·Weight over Components, so it explains itself.
type Score struct {
	Total      float64
	Components []ScoreComponent
}

// Score weights: topology dominates (a switch hop costs more than a rack
// hop, which costs more than an extra node), then fragmentation, then soft
// label preferences.
const (
	weightSwitches      = -100
	weightRacks         = -10
	weightNodes         = -1
	weightFragmentation = -0.5
	weightPreference    = 1
)

// String lists the components as name=value×weight and the total.
func (s Score) String() string {
	var b strings.Builder
	for _, c := range s.Components {
		fmt.Fprintf(&b, "%s=%g×%g ", c.Name, c.Value, c.Weight)
	}
	fmt.Fprintf(&b, "total=%g", s.Total)
	return b.String()
}

// Component returns the value of the named component and whether it exists.
func (s Score) Component(name string) (float64, bool) {
	for _, c := range s.Components {
		if c.Name == name {
			return c.Value, true
		}
	}
	return 0, false
}

// NodeVerdict is the Filter stage's answer for one node.
type NodeVerdict struct {
	Node   string
	Reason Reason
	// Free is the node's usable free GPUs when it was examined.
	Free int
}

// PlacementError explains why a job did not fit: per node why it was
// filtered, counts per reason, and what the passing nodes could hold.
type PlacementError struct {
	Job string
	// GPUs is the size asked for; Group is the GPUs that must share a node.
	GPUs, Group int
	// Passing is how many nodes passed the filters and FitGroups how many
	// groups they could hold together.
	Passing, FitGroups int
	Counts             map[Reason]int
	Nodes              []NodeVerdict
}

// Error summarises the reasons, most frequent first.
func (e *PlacementError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %d GPUs in groups of %d do not fit: %d nodes pass the filters with room for %d of %d groups",
		e.Job, e.GPUs, e.Group, e.Passing, e.FitGroups, e.GPUs/max(e.Group, 1))
	reasons := make([]Reason, 0, len(e.Counts))
	for r := range e.Counts {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if e.Counts[reasons[i]] != e.Counts[reasons[j]] {
			return e.Counts[reasons[i]] > e.Counts[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for _, r := range reasons {
		fmt.Fprintf(&b, "; %s: %d", r, e.Counts[r])
	}
	return b.String()
}

// Is makes errors.Is(err, ErrUnschedulable) true.
func (e *PlacementError) Is(target error) bool { return target == ErrUnschedulable }

// nodeState is a node's mutable view inside one scheduling pass.
type nodeState struct {
	node  *Node
	free  []int // usable free GPU indices, ascending
	spare bool
	order int // position in topology order
}

// state is the scheduler's working copy of a snapshot: the snapshot itself
// is never modified, so several starts in one pass see each other.
type state struct {
	nodes  []nodeState
	byName map[string]int
}

func newState(s *Snapshot) *state {
	st := &state{nodes: make([]nodeState, len(s.Nodes)), byName: make(map[string]int, len(s.Nodes))}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		ns := &st.nodes[i]
		ns.node = n
		ns.free = make([]int, 0, len(n.GPUs))
		for _, g := range n.GPUs {
			if g.Healthy && g.Job == "" {
				ns.free = append(ns.free, g.Index)
			}
		}
		slices.Sort(ns.free)
		st.byName[n.Name] = i
	}
	// Topology order: switch, rack, name. It decides rank layout and which
	// idle nodes become spares.
	idx := make([]int, len(s.Nodes))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return topoCmp(&s.Nodes[a], &s.Nodes[b]) })
	for pos, i := range idx {
		st.nodes[i].order = pos
	}
	st.markSpares(s.Spares, idx)
	return st
}

func topoCmp(a, b *Node) int {
	if c := cmp.Compare(a.Switch(), b.Switch()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Rack(), b.Rack()); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

func (st *state) markSpares(p SparesPolicy, topo []int) {
	if p.Selector != "" {
		k, v, anyValue := parseSelector(p.Selector)
		for i := range st.nodes {
			if got, ok := st.nodes[i].node.Labels[k]; ok && (anyValue || got == v) {
				st.nodes[i].spare = true
			}
		}
		return
	}
	// Hold back the last idle, fully healthy ready nodes in topology order.
	left := p.Count
	for j := len(topo) - 1; j >= 0 && left > 0; j-- {
		ns := &st.nodes[topo[j]]
		if ns.node.State == NodeReady && len(ns.node.GPUs) > 0 && len(ns.free) == len(ns.node.GPUs) {
			ns.spare = true
			left--
		}
	}
}

func (st *state) clone() *state {
	c := &state{nodes: make([]nodeState, len(st.nodes)), byName: st.byName}
	copy(c.nodes, st.nodes)
	for i := range c.nodes {
		c.nodes[i].free = slices.Clone(st.nodes[i].free)
	}
	return c
}

// take removes the placement's GPUs from the free lists; GPUs already gone
// are ignored, so a state can take a placement made on another state.
func (st *state) take(p *Placement) {
	for _, s := range p.Ranks {
		i, ok := st.byName[s.Node]
		if !ok {
			continue
		}
		ns := &st.nodes[i]
		if k := slices.Index(ns.free, s.GPU); k >= 0 {
			ns.free = slices.Delete(ns.free, k, k+1)
		}
	}
}

// release returns the placement's healthy GPUs to the free lists.
func (st *state) release(p *Placement) {
	for _, s := range p.Ranks {
		i, ok := st.byName[s.Node]
		if !ok {
			continue
		}
		ns := &st.nodes[i]
		healthy := false
		for _, g := range ns.node.GPUs {
			if g.Index == s.GPU {
				healthy = g.Healthy
				break
			}
		}
		if !healthy || slices.Contains(ns.free, s.GPU) {
			continue
		}
		k, _ := slices.BinarySearch(ns.free, s.GPU)
		ns.free = slices.Insert(ns.free, k, s.GPU)
	}
}

// freeGPUs counts usable free GPUs on ready, non-spare nodes.
func (st *state) freeGPUs() int {
	n := 0
	for i := range st.nodes {
		if st.nodes[i].node.State == NodeReady && !st.nodes[i].spare {
			n += len(st.nodes[i].free)
		}
	}
	return n
}

// placeOpts restricts a placement (gpuctl assign).
type placeOpts struct {
	only map[string]bool
	// quiet skips building the explanation when a caller only needs to know
	// whether the job fits (Schedule tries many jobs per pass).
	quiet bool
}

// errNoFit is the quiet form of a PlacementError.
var errNoFit = fmt.Errorf("%w (no explanation requested)", ErrUnschedulable)

// Place finds GPUs for the request on the snapshot: tensor-parallel groups
// inside one node, the gang packed onto the fewest switches, then racks,
// then best fit; never on cordoned, draining or down nodes, unhealthy or
// allocated GPUs, or hot spares (unless UseSpares). A request with ElasticDP
// falls back to smaller data-parallel sizes, largest first. The error is a
// *PlacementError (errors.Is ErrUnschedulable) or wraps ErrInvalidRequest.
func Place(s *Snapshot, req *JobRequest) (Placement, error) {
	if err := req.Validate(); err != nil {
		return Placement{}, err
	}
	return newState(s).place(req, placeOpts{})
}

// place runs Filter, Score and Reserve for one request on the state. A
// request allowing several models is placed on each as a request for that
// model with that model's shape: the first that fits when ordered, else
// the best-scoring one (as a job without a model is placed per model).
func (st *state) place(req *JobRequest, o placeOpts) (Placement, error) {
	opts := req.options()
	if len(opts) == 0 {
		return st.placeOne(req, o)
	}
	var (
		best     Placement
		found    bool
		firstErr error
	)
	for _, t := range opts {
		one := *req
		one.Types, one.GPUModel, one.Shape, one.GPUs = nil, t.Model, t.Shape, 0
		p, err := st.placeOne(&one, o)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		p.Model = t.Model
		if req.ordered {
			return p, nil
		}
		if !found || p.Score.Total > best.Score.Total {
			best, found = p, true
		}
	}
	if found {
		return best, nil
	}
	return Placement{}, firstErr
}

func (st *state) placeOne(req *JobRequest, o placeOpts) (Placement, error) {
	full := req.shape()
	dps := []int{full.DP}
	if len(req.ElasticDP) > 0 {
		alt := slices.Clone(req.ElasticDP)
		slices.Sort(alt)
		for i := len(alt) - 1; i >= 0; i-- {
			if alt[i] < full.DP && !slices.Contains(dps, alt[i]) {
				dps = append(dps, alt[i])
			}
		}
	}
	var firstErr error
	for _, dp := range dps {
		sh := full
		sh.DP = dp
		p, err := st.placeShape(req, sh, o)
		if err == nil {
			return p, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return Placement{}, firstErr
}

// cand is a node that passed the filters, with the groups it can hold.
type cand struct {
	ni   int
	cap  int
	pref float64
}

func (st *state) unit(req *JobRequest, sh Shape) (unit, units int) {
	if req.GPUsPerNode > 0 {
		return req.GPUsPerNode, sh.Size() / req.GPUsPerNode
	}
	return sh.TP, sh.PP * sh.DP
}

// filter is the Filter stage for one node; it returns "" when the node passes.
func (st *state) filter(ns *nodeState, req *JobRequest, unit int, o placeOpts) Reason {
	n := ns.node
	switch n.State {
	case NodeReady:
	case NodeCordoned:
		return ReasonCordoned
	case NodeDraining:
		return ReasonDraining
	default:
		return ReasonDown
	}
	if o.only != nil && !o.only[n.Name] {
		return ReasonNotSelected
	}
	if req.GPUModel != "" && n.GPUModel != req.GPUModel {
		return ReasonGPUModel
	}
	if ns.spare && !req.UseSpares {
		return ReasonHotSpare
	}
	if slices.Contains(req.Exclude, n.Name) {
		return ReasonExcluded
	}
	if len(ns.free) < unit {
		if len(n.GPUs) < unit {
			return ReasonNodeTooSmall
		}
		idle := 0
		for _, g := range n.GPUs {
			if g.Job == "" {
				idle++
			}
		}
		if idle >= unit {
			return ReasonUnhealthyGPUs
		}
		return ReasonAllocated
	}
	return ""
}

func preference(n *Node, prefs []Preference) float64 {
	var p float64
	for _, pr := range prefs {
		if v, ok := n.Labels[pr.Key]; ok && v == pr.Value {
			p += pr.Weight
		}
	}
	return p
}

func (st *state) placeShape(req *JobRequest, sh Shape, o placeOpts) (Placement, error) {
	unit, units := st.unit(req, sh)
	var cands []cand
	for i := range st.nodes {
		ns := &st.nodes[i]
		if st.filter(ns, req, unit, o) != "" {
			continue
		}
		c := len(ns.free) / unit
		if req.GPUsPerNode > 0 {
			c = 1
		}
		cands = append(cands, cand{ni: i, cap: c, pref: preference(ns.node, req.Prefer)})
	}
	// Never mix models unless allowed: solve per model and keep the best.
	groups := [][]cand{cands}
	if req.GPUModel == "" && !req.AllowMixed && len(cands) > 0 {
		groups = st.byModel(cands)
	}
	var best Placement
	found := false
	for _, g := range groups {
		p, ok := st.selectGang(req, sh, g, unit, units)
		if ok && (!found || p.Score.Total > best.Score.Total) {
			best, found = p, true
		}
	}
	if found {
		return best, nil
	}
	if o.quiet {
		return Placement{}, errNoFit
	}
	return Placement{}, st.explain(req, sh, unit, units, cands, o)
}

func (st *state) byModel(cands []cand) [][]cand {
	// A cluster has few models: a linear scan beats a map, and the shadow
	// search calls this once per release it tries.
	var models []string
	var counts []int
	for _, c := range cands {
		m := st.nodes[c.ni].node.GPUModel
		k := slices.Index(models, m)
		if k < 0 {
			models, counts = append(models, m), append(counts, 0)
			k = len(models) - 1
		}
		counts[k]++
	}
	if len(models) == 1 {
		return [][]cand{cands}
	}
	order := make([]int, len(models))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(models[a], models[b]) })
	out := make([][]cand, len(models))
	for _, k := range order {
		out[k] = make([]cand, 0, counts[k])
	}
	for _, c := range cands {
		k := slices.Index(models, st.nodes[c.ni].node.GPUModel)
		out[k] = append(out[k], c)
	}
	sorted := make([][]cand, len(models))
	for i, k := range order {
		sorted[i] = out[k]
	}
	return sorted
}

// explain builds the PlacementError, recording a verdict for every node.
func (st *state) explain(req *JobRequest, sh Shape, unit, units int, cands []cand, o placeOpts) *PlacementError {
	e := &PlacementError{Job: req.ID, GPUs: sh.Size(), Group: unit, Counts: map[Reason]int{}}
	for i := range st.nodes {
		ns := &st.nodes[i]
		r := st.filter(ns, req, unit, o)
		if r == "" {
			continue
		}
		e.Counts[r]++
		e.Nodes = append(e.Nodes, NodeVerdict{Node: ns.node.Name, Reason: r, Free: len(ns.free)})
	}
	e.Passing = len(cands)
	for _, c := range cands {
		e.FitGroups += c.cap
	}
	if e.Passing > 0 {
		e.Counts[ReasonTopology] = e.Passing
	}
	return e
}

// tnode is a topology tree node: root, switch, rack or leaf (a candidate).
type tnode struct {
	key  string
	cap  int
	pref float64
	kids []*tnode
	leaf *cand
	used bool
	// desc holds the kids' capacities, largest first, to count how many
	// kids a need takes.
	desc []int
}

func (t *tnode) kidsNeeded(need int) int {
	if t.leaf != nil {
		return 1
	}
	n := 0
	for _, c := range t.desc {
		if need <= 0 {
			break
		}
		need -= c
		n++
	}
	return n
}

func (st *state) tree(cs []cand) *tnode {
	root := &tnode{}
	sw := map[string]*tnode{}
	rk := map[[2]string]*tnode{}
	for i := range cs {
		c := &cs[i]
		n := st.nodes[c.ni].node
		s, r := n.Switch(), n.Rack()
		st1, ok := sw[s]
		if !ok {
			st1 = &tnode{key: s}
			sw[s] = st1
			root.kids = append(root.kids, st1)
		}
		rt, ok := rk[[2]string{s, r}]
		if !ok {
			rt = &tnode{key: r}
			rk[[2]string{s, r}] = rt
			st1.kids = append(st1.kids, rt)
		}
		rt.kids = append(rt.kids, &tnode{key: n.Name, cap: c.cap, pref: c.pref, leaf: c})
	}
	var sum func(t *tnode)
	sum = func(t *tnode) {
		if t.leaf != nil {
			return
		}
		slices.SortFunc(t.kids, func(a, b *tnode) int { return cmp.Compare(a.key, b.key) })
		for _, k := range t.kids {
			sum(k)
			t.cap += k.cap
			t.pref = max(t.pref, k.pref)
			t.desc = append(t.desc, k.cap)
		}
		slices.SortFunc(t.desc, func(a, b int) int { return cmp.Compare(b, a) })
	}
	sum(root)
	return root
}

type take struct {
	c     *cand
	units int
}

// pick chooses need groups under t: if one kid holds them all, the kid
// needing the fewest of its own kids, then the tightest fit, then the best
// preference; otherwise the largest kid whole and repeat. Largest-first
// minimises how many kids are used at each level.
func pick(t *tnode, need int, out []take) []take {
	if t.leaf != nil {
		return append(out, take{t.leaf, need})
	}
	for need > 0 {
		var best *tnode
		bestKids := 0
		for _, k := range t.kids {
			if k.used || k.cap < need {
				continue
			}
			kn := k.kidsNeeded(need)
			if best == nil || kn < bestKids || (kn == bestKids && (k.cap < best.cap || (k.cap == best.cap && k.pref > best.pref))) {
				best, bestKids = k, kn
			}
		}
		if best != nil {
			best.used = true
			return pick(best, need, out)
		}
		var big *tnode
		for _, k := range t.kids {
			if k.used || k.cap == 0 {
				continue
			}
			if big == nil || k.cap > big.cap || (k.cap == big.cap && k.pref > big.pref) {
				big = k
			}
		}
		if big == nil {
			return out // cannot happen when t.cap >= need
		}
		big.used = true
		out = pick(big, big.cap, out)
		need -= big.cap
	}
	return out
}

// selectGang is the Score and Reserve stages for one set of candidates.
func (st *state) selectGang(req *JobRequest, sh Shape, cs []cand, unit, units int) (Placement, bool) {
	total := 0
	for _, c := range cs {
		total += c.cap
	}
	if total < units || units == 0 {
		return Placement{}, false
	}
	root := st.tree(cs)
	takes := pick(root, units, nil)
	slices.SortFunc(takes, func(a, b take) int { return cmp.Compare(st.nodes[a.c.ni].order, st.nodes[b.c.ni].order) })

	p := Placement{Job: req.ID, Shape: sh, Ranks: make([]Slot, 0, sh.Size())}
	switches, racks := map[string]bool{}, map[[2]string]bool{}
	var frag, pref float64
	for _, tk := range takes {
		ns := &st.nodes[tk.c.ni]
		n := ns.node
		switches[n.Switch()] = true
		racks[[2]string{n.Switch(), n.Rack()}] = true
		k := tk.units * unit
		for _, g := range ns.free[:k] {
			p.Ranks = append(p.Ranks, Slot{Node: n.Name, GPU: g})
		}
		if left := len(ns.free) - k; left > 0 {
			frag++
		}
		pref += tk.c.pref * float64(k)
	}
	comps := []ScoreComponent{
		{Name: "switches", Value: float64(len(switches)), Weight: weightSwitches},
		{Name: "racks", Value: float64(len(racks)), Weight: weightRacks},
		{Name: "nodes", Value: float64(len(takes)), Weight: weightNodes},
		{Name: "fragmented_nodes", Value: frag, Weight: weightFragmentation},
		{Name: "preference", Value: pref / float64(sh.Size()), Weight: weightPreference},
	}
	for _, c := range comps {
		p.Score.Total += c.Value * c.Weight
	}
	p.Score.Components = comps
	return p, true
}
