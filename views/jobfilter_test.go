package views

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestJobFilter(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	old := now.Add(-2 * FinishedShownFor).UnixNano()
	jobs := []*api.Job{
		{Id: "j-1", Name: "a", State: api.JobState_JOB_STATE_SUCCEEDED, EndUnixNano: old},
		{Id: "j-2", Name: "a", State: api.JobState_JOB_STATE_RUNNING, Tenant: "x"},
		{Id: "j-3", Name: "b", State: api.JobState_JOB_STATE_PENDING},
	}
	tests := []struct {
		name    string
		f       JobFilter
		want    string
		wantErr string
	}{
		{"default hides what ended long ago", JobFilter{}, "j-2 j-3", ""},
		{"--all", JobFilter{All: true}, "j-1 j-2 j-3", ""},
		{"a name lists every run of it", JobFilter{Names: []string{"a"}}, "j-1 j-2", ""},
		{"by id", JobFilter{Names: []string{"j-3"}}, "j-3", ""},
		{"state", JobFilter{States: []string{"succeeded"}}, "j-1", ""},
		{"tenant", JobFilter{Tenant: "x"}, "j-2", ""},
		{"unknown state", JobFilter{States: []string{"done"}}, "", `--state "done": use pending`},
		{"unknown name", JobFilter{Names: []string{"c"}}, "", `no job with id or name "c"; known: j-1 (a), j-2 (a), j-3 (b)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f.Apply(jobs, now)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			var ids []string
			for _, j := range got {
				ids = append(ids, j.GetId())
			}
			if err != nil || strings.Join(ids, " ") != tt.want {
				t.Fatalf("got %v, %v; want %s", ids, err, tt.want)
			}
			for _, n := range tt.f.Names {
				if m := api.MatchJobs(jobs, n); len(m) != len(got) {
					t.Errorf("%s: filter shows %d, MatchJobs %d", n, len(got), len(m))
				}
			}
		})
	}
}
