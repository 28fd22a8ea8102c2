package views

import (
	"strings"
	"testing"
)

func TestFinishedJobs(t *testing.T) {
	const doc = `{"jobs":[
	{"id":"j-1","name":"a","tenant":"ml","state":"succeeded","gpus":8,"submit_time":"2026-01-01T10:00:00Z",
	 "attempts":[{"start_time":"2026-01-01T10:01:00Z","end_time":"2026-01-01T10:11:00Z"},{"start_time":"2026-01-01T10:20:00Z","end_time":"2026-01-01T10:25:00Z"}]},
	{"id":"j-2","name":"b","state":"failed","gpus":8,"submit_time":"2026-01-01T09:00:00Z",
	 "attempts":[{"start_time":"2026-01-01T09:01:00Z","end_time":"2026-01-01T09:11:00Z"}]},
	{"id":"j-3","name":"c","state":"succeeded","gpus":0,"submit_time":"2026-01-01T09:30:00Z",
	 "attempts":[{"start_time":"2026-01-01T09:31:00Z","end_time":"2026-01-01T09:32:00Z"}]},
	{"id":"j-4","name":"d","state":"succeeded","gpus":4,"submit_time":"2026-01-01T09:40:00Z","attempts":[{"start_time":"2026-01-01T09:41:00Z"}]}
	]}`
	jobs, err := FinishedJobs(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("%d jobs, want the 2 succeeded ones that ran: %+v", len(jobs), jobs)
	}
	a, c := jobs[0], jobs[1]
	if a.ID != "j-1" || a.Runtime != 900 || a.Submit != 1800 || a.GPUs != 8 || a.Tenant != "ml" {
		t.Errorf("j-1: %+v, want 900 s run, submitted 1800 s after the first, 8 GPUs, tenant ml", a)
	}
	if c.ID != "j-3" || c.Runtime != 60 || c.Submit != 0 || c.GPUs != 1 {
		t.Errorf("j-3: %+v, want 60 s run, submitted first, at least 1 GPU", c)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"not json", "jobs", "not a `gpuctl jobs -o json` document"},
		{"nothing succeeded", `{"jobs":[{"id":"j-2","state":"failed"}]}`, "no succeeded job to learn from"},
	} {
		if _, err := FinishedJobs(strings.NewReader(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func FuzzFinishedJobs(f *testing.F) {
	f.Add(`{"jobs":[{"id":"j-1","state":"succeeded","gpus":8,"submit_time":"2026-01-01T10:00:00Z","attempts":[{"start_time":"2026-01-01T10:01:00Z","end_time":"2026-01-01T10:11:00Z"}]}]}`)
	f.Add(`{"jobs":[]}`)
	f.Add(`{"jobs":[{"state":"succeeded","submit_time":"0001-01-01T00:00:00Z","attempts":[{"start_time":"9999-01-01T00:00:00Z","end_time":"0001-01-01T00:00:00Z"}]}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		jobs, err := FinishedJobs(strings.NewReader(doc))
		if err != nil {
			return
		}
		if len(jobs) == 0 {
			t.Fatal("no jobs and no error")
		}
		for _, j := range jobs {
			if j.Runtime < 1 || j.GPUs < 1 || j.Submit < 0 {
				t.Fatalf("job %+v: a job learned from ran at least 1 s on at least 1 GPU, submitted after the first", j)
			}
		}
	})
}
