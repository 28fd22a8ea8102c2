package jobs

import (
	"errors"
	"slices"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// gangs keeps the validation gangs in flight for the owner: the short
// all-reduce a recovery runs on nodes new to its job before it lands
// there. It launches each, applies its ranks' starts and exits, and ends
// it; the recoverer judges the outcome. The current step is the owner's,
// reached through m. It runs on the owner's goroutine only.
type gangs struct {
	m    *Manager
	byID map[string]*validation
}

// validation is one validation gang: one rank per node of the new set.
type validation struct {
	id, job string
	nodes   []string
	gpus    map[string]uint32
	port    uint32
	started time.Time
	ranks   map[string]*valRank
}

type valRank struct {
	pid    uint32
	exited bool
	code   int32
	signal string
	err    string
	// refused: the node refused the gang by its own policy, so it is
	// excluded for the job, not cordoned.
	refused bool
}

// add keeps v until it is forgotten.
func (g *gangs) add(v *validation) {
	remember(g.m.pass, g.byID, v.id)
	g.byID[v.id] = v
}

// forget drops gang id; what may be left of it is not signalled.
func (g *gangs) forget(id string) {
	remember(g.m.pass, g.byID, id)
	delete(g.byID, id)
}

// launch queues v's launch on its nodes, its ranks run as user:group; a
// node that refuses comes back as msgValidationLaunched.
func (g *gangs) launch(v *validation, user, group string) {
	launches := map[string]*api.LaunchRanks{}
	for i, node := range v.nodes {
		launches[node] = &api.LaunchRanks{Job: v.id, Attempt: 1, Command: g.m.cfg.ValidateCommand, WorldSize: int32(len(v.nodes)),
			MasterAddr: g.m.launcher.addrOf(v.nodes[0]), MasterPort: v.port, NodeRank: int32(i), NumNodes: int32(len(v.nodes)),
			RunAsUser: user, RunAsGroup: group,
			Ranks: []*api.RankSpec{{Rank: int32(i), LocalRank: 0, Gpus: []uint32{v.gpus[node]}}}}
	}
	gang, nodes := v.id, slices.Clone(v.nodes)
	timeout, post := g.m.cfg.CommandTimeout, g.m.in.post
	g.m.act(func(d *dispatcher) {
		d.fanOut(nodes, func(node string) *api.Command {
			return &api.Command{Body: &api.Command_Launch{Launch: launches[node]}}
		}, timeout, func(errs map[string]error) {
			if len(errs) > 0 {
				post(msgValidationLaunched{gang: gang, errs: errs})
			}
		})
	})
}

// launched applies the nodes' refusals of a gang's launch.
func (g *gangs) launched(msg msgValidationLaunched) {
	v := g.byID[msg.gang]
	if v == nil {
		return
	}
	for node, err := range msg.errs {
		if r := v.ranks[node]; r != nil {
			var ce *nodes.CommandError
			r.exited, r.code, r.err = true, -1, err.Error()
			r.refused = errors.As(err, &ce) && ce.NodeRefused
		}
	}
	g.m.kick()
}

// end forgets gang id and kills what may be left of it.
func (g *gangs) end(id string) {
	v := g.byID[id]
	if v == nil {
		return
	}
	g.forget(v.id)
	var live []string
	for _, n := range v.nodes {
		if r := v.ranks[n]; r != nil && !r.exited {
			live = append(live, n)
		}
	}
	g.m.launcher.signalNodes(v.id, live, "SIGKILL")
}

// event applies a rank start or exit of a validation gang; it
// reports whether e belonged to one.
func (g *gangs) event(e *api.Event) bool {
	v := g.byID[e.GetJob()]
	if v == nil {
		return false
	}
	r := v.ranks[e.GetNode()]
	if r == nil {
		return true
	}
	switch e.GetKind() {
	case api.EventKind_EVENT_KIND_JOB:
		if r.pid == 0 {
			r.pid = e.GetPid()
		}
	case api.EventKind_EVENT_KIND_PROCESS_EXIT:
		if r.pid == 0 || r.pid == e.GetPid() {
			r.exited, r.code, r.signal = true, e.GetExitCode(), e.GetSignal()
			g.m.kick()
		}
	}
	return true
}
