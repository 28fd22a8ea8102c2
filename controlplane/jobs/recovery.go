package jobs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/transport"
)

// Recovery carries out scheduler.Recover's decisions. A failed job goes
// RECOVERING: its surviving ranks are stopped (SIGTERM, SIGKILL after the
// recovery grace), its failed nodes cordoned (a lost node is suspect
// instead: nodes.SuspectPolicy), and only once every old rank is seen to
// exit or its node is down does the scheduler choose where the next
// attempt runs. Nodes new to the job are first checked with a short
// all-reduce (the validation gang); a node that fails it is cordoned and
// another chosen, and a suspect node that passes it is back in service. The next attempt then resumes from the latest complete
// checkpoint. Each step is an EVENT_KIND_RECOVERY event.

// lostRank marks a rank given up with its node: not seen to exit, so its
// pid may still show on the node's GPUs when the node returns.
const lostRank = "node down"

// recovery is the in-memory progress of one job's recovery; what must
// survive a restart (state, exclusions, counters) is on the job itself.
type recovery struct {
	failure scheduler.Failure
	reason  string
	since   time.Time
	// stepAt is the step the job had reached when it failed.
	stepAt int64
	// resume is the operator's --from-checkpoint step, -1 for the latest.
	resume int64
	// cordon lists failed nodes still to cordon, with why; suspect, lost
	// nodes still to mark suspect.
	cordon, suspect map[string]string
	// stoppedAt is when the last old rank was seen gone.
	stoppedAt time.Time
	decision  *scheduler.Recovery
	// fenceNoted: the wait for a lost node's fence has been announced.
	fenceNoted bool
	// awaitNoted: the wait for restarting nodes has been announced.
	awaitNoted bool
	// validation is the gang checking the decision's new nodes.
	validation string
	rounds     int
}

// recoverer carries out recoveries for the owner and keeps the ones in
// progress; their validation gangs are run by gangs, and the jobs, the
// current step and the nodes are the owner's, reached through m. It runs
// on the owner's goroutine only.
type recoverer struct {
	m *Manager
	// recs are the recoveries in progress by job.
	recs map[string]*recovery
}

func restartPolicy(p jobspec.RestartPolicy) scheduler.RestartPolicy {
	switch p {
	case jobspec.ReplaceNode:
		return scheduler.RestartReplace
	case jobspec.Shrink:
		return scheduler.RestartShrink
	case jobspec.NoRestart:
		return scheduler.RestartNone
	}
	return scheduler.RestartInPlace
}

// event logs and raises a recovery event about job j; d is how long the
// step it reports took.
func (rc *recoverer) event(j *api.Job, sev api.Severity, d time.Duration, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	rc.m.log.Info("recovery", "job", j.GetId(), "attempt", j.GetAttempt(), "step", msg, "seconds", d.Seconds())
	rc.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_RECOVERY, Severity: sev, Job: j.GetId(), Message: msg,
		DurationSeconds: d.Seconds(), Step: j.GetStep()})
}

// request is the scheduler's view of a failed job.
func (rc *recoverer) request(en *entry, f scheduler.Failure) scheduler.RecoverRequest {
	j := en.job
	f.Exclude = slices.Clone(j.GetExclude())
	r := rc.m.placer.request(en)
	if full := rc.m.placer.fullDP(en); full > r.Shape.DP {
		// An elastic job that shrank recovers toward its full size.
		r.Shape.DP = full
	}
	return scheduler.RecoverRequest{Job: r, Placement: placementOf(j.GetPlacement(), shapeOf(j)),
		Policy: restartPolicy(en.spec.RestartPolicy), Restarts: int(j.GetRestarts()), MaxRestarts: en.spec.Restarts(), Failure: f}
}

// orderRequest is the job as RecoversBefore orders it; a job without
// its spec (loaded from an older server) counts at priority 0.
func (rc *recoverer) orderRequest(en *entry) scheduler.JobRequest {
	if en.spec == nil {
		return scheduler.JobRequest{ID: en.job.GetId(), Submit: en.job.GetSubmitUnixNano() / 1e9}
	}
	return rc.m.placer.request(en)
}

// snapshot is the snapshot a recovering job decides on: the
// recovery's view (recoveryBase, suspect nodes offered). Every
// job's GPUs are held as usual, a recovering job's reservation included
// (its surviving GPUs stay its own), except the GPUs a recovery ordered
// after this one reserved off its own nodes before deciding: those were a
// guess, and the job ordered first may take them.
func (rc *recoverer) snapshot(en *entry, now time.Time) scheduler.Snapshot {
	snap := rc.m.placer.recoveryBase(now)
	me := rc.orderRequest(en)
	guessed := map[string]map[int]string{}
	for id, rec := range rc.recs {
		o := rc.m.jobs[id]
		if o == nil || o == en || rec.decision != nil {
			continue
		}
		if r := rc.orderRequest(o); scheduler.RecoversBefore(&me, &r) > 0 {
			continue
		}
		own := map[string]bool{}
		for _, jn := range o.job.GetPlacement() {
			own[jn.GetNode()] = true
		}
		for _, jn := range o.job.GetMoveTarget() {
			if own[jn.GetNode()] {
				continue
			}
			if guessed[jn.GetNode()] == nil {
				guessed[jn.GetNode()] = map[int]string{}
			}
			for _, g := range jn.GetGpus() {
				guessed[jn.GetNode()][int(g)] = id
			}
		}
	}
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		for k := range n.GPUs {
			if g := &n.GPUs[k]; g.Job != "" && guessed[n.Name][g.Index] == g.Job {
				g.Job = ""
			}
		}
	}
	return snap
}

// giveUp records that a job broke for good: it fails and its remaining
// ranks are stopped, since a gang with a dead rank hangs in its next
// collective.
func (rc *recoverer) giveUp(en *entry, reason string, now time.Time) {
	j := en.job
	from := phaseOf(j)
	if rec := rc.recs[j.GetId()]; rec != nil {
		remember(rc.m.pass, rc.recs, j.GetId())
		delete(rc.recs, j.GetId())
		rc.m.gangs.end(rec.validation)
		rc.cordons(j, rec)
		j.DowntimeSeconds += now.Sub(rec.since).Seconds()
	}
	j.State = api.JobState_JOB_STATE_FAILED
	j.Reason = reason
	j.EndUnixNano = now.UnixNano()
	j.MoveTarget = nil
	if liveRanks(j) > 0 {
		j.Stopping = api.JobStop_JOB_STOP_FAILED
		j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	} else {
		j.Stopping = api.JobStop_JOB_STOP_NONE
		endAttempt(j, now, reason)
	}
	if from != Failed {
		rc.m.check(from, EvGiveUp, j)
	}
	rc.m.save(en)
	rc.m.log.Warn("job failed", "job", j.GetId(), "attempt", j.GetAttempt(), "reason", reason)
}

// fail handles a failure of a running (or recovering) job under its
// restart policy: it gives up at once when the policy says so, else the
// job goes RECOVERING and the passes carry the recovery out.
func (rc *recoverer) fail(en *entry, f scheduler.Failure, reason string, now time.Time) {
	j := en.job
	from := phaseOf(j)
	defer rc.m.save(en)
	if rec := rc.recs[j.GetId()]; rec != nil {
		// Another failure while recovering: its nodes are avoided too,
		// and a node or GPU failure explains a rank exit seen first.
		if f.Kind != scheduler.FailRankExit && rec.failure.Kind == scheduler.FailRankExit {
			rec.failure.Kind = f.Kind
		}
		for _, n := range f.Nodes {
			if !slices.Contains(rec.failure.Nodes, n) {
				rec.failure.Nodes = append(rec.failure.Nodes, n)
			}
			if rc.excludes(f.Kind) && !slices.Contains(j.Exclude, n) {
				j.Exclude = append(j.Exclude, n)
			}
		}
		rc.noteCordons(rec, f, reason)
		rc.event(j, api.Severity_SEVERITY_WARNING, 0, "another failure while recovering: %s", reason)
		return
	}
	if en.spec == nil {
		rc.giveUp(en, reason, now)
		return
	}
	d, await := rc.recoverOrAwait(en, f, now, now)
	if d.Action == scheduler.GiveUp && len(await) == 0 {
		rc.event(j, api.Severity_SEVERITY_CRITICAL, 0, "%s; not restarted: %s", reason, d.Reason)
		rc.giveUp(en, fmt.Sprintf("%s (not restarted: %s)", reason, d.Reason), now)
		return
	}
	rec := &recovery{failure: f, reason: reason, since: now, stepAt: j.GetStep(), resume: -1, cordon: map[string]string{}}
	rc.noteCordons(rec, f, reason)
	remember(rc.m.pass, rc.recs, j.GetId())
	rc.recs[j.GetId()] = rec
	rc.m.stops.addAttained(j, now)
	endAttempt(j, now, reason)
	j.StartUnixNano = 0
	j.State = api.JobState_JOB_STATE_RECOVERING
	j.Reason = "recovering: " + reason
	// Reserve where the next attempt is likely to go, so that queued jobs
	// do not take the spares while the old ranks stop; the decision is
	// made again once they are gone.
	j.MoveTarget = jobNodes(&d.Placement)
	for _, n := range f.Nodes {
		if rc.excludes(f.Kind) && !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	for _, n := range f.Exclude {
		if !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	j.Stopping = api.JobStop_JOB_STOP_NONE
	if liveRanks(j) > 0 {
		j.Stopping = api.JobStop_JOB_STOP_FAILED
		j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	}
	ev := EvFail
	if f.Kind == scheduler.FailManual {
		ev = EvRestart
	}
	rc.m.check(from, ev, j)
	rc.event(j, api.Severity_SEVERITY_WARNING, 0, "failure detected (last reported step %d): %s; stopping %d live ranks", j.GetStep(), reason, liveRanks(j))
	rc.m.kick()
}

// excludes says whether a failure's nodes stay excluded from the job's
// later attempts (this recovery avoids them anyway: Failure.Nodes). A rank
// crash blames no node. A lost node is left to its suspicion
// (nodes.SuspectPolicy), which a passed validation or time lifts, so a
// node whose nodemon merely restarted is not lost to the job for good;
// an executor runs no validation gang and is told the exclusions, so
// under one a lost node stays excluded.
func (rc *recoverer) excludes(k scheduler.FailureKind) bool {
	switch k {
	case scheduler.FailRankExit:
		return false
	case scheduler.FailNodeDown:
		return rc.m.cfg.Executor != nil
	}
	return true
}

// noteCordons queues the failed nodes a failure makes unfit: nodes with a
// GPU fault are cordoned; down nodes become suspect (so that no queued work
// lands there when they return unvouched for, while a nodemon that merely
// restarted is back in service once vouched for or after a while).
func (rc *recoverer) noteCordons(rec *recovery, f scheduler.Failure, reason string) {
	var marks map[string]string
	switch f.Kind {
	case scheduler.FailNodeDown:
		if rec.suspect == nil {
			rec.suspect = map[string]string{}
		}
		marks = rec.suspect
	case scheduler.FailGPUFault:
		marks = rec.cordon
	default:
		return
	}
	for _, n := range f.Nodes {
		if _, ok := marks[n]; !ok {
			marks[n] = reason
		}
	}
}

// gpuFault handles an event that makes a GPU unfit (api.GPUFault): a
// running job with a rank on that node recovers without it.
func (rc *recoverer) gpuFault(e *api.Event) {
	fault, ok := api.GPUFault(e)
	if !ok {
		return
	}
	what := strings.TrimSpace(e.GetMessage())
	if what == "" {
		what = fault
	}
	now := rc.m.now()
	for _, en := range rc.m.sorted() {
		j := en.job
		if !active(j) && phaseOf(j) != Recovering {
			continue
		}
		on := false
		for _, jn := range j.GetPlacement() {
			on = on || jn.GetNode() == e.GetNode()
		}
		if !on {
			continue
		}
		reason := fmt.Sprintf("GPU %d of %s faulted: %s", e.GetGpuIndex(), e.GetNode(), what)
		rc.fail(en, scheduler.Failure{Kind: scheduler.FailGPUFault, Nodes: []string{e.GetNode()}}, reason, now)
	}
	rc.m.kick()
}

// advance moves every recovery along one step, the highest priority
// first (scheduler.RecoversBefore): recoveries that decide in the same
// pass take the free capacity in that order.
func (rc *recoverer) advance(now time.Time) {
	var ranks map[string][]*api.RankStatus
	var order []*entry
	for _, en := range rc.m.sorted() {
		if rc.recs[en.job.GetId()] != nil {
			order = append(order, en)
		}
	}
	slices.SortStableFunc(order, func(a, b *entry) int {
		ra, rb := rc.orderRequest(a), rc.orderRequest(b)
		return scheduler.RecoversBefore(&ra, &rb)
	})
	for _, en := range order {
		j := en.job
		rec := rc.recs[j.GetId()]
		if rec == nil {
			continue
		}
		if j.GetState() != api.JobState_JOB_STATE_RECOVERING {
			// Cancelled (or otherwise ended) while recovering.
			remember(rc.m.pass, rc.recs, j.GetId())
			delete(rc.recs, j.GetId())
			rc.m.gangs.end(rec.validation)
			continue
		}
		rc.cordons(j, rec)
		if liveRanks(j) > 0 {
			// The survivors' last reports say how far the job got.
			if ranks == nil {
				ranks = ranksByJob(rc.m.cfg.Nodes.Ranks(""))
			}
			for _, r := range ranks[j.GetId()] {
				if r.GetAttempt() == j.GetAttempt() && r.GetStep() > rec.stepAt {
					rec.stepAt = r.GetStep()
				}
			}
			continue
		}
		if rec.stoppedAt.IsZero() {
			rec.stoppedAt = now
			rc.observeRecovery("stopped", now.Sub(rec.since))
			rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since), "every rank of attempt %d has exited or its node is down", j.GetAttempt())
		}
		if rec.validation != "" {
			rc.checkValidation(en, rec, now)
			continue
		}
		if wait := rc.m.fence.unfenced(en, now); len(wait) > 0 {
			if !rec.fenceNoted {
				rec.fenceNoted = true
				rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since),
					"waiting until attempt %d is fenced on %s (the node returns and confirms it gone, or its lease passes) before the next attempt runs",
					j.GetAttempt(), strings.Join(wait, ","))
			}
			continue
		}
		rc.decide(en, rec, now)
	}
}

func ranksByJob(nrs []nodes.NodeRanks) map[string][]*api.RankStatus {
	out := map[string][]*api.RankStatus{}
	for _, nr := range nrs {
		for _, r := range nr.Ranks {
			out[r.GetJob()] = append(out[r.GetJob()], r)
		}
	}
	return out
}

// cordons queues the cordons of the failed nodes not yet cordoned, and
// the suspicions of the lost ones; each comes back as msgCordoned for its
// recovery event.
func (rc *recoverer) cordons(j *api.Job, rec *recovery) {
	if len(rec.cordon) == 0 && len(rec.suspect) == 0 {
		return
	}
	cordon, suspect := rec.cordon, rec.suspect
	rec.cordon, rec.suspect = map[string]string{}, nil
	id := j.GetId()
	setCordon, post := rc.m.cfg.Nodes.SetCordon, rc.m.in.post
	rc.m.act(func(d *dispatcher) {
		d.async(func() {
			for _, mark := range []struct {
				action string
				todo   map[string]string
			}{{nodes.ActionCordon, cordon}, {nodes.ActionSuspect, suspect}} {
				for _, node := range slices.Sorted(mapKeys(mark.todo)) {
					start := time.Now()
					n, err := setCordon(node, mark.action, fmt.Sprintf("recovering job %s: %s", id, mark.todo[node]))
					post(msgCordoned{job: id, node: node, reason: mark.todo[node], action: mark.action, status: n, took: time.Since(start), err: err})
				}
			}
		})
	})
}

func (rc *recoverer) cordoned(msg msgCordoned) {
	en := rc.m.jobs[msg.job]
	if en == nil {
		return
	}
	if msg.err != nil {
		rc.event(en.job, api.Severity_SEVERITY_WARNING, msg.took, "could not %s %s: %v", msg.action, msg.node, msg.err)
		return
	}
	n := msg.status
	switch {
	case msg.action == nodes.ActionSuspect && !n.GetCordoned():
		rc.event(en.job, api.Severity_SEVERITY_INFO, msg.took, "%s suspect until %s: %s", msg.node,
			time.Unix(0, n.GetSuspectUntilUnixNano()).UTC().Format("15:04:05"), n.GetSuspectReason())
	case msg.action == nodes.ActionSuspect:
		rc.event(en.job, api.Severity_SEVERITY_WARNING, msg.took, "cordoned %s: %s", msg.node, n.GetCordonReason())
	default:
		rc.event(en.job, api.Severity_SEVERITY_INFO, msg.took, "cordoned %s: %s", msg.node, msg.reason)
	}
}

// vouch lifts the suspicion of the suspect nodes among names: a validation
// gang passed there.
func (rc *recoverer) vouch(names []string, gang string, now time.Time) {
	suspect := map[string]bool{}
	for _, n := range rc.m.cfg.Nodes.Nodes() {
		if nodes.Suspected(n.GetSuspectUntilUnixNano(), now) {
			suspect[n.GetRegistration().GetName()] = true
		}
	}
	var todo []string
	for _, n := range names {
		if suspect[n] {
			todo = append(todo, n)
		}
	}
	if len(todo) == 0 {
		return
	}
	setCordon, log := rc.m.cfg.Nodes.SetCordon, rc.m.log
	rc.m.act(func(d *dispatcher) {
		d.async(func() {
			for _, node := range todo {
				if _, err := setCordon(node, nodes.ActionVouch, "passed validation "+gang); err != nil {
					log.Warn("lift suspicion", "node", node, "err", err)
				}
			}
		})
	})
}

// recoverOrAwait decides as scheduler.Recover does, offering suspect nodes
// (recoverySnapshot). A decision to give up that would not be one if the
// nodes down only a moment ago were back (awaited) is a wait for them: a
// nodemon or server that merely restarted is not missing capacity. It
// returns them; nil when the decision stands.
func (rc *recoverer) recoverOrAwait(en *entry, f scheduler.Failure, since, now time.Time) (scheduler.Recovery, []string) {
	snap := rc.snapshot(en, now)
	req := rc.request(en, rc.returned(f, since))
	d := scheduler.Recover(&snap, &req)
	if d.Action != scheduler.GiveUp {
		return d, nil
	}
	await := rc.awaited(now)
	if len(await) == 0 {
		return d, nil
	}
	back := snap
	back.Nodes = slices.Clone(snap.Nodes)
	for i := range back.Nodes {
		n := &back.Nodes[i]
		if n.State != scheduler.NodeDown || !slices.Contains(await, n.Name) {
			continue
		}
		n.State = scheduler.NodeReady
		// Its last samples, from before it went, still list the ranks
		// given up with it; they are fenced when it returns.
		n.GPUs = slices.Clone(n.GPUs)
		for g := range n.GPUs {
			if n.GPUs[g].Job == unmanaged {
				n.GPUs[g].Job = ""
			}
		}
	}
	// A lost node of this job that returns in time may run it again
	// (returned), so it counts back too.
	backF := f
	if f.Kind == scheduler.FailNodeDown && rc.m.cfg.Executor == nil {
		backF.Nodes = slices.DeleteFunc(slices.Clone(f.Nodes), func(n string) bool { return slices.Contains(await, n) })
	}
	backReq := rc.request(en, rc.returned(backF, since))
	if scheduler.Recover(&back, &backReq).Action == scheduler.GiveUp {
		return d, nil
	}
	return d, await
}

// returned drops from a node-down failure the lost nodes back in service
// since the recovery began (up again after it, neither cordoned nor
// draining): a nodemon that merely restarted may run the job again; a
// node that refused a launch never went away and stays failed. They are suspect, so validated first
// where validation gangs run (unvouched). Under an executor a lost node
// stays failed for the recovery, as it stays excluded.
func (rc *recoverer) returned(f scheduler.Failure, since time.Time) scheduler.Failure {
	if f.Kind != scheduler.FailNodeDown || rc.m.cfg.Executor != nil {
		return f
	}
	up := map[string]bool{}
	for _, n := range rc.m.cfg.Nodes.Nodes() {
		if nodeIsUp(n) && !n.GetCordoned() && !n.GetDraining() && n.GetStateSinceUnixNano() >= since.UnixNano() {
			up[n.GetRegistration().GetName()] = true
		}
	}
	f.Nodes = slices.DeleteFunc(slices.Clone(f.Nodes), func(n string) bool { return up[n] })
	return f
}

// unvouched are the nodes of a decision to validate before the relaunch:
// those new to the job, and the suspect ones it keeps or takes back.
func (rc *recoverer) unvouched(d *scheduler.Recovery, now time.Time) []string {
	out := slices.Clone(d.Added)
	suspect := map[string]bool{}
	for _, n := range rc.m.cfg.Nodes.Nodes() {
		if nodes.Suspected(n.GetSuspectUntilUnixNano(), now) {
			suspect[n.GetRegistration().GetName()] = true
		}
	}
	for _, n := range d.Placement.Nodes() {
		if suspect[n] && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// awaited names the nodes down now that may only be restarting: neither
// cordoned nor draining, and down for less than their reconnect bound
// (ReconnectBound), counted from the server's start when that is later.
// Every live nodemon is back within it.
func (rc *recoverer) awaited(now time.Time) []string {
	var out []string
	for _, n := range rc.m.cfg.Nodes.Nodes() {
		if nodeIsUp(n) || n.GetCordoned() || n.GetDraining() {
			continue
		}
		since := time.Unix(0, n.GetStateSinceUnixNano())
		if since.Before(rc.m.startedAt) {
			since = rc.m.startedAt
		}
		bound := ReconnectBound(time.Duration(n.GetRegistration().GetHeartbeatIntervalMs())*time.Millisecond, rc.m.cfg.ReconnectGrace)
		if now.Sub(since) < bound {
			out = append(out, n.GetRegistration().GetName())
		}
	}
	slices.Sort(out)
	return out
}

// decide asks the scheduler where the next attempt runs, then validates
// new nodes or relaunches at once.
func (rc *recoverer) decide(en *entry, rec *recovery, now time.Time) {
	j := en.job
	d, await := rc.recoverOrAwait(en, rec.failure, rec.since, now)
	if d.Action == scheduler.GiveUp && len(await) > 0 {
		if !rec.awaitNoted {
			rec.awaitNoted = true
			rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since), "waiting for %s to reconnect (down a moment ago, maybe restarting): %s",
				strings.Join(await, ","), d.Reason)
		}
		return
	}
	if d.Action == scheduler.GiveUp {
		rc.event(j, api.Severity_SEVERITY_CRITICAL, now.Sub(rec.since), "giving up: %s", d.Reason)
		rc.giveUp(en, fmt.Sprintf("%s (not recovered: %s)", rec.reason, d.Reason), now)
		return
	}
	rec.decision = &d
	rc.observeRecovery("decided", now.Sub(rec.since))
	j.MoveTarget = jobNodes(&d.Placement)
	rc.m.save(en)
	rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since), "decided to %s: %s", d.Action, d.Reason)
	// A validation gang is launched by nodemon itself: under an executor
	// (Slurm) it would run outside its allocations, so the executor's own
	// node checks vouch for new nodes instead.
	if len(rc.unvouched(&d, now)) > 0 && len(rc.m.cfg.ValidateCommand) > 0 && rc.m.cfg.Executor == nil {
		rc.validate(en, rec, now)
		return
	}
	rc.relaunch(en, rec, now)
}

// validate launches the validation gang on the decision's nodes and holds
// their GPUs for the job meanwhile.
func (rc *recoverer) validate(en *entry, rec *recovery, now time.Time) {
	j := en.job
	pl := rec.decision.Placement
	rec.rounds++
	v := &validation{id: fmt.Sprintf("%s-validate-%d", j.GetId(), j.GetAttempt()+1), job: j.GetId(),
		gpus: map[string]uint32{}, started: now, ranks: map[string]*valRank{}}
	if rec.rounds > 1 {
		v.id += fmt.Sprintf(".%d", rec.rounds)
	}
	for _, sl := range pl.Ranks {
		if _, ok := v.gpus[sl.Node]; !ok {
			v.gpus[sl.Node] = uint32(sl.GPU)
			v.nodes = append(v.nodes, sl.Node)
			v.ranks[sl.Node] = &valRank{}
		}
	}
	v.port = rc.m.launcher.port(v.id, 1)
	rc.m.gangs.add(v)
	rec.validation = v.id
	j.MoveTarget = jobNodes(&pl)
	j.Reason = fmt.Sprintf("recovering: validating %s before relaunch (%s)", strings.Join(v.nodes, ","), rec.reason)
	rc.m.save(en)
	rc.event(j, api.Severity_SEVERITY_INFO, 0, "validating %d nodes (%s) with %s", len(v.nodes), strings.Join(v.nodes, ","), v.id)
	// The gang runs as the job would: a node that refuses root ranks
	// refuses them for validation too.
	user, group := rc.m.cfg.RunAs.RunAs(en.spec)
	rc.m.gangs.launch(v, user, group)
}

// checkValidation waits for the gang: all exits 0 relaunches the job; a
// failure or the timeout cordons the new nodes that did not pass and
// decides again without them.
func (rc *recoverer) checkValidation(en *entry, rec *recovery, now time.Time) {
	j := en.job
	v := rc.m.gangs.byID[rec.validation]
	if v == nil {
		rec.validation = ""
		return
	}
	done, failed := true, false
	for _, r := range v.ranks {
		if !r.exited {
			done = false
		} else if r.code != 0 || r.signal != "" || r.err != "" {
			failed = true
		}
	}
	timedOut := now.Sub(v.started) >= rc.m.cfg.ValidateTimeout
	if done && !failed {
		rc.m.gangs.forget(v.id)
		rec.validation = ""
		rc.observeRecovery("validated", now.Sub(rec.since))
		rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(v.started), "validation %s passed on %s", v.id, strings.Join(v.nodes, ","))
		rc.vouch(v.nodes, v.id, now)
		rc.relaunch(en, rec, now)
		return
	}
	if !failed && !timedOut {
		return
	}
	// Blame the new nodes whose rank did not pass; if theirs all passed,
	// the new set as a whole did not work together.
	added := rc.unvouched(rec.decision, now)
	var blame, why []string
	for _, node := range v.nodes {
		r := v.ranks[node]
		var what string
		switch {
		case r.err != "":
			what = "launch failed: " + r.err
		case !r.exited:
			what = fmt.Sprintf("no exit within %s", rc.m.cfg.ValidateTimeout)
		case r.signal != "":
			what = "killed by " + r.signal
		case r.code != 0:
			what = fmt.Sprintf("exited with code %d", r.code)
		default:
			continue
		}
		why = append(why, node+": "+what)
		if slices.Contains(added, node) {
			blame = append(blame, node)
		}
	}
	if len(blame) == 0 {
		blame = slices.Clone(added)
	}
	rc.m.gangs.forget(v.id)
	rec.validation = ""
	rec.decision = nil
	rc.m.launcher.signalNodes(v.id, v.nodes, "SIGKILL")
	rc.event(j, api.Severity_SEVERITY_WARNING, now.Sub(v.started), "validation %s failed (%s); excluding %s (cordoned unless it refused by its own policy) and choosing again",
		v.id, strings.Join(why, "; "), strings.Join(blame, ","))
	for _, n := range blame {
		if r := v.ranks[n]; r == nil || !r.refused {
			rec.cordon[n] = "failed validation " + v.id + " (" + strings.Join(why, "; ") + ")"
		}
		if !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	rc.m.save(en)
	if rec.rounds >= rc.m.cfg.MaxValidations {
		rc.giveUp(en, fmt.Sprintf("%s (not recovered: %d validation rounds failed, last: %s)", rec.reason, rec.rounds, strings.Join(why, "; ")), now)
	}
	rc.cordons(j, rec)
}

// relaunch starts the next attempt on the decision's placement from the
// latest complete checkpoint, and books the counters.
func (rc *recoverer) relaunch(en *entry, rec *recovery, now time.Time) {
	j := en.job
	d := rec.decision
	resume := j.GetLastCheckpointStep()
	if rec.resume >= 0 {
		resume = rec.resume
	}
	lost := max(rec.stepAt-resume, 0)
	p := rc.m.prog.of(j.GetId())
	if lost > 0 && p.AttemptSteps > 0 {
		// The lost steps' time was counted useful when they ran.
		j.UsefulSeconds = max(j.GetUsefulSeconds()-float64(lost)*p.AttemptUseful/float64(p.AttemptSteps), 0)
	}
	if n := len(j.GetAttempts()); n > 0 {
		j.Attempts[n-1].LostSteps = lost
	}
	j.LostSteps += lost
	j.Restarts++
	j.DowntimeSeconds += now.Sub(rec.since).Seconds()
	remember(rc.m.pass, rc.recs, j.GetId())
	delete(rc.recs, j.GetId())
	en.resume, en.resumeSet = resume, true
	if d.Action == scheduler.ShrinkDP {
		en.resizeWhy = d.Reason
	}
	if !rc.m.placer.start(en, d.Placement, now, "") {
		rc.recs[j.GetId()] = rec
		return
	}
	j.Step = resume
	p.Restart(resume)
	rc.observeRecovery("relaunched", now.Sub(rec.since))
	rc.event(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since),
		"attempt %d running on %s from step %d (%d steps lost; failed at step %d): %s", j.GetAttempt(),
		strings.Join(d.Placement.Nodes(), ","), resume, lost, rec.stepAt, d.Reason)
}

// DefaultReconnectGrace is how long a node may take, beyond twice its
// heartbeat, to reconnect after the server starts: the longest a live
// nodemon takes to begin an attempt that server answers (its attempt in
// flight timing out, then its longest pause; transport.NodeReconnectWithin).
const DefaultReconnectGrace = transport.NodeReconnectWithin

// ReconnectBound is how long after the server starts a node with heartbeat
// interval hb (0: nodes.DefaultHeartbeat) may stay away holding live ranks
// before it counts as down: twice its heartbeat (it hears of the restart
// at its next one, and registers) plus grace.
func ReconnectBound(hb, grace time.Duration) time.Duration {
	if hb <= 0 {
		hb = nodes.DefaultHeartbeat
	}
	return 2*hb + grace
}

// lostNodes treats a node that holds live ranks but has not been connected
// within its reconnect bound (ReconnectBound) as down, measured from the
// server's start or from when it was last seen since. The failure
// detector does this for nodes it sees go; this catches nodes a restarted
// server loaded as disconnected that never came back. Only a node truly
// gone is failed here: every live nodemon reconnects within the bound. A
// node the registry still holds up while it reconnects (its connection
// closed; a pause of the server's own credited) is the detector's to
// judge, not this clock's.
func (rc *recoverer) lostNodes(all []*api.NodeStatus, now time.Time) {
	var holding map[string]bool
	for _, en := range rc.m.jobs {
		for _, jn := range en.job.GetPlacement() {
			for _, r := range jn.GetRanks() {
				if !r.GetExited() {
					if holding == nil {
						holding = map[string]bool{}
					}
					holding[jn.GetNode()] = true
				}
			}
		}
	}
	if holding == nil {
		return
	}
	known := map[string]bool{}
	for _, n := range all {
		name := n.GetRegistration().GetName()
		known[name] = true
		if !holding[name] || n.GetConnected() || n.GetState() == api.NodeState_NODE_STATE_READY {
			continue
		}
		bound := ReconnectBound(time.Duration(n.GetRegistration().GetHeartbeatIntervalMs())*time.Millisecond, rc.m.cfg.ReconnectGrace)
		since := rc.m.startedAt
		if seen := time.Unix(0, n.GetLastSeenUnixNano()); seen.After(since) {
			since = seen
		}
		if now.Sub(since) > bound {
			rc.m.nodes.down(name, fmt.Sprintf("not reconnected within %s", bound.Round(time.Millisecond)), now)
		}
	}
	for name := range holding {
		if bound := ReconnectBound(0, rc.m.cfg.ReconnectGrace); !known[name] && now.Sub(rc.m.startedAt) > bound {
			rc.m.nodes.down(name, "node unknown to the server", now)
		}
	}
}

func (rc *recoverer) observeRecovery(step string, d time.Duration) {
	if o := rc.m.observer(); o != nil {
		o.ObserveRecoveryStep(step, d)
	}
}
