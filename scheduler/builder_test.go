package scheduler

import (
	"fmt"
	"testing"
)

// clusterBuilder builds real in-memory snapshots for tests.
type clusterBuilder struct {
	t *testing.T
	s Snapshot
}

// newCluster makes switches × racks × nodes nodes of gpus H100s each, named
// s<switch>r<rack>n<node>.
func newCluster(t *testing.T, switches, racksPerSwitch, nodesPerRack, gpus int) *clusterBuilder {
	t.Helper()
	b := &clusterBuilder{t: t}
	for sw := 0; sw < switches; sw++ {
		for r := 0; r < racksPerSwitch; r++ {
			for n := 0; n < nodesPerRack; n++ {
				node := Node{
					Name:     fmt.Sprintf("s%dr%dn%02d", sw, r, n),
					Labels:   map[string]string{LabelSwitch: fmt.Sprintf("sw%d", sw), LabelRack: fmt.Sprintf("sw%d-rack%d", sw, r)},
					GPUModel: "H100",
				}
				for g := 0; g < gpus; g++ {
					node.GPUs = append(node.GPUs, GPU{Index: g, Healthy: true})
				}
				b.s.Nodes = append(b.s.Nodes, node)
			}
		}
	}
	return b
}

func (b *clusterBuilder) node(name string) *Node {
	b.t.Helper()
	for i := range b.s.Nodes {
		if b.s.Nodes[i].Name == name {
			return &b.s.Nodes[i]
		}
	}
	b.t.Fatalf("no node %s", name)
	return nil
}

func (b *clusterBuilder) state(name string, st NodeState) *clusterBuilder {
	b.node(name).State = st
	return b
}

func (b *clusterBuilder) model(name, m string) *clusterBuilder {
	b.node(name).GPUModel = m
	return b
}

func (b *clusterBuilder) label(name, k, v string) *clusterBuilder {
	b.node(name).Labels[k] = v
	return b
}

func (b *clusterBuilder) unhealthy(name string, gpus ...int) *clusterBuilder {
	n := b.node(name)
	for _, g := range gpus {
		n.GPUs[g].Healthy = false
	}
	return b
}

// run records a running job holding the given GPUs of one node.
func (b *clusterBuilder) run(job, node string, gpus []int, mod func(*RunningJob)) *clusterBuilder {
	n := b.node(node)
	rj := RunningJob{Request: JobRequest{ID: job, GPUs: len(gpus)}, Placement: Placement{Job: job, Shape: Shape{1, 1, len(gpus)}}}
	for _, g := range gpus {
		n.GPUs[g].Job = job
		rj.Placement.Ranks = append(rj.Placement.Ranks, Slot{Node: node, GPU: g})
	}
	if mod != nil {
		mod(&rj)
	}
	b.s.Running = append(b.s.Running, rj)
	return b
}

func (b *clusterBuilder) pending(reqs ...JobRequest) *clusterBuilder {
	b.s.Pending = append(b.s.Pending, reqs...)
	return b
}

func (b *clusterBuilder) now(t int64) *clusterBuilder {
	b.s.Now = t
	return b
}

func (b *clusterBuilder) snap() *Snapshot { return &b.s }

func gpuRange(lo, hi int) []int {
	var out []int
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// checkInvariants asserts what every placement must hold.
func checkInvariants(t *testing.T, s *Snapshot, req *JobRequest, p Placement) {
	t.Helper()
	nodes := map[string]*Node{}
	for i := range s.Nodes {
		nodes[s.Nodes[i].Name] = &s.Nodes[i]
	}
	sh := p.Shape
	if len(p.Ranks) != sh.Size() {
		t.Fatalf("placement has %d ranks for shape %s", len(p.Ranks), sh)
	}
	if sh.TP != req.shape().TP || sh.PP != req.shape().PP {
		t.Fatalf("shape %s changed tp/pp of %s", sh, req.shape())
	}
	if sh.DP != req.shape().DP {
		ok := false
		for _, d := range req.ElasticDP {
			ok = ok || d == sh.DP
		}
		if !ok {
			t.Fatalf("dp %d is neither requested nor elastic", sh.DP)
		}
	}
	seen := map[Slot]bool{}
	models := map[string]bool{}
	perNode := map[string]int{}
	for r, sl := range p.Ranks {
		if seen[sl] {
			t.Fatalf("GPU %v given twice", sl)
		}
		seen[sl] = true
		n := nodes[sl.Node]
		if n == nil {
			t.Fatalf("rank %d on unknown node %s", r, sl.Node)
		}
		if n.State != NodeReady {
			t.Fatalf("rank %d on %s node %s", r, n.State, n.Name)
		}
		var g *GPU
		for i := range n.GPUs {
			if n.GPUs[i].Index == sl.GPU {
				g = &n.GPUs[i]
			}
		}
		if g == nil || !g.Healthy || g.Job != "" {
			t.Fatalf("rank %d on unusable GPU %v (%+v)", r, sl, g)
		}
		if req.GPUModel != "" && n.GPUModel != req.GPUModel {
			t.Fatalf("rank %d on model %s, want %s", r, n.GPUModel, req.GPUModel)
		}
		models[n.GPUModel] = true
		perNode[sl.Node]++
		// Tensor-parallel groups are runs of TP consecutive ranks.
		if r%sh.TP != 0 && p.Ranks[r-1].Node != sl.Node {
			t.Fatalf("tp group of rank %d crosses nodes %s and %s", r, p.Ranks[r-1].Node, sl.Node)
		}
	}
	if len(models) > 1 && !req.AllowMixed {
		t.Fatalf("mixed models %v", models)
	}
	if req.GPUsPerNode > 0 {
		for n, c := range perNode {
			if c != req.GPUsPerNode {
				t.Fatalf("node %s has %d GPUs, want exactly %d", n, c, req.GPUsPerNode)
			}
		}
	}
}
