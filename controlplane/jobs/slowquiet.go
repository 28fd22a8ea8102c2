package jobs

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
)

// SlowQuieted says whether an operator acknowledged a fail-slow finding of
// job j (for its attempt now) and until when one silenced it (0: not).
func SlowQuieted(j *api.Job, f *failslow.Finding, now time.Time) (acked bool, until int64) {
	key := f.Key()
	for _, q := range j.GetSlowQuiet() {
		if len(q.GetKeys()) > 0 {
			acked = acked || q.GetAttempt() == j.GetAttempt() && slices.Contains(q.GetKeys(), key)
			continue
		}
		if q.GetUntilUnixNano() > now.UnixNano() && (q.GetRank() < 0 || q.GetRank() == f.Rank) && (q.GetNode() == "" || q.GetNode() == f.Node) {
			until = max(until, q.GetUntilUnixNano())
		}
	}
	return acked, until
}

// QuietSlow acknowledges the fail-slow findings of a running job standing
// now (r.ForNs 0), or silences the job's findings for r.ForNs, narrowed
// to a rank or node when r names one. Either is stored with the job, so a
// new leader keeps it. It returns the job and the standing findings
// covered.
func (m *Manager) QuietSlow(ctx context.Context, r *api.QuietSlowRequest, who string) (*api.Job, []failslow.Finding, error) {
	var covered []failslow.Finding
	j, err := m.jobAnswer(ctx, func() (*api.Job, error) {
		en, err := m.findEntry(r.GetJob())
		if err != nil {
			return nil, err
		}
		j := en.job
		if !active(j) {
			return nil, fmt.Errorf("job %s is %s: only a running job's fail-slow findings can be acknowledged or silenced", j.GetId(), phaseOf(j))
		}
		if r.GetForNs() < 0 {
			return nil, fmt.Errorf("--for %s is negative: give how long the silence lasts, e.g. 30m", time.Duration(r.GetForNs()))
		}
		rank := int32(-1)
		if r.GetHasRank() {
			rank = r.GetRank()
			if rank < 0 || !slices.ContainsFunc(j.GetPlacement(), func(jn *api.JobNode) bool {
				return slices.ContainsFunc(jn.GetRanks(), func(jr *api.JobRank) bool { return jr.GetRank() == rank })
			}) {
				return nil, fmt.Errorf("--rank %d: job %s has no such rank: `gpuctl jobs %s` lists its ranks", rank, j.GetId(), j.GetId())
			}
		}
		if n := r.GetNode(); n != "" && !slices.ContainsFunc(j.GetPlacement(), func(jn *api.JobNode) bool { return jn.GetNode() == n }) {
			return nil, fmt.Errorf("--node %s runs no rank of job %s: `gpuctl jobs %s` lists its nodes", n, j.GetId(), j.GetId())
		}
		now := m.now()
		var keys []string
		covered = m.stall.slow.of(j.GetId(), rank, r.GetNode())
		for i := range covered {
			keys = append(keys, covered[i].Key())
		}
		q := &api.SlowQuiet{Rank: rank, Node: r.GetNode(), By: who, AtUnixNano: now.UnixNano()}
		if r.GetForNs() == 0 {
			if len(keys) == 0 {
				return nil, fmt.Errorf("job %s has no standing fail-slow finding%s to acknowledge: `gpuctl stalls %s` lists them", j.GetId(), narrowed(rank, r.GetNode()), j.GetId())
			}
			q = &api.SlowQuiet{Keys: keys, Attempt: j.GetAttempt(), Rank: rank, Node: r.GetNode(), By: who, AtUnixNano: now.UnixNano()}
		} else {
			q.UntilUnixNano = now.Add(time.Duration(r.GetForNs())).UnixNano()
		}
		// Keep what still counts: this attempt's acknowledgements and the
		// silences not yet over.
		j.SlowQuiet = slices.DeleteFunc(j.SlowQuiet, func(q *api.SlowQuiet) bool {
			if len(q.GetKeys()) > 0 {
				return q.GetAttempt() != j.GetAttempt()
			}
			return q.GetUntilUnixNano() <= now.UnixNano()
		})
		j.SlowQuiet = append(j.SlowQuiet, q)
		m.save(en)
		what := "acknowledged"
		if q.GetUntilUnixNano() > 0 {
			what = "silenced for " + time.Duration(r.GetForNs()).String()
		}
		m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_SLOW, Severity: api.Severity_SEVERITY_INFO, Job: j.GetId(), Node: r.GetNode(),
			Message: fmt.Sprintf("fail-slow findings%s %s by %s (%d standing)", narrowed(rank, r.GetNode()), what, who, len(covered)),
			Attrs:   map[string]string{"action": "quiet"}})
		return clone(j), nil
	})
	return j, covered, err
}

// narrowed names a rank and node a request narrows to, for messages.
func narrowed(rank int32, node string) string {
	s := ""
	if rank >= 0 {
		s += fmt.Sprintf(" on rank %d", rank)
	}
	if node != "" {
		s += " on " + node
	}
	return s
}
