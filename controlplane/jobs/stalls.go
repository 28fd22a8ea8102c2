package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
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

func (m *Manager) stallTargets() []StallTarget {
	var out []StallTarget
	for _, en := range m.sorted() {
		j := en.committed
		if j == nil || !active(j) || en.spec == nil {
			continue
		}
		out = append(out, StallTarget{Job: j.GetId(), Attempt: j.GetAttempt(), Threshold: en.spec.StallThreshold})
	}
	return out
}

// Stalls hands the owner one pass of the stall detector: the stalls it
// declared, the jobs stalled now, and the events to store. It returns once
// they are applied and stored, so that a listing never shows a stall
// before its event and its job's flag.
func (m *Manager) Stalls(ctx context.Context, declared []*api.Stall, stalled map[string]bool, events []*api.Event) error {
	done := make(chan struct{})
	m.in.post(msgStalls{declared: declared, stalled: stalled, events: events, done: done})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) stalls(msg msgStalls) {
	defer close(msg.done)
	for _, e := range msg.events {
		m.raise(e)
	}
	m.stalled = msg.stalled
	for id, en := range m.jobs {
		if en.job.GetStalled() != msg.stalled[id] {
			en.job.Stalled = msg.stalled[id]
			m.save(en)
		}
	}
	for _, st := range msg.declared {
		m.stalledJob(st)
	}
	if err := m.commit(m.pass); err != nil {
		m.log.Error("commit stall changes; retrying on the next pass", "err", err)
	}
}

// stalledJob handles a stall the detector declared: a job with
// stall_recovery auto restarts without the lagging ranks' nodes; for the
// others the advice goes to the events.
func (m *Manager) stalledJob(st *api.Stall) {
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
	if !active(j) || en.spec == nil {
		return
	}
	if en.spec.StallRecovery != jobspec.StallAuto {
		m.recoveryEvent(j, api.Severity_SEVERITY_WARNING, 0, "stall on lagging nodes %s; stall_recovery is manual: `gpuctl restart %s --exclude NODE`",
			strings.Join(lagging, ","), j.GetId())
		return
	}
	reason := fmt.Sprintf("NCCL stall on communicator %#x, lagging nodes %s: %s", st.GetComm(), strings.Join(lagging, ","), st.GetDiagnosis())
	m.fail(en, scheduler.Failure{Kind: scheduler.FailStall, Nodes: lagging}, reason, m.now())
}
