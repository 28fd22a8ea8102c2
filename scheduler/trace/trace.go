// Package trace reads job traces for the scheduler's simulator: the public
// Philly trace (JSON) and a simple CSV format.
package trace

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Job is one job of a trace.
type Job struct {
	ID string
	// Submit is seconds since the trace's first submission (Philly) or as
	// written (CSV).
	Submit int64
	GPUs   int
	// Runtime is the job's total recorded execution in seconds, failed
	// attempts included.
	Runtime int64
	// Failures are the execution offsets (seconds of running, not wall
	// time) at which an attempt failed; strictly increasing, below Runtime.
	Failures []int64
	Tenant   string
	Priority int
	// Name is the job's name, when the trace keeps one.
	Name string
	// Clock is the submission's wall-clock time, when the trace records
	// one (zero otherwise): when in the day it was submitted.
	Clock time.Time
}

// validate checks what the simulator relies on.
func (j *Job) validate() error {
	switch {
	case j.ID == "":
		return fmt.Errorf("job has no id")
	case j.GPUs < 1:
		return fmt.Errorf("job %s asks for %d GPUs; it needs at least 1", j.ID, j.GPUs)
	case j.Runtime < 1:
		return fmt.Errorf("job %s has runtime %d s; it needs at least 1", j.ID, j.Runtime)
	case j.Submit < 0:
		return fmt.Errorf("job %s has negative submit time %d", j.ID, j.Submit)
	}
	prev := int64(-1)
	for _, f := range j.Failures {
		if f <= prev || f >= j.Runtime {
			return fmt.Errorf("job %s: failure offsets must increase and stay below runtime %d s, got %v", j.ID, j.Runtime, j.Failures)
		}
		prev = f
	}
	return nil
}

// sortJobs orders jobs by submit time, then id, and rejects duplicate ids.
func sortJobs(jobs []Job) error {
	slices.SortStableFunc(jobs, func(a, b Job) int {
		if a.Submit != b.Submit {
			if a.Submit < b.Submit {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	seen := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		if seen[j.ID] {
			return fmt.Errorf("job id %s appears twice; ids must be unique", j.ID)
		}
		seen[j.ID] = true
	}
	return nil
}

// Load reads a trace file: .json as Philly, .csv as CSV.
func Load(path string) ([]Job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	var jobs []Job
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".json":
		jobs, err = ReadPhilly(f)
	case ".csv":
		jobs, err = ReadCSV(f)
	default:
		return nil, fmt.Errorf("trace %s: unknown extension %q; use .json (Philly) or .csv", path, ext)
	}
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return jobs, nil
}
