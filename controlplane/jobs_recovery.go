package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
)

// Recovery carries out scheduler.Recover's decisions. A failed job goes
// RECOVERING: its surviving ranks are stopped (SIGTERM, SIGKILL after the
// recovery grace), its failed nodes cordoned, and only once every old rank
// is seen to exit or its node is down does the scheduler choose where the
// next attempt runs. Nodes new to the job are first checked with a short
// all-reduce (the validation gang); a node that fails it is cordoned and
// another chosen. The next attempt then resumes from the latest complete
// checkpoint. Each step is an EVENT_KIND_RECOVERY event.

// cordoner takes a node out of scheduling with a reason; the Server is one.
type cordoner interface {
	Cordon(node, reason string) error
}

// faultXIDs are the XIDs after which a node is cordoned: the GPU fell off
// the bus, double-bit or uncontained ECC errors, page retirement and row
// remapping events and failures, NVLink errors.
var faultXIDs = []uint32{48, 63, 64, 74, 79, 94, 95}

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
	// cordon lists failed nodes still to cordon, with why.
	cordon map[string]string
	// stoppedAt is when the last old rank was seen gone.
	stoppedAt time.Time
	decision  *scheduler.Recovery
	// validation is the gang checking the decision's new nodes.
	validation string
	rounds     int
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
}

// jobProgress tracks what the counters need between passes.
type jobProgress struct {
	at     time.Time
	step   int64
	energy map[string]uint64
	// useful seconds and steps of the current attempt, to charge lost
	// steps at the attempt's own pace.
	attemptUseful float64
	attemptSteps  int64
	// ckptAt is the last checkpoint (or request for one), for jobs the
	// server checkpoints at the advised interval.
	ckptAt time.Time
	// ckpts maps a checkpoint step to the ranks that reported it.
	ckpts map[int64]map[int32]bool
}

func (m *jobManager) progressOf(id string) *jobProgress {
	p := m.prog[id]
	if p == nil {
		p = &jobProgress{energy: map[string]uint64{}, ckpts: map[int64]map[int32]bool{}}
		m.prog[id] = p
	}
	return p
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

// raise persists a job event; a store failure is logged.
func (m *jobManager) raise(e *api.Event) {
	if e.TimeUnixNano == 0 {
		e.TimeUnixNano = m.now().UnixNano()
	}
	if e.Severity == api.Severity_SEVERITY_UNSPECIFIED {
		e.Severity = api.Severity_SEVERITY_INFO
	}
	if err := m.store.AppendEvent(e); err != nil {
		m.log.Error("persist event", "job", e.GetJob(), "kind", e.GetKind(), "err", err)
	}
}

func (m *jobManager) recoveryEvent(j *api.Job, sev api.Severity, d time.Duration, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.log.Info("recovery", "job", j.GetId(), "attempt", j.GetAttempt(), "step", msg, "seconds", d.Seconds())
	m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_RECOVERY, Severity: sev, Job: j.GetId(), Message: msg,
		DurationSeconds: d.Seconds(), Step: j.GetStep()})
}

// recoverRequest is the scheduler's view of a failed job.
func (m *jobManager) recoverRequest(en *jobEntry, f scheduler.Failure) scheduler.RecoverRequest {
	j := en.job
	f.Exclude = slices.Clone(j.GetExclude())
	return scheduler.RecoverRequest{Job: m.request(en), Placement: placementOf(j.GetPlacement(), shapeOf(j)),
		Policy: restartPolicy(en.spec.RestartPolicy), Restarts: int(j.GetRestarts()), MaxRestarts: en.spec.Restarts(), Failure: f}
}

// finalFailLocked records that a job broke for good: it fails and its
// remaining ranks are stopped, since a gang with a dead rank hangs in its
// next collective.
func (m *jobManager) finalFailLocked(en *jobEntry, reason string, now time.Time) {
	j := en.job
	if rec := m.recs[j.GetId()]; rec != nil {
		delete(m.recs, j.GetId())
		m.later = append(m.later, m.endValidationLocked(rec)...)
		m.later = append(m.later, m.cordonsLocked(j, rec)...)
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
	}
	m.log.Warn("job failed", "job", j.GetId(), "attempt", j.GetAttempt(), "reason", reason)
}

// failLocked handles a failure of a running (or recovering) job under its
// restart policy: it gives up at once when the policy says so, else the
// job goes RECOVERING and reconcile carries the recovery out.
func (m *jobManager) failLocked(en *jobEntry, f scheduler.Failure, reason string, now time.Time) {
	j := en.job
	if rec := m.recs[j.GetId()]; rec != nil {
		// Another failure while recovering: its nodes are avoided too,
		// and a node or GPU failure explains a rank exit seen first.
		if f.Kind != scheduler.FailRankExit && rec.failure.Kind == scheduler.FailRankExit {
			rec.failure.Kind = f.Kind
		}
		for _, n := range f.Nodes {
			if !slices.Contains(rec.failure.Nodes, n) {
				rec.failure.Nodes = append(rec.failure.Nodes, n)
			}
			if f.Kind != scheduler.FailRankExit && !slices.Contains(j.Exclude, n) {
				j.Exclude = append(j.Exclude, n)
			}
		}
		m.noteCordonsLocked(rec, f, reason)
		m.recoveryEvent(j, api.Severity_SEVERITY_WARNING, 0, "another failure while recovering: %s", reason)
		return
	}
	if en.spec == nil {
		m.finalFailLocked(en, reason, now)
		return
	}
	snap := m.snapshotLocked(now)
	req := m.recoverRequest(en, f)
	d := scheduler.Recover(&snap, &req)
	if d.Action == scheduler.GiveUp {
		m.recoveryEvent(j, api.Severity_SEVERITY_CRITICAL, 0, "%s; not restarted: %s", reason, d.Reason)
		m.finalFailLocked(en, fmt.Sprintf("%s (not restarted: %s)", reason, d.Reason), now)
		return
	}
	rec := &recovery{failure: f, reason: reason, since: now, stepAt: j.GetStep(), resume: -1, cordon: map[string]string{}}
	m.noteCordonsLocked(rec, f, reason)
	m.recs[j.GetId()] = rec
	m.addAttainedLocked(j, now)
	j.StartUnixNano = 0
	j.State = api.JobState_JOB_STATE_RECOVERING
	j.Reason = "recovering: " + reason
	// Reserve where the next attempt is likely to go, so that queued jobs
	// do not take the spares while the old ranks stop; the decision is
	// made again once they are gone.
	j.MoveTarget = jobNodes(&d.Placement)
	for _, n := range f.Nodes {
		if f.Kind != scheduler.FailRankExit && !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	for _, n := range f.Exclude {
		if !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	if liveRanks(j) > 0 {
		j.Stopping = api.JobStop_JOB_STOP_FAILED
		j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	}
	m.recoveryEvent(j, api.Severity_SEVERITY_WARNING, 0, "failure detected (last reported step %d): %s; stopping %d live ranks", j.GetStep(), reason, liveRanks(j))
}

// noteCordonsLocked queues the failed nodes a failure makes unfit: down
// nodes (so that nothing lands there when they return unvouched for) and
// nodes with a GPU fault.
func (m *jobManager) noteCordonsLocked(rec *recovery, f scheduler.Failure, reason string) {
	switch f.Kind {
	case scheduler.FailNodeDown, scheduler.FailGPUFault:
		for _, n := range f.Nodes {
			if _, ok := rec.cordon[n]; !ok {
				rec.cordon[n] = reason
			}
		}
	}
}

// gpuFault handles an XID, ECC or GPU-lost event: a running job with a
// rank on a faulted GPU's node recovers without that node.
func (m *jobManager) gpuFault(e *api.Event) {
	fault := false
	switch e.GetKind() {
	case api.EventKind_EVENT_KIND_XID:
		fault = slices.Contains(faultXIDs, e.GetXid())
		switch e.GetXidClass() {
		case api.XIDClass_XID_CLASS_RESET_GPU, api.XIDClass_XID_CLASS_REBOOT_NODE, api.XIDClass_XID_CLASS_HARDWARE:
			fault = true
		}
	case api.EventKind_EVENT_KIND_ECC:
		fault = e.GetSeverity() == api.Severity_SEVERITY_CRITICAL
	case api.EventKind_EVENT_KIND_GPU_LOST:
		fault = true
	}
	if !fault {
		return
	}
	what := strings.TrimSpace(e.GetMessage())
	if what == "" {
		what = e.GetKind().String()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for _, en := range m.sortedLocked() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_RUNNING && j.GetState() != api.JobState_JOB_STATE_RECOVERING {
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
		if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() != api.JobStop_JOB_STOP_NONE {
			continue
		}
		m.failLocked(en, scheduler.Failure{Kind: scheduler.FailGPUFault, Nodes: []string{e.GetNode()}}, reason, now)
		m.persistLocked(en)
	}
	m.poke()
}

// recoveriesLocked moves every recovery along one step.
func (m *jobManager) recoveriesLocked(ctx context.Context, now time.Time) []action {
	var acts []action
	for _, en := range m.sortedLocked() {
		j := en.job
		rec := m.recs[j.GetId()]
		if rec == nil {
			continue
		}
		if j.GetState() != api.JobState_JOB_STATE_RECOVERING {
			// Cancelled (or otherwise ended) while recovering.
			delete(m.recs, j.GetId())
			acts = append(acts, m.endValidationLocked(rec)...)
			continue
		}
		acts = append(acts, m.cordonsLocked(j, rec)...)
		if liveRanks(j) > 0 {
			// The survivors' last reports say how far the job got.
			if m.ranks != nil {
				for _, nr := range m.ranks(j.GetId()) {
					for _, r := range nr.Ranks {
						if r.GetAttempt() == j.GetAttempt() && r.GetStep() > rec.stepAt {
							rec.stepAt = r.GetStep()
						}
					}
				}
			}
			continue
		}
		if rec.stoppedAt.IsZero() {
			rec.stoppedAt = now
			m.recoveryEvent(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since), "every rank of attempt %d has exited or its node is down", j.GetAttempt())
		}
		if rec.validation != "" {
			acts = append(acts, m.checkValidationLocked(en, rec, now)...)
			continue
		}
		acts = append(acts, m.decideLocked(en, rec, now)...)
	}
	return acts
}

// cordonsLocked cordons the failed nodes not yet cordoned.
func (m *jobManager) cordonsLocked(j *api.Job, rec *recovery) []action {
	if len(rec.cordon) == 0 {
		return nil
	}
	todo := rec.cordon
	rec.cordon = map[string]string{}
	id := j.GetId()
	return []action{func(context.Context) {
		for _, node := range slices.Sorted(mapKeys(todo)) {
			why := fmt.Sprintf("recovering job %s: %s", id, todo[node])
			start := time.Now()
			err := m.cordonNode(node, why)
			m.mu.Lock()
			if en := m.jobs[id]; en != nil {
				if err != nil {
					m.recoveryEvent(en.job, api.Severity_SEVERITY_WARNING, time.Since(start), "could not cordon %s: %v", node, err)
				} else {
					m.recoveryEvent(en.job, api.Severity_SEVERITY_INFO, time.Since(start), "cordoned %s: %s", node, todo[node])
				}
			}
			m.mu.Unlock()
		}
	}}
}

func (m *jobManager) cordonNode(node, reason string) error {
	if m.cordon == nil {
		return errors.New("this server cannot cordon nodes")
	}
	return m.cordon(node, reason)
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

// decideLocked asks the scheduler where the next attempt runs, then
// validates new nodes or relaunches at once.
func (m *jobManager) decideLocked(en *jobEntry, rec *recovery, now time.Time) []action {
	j := en.job
	snap := m.snapshotLocked(now)
	req := m.recoverRequest(en, rec.failure)
	d := scheduler.Recover(&snap, &req)
	if d.Action == scheduler.GiveUp {
		m.recoveryEvent(j, api.Severity_SEVERITY_CRITICAL, now.Sub(rec.since), "giving up: %s", d.Reason)
		m.finalFailLocked(en, fmt.Sprintf("%s (not recovered: %s)", rec.reason, d.Reason), now)
		m.persistLocked(en)
		return nil
	}
	rec.decision = &d
	j.MoveTarget = jobNodes(&d.Placement)
	m.recoveryEvent(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since), "decided to %s: %s", d.Action, d.Reason)
	if len(d.Added) > 0 && len(m.cfg.ValidateCommand) > 0 {
		return m.validateLocked(en, rec, now)
	}
	return m.relaunchLocked(en, rec, now)
}

// validateLocked launches the validation gang on the decision's nodes and
// holds their GPUs for the job meanwhile.
func (m *jobManager) validateLocked(en *jobEntry, rec *recovery, now time.Time) []action {
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
	v.port = m.portLocked(v.id, 1)
	m.vals[v.id] = v
	rec.validation = v.id
	j.MoveTarget = jobNodes(&pl)
	j.Reason = fmt.Sprintf("recovering: validating %s before relaunch (%s)", strings.Join(v.nodes, ","), rec.reason)
	m.persistLocked(en)
	m.recoveryEvent(j, api.Severity_SEVERITY_INFO, 0, "validating %d nodes (%s) with %s", len(v.nodes), strings.Join(v.nodes, ","), v.id)
	launches := map[string]*api.LaunchRanks{}
	for i, node := range v.nodes {
		launches[node] = &api.LaunchRanks{Job: v.id, Attempt: 1, Command: m.cfg.ValidateCommand, WorldSize: int32(len(v.nodes)),
			MasterAddr: m.addrOf(v.nodes[0]), MasterPort: v.port,
			Ranks: []*api.RankSpec{{Rank: int32(i), LocalRank: 0, Gpus: []uint32{v.gpus[node]}}}}
	}
	nodes := slices.Clone(v.nodes)
	id := v.id
	return []action{func(ctx context.Context) {
		errs := m.fanOut(ctx, nodes, func(node string) *api.Command {
			return &api.Command{Body: &api.Command_Launch{Launch: launches[node]}}
		})
		if len(errs) == 0 {
			return
		}
		m.mu.Lock()
		if v := m.vals[id]; v != nil {
			for node, err := range errs {
				if r := v.ranks[node]; r != nil {
					r.exited, r.code, r.err = true, -1, err.Error()
				}
			}
		}
		m.mu.Unlock()
		m.poke()
	}}
}

// checkValidationLocked waits for the gang: all exits 0 relaunches the
// job; a failure or the timeout cordons the new nodes that did not pass
// and decides again without them.
func (m *jobManager) checkValidationLocked(en *jobEntry, rec *recovery, now time.Time) []action {
	j := en.job
	v := m.vals[rec.validation]
	if v == nil {
		rec.validation = ""
		return nil
	}
	done, failed := true, false
	for _, r := range v.ranks {
		if !r.exited {
			done = false
		} else if r.code != 0 || r.signal != "" || r.err != "" {
			failed = true
		}
	}
	timedOut := now.Sub(v.started) >= m.cfg.ValidateTimeout
	if done && !failed {
		delete(m.vals, v.id)
		rec.validation = ""
		m.recoveryEvent(j, api.Severity_SEVERITY_INFO, now.Sub(v.started), "validation %s passed on %s", v.id, strings.Join(v.nodes, ","))
		return m.relaunchLocked(en, rec, now)
	}
	if !failed && !timedOut {
		return nil
	}
	// Blame the new nodes whose rank did not pass; if theirs all passed,
	// the new set as a whole did not work together.
	added := rec.decision.Added
	var blame []string
	var why []string
	for _, node := range v.nodes {
		r := v.ranks[node]
		var what string
		switch {
		case r.err != "":
			what = "launch failed: " + r.err
		case !r.exited:
			what = fmt.Sprintf("no exit within %s", m.cfg.ValidateTimeout)
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
	delete(m.vals, v.id)
	rec.validation = ""
	rec.decision = nil
	acts := []action{killGang(m, v.id, v.nodes)}
	m.recoveryEvent(j, api.Severity_SEVERITY_WARNING, now.Sub(v.started), "validation %s failed (%s); cordoning %s and choosing again",
		v.id, strings.Join(why, "; "), strings.Join(blame, ","))
	for _, n := range blame {
		rec.cordon[n] = "failed validation " + v.id + " (" + strings.Join(why, "; ") + ")"
		if !slices.Contains(j.Exclude, n) {
			j.Exclude = append(j.Exclude, n)
		}
	}
	if rec.rounds >= m.cfg.MaxValidations {
		m.finalFailLocked(en, fmt.Sprintf("%s (not recovered: %d validation rounds failed, last: %s)", rec.reason, rec.rounds, strings.Join(why, "; ")), now)
	}
	m.persistLocked(en)
	return append(acts, m.cordonsLocked(j, rec)...)
}

// killGang sends SIGKILL to every rank of a validation gang.
func killGang(m *jobManager, id string, nodes []string) action {
	return func(ctx context.Context) {
		errs := m.fanOut(ctx, nodes, func(string) *api.Command {
			return &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: id, Signal: "SIGKILL"}}}
		})
		for node, err := range errs {
			m.log.Debug("kill validation gang", "gang", id, "node", node, "err", err)
		}
	}
}

// endValidationLocked forgets a recovery's validation gang and kills what
// may be left of it.
func (m *jobManager) endValidationLocked(rec *recovery) []action {
	v := m.vals[rec.validation]
	if v == nil {
		return nil
	}
	delete(m.vals, v.id)
	var live []string
	for _, n := range v.nodes {
		if r := v.ranks[n]; r != nil && !r.exited {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return []action{killGang(m, v.id, live)}
}

// validationEvent applies a rank start or exit of a validation gang; it
// reports whether e belonged to one.
func (m *jobManager) validationEventLocked(e *api.Event) bool {
	v := m.vals[e.GetJob()]
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
		}
	}
	return true
}

// relaunchLocked starts the next attempt on the decision's placement from
// the latest complete checkpoint, and books the counters.
func (m *jobManager) relaunchLocked(en *jobEntry, rec *recovery, now time.Time) []action {
	j := en.job
	d := rec.decision
	prev := proto.Clone(j).(*api.Job)
	resume := m.resumeStepLocked(en)
	if rec.resume >= 0 {
		resume = rec.resume
	}
	lost := max(rec.stepAt-resume, 0)
	p := m.progressOf(j.GetId())
	if lost > 0 && p.attemptSteps > 0 {
		// The lost steps' time was counted useful when they ran.
		j.UsefulSeconds = max(j.GetUsefulSeconds()-float64(lost)*p.attemptUseful/float64(p.attemptSteps), 0)
	}
	j.LostSteps += lost
	j.Restarts++
	j.DowntimeSeconds += now.Sub(rec.since).Seconds()
	delete(m.recs, j.GetId())
	en.resume, en.resumeSet = resume, true
	act := m.startLocked(en, d.Placement, now)
	if act == nil {
		en.job = prev
		m.recs[j.GetId()] = rec
		return nil
	}
	j = en.job
	j.Step = resume
	p.step, p.attemptUseful, p.attemptSteps = resume, 0, 0
	m.persistLocked(en)
	m.recoveryEvent(j, api.Severity_SEVERITY_INFO, now.Sub(rec.since),
		"attempt %d running on %s from step %d (%d steps lost; failed at step %d): %s", j.GetAttempt(),
		strings.Join(d.Placement.Nodes(), ","), resume, lost, rec.stepAt, d.Reason)
	return []action{act}
}

// resumeStepLocked is the latest complete checkpoint: the highest step
// every rank of an attempt reported (CHECKPOINT events, rank status), or
// the checkpoint dir's `latest` marker where the server can read it,
// whichever is later.
func (m *jobManager) resumeStepLocked(en *jobEntry) int64 {
	j := en.job
	step := j.GetLastCheckpointStep()
	if l, ok := readLatest(j.GetCheckpointDir()); ok && l > step {
		step = l
	}
	return step
}

// checkpointExists checks step-N/ in a checkpoint dir the server can see;
// a dir it cannot see (on the nodes only) is taken on trust.
func checkpointExists(dir string, step int64) error {
	if dir == "" || step == 0 {
		return nil
	}
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("step-%d", step))); err != nil {
		return fmt.Errorf("no checkpoint of step %d in %s", step, dir)
	}
	return nil
}

// checkpointed records a rank's completed checkpoint.
func (m *jobManager) checkpointed(e *api.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en := m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	j := en.job
	if r := findRank(j, e.GetNode(), e.GetRank()); r == nil || (e.GetPid() != 0 && r.GetPid() != 0 && r.GetPid() != e.GetPid()) {
		return
	}
	if e.GetSeconds() > 0 {
		n := float64(j.GetCheckpoints())
		j.CheckpointSeconds = (j.GetCheckpointSeconds()*n + e.GetSeconds()) / (n + 1)
		j.Checkpoints++
	}
	p := m.progressOf(j.GetId())
	p.ckptAt = m.now()
	rs := p.ckpts[e.GetStep()]
	if rs == nil {
		rs = map[int32]bool{}
		p.ckpts[e.GetStep()] = rs
	}
	rs[e.GetRank()] = true
	if len(rs) >= jobGPUs(j) && e.GetStep() > j.GetLastCheckpointStep() {
		j.LastCheckpointStep = e.GetStep()
		for s := range p.ckpts {
			if s <= e.GetStep() {
				delete(p.ckpts, s)
			}
		}
	}
	m.persistLocked(en)
}

// priorGPUMTBF is the per-GPU mean time between job-interrupting failures
// assumed before the cluster has seen any: 419 unexpected interruptions in
// 54 days on 16,384 H100s (Llama 3 pre-training, Meta 2024), about 50,700
// GPU-hours. It counts as one failure of evidence, so the estimate moves
// to the cluster's own rate as failures accumulate.
const priorGPUMTBF = 50_700 * time.Hour

// gpuMTBFLocked estimates the per-GPU MTBF from the failures this cluster
// has seen (restarts and failed jobs) over the GPU-seconds its jobs ran,
// with the prior above as one pseudo-failure.
func (m *jobManager) gpuMTBFLocked(now time.Time) float64 {
	failures := 1.0
	exposure := priorGPUMTBF.Seconds()
	for _, en := range m.jobs {
		j := en.job
		failures += float64(j.GetRestarts())
		if j.GetState() == api.JobState_JOB_STATE_FAILED && j.GetAttempt() > 0 {
			failures++
		}
		exposure += j.GetAttainedGpuSeconds()
		if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStartUnixNano() > 0 {
			exposure += now.Sub(time.Unix(0, j.GetStartUnixNano())).Seconds() * float64(jobGPUs(j))
		}
	}
	return exposure / failures
}

// youngDaly is the checkpoint interval sqrt(2·C·MTBF) that minimises
// expected lost work for checkpoint cost C and mean time between failures.
func youngDaly(ckptSeconds, mtbfSeconds float64) float64 {
	if ckptSeconds <= 0 || mtbfSeconds <= 0 {
		return 0
	}
	return math.Sqrt(2 * ckptSeconds * mtbfSeconds)
}

// metricsLocked refreshes each running job's step, checkpoint, energy,
// useful time, goodput and advised checkpoint interval, and asks for a
// checkpoint (SIGUSR1) where the server drives a job's interval.
func (m *jobManager) metricsLocked(now time.Time) []action {
	var (
		acts  []action
		nodes map[string]*api.NodeStatus
		ranks map[string][]*api.RankStatus
	)
	gpuMTBF := m.gpuMTBFLocked(now)
	for _, en := range m.sortedLocked() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_RUNNING {
			if p := m.prog[j.GetId()]; p != nil && terminal(j.GetState()) {
				delete(m.prog, j.GetId())
			} else if p != nil {
				p.energy, p.at = map[string]uint64{}, time.Time{}
			}
			continue
		}
		if nodes == nil {
			nodes = map[string]*api.NodeStatus{}
			for _, n := range m.nodes() {
				nodes[n.GetRegistration().GetName()] = n
			}
			ranks = map[string][]*api.RankStatus{}
			if m.ranks != nil {
				for _, nr := range m.ranks("") {
					for _, r := range nr.Ranks {
						ranks[r.GetJob()] = append(ranks[r.GetJob()], r)
					}
				}
			}
		}
		changed := false
		p := m.progressOf(j.GetId())
		// Progress from the ranks' own reports of this attempt.
		var step, ckpt int64 = 0, -1
		seen := 0
		for _, r := range ranks[j.GetId()] {
			if r.GetAttempt() != 0 && r.GetAttempt() != j.GetAttempt() {
				continue
			}
			seen++
			step = max(step, r.GetStep())
			if ckpt < 0 || r.GetLastCheckpointStep() < ckpt {
				ckpt = r.GetLastCheckpointStep()
			}
		}
		if seen >= jobGPUs(j) && ckpt > j.GetLastCheckpointStep() {
			j.LastCheckpointStep, changed = ckpt, true
		}
		if l, ok := readLatest(j.GetCheckpointDir()); ok && l > j.GetLastCheckpointStep() {
			j.LastCheckpointStep, changed = l, true
		}
		if step > j.GetStep() {
			j.Step, changed = step, true
		}
		// Useful time: wall time in which the job advanced a step; a job
		// whose ranks report no steps counts its running time.
		if !p.at.IsZero() {
			dt := now.Sub(p.at).Seconds()
			switch {
			case seen == 0 && j.GetStep() == 0:
				j.UsefulSeconds += dt
				changed = true
			case j.GetStep() > p.step && !j.GetStalled():
				j.UsefulSeconds += dt
				p.attemptUseful += dt
				p.attemptSteps += j.GetStep() - p.step
				changed = true
			}
		}
		p.at, p.step = now, j.GetStep()
		if p.attemptSteps >= minCalibrationSteps && j.GetPlan() != nil {
			measured := p.attemptUseful / float64(p.attemptSteps)
			if before := j.GetPlan().GetMeasuredStepSeconds(); before == 0 || math.Abs(measured-before) > 0.01*before {
				calibrate(en.spec, j.Plan, measured)
				changed = true
			}
		}
		// Energy: deltas of the NVML energy counter of the job's GPUs.
		for _, jn := range j.GetPlacement() {
			n := nodes[jn.GetNode()]
			for _, g := range n.GetGpus() {
				if !slices.Contains(jn.GetGpus(), g.GetInfo().GetIndex()) || g.GetLast() == nil {
					continue
				}
				key := jn.GetNode() + "/" + strconv.Itoa(int(g.GetInfo().GetIndex()))
				cur := g.GetLast().GetEnergyMj()
				if prev, ok := p.energy[key]; ok && cur > prev {
					j.EnergyJoules += float64(cur-prev) / 1000
					changed = true
				}
				p.energy[key] = cur
			}
		}
		if first := j.GetFirstStartUnixNano(); first > 0 {
			if wall := now.Sub(time.Unix(0, first)).Seconds(); wall > 0 {
				j.Goodput = min(j.GetUsefulSeconds()/wall, 1)
			}
		}
		adv := youngDaly(j.GetCheckpointSeconds(), gpuMTBF/float64(max(jobGPUs(j), 1)))
		if math.Abs(adv-j.GetAdvisedCheckpointIntervalSeconds()) > 0.5 {
			j.AdvisedCheckpointIntervalSeconds, changed = adv, true
		}
		if en.spec != nil && en.spec.Checkpoint.IntervalAuto && j.GetStopping() == api.JobStop_JOB_STOP_NONE {
			every := time.Duration(adv * float64(time.Second))
			if every <= 0 {
				every = en.spec.Checkpoint.Interval
			}
			if p.ckptAt.IsZero() {
				p.ckptAt = time.Unix(0, j.GetStartUnixNano())
			}
			if now.Sub(p.ckptAt) >= every {
				p.ckptAt = now
				m.log.Info("asking for a checkpoint at the advised interval", "job", j.GetId(), "every", every)
				acts = append(acts, m.signalAction(j, "SIGUSR1"))
			}
		}
		if changed {
			m.persistLocked(en)
		}
	}
	return acts
}

// lostNodesLocked treats a node that holds live ranks but has not been
// connected for its grace (twice its heartbeat plus ReconnectGrace) as
// down. The failure detector does this for nodes it sees go; this catches
// nodes a restarted server loaded as disconnected that never came back.
func (m *jobManager) lostNodesLocked(now time.Time) {
	var holding map[string]bool
	for _, en := range m.jobs {
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
	for _, n := range m.nodes() {
		name := n.GetRegistration().GetName()
		known[name] = true
		if !holding[name] || n.GetConnected() {
			continue
		}
		hb := time.Duration(n.GetRegistration().GetHeartbeatIntervalMs()) * time.Millisecond
		if hb <= 0 {
			hb = defaultHeartbeat
		}
		grace := 2*hb + m.cfg.ReconnectGrace
		since := m.loadedAt
		if seen := time.Unix(0, n.GetLastSeenUnixNano()); seen.After(since) {
			since = seen
		}
		if now.Sub(since) > grace {
			m.nodeDownLocked(name, fmt.Sprintf("not reconnected within %s", grace.Round(time.Millisecond)), now)
		}
	}
	for name := range holding {
		if !known[name] && now.Sub(m.loadedAt) > m.cfg.ReconnectGrace {
			m.nodeDownLocked(name, "node unknown to the server", now)
		}
	}
}

// checkpoint asks every rank of a running job to checkpoint now (SIGUSR1).
func (m *jobManager) checkpoint(ctx context.Context, key string) (*api.Job, error) {
	m.mu.Lock()
	en, err := m.findLocked(key)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	j := en.job
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE {
		m.mu.Unlock()
		return nil, fmt.Errorf("job %s is %s: only a running job can checkpoint", j.GetId(), stateName(j.GetState()))
	}
	if j.GetCheckpointDir() == "" {
		m.mu.Unlock()
		return nil, fmt.Errorf("job %s has no checkpoint dir: set checkpoint.dir in its job file", j.GetId())
	}
	m.progressOf(j.GetId()).ckptAt = m.now()
	act := m.signalAction(j, "SIGUSR1")
	out := proto.Clone(j).(*api.Job)
	m.mu.Unlock()
	m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: out.GetId(), Message: "checkpoint requested (SIGUSR1 to every rank)", Step: out.GetStep()})
	act(ctx)
	return out, nil
}

// restart restarts a running job (or a failed one) from a checkpoint,
// optionally avoiding nodes: the same recovery a failure gets, without
// the max_restarts bound.
func (m *jobManager) restart(key, from string, exclude []string, who string) (*api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en, err := m.findLocked(key)
	if err != nil {
		return nil, err
	}
	j := en.job
	resume := int64(-1)
	switch from {
	case "", "latest":
	default:
		n, err := strconv.ParseInt(from, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--from-checkpoint %q: give latest or a step number", from)
		}
		if err := checkpointExists(j.GetCheckpointDir(), n); err != nil {
			return nil, fmt.Errorf("--from-checkpoint %d: %w", n, err)
		}
		resume = n
	}
	for _, n := range exclude {
		if !slices.ContainsFunc(m.nodes(), func(s *api.NodeStatus) bool { return s.GetRegistration().GetName() == n }) {
			return nil, fmt.Errorf("--exclude %s: unknown node: `gpuctl nodes` lists them", n)
		}
	}
	switch {
	case en.spec == nil:
		return nil, fmt.Errorf("job %s has no usable job file", j.GetId())
	case j.GetState() == api.JobState_JOB_STATE_RECOVERING:
		return nil, fmt.Errorf("job %s is already recovering (%s)", j.GetId(), j.GetReason())
	case j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() != api.JobStop_JOB_STOP_NONE:
		return nil, fmt.Errorf("job %s is being stopped (%s); restart it once that is done", j.GetId(), j.GetReason())
	case j.GetState() == api.JobState_JOB_STATE_FAILED && liveRanks(j) == 0 && len(j.GetPlacement()) > 0:
	case j.GetState() != api.JobState_JOB_STATE_RUNNING:
		return nil, fmt.Errorf("job %s is %s: only a running or failed job can be restarted", j.GetId(), stateName(j.GetState()))
	}
	now := m.now()
	// A restart the scheduler cannot place is refused before any rank is
	// touched: the job keeps running where it is.
	snap := m.snapshotLocked(now)
	req := m.recoverRequest(en, scheduler.Failure{Kind: scheduler.FailManual})
	req.Failure.Exclude = append(req.Failure.Exclude, exclude...)
	if d := scheduler.Recover(&snap, &req); d.Action == scheduler.GiveUp {
		return nil, fmt.Errorf("restart %s refused, the job is left as it is: %s", j.GetId(), d.Reason)
	}
	prev := proto.Clone(j).(*api.Job)
	reason := "restart requested by " + who
	if len(exclude) > 0 {
		reason += " excluding " + strings.Join(exclude, ",")
	}
	if j.GetState() == api.JobState_JOB_STATE_FAILED {
		j.State, j.EndUnixNano = api.JobState_JOB_STATE_RUNNING, 0
	}
	m.failLocked(en, scheduler.Failure{Kind: scheduler.FailManual, Exclude: exclude}, reason, now)
	if rec := m.recs[j.GetId()]; rec != nil {
		rec.resume = resume
	}
	if err := m.persistLocked(en); err != nil {
		en.job = prev
		delete(m.recs, j.GetId())
		return nil, fmt.Errorf("restart %s: %w", j.GetId(), err)
	}
	m.poke()
	out := proto.Clone(en.job).(*api.Job)
	if out.GetState() == api.JobState_JOB_STATE_FAILED {
		return out, fmt.Errorf("job %s: %s", out.GetId(), out.GetReason())
	}
	return out, nil
}

// stalled handles a stall the detector declared (Server.onStall): a job
// with stall_recovery auto restarts without the lagging ranks' nodes; for
// the others the advice goes to the events.
func (m *jobManager) stalled(st *api.Stall) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en := m.jobs[st.GetJob()]
	if en == nil {
		return
	}
	j := en.job
	var lagging []string
	for _, r := range st.GetLaggingRanks() {
		if r.GetNode() != "" && !slices.Contains(lagging, r.GetNode()) {
			lagging = append(lagging, r.GetNode())
		}
	}
	slices.Sort(lagging)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE || en.spec == nil {
		return
	}
	if en.spec.StallRecovery != jobspec.StallAuto {
		m.recoveryEvent(j, api.Severity_SEVERITY_WARNING, 0, "stall on lagging nodes %s; stall_recovery is manual: `gpuctl restart %s --exclude NODE`",
			strings.Join(lagging, ","), j.GetId())
		return
	}
	reason := fmt.Sprintf("NCCL stall on communicator %#x, lagging nodes %s: %s", st.GetComm(), strings.Join(lagging, ","), st.GetDiagnosis())
	m.failLocked(en, scheduler.Failure{Kind: scheduler.FailStall, Nodes: lagging}, reason, m.now())
	m.persistLocked(en)
	m.poke()
}

// reconcileRegistration applies a node's report of the ranks it runs when
// it (re)connects: a live rank of ours it no longer runs is gone (its exit
// was lost with a restarted nodemon).
func (m *jobManager) reconcileRegistration(node string) {
	var reg *api.NodeRegistration
	for _, n := range m.nodes() {
		if n.GetRegistration().GetName() == node {
			reg = n.GetRegistration()
		}
	}
	if len(reg.GetRunning()) == 0 {
		// Nothing reported (or a nodemon that does not report): exits of
		// ranks it had arrive as events, and a stop that finds no rank
		// gives it up after SIGKILL (stopsLocked).
		return
	}
	running := map[uint32]bool{}
	for _, r := range reg.GetRunning() {
		running[r.GetPid()] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for _, en := range m.sortedLocked() {
		j := en.job
		var gone []string
		for _, jn := range j.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if r.GetExited() || r.GetPid() == 0 || running[r.GetPid()] {
					continue
				}
				r.Exited, r.ExitCode, r.Signal = true, -1, "gone after reconnect"
				gone = append(gone, fmt.Sprintf("rank %d (pid %d)", r.GetRank(), r.GetPid()))
			}
		}
		if len(gone) == 0 {
			continue
		}
		if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() == api.JobStop_JOB_STOP_NONE {
			m.failLocked(en, scheduler.Failure{Kind: scheduler.FailRankExit},
				fmt.Sprintf("%s on %s no longer running when the node reconnected", strings.Join(gone, ", "), node), now)
		}
		m.persistLocked(en)
	}
	m.poke()
}
