package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// The Philly trace comes from Microsoft's Philly GPU clusters, Sept–Dec 2017:
// Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
// Training Workloads", USENIX ATC 2019. The multi-GPU subset read here is
// analysis/jobs.json of github.com/marwage/philly-traces, licensed Creative
// Commons Attribution 4.0: a JSON list of
//
//	{"id", "num_gpus", "runtime" (minutes), "submitted_time": "2006-01-02 15:04:05",
//	 "attempts": [{"start_time", "end_time"}, ...]}
//
// Every attempt but the last ended in a failure. Its "runtime" runs from
// the first start to the last end, gaps included, so Runtime is taken from
// the attempts instead: the sum of their durations.
const phillyTime = "2006-01-02 15:04:05"

type phillyAttempt struct {
	Start string `json:"start_time"`
	End   string `json:"end_time"`
}

type phillyJob struct {
	ID        string          `json:"id"`
	GPUs      *int            `json:"num_gpus"`
	Runtime   float64         `json:"runtime"`
	Submitted string          `json:"submitted_time"`
	Attempts  []phillyAttempt `json:"attempts"`
}

// ReadPhilly reads the Philly JSON trace. Submit times become seconds since
// the earliest submission (timestamps are read as UTC; only differences
// matter). Errors name the record index and job id.
func ReadPhilly(r io.Reader) ([]Job, error) {
	var raw []json.RawMessage
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return nil, fmt.Errorf("philly trace: want a JSON list of jobs: %w", err)
	}
	jobs := make([]Job, 0, len(raw))
	submits := make([]time.Time, 0, len(raw))
	for i, m := range raw {
		var pj phillyJob
		if err := json.Unmarshal(m, &pj); err != nil {
			return nil, fmt.Errorf("philly record %d: %w", i, err)
		}
		j, sub, err := pj.job()
		if err != nil {
			return nil, fmt.Errorf("philly record %d: %w", i, err)
		}
		jobs = append(jobs, j)
		submits = append(submits, sub)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("philly trace has no jobs")
	}
	first := submits[0]
	for _, t := range submits {
		if t.Before(first) {
			first = t
		}
	}
	for i := range jobs {
		jobs[i].Submit = int64(submits[i].Sub(first) / time.Second)
		jobs[i].Clock = submits[i]
	}
	if err := sortJobs(jobs); err != nil {
		return nil, fmt.Errorf("philly trace: %w", err)
	}
	return jobs, nil
}

func (pj *phillyJob) job() (Job, time.Time, error) {
	if pj.ID == "" {
		return Job{}, time.Time{}, fmt.Errorf("missing id")
	}
	if pj.GPUs == nil {
		return Job{}, time.Time{}, fmt.Errorf("job %s: missing num_gpus", pj.ID)
	}
	sub, err := time.Parse(phillyTime, pj.Submitted)
	if err != nil {
		return Job{}, time.Time{}, fmt.Errorf("job %s: submitted_time %q: want %q", pj.ID, pj.Submitted, phillyTime)
	}
	j := Job{ID: pj.ID, GPUs: *pj.GPUs}
	if len(pj.Attempts) == 0 {
		// No attempts recorded: trust the runtime field.
		if math.IsNaN(pj.Runtime) || pj.Runtime <= 0 || pj.Runtime > 1e9 {
			return Job{}, time.Time{}, fmt.Errorf("job %s: no attempts and runtime %v minutes", pj.ID, pj.Runtime)
		}
		j.Runtime = int64(math.Round(pj.Runtime * 60))
	}
	for k, a := range pj.Attempts {
		s, err1 := time.Parse(phillyTime, a.Start)
		e, err2 := time.Parse(phillyTime, a.End)
		if err1 != nil || err2 != nil {
			return Job{}, time.Time{}, fmt.Errorf("job %s: attempt %d: times %q and %q: want %q", pj.ID, k, a.Start, a.End, phillyTime)
		}
		if e.Before(s) {
			return Job{}, time.Time{}, fmt.Errorf("job %s: attempt %d ends (%s) before it starts (%s)", pj.ID, k, a.End, a.Start)
		}
		j.Runtime += int64(e.Sub(s) / time.Second)
		if k < len(pj.Attempts)-1 {
			j.Failures = append(j.Failures, j.Runtime)
		}
	}
	// Zero-length failed attempts add no distinct offset; keep the first.
	j.Failures = dedupe(j.Failures)
	if err := j.validate(); err != nil {
		return Job{}, time.Time{}, err
	}
	return j, sub, nil
}

func dedupe(xs []int64) []int64 {
	out := xs[:0]
	for i, x := range xs {
		if i == 0 || x != xs[i-1] {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
