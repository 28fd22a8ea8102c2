// Package scheduler decides where and when GPU training jobs run. It is a
// pure function of a cluster snapshot: it never reads a clock (time is the
// snapshot's Now), does no I/O and starts no goroutines, so every decision
// can be replayed from the snapshot that produced it.
//
// A placement runs the stages of the Kubernetes scheduling framework:
// Filter (feasibility checks that record why a node was rejected, as Nomad's
// checkers do), Score (per-node and per-gang terms that explain themselves),
// Reserve (concrete GPUs per rank). Bind is the control plane's: it applies
// the decisions Schedule returns and may reject them.
package scheduler

import (
	"fmt"
	"strings"
)

// Label keys the placer reads for topology. Nodes without them are treated
// as sitting alone on an unnamed rack and switch.
const (
	LabelRack   = "rack"
	LabelSwitch = "switch"
)

// NodeState is the administrative and health state of a node.
type NodeState int

// Node states. Only NodeReady nodes receive new work.
const (
	NodeReady NodeState = iota
	NodeCordoned
	NodeDraining
	NodeDown
)

var nodeStateNames = [...]string{"ready", "cordoned", "draining", "down"}

// String returns the state's lower-case name.
func (s NodeState) String() string {
	if s >= 0 && int(s) < len(nodeStateNames) {
		return nodeStateNames[s]
	}
	return fmt.Sprintf("NodeState(%d)", int(s))
}

// GPU is one accelerator of a node as the scheduler sees it.
type GPU struct {
	Index   int
	Healthy bool
	// Job is the id of the job the GPU is allocated to; empty when free.
	Job string
}

// Node is one host and its GPUs. All GPUs of a node share one model and one
// NVLink domain, which is why tensor-parallel groups never leave a node.
type Node struct {
	Name     string
	State    NodeState
	Labels   map[string]string
	GPUModel string
	GPUs     []GPU
}

// Rack returns the node's rack label.
func (n *Node) Rack() string { return n.Labels[LabelRack] }

// Switch returns the node's switch label.
func (n *Node) Switch() string { return n.Labels[LabelSwitch] }

// SparesPolicy holds nodes back as hot spares, for recovery to swap in when
// a node of a running job fails. Selector ("key=value") names spare nodes by
// label; otherwise Count idle ready nodes are held back, chosen from the end
// of the topology order so the choice is stable across snapshots.
type SparesPolicy struct {
	Count    int
	Selector string
}

// Shape is a job's parallel layout: TP tensor-parallel ranks inside one node,
// PP pipeline stages, DP data-parallel replicas. World size is TP·PP·DP.
//
// Ranks follow Megatron-LM's order: tp innermost, then dp, then pp, so
// rank = tp_rank + TP·(dp_rank + DP·pp_rank). A tensor-parallel group is a
// run of TP consecutive ranks, and one pipeline stage's data-parallel ring is
// a run of TP·DP consecutive ranks; the placer lays ranks out in topology
// order, so both stay as close together as the cluster allows.
type Shape struct {
	TP, PP, DP int
}

// Size is the number of GPUs of the shape.
func (s Shape) Size() int { return s.TP * s.PP * s.DP }

// String formats the shape as tp×pp×dp.
func (s Shape) String() string { return fmt.Sprintf("tp%d·pp%d·dp%d", s.TP, s.PP, s.DP) }

// Preference is a soft placement wish: nodes whose label Key equals Value
// score Weight more (e.g. power=low-carbon).
type Preference struct {
	Key, Value string
	Weight     float64
}

// JobRequest is what a job asks of the scheduler.
type JobRequest struct {
	ID       string
	Tenant   string
	Priority int
	// Submit is the virtual time (seconds) the job entered the queue.
	Submit int64
	// GPUs is the total asked for. With Shape unset it is placed as
	// TP=1, PP=1, DP=GPUs; with Shape set it must equal Shape.Size() or be 0.
	GPUs  int
	Shape Shape
	// GPUsPerNode, when set, asks for exactly GPUs/GPUsPerNode whole nodes
	// with GPUsPerNode GPUs on each (the "nodes × GPUs per node" form).
	GPUsPerNode int
	// GPUModel restricts the job to nodes of that model. With it empty the
	// job still never mixes models unless AllowMixed.
	GPUModel   string
	AllowMixed bool
	// Types, when set, lets the job run on any one of these models, each
	// with its own shape (the plan chosen for that model); GPUModel, Shape
	// and AllowMixed are then unset. Without a heterogeneity-aware policy
	// the job is placed as a job without a model is, on its models only;
	// with one (Allocator) it tries them in the order allocated.
	Types []TypeOption
	// StartedOn is the model an earlier attempt ran on. A job that cannot
	// reshard its checkpoint (Reshardable false) restarts on it only: its
	// checkpoint holds the shards of that model's plan.
	StartedOn   string
	Reshardable bool
	// ordered makes place take the first of Types that fits (the order
	// Schedule set from an Allocation) instead of the best-scoring one.
	ordered bool
	Prefer  []Preference
	// Estimate is the job's own runtime estimate in seconds; 0 when unknown.
	Estimate int64
	// Attained is the GPU-seconds of service the job received before this
	// request (earlier attempts); running time since Start is added on top.
	Attained    float64
	Preemptible bool
	// Checkpoint says the job checkpoints on request (SIGUSR1), so a
	// preemption asks for a checkpoint before stopping it.
	Checkpoint bool
	// ElasticDP lists the other data-parallel sizes the job accepts when its
	// full size does not fit; the placer tries them largest first.
	ElasticDP []int
	// UseSpares lets recovery place onto hot spare nodes.
	UseSpares bool
	// Exclude are nodes the job must avoid: it failed there, or the node
	// refused it by a policy of its own.
	Exclude []string
	// Until, when set, makes the job deferrable: it must finish by this
	// virtual time, and a carbon-aware policy may hold it for a cleaner
	// hour or site before then. 0 means run as soon as it fits.
	Until int64
}

// shape returns the request's effective shape (its first type's, for a
// job allowing several).
func (r *JobRequest) shape() Shape {
	if o := r.options(); len(o) > 0 {
		return o[0].Shape
	}
	if r.Shape.TP == 0 && r.Shape.PP == 0 && r.Shape.DP == 0 {
		return Shape{TP: 1, PP: 1, DP: r.GPUs}
	}
	return r.Shape
}

// Size returns the number of GPUs the request asks for at full size.
func (r *JobRequest) Size() int { return r.shape().Size() }

// Validate checks the request's shape and sizes and says what to fix.
func (r *JobRequest) Validate() error {
	if r.ID == "" {
		return fmt.Errorf("%w: job has no id", ErrInvalidRequest)
	}
	s := r.shape()
	if s.TP < 1 || s.PP < 1 || s.DP < 1 {
		return fmt.Errorf("%w: job %s: shape %s: tp, pp and dp must each be at least 1", ErrInvalidRequest, r.ID, s)
	}
	if r.GPUs != 0 && r.GPUs != s.Size() {
		return fmt.Errorf("%w: job %s: gpus %d does not match shape %s (%d GPUs); set one or make them agree",
			ErrInvalidRequest, r.ID, r.GPUs, s, s.Size())
	}
	if r.GPUsPerNode < 0 {
		return fmt.Errorf("%w: job %s: gpus per node %d is negative", ErrInvalidRequest, r.ID, r.GPUsPerNode)
	}
	if r.GPUsPerNode > 0 {
		if s.Size()%r.GPUsPerNode != 0 {
			return fmt.Errorf("%w: job %s: %d GPUs is not a whole number of nodes of %d GPUs",
				ErrInvalidRequest, r.ID, s.Size(), r.GPUsPerNode)
		}
		if r.GPUsPerNode%s.TP != 0 {
			return fmt.Errorf("%w: job %s: tp %d does not divide %d GPUs per node (tensor parallelism stays inside a node)",
				ErrInvalidRequest, r.ID, s.TP, r.GPUsPerNode)
		}
	}
	if err := r.validateTypes(); err != nil {
		return err
	}
	for _, dp := range r.ElasticDP {
		if dp < 1 {
			return fmt.Errorf("%w: job %s: elastic dp size %d must be at least 1", ErrInvalidRequest, r.ID, dp)
		}
	}
	if r.Estimate < 0 {
		return fmt.Errorf("%w: job %s: negative runtime estimate %d", ErrInvalidRequest, r.ID, r.Estimate)
	}
	return nil
}

// RunningJob is a job holding GPUs.
type RunningJob struct {
	Request   JobRequest
	Placement Placement
	// Start is the virtual time the current attempt started.
	Start int64
	// Stopping marks a job already asked to stop (preempted), so it is not
	// chosen again and its GPUs count as freed once its grace has passed.
	Stopping bool
	// StopBy is when a Stopping job's GPUs are expected back.
	StopBy int64
}

// GPUs returns the number of GPUs the job holds.
func (j *RunningJob) GPUs() int { return len(j.Placement.Ranks) }

// EstimatedEnd returns when the job should finish by its own estimate, and
// false when it has none.
func (j *RunningJob) EstimatedEnd() (int64, bool) {
	if j.Stopping {
		return j.StopBy, true
	}
	if j.Request.Estimate <= 0 {
		return 0, false
	}
	return j.Start + j.Request.Estimate, true
}

// AttainedAt returns the job's attained service (GPU-seconds) at time now.
func (j *RunningJob) AttainedAt(now int64) float64 {
	run := now - j.Start
	if run < 0 {
		run = 0
	}
	return j.Request.Attained + float64(run)*float64(j.GPUs())
}

// Tenant is a team sharing the cluster; Weight scales its fair share.
type Tenant struct {
	Name   string
	Weight float64
}

// Snapshot is everything the scheduler knows at one virtual instant.
type Snapshot struct {
	// Now is virtual time in seconds; the scheduler never reads a clock.
	Now     int64
	Nodes   []Node
	Spares  SparesPolicy
	Running []RunningJob
	Pending []JobRequest
	Tenants []Tenant
}

// tenantWeight returns the tenant's weight, 1 when unknown or unset.
func (s *Snapshot) tenantWeight(name string) float64 {
	for i := range s.Tenants {
		if s.Tenants[i].Name == name && s.Tenants[i].Weight > 0 {
			return s.Tenants[i].Weight
		}
	}
	return 1
}

// parseSelector splits "key=value"; a bare key matches any value.
func parseSelector(sel string) (key, value string, anyValue bool) {
	k, v, ok := strings.Cut(sel, "=")
	return k, v, !ok
}
