package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

var bucketJobs = []byte("jobs")

// PutJob creates or replaces a job's record under its id.
func (s *Bolt) PutJob(j *api.Job) error {
	return s.Update(func(tx Tx) error { return tx.PutJob(j) })
}

// Job returns the job with id, or ErrNotFound.
func (s *Bolt) Job(id string) (*api.Job, error) {
	var j *api.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		var v []byte
		if bk := tx.Bucket(bucketJobs); bk != nil {
			v = bk.Get([]byte(id))
		}
		if v == nil {
			return fmt.Errorf("job %s: %w", id, ErrNotFound)
		}
		j = &api.Job{}
		if err := proto.Unmarshal(v, j); err != nil {
			return fmt.Errorf("decode job %s: %w", id, err)
		}
		return nil
	})
	return j, err
}

// Jobs returns every job, sorted by id.
func (s *Bolt) Jobs() ([]*api.Job, error) {
	var out []*api.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketJobs)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			j := &api.Job{}
			if err := proto.Unmarshal(v, j); err != nil {
				return fmt.Errorf("decode job %s: %w", k, err)
			}
			out = append(out, j)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return out, nil
}
