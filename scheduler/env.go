package scheduler

import (
	"strconv"
	"strings"
)

// RankEnv is one rank's launch environment on its node.
type RankEnv struct {
	Rank, LocalRank int
	GPU             int
	// Env holds RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
	// MASTER_ADDR, MASTER_PORT and CUDA_VISIBLE_DEVICES.
	Env map[string]string
}

// NodeLaunch is what one node runs for a placement.
type NodeLaunch struct {
	Node     string
	NodeRank int
	// CUDAVisibleDevices lists the node's GPUs in local-rank order, so
	// LOCAL_RANK i uses device i of the visible set.
	CUDAVisibleDevices string
	Ranks              []RankEnv
}

// LaunchEnv derives per-node launch environments from a placement, in the
// torchrun convention: MASTER_ADDR is rank 0's node, local ranks number a
// node's ranks in rank order. addr maps a node name to the address ranks
// dial; nil uses the name itself.
func LaunchEnv(p *Placement, port int, addr func(node string) string) []NodeLaunch {
	if len(p.Ranks) == 0 {
		return nil
	}
	if addr == nil {
		addr = func(n string) string { return n }
	}
	master := addr(p.Ranks[0].Node)
	nodes := p.Nodes()
	pos := make(map[string]int, len(nodes))
	out := make([]NodeLaunch, len(nodes))
	for i, n := range nodes {
		pos[n] = i
		out[i] = NodeLaunch{Node: n, NodeRank: i}
	}
	for r, s := range p.Ranks {
		nl := &out[pos[s.Node]]
		nl.Ranks = append(nl.Ranks, RankEnv{Rank: r, LocalRank: len(nl.Ranks), GPU: s.GPU})
	}
	world := strconv.Itoa(len(p.Ranks))
	for i := range out {
		nl := &out[i]
		devs := make([]string, len(nl.Ranks))
		for j, re := range nl.Ranks {
			devs[j] = strconv.Itoa(re.GPU)
		}
		nl.CUDAVisibleDevices = strings.Join(devs, ",")
		for j := range nl.Ranks {
			re := &nl.Ranks[j]
			re.Env = map[string]string{
				"RANK":                 strconv.Itoa(re.Rank),
				"LOCAL_RANK":           strconv.Itoa(re.LocalRank),
				"WORLD_SIZE":           world,
				"LOCAL_WORLD_SIZE":     strconv.Itoa(len(nl.Ranks)),
				"NODE_RANK":            strconv.Itoa(nl.NodeRank),
				"MASTER_ADDR":          master,
				"MASTER_PORT":          strconv.Itoa(port),
				"CUDA_VISIBLE_DEVICES": nl.CUDAVisibleDevices,
			}
		}
	}
	return out
}
