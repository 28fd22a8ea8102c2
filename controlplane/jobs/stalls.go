package jobs

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
)

// StallTarget is a job the stall detector watches: running, not being
// stopped, with its current attempt and the stall_threshold of its job
// file (0 when it sets none).
type StallTarget struct {
	Job       string
	Attempt   uint32
	Threshold time.Duration
}

// StallTargets lists the jobs the stall detector should watch now.
func (m *Manager) StallTargets() []StallTarget { return m.View().targets }

// stallWatch applies the stall detector's passes for the owner: the
// stalls it declared, the jobs stalled now, and the fail-slow findings,
// acted on within the owner's SlowRule. It keeps what it knows of the
// standing fail-slow findings; the jobs and the current step are the
// owner's, reached through m. It runs on the owner's goroutine only.
type stallWatch struct {
	m *Manager
	// slow is what it keeps of the standing fail-slow findings.
	slow slowWatch
}

// targets lists the jobs the stall detector should watch, for the view.
func (sw *stallWatch) targets() []StallTarget {
	var out []StallTarget
	for _, en := range sw.m.sorted() {
		j := en.committed
		if j == nil || !active(j) || en.spec == nil {
			continue
		}
		out = append(out, StallTarget{Job: j.GetId(), Attempt: j.GetAttempt(), Threshold: en.spec.StallThreshold})
	}
	return out
}

// Stalls hands the owner one pass of the stall detector: the stalls it
// declared, the jobs stalled now, the events to store and the fail-slow
// findings standing now. It returns once they are applied and stored, so
// that a listing never shows a stall before its event and its job's flag.
func (m *Manager) Stalls(ctx context.Context, declared []*api.Stall, stalled map[string]bool, events []*api.Event, slow []failslow.Finding) error {
	done := make(chan struct{})
	m.in.post(msgStalls{declared: declared, stalled: stalled, events: events, slow: slow, done: done})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (sw *stallWatch) apply(msg msgStalls) {
	defer close(msg.done)
	for _, e := range msg.events {
		sw.m.raise(e)
	}
	for id, en := range sw.m.jobs {
		if en.job.GetStalled() != msg.stalled[id] {
			en.job.Stalled = msg.stalled[id]
			sw.m.save(en)
		}
	}
	for _, st := range msg.declared {
		sw.declared(st)
	}
	sw.findings(msg.slow, sw.m.now())
	if err := sw.m.commit(sw.m.pass); err != nil {
		sw.m.log.Error("commit stall changes; retrying on the next pass", "err", err)
	}
}

// declared handles a stall the detector declared: a job with
// stall_recovery auto restarts without the lagging ranks' nodes; for the
// others the advice goes to the events.
func (sw *stallWatch) declared(st *api.Stall) {
	en := sw.m.jobs[st.GetJob()]
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
	if !active(j) || en.spec == nil {
		return
	}
	if en.spec.StallRecovery != jobspec.StallAuto {
		sw.m.rec.event(j, api.Severity_SEVERITY_WARNING, 0, "stall on lagging nodes %s; stall_recovery is manual: `gpuctl restart %s --exclude NODE`",
			strings.Join(lagging, ","), j.GetId())
		return
	}
	reason := fmt.Sprintf("NCCL stall on communicator %#x, lagging nodes %s: %s", st.GetComm(), strings.Join(lagging, ","), st.GetDiagnosis())
	sw.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailStall, Nodes: lagging}, reason, sw.m.now())
}

// findings acts on the fail-slow findings standing now, under each
// job's slow_recovery and the bound (scheduler.DecideSlow): a finding of a
// job with slow_recovery auto that has stood for the hold restarts the job
// from its last checkpoint without the slow node, when the restart plan
// swaps it for a spare; otherwise, or past the bound, the finding only
// alerts, with an event saying why, once per finding and outcome.
func (sw *stallWatch) findings(fs []failslow.Finding, now time.Time) {
	states := sw.slow.update(fs, now)
	for i := range fs {
		f, st := &fs[i], states[i]
		en := sw.m.jobs[f.Job]
		if en == nil || en.spec == nil || !active(en.job) || sw.m.rec.recs[f.Job] != nil {
			continue
		}
		j := en.job
		acked, until := SlowQuieted(j, f, now)
		d := scheduler.DecideSlow(sw.m.cfg.SlowRule, scheduler.SlowCase{Auto: en.spec.SlowRecovery == jobspec.SlowAuto,
			Class: string(f.Class), Node: f.Node, Quiet: acked || until > 0,
			Since: st.seen.UnixNano(), Now: now.UnixNano(), Past: j.GetSlowExclusionsUnixNano()})
		switch d.Verdict {
		case scheduler.SlowBound:
			sw.say(st, f, "bound", api.Severity_SEVERITY_WARNING, "%s: not acted on: %s; `gpuctl restart %s --exclude %s` moves it now",
				f.Class, d.Reason, j.GetId(), f.Node)
		case scheduler.SlowExclude:
			// With no spare, a plan is tried again at most every
			// slowRetry, not on every pass.
			if st.said != "no-spare" || now.Sub(st.tried) >= slowRetry {
				st.tried = now
				sw.exclude(en, st, f, d, now)
			}
		}
	}
}

// slowWatch is what the owner keeps of the fail-slow findings: those
// standing after the detector's last pass, which an acknowledgement
// covers, and the state of each by key.
type slowWatch struct {
	standing []failslow.Finding
	byKey    map[string]*slowState
}

// update takes the findings standing now and returns their states in the
// same order, a new one first seen now; the states of findings no longer
// standing are forgotten.
func (w *slowWatch) update(fs []failslow.Finding, now time.Time) []*slowState {
	w.standing = fs
	states := make([]*slowState, len(fs))
	keep := make(map[string]*slowState, len(fs))
	for i := range fs {
		key := fs[i].Key()
		st := w.byKey[key]
		if st == nil {
			st = &slowState{seen: now}
		}
		states[i], keep[key] = st, st
	}
	w.byKey = keep
	return states
}

// of returns the standing findings of job, narrowed to a rank (negative:
// any) and a node (empty: any).
func (w *slowWatch) of(job string, rank int32, node string) []failslow.Finding {
	var fs []failslow.Finding
	for _, f := range w.standing {
		if f.Job == job && (rank < 0 || f.Rank == rank) && (node == "" || f.Node == node) {
			fs = append(fs, f)
		}
	}
	return fs
}

// slowState is what the owner keeps of a standing fail-slow finding: when
// it first saw it (the hold is timed on the owner's clock, not the
// nodes'), when it last planned a restart for it, and what it last
// announced, so that each outcome is announced once.
type slowState struct {
	seen, tried time.Time
	said        string
	// ckptAsked is when the job was asked to checkpoint before the
	// restart, and ckptFrom its latest checkpoint step then.
	ckptAsked time.Time
	ckptFrom  int64
}

// checkpointing says whether the restart still waits for the checkpoint
// it asked for: until a newer checkpoint is reported or slowCheckpointWait
// has passed (then the last one serves).
func (st *slowState) checkpointing(j *api.Job, now time.Time) bool {
	return !st.ckptAsked.IsZero() && j.GetLastCheckpointStep() <= st.ckptFrom && now.Sub(st.ckptAsked) < slowCheckpointWait
}

const (
	// slowRetry is how often a finding with no spare for its node is
	// planned again.
	slowRetry = 5 * time.Second
	// slowCheckpointWait bounds the wait for the checkpoint asked for
	// before a slow node is excluded.
	slowCheckpointWait = 2 * time.Minute
)

// exclude restarts a job without the node a fail-slow finding blames,
// through the recovery every failure takes, when the plan puts a spare in
// its place; a slow node is still a working one, so the job is never
// shrunk or given up for it. A job with a checkpoint dir is asked to
// checkpoint first, and restarted once that checkpoint is reported (or
// after slowCheckpointWait, from its last one).
func (sw *stallWatch) exclude(en *entry, st *slowState, f *failslow.Finding, d scheduler.SlowDecision, now time.Time) {
	j := en.job
	if st.checkpointing(j, now) {
		return
	}
	fail := scheduler.Failure{Kind: scheduler.FailSlow, Nodes: []string{d.Node}}
	snap := sw.m.placer.snapshot(now)
	req := sw.m.rec.request(en, fail)
	plan := scheduler.Recover(&snap, &req)
	if plan.Action != scheduler.ReplaceNodes && plan.Action != scheduler.Replan {
		sw.say(st, f, "no-spare", api.Severity_SEVERITY_WARNING, "%s: not acted on: no spare to take %s's place (%s: %s); the job keeps running there",
			f.Class, d.Node, plan.Action, plan.Reason)
		return
	}
	if j.GetCheckpointDir() != "" && st.ckptAsked.IsZero() {
		// Checkpoint first, so the restart loses as little as it can;
		// the job runs on, slowly, meanwhile.
		st.ckptAsked, st.ckptFrom = now, j.GetLastCheckpointStep()
		sw.m.prog.of(j.GetId()).CheckpointAt = now
		sw.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: j.GetId(), Step: j.GetStep(),
			Message: fmt.Sprintf("checkpoint requested (SIGUSR1 to every rank) before restarting without %s: %s", d.Node, d.Reason)})
		sw.m.launcher.signal(j, "SIGUSR1")
		return
	}
	j.SlowExclusionsUnixNano = append(j.SlowExclusionsUnixNano, now.UnixNano())
	rule := sw.m.cfg.SlowRule
	sw.say(st, f, "exclude", api.Severity_SEVERITY_WARNING, "%s: restarting from the last checkpoint without %s (automatic slow exclusion %d of at most %d in %s)",
		d.Reason, d.Node, len(j.SlowExclusionsUnixNano), rule.Max, rule.Window)
	sw.m.rec.fail(en, fail, "fail-slow: "+d.Reason, now)
}

// say raises an event about what was done with a fail-slow finding
// (attrs.action: exclude, bound or no-spare), once per finding and
// action.
func (sw *stallWatch) say(st *slowState, f *failslow.Finding, action string, sev api.Severity, format string, args ...any) {
	if st.said == action {
		return
	}
	st.said = action
	e := &api.Event{Kind: api.EventKind_EVENT_KIND_SLOW, Severity: sev, Job: f.Job, Node: f.Node,
		Message: fmt.Sprintf(format, args...), Attrs: map[string]string{"class": string(f.Class), "action": action}}
	if f.Rank >= 0 {
		e.Rank = f.Rank
		e.Attrs["rank"] = strconv.Itoa(int(f.Rank))
	}
	sw.m.log.Warn("fail-slow finding", "job", f.Job, "action", action, "msg", e.Message)
	sw.m.raise(e)
}
