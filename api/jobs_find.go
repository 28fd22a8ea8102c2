package api

import (
	"cmp"
	"fmt"
	"strings"
)

// FindJob is the one answer to "which job does key mean", for gpuctl serve,
// its standby, the CLI and the console: the job whose id is key; else the
// only job named key; else, of several named so, the only one that has not
// ended (a name is reused once its job is over). Several live jobs of one
// name, or only ended ones, are ambiguous: the error lists them by id.
func FindJob(jobs []*Job, key string) (*Job, error) {
	var named, live []*Job
	for _, j := range jobs {
		if j.GetId() == key {
			return j, nil
		}
		if j.GetName() == key {
			named = append(named, j)
			if !j.GetState().Ended() {
				live = append(live, j)
			}
		}
	}
	switch {
	case len(named) == 0:
		return nil, fmt.Errorf("unknown job %q: `gpuctl jobs` lists them", key)
	case len(named) == 1:
		return named[0], nil
	case len(live) == 1:
		return live[0], nil
	}
	ids := make([]string, len(named))
	for i, j := range named {
		ids[i] = j.GetId() + " (" + j.GetState().Short() + ")"
	}
	return nil, fmt.Errorf("job name %q matches %s: name one by id", key, strings.Join(ids, ", "))
}

// MatchJobs is every job whose id or name is key, in the order given: a
// listing by name shows every run of that name.
func MatchJobs(jobs []*Job, key string) []*Job {
	var out []*Job
	for _, j := range jobs {
		if j.Is(key) {
			out = append(out, j)
		}
	}
	return out
}

// Is reports whether key names j: its id or its name.
func (j *Job) Is(key string) bool { return j.GetId() == key || j.GetName() == key }

// OldestFirst is the one order of job listings, for gpuctl serve's view of
// its jobs and for a client's watch cache: by submission, then by id.
func OldestFirst(a, b *Job) int {
	return cmp.Or(cmp.Compare(a.GetSubmitUnixNano(), b.GetSubmitUnixNano()), strings.Compare(a.GetId(), b.GetId()))
}
