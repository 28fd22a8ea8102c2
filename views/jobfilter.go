package views

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// JobFilter is what `gpuctl jobs` shows: the named jobs (every run of a
// name, as api.MatchJobs), or every job but those finished more than a
// day ago (as squeue), narrowed by state and tenant.
type JobFilter struct {
	Names  []string
	States []string
	Tenant string
	All    bool
}

// FinishedShownFor is how long a finished job stays in `gpuctl jobs`
// without --all.
const FinishedShownFor = 24 * time.Hour

// Apply keeps the jobs f shows, in order; a name that matches no job is
// an error that lists the jobs there are.
func (f JobFilter) Apply(jobs []*api.Job, now time.Time) ([]*api.Job, error) {
	for _, s := range f.States {
		if !slices.Contains(JobStateNames(), s) {
			return nil, fmt.Errorf("--state %q: use %s", s, strings.Join(JobStateNames(), ", "))
		}
	}
	if len(f.Names) > 0 {
		var known []string
		matched := map[string]bool{}
		var out []*api.Job
		for _, j := range jobs {
			known = append(known, j.GetId()+" ("+j.GetName()+")")
			for _, n := range f.Names {
				if j.Is(n) {
					matched[n] = true
					out = append(out, j)
					break
				}
			}
		}
		var missing []string
		for _, n := range f.Names {
			if !matched[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return nil, unknownJobs(missing, known)
		}
		jobs = out
	}
	var out []*api.Job
	for _, j := range jobs {
		state := JobStateName(j.GetState())
		switch {
		case len(f.States) > 0 && !slices.Contains(f.States, state):
		case f.Tenant != "" && j.GetTenant() != f.Tenant:
		case len(f.Names) == 0 && !f.All && len(f.States) == 0 && j.GetState().Ended() &&
			j.GetEndUnixNano() != 0 && now.Sub(time.Unix(0, j.GetEndUnixNano())) > FinishedShownFor:
		default:
			out = append(out, j)
		}
	}
	return out, nil
}

// unknownJobs says which names matched no job and which jobs there are.
func unknownJobs(missing, known []string) error {
	list := "there are none"
	switch {
	case len(known) > 10:
		list = "known: " + strings.Join(known[len(known)-10:], ", ") + fmt.Sprintf(" and %d older", len(known)-10)
	case len(known) > 0:
		list = "known: " + strings.Join(known, ", ")
	}
	return fmt.Errorf("no job with id or name %s; %s (`gpuctl jobs --all` lists them)", strings.Join(Quoted(missing), ", "), list)
}

// Quoted quotes each of ss, for naming what matched nothing in an error.
func Quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}
