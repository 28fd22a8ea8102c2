package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Assign places req only on the named nodes (gpuctl assign JOB --nodes a,b).
// A job already running in the snapshot may reuse its own GPUs, so an
// assignment can move it. Unknown or repeated node names are errors; a
// placement failure is a *PlacementError listing only the named nodes.
func Assign(s *Snapshot, req *JobRequest, nodes []string) (Placement, error) {
	if err := req.Validate(); err != nil {
		return Placement{}, err
	}
	if len(nodes) == 0 {
		return Placement{}, fmt.Errorf("%w: assign %s: no nodes given; name at least one node", ErrInvalidRequest, req.ID)
	}
	st := newState(s)
	only := make(map[string]bool, len(nodes))
	var unknown []string
	for _, n := range nodes {
		if only[n] {
			return Placement{}, fmt.Errorf("%w: assign %s: node %s named twice", ErrInvalidRequest, req.ID, n)
		}
		if _, ok := st.byName[n]; !ok {
			unknown = append(unknown, n)
		}
		only[n] = true
	}
	if len(unknown) > 0 {
		return Placement{}, fmt.Errorf("%w: assign %s: unknown nodes %s; list nodes with `gpuctl nodes`",
			ErrInvalidRequest, req.ID, strings.Join(unknown, ", "))
	}
	for i := range s.Running {
		if s.Running[i].Request.ID == req.ID {
			st.release(&s.Running[i].Placement)
		}
	}
	pl, err := st.place(req, placeOpts{only: only})
	if err != nil {
		if pe, ok := err.(*PlacementError); ok {
			delete(pe.Counts, ReasonNotSelected)
			pe.Nodes = slices.DeleteFunc(pe.Nodes, func(v NodeVerdict) bool { return v.Reason == ReasonNotSelected })
		}
		return Placement{}, err
	}
	return pl, nil
}

// AssignExact is Assign for an operator who names the nodes: the job uses
// every named node or is refused, saying which would be left unused.
func AssignExact(s *Snapshot, req *JobRequest, nodes []string) (Placement, error) {
	pl, err := Assign(s, req, nodes)
	if err != nil {
		return pl, err
	}
	used := pl.Nodes()
	var idle []string
	for _, n := range nodes {
		if !slices.Contains(used, n) {
			idle = append(idle, n)
		}
	}
	if len(idle) > 0 {
		return Placement{}, fmt.Errorf("%w: assign %s: its %d GPUs fit on %s and would leave %s unused: name exactly the nodes it should run on",
			ErrInvalidRequest, req.ID, len(pl.Ranks), strings.Join(used, ","), strings.Join(idle, ","))
	}
	return pl, nil
}

// Packing measures how well running jobs are packed; lower is better.
type Packing struct {
	// FragmentedNodes are ready nodes with both allocated and free GPUs.
	FragmentedNodes int
	// ExtraSwitches and ExtraRacks sum, over jobs, the switches and racks a
	// job spans beyond its first.
	ExtraSwitches, ExtraRacks int
}

// Cost weighs the terms like the placer does: a switch hop over a rack hop
// over a fragmented node.
func (p Packing) Cost() float64 {
	return 100*float64(p.ExtraSwitches) + 10*float64(p.ExtraRacks) + float64(p.FragmentedNodes)
}

// Move is one checkpoint-restart of a running job onto better GPUs.
type Move struct {
	Job           string
	From, To      Placement
	Before, After Packing
}

// RebalancePlan is the ordered moves of a rebalance; empty when nothing
// improves packing.
type RebalancePlan struct {
	Moves         []Move
	Before, After Packing
}

func packing(st *state, jobs map[string]*Placement) Packing {
	var p Packing
	for i := range st.nodes {
		ns := &st.nodes[i]
		if ns.node.State != NodeReady {
			continue
		}
		healthy := 0
		for _, g := range ns.node.GPUs {
			if g.Healthy {
				healthy++
			}
		}
		if len(ns.free) > 0 && len(ns.free) < healthy {
			p.FragmentedNodes++
		}
	}
	for _, pl := range jobs {
		sw, rk := spread(st, pl)
		p.ExtraSwitches += sw
		p.ExtraRacks += rk
	}
	return p
}

// spread returns the switches and racks a placement spans beyond its first.
func spread(st *state, pl *Placement) (switches, racks int) {
	sw, rk := map[string]bool{}, map[[2]string]bool{}
	for _, n := range pl.Nodes() {
		if i, ok := st.byName[n]; ok {
			node := st.nodes[i].node
			sw[node.Switch()] = true
			rk[[2]string{node.Switch(), node.Rack()}] = true
		}
	}
	return max(len(sw)-1, 0), max(len(rk)-1, 0)
}

// Rebalance plans up to maxMoves checkpoint-restarts of running jobs that
// lower the packing cost (fewer fragmented nodes, switches and racks). Only
// preemptible jobs that checkpoint are moved, worst-spread first; each move
// is accepted only if the cluster's cost strictly drops.
func Rebalance(s *Snapshot, maxMoves int) RebalancePlan {
	st := newState(s)
	jobs := make(map[string]*Placement, len(s.Running))
	var movable []*RunningJob
	for i := range s.Running {
		j := &s.Running[i]
		pl := j.Placement
		jobs[j.Request.ID] = &pl
		if j.Request.Preemptible && j.Request.Checkpoint && !j.Stopping {
			movable = append(movable, j)
		}
	}
	worst := func(j *RunningJob) int {
		sw, rk := spread(st, &j.Placement)
		return 100*sw + 10*rk + len(j.Placement.Nodes())
	}
	slices.SortFunc(movable, func(a, b *RunningJob) int {
		if c := cmp.Compare(worst(b), worst(a)); c != 0 {
			return c
		}
		return cmp.Compare(a.Request.ID, b.Request.ID)
	})
	plan := RebalancePlan{Before: packing(st, jobs)}
	cur := plan.Before
	for improved := true; improved && len(plan.Moves) < maxMoves; {
		improved = false
		for _, j := range movable {
			if len(plan.Moves) >= maxMoves {
				break
			}
			id := j.Request.ID
			from := jobs[id]
			req := j.Request
			req.Shape, req.GPUs, req.ElasticDP = from.Shape, 0, nil
			st.release(from)
			to, err := st.place(&req, placeOpts{})
			if err != nil {
				st.take(from)
				continue
			}
			st.take(&to)
			jobs[id] = &to
			next := packing(st, jobs)
			if next.Cost() < cur.Cost() {
				plan.Moves = append(plan.Moves, Move{Job: id, From: *from, To: to, Before: cur, After: next})
				cur = next
				improved = true
				continue
			}
			st.release(&to)
			st.take(from)
			jobs[id] = from
		}
	}
	plan.After = cur
	return plan
}
