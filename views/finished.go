package views

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gpuctl/gpuctl/scheduler/trace"
)

// FinishedJobs reads the succeeded jobs of a `gpuctl jobs -o json`
// document as a trace, to learn runtimes from: each ran as long as its
// attempts together, and was submitted when it was (seconds from the
// first submission).
func FinishedJobs(r io.Reader) ([]trace.Job, error) {
	var doc struct {
		Jobs []JobJSON `json:"jobs"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a `gpuctl jobs -o json` document: %w", err)
	}
	var jobs []trace.Job
	var first int64
	for _, j := range doc.Jobs {
		if j.State != "succeeded" || j.SubmitTime == nil {
			continue
		}
		var ran float64
		for _, a := range j.Attempts {
			if a.StartTime != nil && a.EndTime != nil {
				ran += a.EndTime.Sub(*a.StartTime).Seconds()
			}
		}
		if ran < 1 {
			continue
		}
		tenant := ""
		if j.Tenant != nil {
			tenant = *j.Tenant
		}
		sub := j.SubmitTime.Unix()
		if len(jobs) == 0 || sub < first {
			first = sub
		}
		jobs = append(jobs, trace.Job{ID: j.ID, Name: j.Name, Submit: sub, GPUs: max(j.GPUs, 1), Runtime: int64(ran), Tenant: tenant,
			Clock: j.SubmitTime.UTC()})
	}
	if len(jobs) == 0 {
		return nil, errors.New("no succeeded job to learn from")
	}
	for i := range jobs {
		jobs[i].Submit -= first
	}
	return jobs, nil
}
