package api

import (
	"slices"
	"strings"
	"testing"
)

func TestFindJob(t *testing.T) {
	job := func(id, name string, s JobState) *Job { return &Job{Id: id, Name: name, State: s} }
	run, done := JobState_JOB_STATE_RUNNING, JobState_JOB_STATE_SUCCEEDED
	tests := []struct {
		name    string
		jobs    []*Job
		key     string
		want    string
		wantErr string
	}{
		{"by id", []*Job{job("j-1", "a", run), job("j-2", "j-1", run)}, "j-1", "j-1", ""},
		{"the only one named", []*Job{job("j-1", "a", done)}, "a", "j-1", ""},
		{"the live one of a reused name", []*Job{job("j-1", "a", done), job("j-2", "a", run), job("j-3", "a", done)}, "a", "j-2", ""},
		{"two live of one name", []*Job{job("j-1", "a", run), job("j-2", "a", run)}, "a", "", "matches j-1 (running), j-2 (running): name one by id"},
		{"only ended ones", []*Job{job("j-1", "a", done), job("j-2", "a", done)}, "a", "", "name one by id"},
		{"none", []*Job{job("j-1", "a", run)}, "b", "", `unknown job "b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := FindJob(tt.jobs, tt.key)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FindJob(%q) = %v, %v; want error with %q", tt.key, j.GetId(), err, tt.wantErr)
				}
				return
			}
			if err != nil || j.GetId() != tt.want {
				t.Fatalf("FindJob(%q) = %v, %v; want %s", tt.key, j.GetId(), err, tt.want)
			}
		})
	}
}

func TestMatchJobsListsEveryRun(t *testing.T) {
	jobs := []*Job{{Id: "j-1", Name: "a"}, {Id: "j-2", Name: "b"}, {Id: "j-3", Name: "a"}}
	got := MatchJobs(jobs, "a")
	if len(got) != 2 || got[0].GetId() != "j-1" || got[1].GetId() != "j-3" {
		t.Fatalf("MatchJobs(a) = %v", got)
	}
}

func TestOldestFirst(t *testing.T) {
	jobs := []*Job{{Id: "j-c", SubmitUnixNano: 2}, {Id: "j-b", SubmitUnixNano: 1}, {Id: "j-a", SubmitUnixNano: 2}, {Id: "j-d", SubmitUnixNano: 0}}
	slices.SortFunc(jobs, OldestFirst)
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.GetId())
	}
	if got := strings.Join(ids, " "); got != "j-d j-b j-a j-c" {
		t.Errorf("order %s, want j-d j-b j-a j-c (by submission, then id)", got)
	}
}
