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
	id := j.GetId()
	if id == "" {
		return fmt.Errorf("put job: record has no id")
	}
	b, err := proto.Marshal(j)
	if err != nil {
		return fmt.Errorf("put job %s: %w", id, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		// Created here rather than at open so a store written before jobs
		// existed opens unchanged.
		bk, err := tx.CreateBucketIfNotExists(bucketJobs)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), b)
	}); err != nil {
		return fmt.Errorf("put job %s: %w", id, err)
	}
	return nil
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
