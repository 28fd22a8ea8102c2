package jobs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	predictor "github.com/gpuctl/gpuctl/scheduler/predict"
)

// placer runs the scheduler for the owner: it builds the scheduler's view
// of the nodes and jobs, applies the scheduler's decisions (start,
// preempt, move, resize an elastic job), and explains why each queued job
// waits. The jobs and the current step are the owner's, reached through
// m. It runs on the owner's goroutine only.
type placer struct{ m *Manager }

// reconcile is one scheduling pass: nodes lost for good, stops, recoveries,
// moves, the scheduler's decisions, and every running job's progress.
func (m *Manager) reconcile() {
	now := m.now()
	nodes := m.cfg.Nodes.Nodes()
	m.rec.lostNodes(nodes, now)
	m.stops.drive(nodes, now)
	m.rec.advance(now)
	m.placer.growBack(now)
	m.stops.beginMoves(now)
	m.placer.schedule(now)
	m.prog.update(nodes, now)
}

// unmanaged is the job the scheduler sees on a GPU that runs processes
// gpuctl did not launch.
const unmanaged = "(unmanaged)"

// schedNodeState maps a node's status at now to the scheduler's view: only
// a ready node takes work, a cordon outranks liveness for the reason, and a
// suspect node is held back as a cordoned one is (recoveryBase offers
// it to recoveries).
func schedNodeState(n *api.NodeStatus, now time.Time) scheduler.NodeState {
	switch {
	case n.GetDraining():
		return scheduler.NodeDraining
	case n.GetCordoned(), heldAsSuspect(n, now):
		return scheduler.NodeCordoned
	case nodeIsUp(n):
		return scheduler.NodeReady
	}
	return scheduler.NodeDown
}

func nodeIsUp(n *api.NodeStatus) bool {
	return n.GetState() == api.NodeState_NODE_STATE_READY && n.GetConnected()
}

// heldAsSuspect reports whether n is up and kept from queued work only by
// a suspicion: the nodes a recovery may take all the same.
func heldAsSuspect(n *api.NodeStatus, now time.Time) bool {
	return !n.GetDraining() && !n.GetCordoned() && nodes.Suspected(n.GetSuspectUntilUnixNano(), now) && nodeIsUp(n)
}

// recoveryBase is the scheduler's view for a recovery: suspect nodes
// (lost by a recovery, back since) are offered as ready. A recovery that
// takes one validates it first where validation gangs run, and one that
// passes is back in service (vouch); a node lost too often is cordoned,
// never suspect.
func (pc *placer) recoveryBase(now time.Time) scheduler.Snapshot {
	all := pc.m.cfg.Nodes.Nodes()
	suspect := map[string]bool{}
	for _, n := range all {
		if heldAsSuspect(n, now) {
			suspect[n.GetRegistration().GetName()] = true
		}
	}
	snap := pc.snapshotOf(all, now)
	for i := range snap.Nodes {
		if suspect[snap.Nodes[i].Name] {
			snap.Nodes[i].State = scheduler.NodeReady
		}
	}
	return snap
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

// snapshot builds the scheduler's view: every known node with its state,
// labels and healthy GPUs; a GPU belongs to a job while a rank of it lives
// there (whatever the job's state) or a move or recovery is about to land
// there; running jobs and the queue.
func (pc *placer) snapshot(now time.Time) scheduler.Snapshot {
	return pc.snapshotOf(pc.m.cfg.Nodes.Nodes(), now)
}

func (pc *placer) snapshotOf(nodes []*api.NodeStatus, now time.Time) scheduler.Snapshot {
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
	entries := pc.m.sorted()
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
	for _, j := range pc.m.exec.externals {
		if j.GetState() != api.JobState_JOB_STATE_RUNNING {
			continue // ended: squeue --states=all lists it a while longer
		}
		// Slurm gave these GPUs to a job gpuctl did not submit.
		for _, jn := range j.GetPlacement() {
			for _, g := range jn.GetGpus() {
				if alloc[jn.GetNode()][g] == "" {
					hold(jn.GetNode(), g, j.GetId())
				}
			}
		}
	}
	for _, v := range pc.m.gangs.byID {
		for node, gpu := range v.gpus {
			if ours[node] == nil {
				ours[node] = map[uint32]bool{}
			}
			if r := v.ranks[node]; r != nil && r.pid != 0 {
				ours[node][r.pid] = true
			}
			if alloc[node][gpu] == "" {
				hold(node, gpu, v.job)
			}
		}
	}
	snap := scheduler.Snapshot{Now: now.Unix()}
	for _, n := range nodes {
		name := n.GetRegistration().GetName()
		node := scheduler.Node{Name: name, State: schedNodeState(n, now), Labels: n.GetRegistration().GetLabels()}
		for _, g := range n.GetGpus() {
			if node.GPUModel == "" {
				node.GPUModel = gpuProfile(g.GetInfo().GetModel())
			}
			idx := g.GetInfo().GetIndex()
			job := alloc[name][idx]
			if job == "" && !n.GetStale() {
				// A process gpuctl did not start (a job launched around it)
				// makes the GPU busy all the same. A stale sample's processes
				// (a node just back) may long be gone: its next sample says.
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
	grace := int64(pc.m.stops.preemptGrace() / time.Second)
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
			rj := scheduler.RunningJob{Request: pc.request(en), Placement: placementOf(j.GetPlacement(), shapeOf(j)),
				Start: j.GetStartUnixNano() / 1e9, Stopping: !active(j)}
			if rj.Stopping {
				rj.StopBy = j.GetStopSinceUnixNano()/1e9 + grace
			}
			snap.Running = append(snap.Running, rj)
		case api.JobState_JOB_STATE_PENDING:
			if !j.GetHold() && !now.Before(en.retryAt) {
				snap.Pending = append(snap.Pending, pc.request(en))
			}
		}
	}
	return snap
}

// request is the job as the scheduler sees it. A job that checkpoints
// (its file names a checkpoint dir) can be stopped and resumed, so it is
// preemptible and movable; others are never stopped by the scheduler.
func (pc *placer) request(en *entry) scheduler.JobRequest {
	j, s := en.job, en.spec
	ckpt := s.Checkpoint.Dir != ""
	r := scheduler.JobRequest{
		ID: j.GetId(), Tenant: s.Tenant, Priority: s.Priority, Submit: j.GetSubmitUnixNano() / 1e9,
		Shape: shapeOf(j), AllowMixed: s.AllowMixed, Estimate: remaining(j, s),
		Attained: j.GetAttainedGpuSeconds(), Preemptible: ckpt, Checkpoint: ckpt,
		Exclude: slices.Clone(j.GetExclude()),
	}
	if s.GPUModel != "" {
		if hw, err := costmodel.LookupHardware(s.GPUModel); err == nil {
			r.GPUModel = hw.Name
		}
	}
	if ts := j.GetTypePlans(); len(ts) > 1 {
		// Each model has its own plan: the scheduler picks the model, and
		// the job restarts elsewhere only if its checkpoint reshards.
		r.Shape, r.Types = scheduler.Shape{}, typeOptions(ts)
		r.StartedOn, r.Reshardable = j.GetGpuType(), s.Checkpoint.Reshardable
	}
	if per := s.GPUsPerNode; per > 0 && s.TotalGPUs()%per == 0 && s.TotalGPUs() >= per {
		r.GPUsPerNode = per
	}
	if s.Elastic != nil {
		r.ElasticDP = slices.Clone(s.Elastic.DataParallel)
	}
	if d := s.Deadline(time.Unix(0, j.GetSubmitUnixNano())); !d.IsZero() {
		r.Until = max(d.Unix(), 1)
	}
	return r
}

// estimate is the runtime the scheduler should expect of a job on its
// submission: its file's own, else the runtime model's, else none.
func (pc *placer) estimate(j *api.Job, s *jobspec.Spec) (int64, string) {
	if s.EstimatedRuntime > 0 {
		return int64(s.EstimatedRuntime / time.Second), "job file"
	}
	if pc.m.cfg.Runtimes == nil {
		return 0, ""
	}
	p := pc.m.cfg.Runtimes.Predict(predictor.Features{Tenant: s.Tenant, User: s.User, Name: s.Name, GPUs: s.TotalGPUs(),
		Hour: time.Unix(0, j.GetSubmitUnixNano()).UTC().Hour()})
	if p.Seconds <= 0 {
		return 0, ""
	}
	return p.Seconds, fmt.Sprintf("learned: %s, %d jobs", p.Basis, p.Support)
}

// remaining is what is left of a job's expected runtime once it has run
// its useful time (a job past it is expected to run half as long again).
// A job stored before it had an estimate of its own has its file's.
func remaining(j *api.Job, s *jobspec.Spec) int64 {
	est := j.GetEstimateSeconds()
	if est <= 0 {
		est = int64(s.EstimatedRuntime / time.Second)
	}
	if est <= 0 {
		return 0
	}
	return predictor.Remaining(est, int64(j.GetUsefulSeconds()))
}

// shapeOf is the job's shape for placement. Context-parallel groups sit
// between tensor and data parallelism in rank order, so they are placed
// as data-parallel replicas: cp × dp of them.
func shapeOf(j *api.Job) scheduler.Shape {
	p := j.GetPlan()
	return scheduler.Shape{TP: int(p.GetTp()), PP: int(p.GetPp()), DP: int(p.GetDp() * max(p.GetCp(), 1))}
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

func liveRanks(j *api.Job) int {
	n := 0
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				n++
			}
		}
	}
	return n
}

func jobGPUs(j *api.Job) int {
	n := 0
	for _, jn := range j.GetPlacement() {
		n += len(jn.GetRanks())
	}
	return n
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

// findRank returns the current attempt's rank on node, or nil.
func findRank(j *api.Job, node string, rank int32) *api.JobRank {
	for _, jn := range j.GetPlacement() {
		if jn.GetNode() != node {
			continue
		}
		for _, r := range jn.GetRanks() {
			if r.GetRank() == rank {
				return r
			}
		}
	}
	return nil
}

// ------------------------------------------------------------ scheduling

// schedule runs the scheduler over the live snapshot and applies its
// decisions, then explains why each job still pending waits.
func (pc *placer) schedule(now time.Time) {
	snap := pc.snapshot(now)
	// A job that cannot fit even the idle cluster would block the queue
	// head forever; it waits aside, with why, until the cluster grows. A
	// deferrable job held for cleaner power waits aside too.
	aside := map[string]string{}
	queue := snap.Pending[:0:0]
	for _, r := range snap.Pending {
		if why, ok := scheduler.NeverFits(&snap, &r); ok {
			aside[r.ID] = why + ", so it waits for nodes to join"
			continue
		}
		queue = append(queue, r)
	}
	snap.Pending = queue
	var (
		started = map[string]bool{}
		reserve *scheduler.Reserve
		preempt []string
	)
	for _, d := range scheduler.Schedule(&snap, pc.m.cfg.Policy) {
		en := pc.m.jobs[d.JobID()]
		if en == nil {
			continue
		}
		switch d := d.(type) {
		case scheduler.Start:
			undo := useType(en.job, d.Placement.Model, d.TypeReason)
			if pc.start(en, d.Placement, now, "") {
				started[d.Job] = true
			} else {
				undo()
			}
		case scheduler.Preempt:
			if pc.m.stops.preempt(en, d, now) {
				preempt = append(preempt, d.Job)
			}
		case scheduler.Reserve:
			reserve = &d
		case scheduler.Hold:
			aside[d.Job] = d.Reason + " from " + time.Unix(d.At, 0).UTC().Format(time.RFC3339)
		case scheduler.Reject:
			pc.m.rec.giveUp(en, "rejected by the scheduler: "+d.Err.Error(), now)
		}
	}
	pc.explain(now, started, aside, reserve, preempt)
}

// start records a new attempt on pl and queues its launch; it reports
// whether the attempt was recorded. why, when set, replaces the default
// reason.
func (pc *placer) start(en *entry, pl scheduler.Placement, now time.Time, why string) bool {
	if en.spec == nil || len(pl.Ranks) == 0 {
		return false
	}
	j := en.job
	from := phaseOf(j)
	if err := may(j, EvStart); err != nil {
		pc.m.log.Error("start refused", "err", err)
		return false
	}
	if wait := pc.m.fence.unfenced(en, now); len(wait) > 0 {
		// A rank never runs twice: the next attempt waits for the old one.
		pc.m.log.Info("start waits for the old attempt to be fenced", "job", j.GetId(), "nodes", wait)
		return false
	}
	j.Attempt++
	if pl.Shape.DP > 0 {
		pc.resize(en, pl.Shape.DP)
	}
	j.Placement = jobNodes(&pl)
	j.Witnesses, _ = pc.m.fence.witnessPool(pl.Nodes())
	j.MasterAddr = pc.m.launcher.addrOf(pl.Ranks[0].Node)
	j.MasterPort = pc.m.launcher.port(j.GetId(), j.GetAttempt())
	j.ResumeStep = 0
	switch {
	case en.resumeSet:
		j.ResumeStep = en.resume
		en.resume, en.resumeSet = 0, false
		rewind(j, j.GetResumeStep())
	case j.GetAttempt() > 1:
		j.ResumeStep = j.GetLastCheckpointStep()
	}
	j.State = api.JobState_JOB_STATE_RUNNING
	j.StartUnixNano = now.UnixNano()
	if j.GetFirstStartUnixNano() == 0 {
		j.FirstStartUnixNano = now.UnixNano()
	}
	j.Stalled = false
	j.PendingReason, j.Hold = "", false
	j.Stopping, j.TermSentUnixNano, j.StopSinceUnixNano, j.MoveTarget = api.JobStop_JOB_STOP_NONE, 0, 0, nil
	j.Reason = fmt.Sprintf("attempt %d started on %s", j.GetAttempt(), strings.Join(pl.Nodes(), ","))
	if j.GetResumeStep() > 0 {
		j.Reason += fmt.Sprintf(", resuming from step %d", j.GetResumeStep())
	}
	if why != "" {
		j.Reason = why
	}
	j.Attempts = append(j.Attempts, &api.JobAttempt{Attempt: j.GetAttempt(), StartUnixNano: now.UnixNano(), Nodes: pl.Nodes(),
		Gpus: int32(len(pl.Ranks)), Dp: j.GetPlan().GetDp(), ResumeStep: j.GetResumeStep(), LastStep: j.GetResumeStep()})
	pc.m.check(from, EvStart, j)
	pc.m.save(en)
	pc.m.launcher.launch(en)
	return true
}

// explain sets every waiting job's pending reason.
func (pc *placer) explain(now time.Time, started map[string]bool, aside map[string]string, reserve *scheduler.Reserve, preempting []string) {
	var snap scheduler.Snapshot
	built := false
	explained := 0
	for _, en := range pc.m.sorted() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_PENDING || started[j.GetId()] || en.spec == nil {
			continue
		}
		var why string
		switch {
		case j.GetHold():
			why = fmt.Sprintf("held: place it with `gpuctl assign %s --nodes …` or let the scheduler with `gpuctl release %s`", j.GetId(), j.GetId())
		case aside[j.GetId()] != "":
			why = aside[j.GetId()]
		case now.Before(en.retryAt):
			why = fmt.Sprintf("tried again at %s: %s", en.retryAt.UTC().Format(time.TimeOnly), en.retryWhy)
		case explained >= pc.m.cfg.MaxExplained:
			why = "queued"
		default:
			explained++
			if !built {
				snap, built = pc.snapshot(now), true
			}
			why = pc.waitReason(&snap, en, reserve, preempting)
		}
		if why != j.GetPendingReason() {
			j.PendingReason = why
			pc.m.save(en)
		}
	}
}

// waitReason says why a queued job is not running: the placer's reasons
// when it does not fit, else which job it waits behind.
func (pc *placer) waitReason(snap *scheduler.Snapshot, en *entry, reserve *scheduler.Reserve, preempting []string) string {
	r := pc.request(en)
	_, err := scheduler.Place(snap, &r)
	mine := reserve != nil && reserve.Job == r.ID
	var pe *scheduler.PlacementError
	switch {
	case err == nil && mine && len(preempting) > 0:
		return "starts once preempted " + strings.Join(preempting, ", ") + " stop"
	case err == nil && reserve != nil && !mine:
		return fmt.Sprintf("fits now, but waits behind %s, first in the %s order", reserve.Job, pc.m.cfg.Policy.Name())
	case err == nil:
		return "fits now; starting on the next scheduling pass"
	case errors.As(err, &pe):
		why := pe.Explain(&r)
		if mine && len(preempting) > 0 {
			why += "; preempting " + strings.Join(preempting, ", ")
		} else if mine && reserve.Known {
			why += fmt.Sprintf("; next in line, expected to start in %s", time.Duration(max(reserve.At-snap.Now, 0))*time.Second)
		}
		return why
	}
	return err.Error()
}

func mapKeys[V any](mp map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range mp {
			if !yield(k) {
				return
			}
		}
	}
}
