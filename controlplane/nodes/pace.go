package nodes

import (
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler/pace"
)

// PaceEvery is how often the detector judges whether nodes should send
// telemetry less often (scheduler/pace).
const PaceEvery = time.Second

// pacing is the registry's telemetry pace: the rule's memory, used by the
// detector's goroutine alone, and the factor asked for now, read by new
// sessions and the status.
type pacing struct {
	rule   *pace.Pacer
	judged time.Time
	shed   uint64 // batches and GPU samples shed as of the last judgment
}

// Pace is how many times less often than their own interval nodes are
// asked to send telemetry now (1: their own pace).
func (r *Registry) Pace() uint32 {
	if f := r.paceFactor.Load(); f > 1 {
		return f
	}
	return 1
}

// judgePace runs the pace rule once every PaceEvery, on how late
// heartbeats are heard (lag), how full the ingest queue is and what was
// shed since, and tells every node that honours it when the factor
// changes.
func (r *Registry) judgePace(now time.Time, lag time.Duration) {
	p := &r.pacing
	if !p.judged.IsZero() && now.Sub(p.judged) < PaceEvery {
		return
	}
	p.judged = now
	r.queue.mu.Lock()
	fill := float64(len(r.queue.waiting)) / float64(max(r.cfg.IngestQueue, 1))
	shed := r.queue.shed.Batches + r.queue.shed.GPUSamples
	r.queue.mu.Unlock()
	factor, changed, why := p.rule.Update(now, pace.Signals{Late: lag, QueueFill: fill, Shed: shed - min(shed, p.shed)})
	p.shed = shed
	if !changed {
		return
	}
	r.paceFactor.Store(factor)
	r.log.Warn("telemetry pace", "factor", factor, "why", why)
	r.mu.RLock()
	var sessions []*session
	for _, e := range r.nodes {
		if e.session != nil && e.session.uses(api.FeatureTelemetryPace) {
			sessions = append(sessions, e.session)
		}
	}
	r.mu.RUnlock()
	for _, ns := range sessions {
		go ns.sendPace(factor)
	}
}

// sendPace tells the node the pace to send its telemetry at; a node that
// misses it (its session ending) hears the pace at its next registration.
func (ns *session) sendPace(factor uint32) {
	if err := ns.send(&api.ServerMessage{Body: &api.ServerMessage_Pace{Pace: &api.TelemetryPace{Factor: factor}}}); err != nil {
		ns.r.log.Debug("send telemetry pace", "node", ns.name, "err", err)
	}
}
