package controlplane

import (
	"cmp"
	"context"
	"slices"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/metrics"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
)

// Slowness is what the fail-slow analysis says now, for the exporter
// (metrics.SlowSource).
func (s *Server) Slowness() metrics.Slowness {
	out := metrics.Slowness{Findings: map[string]int{}, Quiet: map[string]int{}, Lateness: map[string]map[int32]float64{}, Slowdown: s.slow.Slowdown()}
	for _, c := range failslow.Classes {
		out.Findings[string(c)] = 0
	}
	now := s.cfg.Now()
	v := s.jobs.View()
	for _, f := range s.slow.Findings() {
		if j, err := v.Find(f.Job); err == nil {
			if acked, until := jobs.SlowQuieted(j, &f, now); acked || until > 0 {
				out.Quiet[string(f.Class)]++
				continue
			}
		}
		out.Findings[string(f.Class)]++
	}
	for job, ranks := range s.slow.Lateness() {
		m := make(map[int32]float64, len(ranks))
		for r, d := range ranks {
			m[r] = d.Seconds()
		}
		out.Lateness[job] = m
	}
	return out
}

// SlowFindings returns the fail-slow findings standing now, of one job (id
// or name) or of every job when job is "".
func (s *Server) SlowFindings(job string) ([]*api.SlowFinding, error) {
	id, err := s.slowJobID(job)
	if err != nil {
		return nil, err
	}
	var out []*api.SlowFinding
	for _, f := range s.slow.Findings() {
		if id != "" && f.Job != id {
			continue
		}
		out = append(out, s.slowFinding(&f))
	}
	return out, nil
}

// RankLateness returns every running rank's rolling lateness, of one job
// (id or name) or of every job when job is "", by job then rank.
func (s *Server) RankLateness(job string) ([]*api.RankLateness, error) {
	id, err := s.slowJobID(job)
	if err != nil {
		return nil, err
	}
	var out []*api.RankLateness
	for j, ranks := range s.slow.Lateness() {
		if id != "" && j != id {
			continue
		}
		for r, d := range ranks {
			out = append(out, &api.RankLateness{Job: j, Rank: r, LateNs: int64(d)})
		}
	}
	slices.SortFunc(out, func(a, b *api.RankLateness) int {
		return cmp.Or(cmp.Compare(a.GetJob(), b.GetJob()), cmp.Compare(a.GetRank(), b.GetRank()))
	})
	return out, nil
}

// slowJobID is the id of the job key names, "" for every job.
func (s *Server) slowJobID(key string) (string, error) {
	if key == "" {
		return "", nil
	}
	j, err := s.jobs.Lookup(key)
	if err != nil {
		return "", err
	}
	return j.GetId(), nil
}

// slowFinding is a finding as the API lists it, with its job's
// acknowledgement and silence.
func (s *Server) slowFinding(f *failslow.Finding) *api.SlowFinding {
	out := &api.SlowFinding{Job: f.Job, Class: string(f.Class), Rank: f.Rank, Node: f.Node, Comm: int32(f.Comm),
		SinceUnixNano: f.Since, LateNs: int64(f.Late), Slowdown: f.Slowdown, Evidence: f.Evidence}
	if j, err := s.jobs.View().Find(f.Job); err == nil {
		out.Acked, out.SilencedUntilUnixNano = jobs.SlowQuieted(j, f, s.cfg.Now())
	}
	return out
}

// quietSlow answers gpuctl stalls ack and silence.
func (s *Server) quietSlow(ctx context.Context, c *call) error {
	j, covered, err := s.jobs.QuietSlow(ctx, c.req.GetQuietSlow(), c.caller.Name)
	if err != nil {
		return c.fail("%v", err)
	}
	r := &api.QuietSlowResponse{Job: j}
	for i := range covered {
		r.Covered = append(r.Covered, s.slowFinding(&covered[i]))
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_QuietSlow{QuietSlow: r}})
}
