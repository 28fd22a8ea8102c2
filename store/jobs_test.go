package store

import (
	"errors"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

func TestJobsPersist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	if js, err := s.Jobs(); err != nil || len(js) != 0 {
		t.Fatalf("empty store: %v, %v", js, err)
	}
	if _, err := s.Job("j-000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing job: %v, want ErrNotFound", err)
	}
	if err := s.PutJob(&api.Job{Name: "no-id"}); err == nil {
		t.Fatal("a job without an id was stored")
	}
	jobs := []*api.Job{
		{Id: "j-bbbbbb", Name: "b", State: api.JobState_JOB_STATE_PENDING, SpecYaml: "name: b\n", PendingReason: "needs 16 GPUs"},
		{Id: "j-aaaaaa", Name: "a", State: api.JobState_JOB_STATE_RUNNING, Attempt: 2,
			Placement: []*api.JobNode{{Node: "node-00", Gpus: []uint32{0, 1}, Ranks: []*api.JobRank{{Rank: 0, Pid: 42}, {Rank: 1, LocalRank: 1, Gpu: 1, Pid: 43}}}}},
	}
	for _, j := range jobs {
		if err := s.PutJob(j); err != nil {
			t.Fatal(err)
		}
	}
	// Replace: the last write wins.
	jobs[1].State = api.JobState_JOB_STATE_SUCCEEDED
	if err := s.PutJob(jobs[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	got, err := s.Jobs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].GetId() != "j-aaaaaa" || got[1].GetId() != "j-bbbbbb" {
		t.Fatalf("jobs after reopen, sorted by id: %v", got)
	}
	if !proto.Equal(got[0], jobs[1]) || !proto.Equal(got[1], jobs[0]) {
		t.Errorf("round trip changed the records:\n%v\n%v", got, jobs)
	}
	one, err := s.Job("j-aaaaaa")
	if err != nil || one.GetState() != api.JobState_JOB_STATE_SUCCEEDED || one.GetPlacement()[0].GetRanks()[1].GetPid() != 43 {
		t.Errorf("Job = %v, %v", one, err)
	}
}
