package app

import (
	"fmt"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// SlowRefresh is how often the console asks for the fail-slow findings
// and the ranks' lateness (ListStalls): they change with every analysis
// pass, too often for the watch.
const SlowRefresh = 2 * time.Second

// Slow is what the console last heard of fail-slow: the findings standing
// and every running rank's lateness.
type Slow struct {
	Findings []*api.SlowFinding
	late     map[string]map[int32]time.Duration
}

// NewSlow indexes a ListStalls answer.
func NewSlow(r *api.ListStallsResponse) Slow {
	s := Slow{Findings: r.GetSlow(), late: map[string]map[int32]time.Duration{}}
	for _, l := range r.GetLateness() {
		if s.late[l.GetJob()] == nil {
			s.late[l.GetJob()] = map[int32]time.Duration{}
		}
		s.late[l.GetJob()][l.GetRank()] = time.Duration(l.GetLateNs())
	}
	return s
}

// SlowMsg carries a ListStalls answer to the root model.
type SlowMsg struct {
	Resp *api.ListStallsResponse
	Err  error
}

// Lateness is rank's rolling lateness in job, false when the server has
// none (too few collectives yet, or an older server).
func (s *Slow) Lateness(job string, rank int32) (time.Duration, bool) {
	d, ok := s.late[job][rank]
	return d, ok
}

// SlowRank is the compute-slow finding on rank of job, or nil.
func (s *Slow) SlowRank(job string, rank int32) *api.SlowFinding {
	for _, f := range s.Findings {
		if f.GetJob() == job && f.GetClass() == "compute-slow" && f.GetRank() == rank {
			return f
		}
	}
	return nil
}

// SlowText is how the console writes one finding; the Stalls view's rows,
// its detail and the banner all take it from here.
type SlowText struct {
	// Kind is short: slow rank, slow link, slow job.
	Kind string
	// Who is the rank and node, the node, or every rank.
	Who string
	// Size is how late or how much slower.
	Size     string
	Evidence string
}

// FindingText writes f.
func FindingText(f *api.SlowFinding) SlowText {
	t := SlowText{Kind: f.GetClass(), Who: "every rank", Size: fmt.Sprintf("%.2fx", f.GetSlowdown()), Evidence: api.EscapeText(f.GetEvidence())}
	switch f.GetClass() {
	case "compute-slow":
		t.Kind, t.Who = "slow rank", fmt.Sprintf("r%d@%s", f.GetRank(), f.GetNode())
		if f.GetLateNs() > 0 {
			t.Size = Late(time.Duration(f.GetLateNs())) + " late"
		}
	case "communication-slow":
		t.Kind, t.Who = "slow link", fmt.Sprintf("comm #%d", f.GetComm())
		if f.GetNode() != "" {
			t.Who = fmt.Sprintf("%s comm #%d", f.GetNode(), f.GetComm())
		}
	case "job-wide":
		t.Kind = "slow job"
	}
	return t
}

// Late renders a lateness in milliseconds, as a person compares them.
func Late(d time.Duration) string {
	if d >= 10*time.Second {
		return Duration(d)
	}
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}

// SlowGPU is the node and GPU of a compute-slow finding's rank, from the
// job's placement; false when the finding names no rank or the rank is
// not placed.
func SlowGPU(j *api.Job, f *api.SlowFinding) (node string, gpu int, ok bool) {
	if f.GetClass() != "compute-slow" {
		return "", 0, false
	}
	for _, pn := range j.GetPlacement() {
		for _, r := range pn.GetRanks() {
			if r.GetRank() == f.GetRank() {
				return pn.GetNode(), int(r.GetGpu()), true
			}
		}
	}
	return "", 0, false
}

// SlowJump is the `:` command that opens where a finding points: the
// slow rank's GPU, the slow link's node flows, or the job.
func SlowJump(j *api.Job, f *api.SlowFinding) string {
	if node, gpu, ok := SlowGPU(j, f); ok {
		return fmt.Sprintf("gpu %s %d", node, gpu)
	}
	if f.GetClass() == "communication-slow" && f.GetNode() != "" {
		return "flows " + f.GetNode()
	}
	return "job " + f.GetJob()
}
