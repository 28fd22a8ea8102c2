package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/transport"
)

// Operator actions on nodes (cordon, uncordon, drain) and the log relay.

// Cordon stops new placements on node, saying why; what runs there keeps
// running. Recovery cordons a node it gives up on this way.
func (s *Server) Cordon(node, reason string) error {
	_, err := s.st.setCordon(node, api.NodeState_NODE_STATE_CORDONED, reason, s.now())
	return err
}

// cordon answers gpuctl cordon, uncordon and drain. The node's new state
// is persisted before the answer; a drain also queues moves of the jobs
// running there.
func (s *Server) cordon(req *api.CordonRequest) (*api.CordonResponse, error) {
	var to api.NodeState
	switch req.GetAction() {
	case "cordon":
		to = api.NodeState_NODE_STATE_CORDONED
	case "uncordon":
		to = api.NodeState_NODE_STATE_READY
	case "drain":
		to = api.NodeState_NODE_STATE_DRAINING
	default:
		return nil, fmt.Errorf("unknown node action %q: use cordon, uncordon or drain", req.GetAction())
	}
	if req.GetNode() == "" {
		return nil, errors.New("no node named: `gpuctl nodes` lists them")
	}
	n, err := s.st.setCordon(req.GetNode(), to, req.GetReason(), s.now())
	if err != nil {
		return nil, err
	}
	resp := &api.CordonResponse{Node: n}
	switch to {
	case api.NodeState_NODE_STATE_DRAINING:
		resp.Jobs = s.jobs.drain(req.GetNode())
	case api.NodeState_NODE_STATE_READY:
		// Pending jobs may fit now.
		s.jobs.poke()
	}
	return resp, nil
}

// setCordon moves node to cordoned, draining or (uncordon) ready, persists
// it, raises an event and returns the node's new status. Uncordoning a
// node that is lost leaves it down until it reconnects.
func (s *state) setCordon(node string, to api.NodeState, reason string, now time.Time) (*api.NodeStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[node]
	if !ok {
		return nil, fmt.Errorf("unknown node %q: `gpuctl nodes` lists the known ones", node)
	}
	from := e.status.GetState()
	st := proto.Clone(e.status).(*api.NodeStatus)
	var msg string
	switch to {
	case api.NodeState_NODE_STATE_READY:
		if !cordonedState(from) {
			return st, nil
		}
		st.State, st.CordonReason = api.NodeState_NODE_STATE_READY, ""
		if e.down {
			st.State = api.NodeState_NODE_STATE_DOWN
		}
		msg = "uncordoned: takes new work"
		if e.down {
			msg += " once it reconnects"
		}
	default:
		if reason == "" && cordonedState(from) {
			reason = st.GetCordonReason()
		}
		if from == to && reason == st.GetCordonReason() {
			return st, nil
		}
		st.State, st.CordonReason = to, reason
		msg = "cordoned: takes no new work"
		if to == api.NodeState_NODE_STATE_DRAINING {
			msg = "draining: takes no new work; its jobs move elsewhere"
		}
		if reason != "" {
			msg += " (" + reason + ")"
		}
	}
	if err := s.store.PutNode(st); err != nil {
		return nil, fmt.Errorf("persist node %s: %w", node, err)
	}
	e.status = st
	s.log.Info("node cordon", "node", node, "from", from.Short(), "to", st.GetState().Short(), "reason", reason)
	s.raiseLocked(&api.Event{Node: node, TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_CORDON,
		Severity: api.Severity_SEVERITY_INFO, Message: msg})
	return proto.Clone(st).(*api.NodeStatus), nil
}

// drain queues a move off node for every running job there that can be
// moved (it checkpoints and fits elsewhere), and says for each job with
// live ranks on the node what becomes of it. The moves run one at a time
// like a rebalance: checkpoint, stop, relaunch resuming from it.
func (m *jobManager) drain(node string) []*api.DrainedJob {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.snapshotLocked(m.now())
	gpu := func(node string, idx int) *scheduler.GPU {
		for i := range snap.Nodes {
			if snap.Nodes[i].Name != node {
				continue
			}
			for k := range snap.Nodes[i].GPUs {
				if snap.Nodes[i].GPUs[k].Index == idx {
					return &snap.Nodes[i].GPUs[k]
				}
			}
		}
		return nil
	}
	// Queued moves hold no GPUs yet: reserve their targets, and those of
	// the moves planned here, so that no two land on the same GPUs.
	hold := func(job string, pl *scheduler.Placement) {
		for _, sl := range pl.Ranks {
			if g := gpu(sl.Node, sl.GPU); g != nil && g.Job == "" {
				g.Job = job
			}
		}
	}
	queued := map[string][]string{}
	for i := range m.moves {
		hold(m.moves[i].Job, &m.moves[i].To)
		queued[m.moves[i].Job] = m.moves[i].To.Nodes()
	}
	var others []string
	for _, n := range snap.Nodes {
		if n.Name != node {
			others = append(others, n.Name)
		}
	}
	var out []*api.DrainedJob
	for _, en := range m.sortedLocked() {
		j := en.job
		if !liveOn(j, node) {
			continue
		}
		d := &api.DrainedJob{Job: j.GetId()}
		out = append(out, d)
		switch {
		case j.GetStopping() == api.JobStop_JOB_STOP_MOVE:
			d.Moving = true
			for _, jn := range j.GetMoveTarget() {
				d.To = append(d.To, jn.GetNode())
			}
		case j.GetStopping() != api.JobStop_JOB_STOP_NONE || j.GetState() != api.JobState_JOB_STATE_RUNNING:
			d.Reason = "its ranks are being stopped (job " + stateName(j.GetState()) + ")"
		case queued[j.GetId()] != nil:
			d.Moving, d.To = true, queued[j.GetId()]
		case en.spec == nil || en.spec.Checkpoint.Dir == "":
			d.Reason = "it names no checkpoint dir, so a move would lose its progress: cancel it, or wait for it to end"
		case len(others) == 0:
			d.Reason = "no other node to move it to"
		default:
			r := m.request(en)
			pl, err := scheduler.Assign(&snap, &r, others)
			if err != nil {
				var pe *scheduler.PlacementError
				if errors.As(err, &pe) {
					d.Reason = "no room elsewhere: " + placementReason(pe, &r)
				} else {
					d.Reason = "cannot plan a move: " + err.Error()
				}
				continue
			}
			m.moves = append(m.moves, scheduler.Move{Job: j.GetId(), From: placementOf(j.GetPlacement(), shapeOf(j)), To: pl})
			hold(j.GetId(), &pl)
			d.Moving, d.To = true, pl.Nodes()
			m.log.Info("drain: moving job", "node", node, "job", j.GetId(), "to", d.To)
		}
	}
	m.poke()
	return out
}

// liveOn reports whether job j has a live rank on node.
func liveOn(j *api.Job, node string) bool {
	for _, jn := range j.GetPlacement() {
		if jn.GetNode() != node {
			continue
		}
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				return true
			}
		}
	}
	return false
}

// ---------------------------------------------------------------- logs

const (
	// logsPoll is how often a followed log is read again.
	logsPoll = 250 * time.Millisecond
	// logsChunk is the most one read asks a node for.
	logsChunk = 64 << 10
)

// rankNode returns the node that runs (or ran) rank of job's current
// attempt.
func rankNode(j *api.Job, rank int32) (string, error) {
	n := 0
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetRank() == rank {
				return jn.GetNode(), nil
			}
			n++
		}
	}
	if n == 0 {
		return "", fmt.Errorf("job %s is %s and placed nowhere: it has no logs until it starts", j.GetId(), stateName(j.GetState()))
	}
	return "", fmt.Errorf("job %s has no rank %d: its ranks are 0..%d", j.GetId(), rank, n-1)
}

// logs relays one rank's log from its node: everything from the start (or
// the last tail bytes), then, when following, what the rank writes next,
// until the client goes away or the job ends.
func (s *Server) logs(ctx context.Context, st *transport.Stream, req *api.LogsRequest) error {
	fail := func(format string, args ...any) error {
		return st.Send(&api.ClientResponse{Error: fmt.Sprintf(format, args...)})
	}
	j, err := s.jobs.lookup(req.GetJob())
	if err != nil {
		return fail("%v", err)
	}
	rank := req.GetRank()
	node, err := rankNode(j, rank)
	if err != nil {
		return fail("%v", err)
	}
	offset := int64(0)
	if req.GetTailBytes() > 0 {
		offset = -int64(req.GetTailBytes())
	}
	tick := time.NewTicker(logsPoll)
	defer tick.Stop()
	for {
		ended := terminal(j.GetState())
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ack, err := s.CommandAck(cctx, node, &api.Command{Body: &api.Command_ReadLogs{ReadLogs: &api.ReadLogs{
				Job: j.GetId(), Rank: rank, Offset: offset, MaxBytes: logsChunk}}})
			cancel()
			if err != nil {
				return fail("read the log of rank %d of %s on %s: %v", rank, j.GetId(), node, err)
			}
			if len(ack.GetData()) > 0 {
				if err := st.Send(&api.ClientResponse{Body: &api.ClientResponse_Logs{Logs: &api.LogsChunk{Data: ack.GetData(), Node: node}}}); err != nil {
					return err
				}
			}
			offset = ack.GetNextOffset()
			if len(ack.GetData()) < logsChunk {
				break
			}
		}
		if !req.GetFollow() || ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-st.Context().Done():
			return nil
		case <-tick.C:
		}
		if j, err = s.jobs.lookup(j.GetId()); err != nil {
			return nil
		}
		// A restart elsewhere writes a new log there.
		if n, err := rankNode(j, rank); err == nil && n != node {
			node, offset = n, 0
		}
	}
}
