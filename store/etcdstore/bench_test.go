package etcdstore

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/store"
)

const spec = `name: llama-70b-pretrain
tenant: research
priority: 100
model: {params: 70e9, layers: 80, hidden: 8192, heads: 64, seq: 4096, vocab: 128256}
plan: {tp: 8, pp: 4, dp: 4, micro_batch: 1, num_micro_batches: 32}
gpus: 128
checkpoint: {dir: /ckpt/llama-70b, interval: 30m}
command: [torchrun, --nproc-per-node=8, pretrain_gpt.py, --config, /cfg/llama70b.yaml]
env: {NCCL_IB_HCA: mlx5, NCCL_SOCKET_IFNAME: eth0}
`

// passJob is a running job as a pass writes it: spec, plan and a
// placement of 16 nodes of 8 GPUs and 8 ranks each.
func passJob(i int) *api.Job {
	j := &api.Job{
		Id: fmt.Sprintf("j-%06d", i), Name: "llama-70b-pretrain", Tenant: "research", Priority: 100,
		SpecYaml: spec, State: api.JobState_JOB_STATE_RUNNING, Attempt: 3,
		Plan:           &api.JobPlan{Tp: 8, Pp: 4, Dp: 4, MicroBatch: 1, NumMicroBatches: 32, Source: "costmodel", StepSeconds: 11.2, Mfu: 0.41},
		SubmitUnixNano: 1, StartUnixNano: 2, Step: 123456, LastCheckpointStep: 123000, Goodput: 0.93,
		MasterAddr: "10.0.0.1", MasterPort: 29500, CheckpointDir: "/ckpt/llama-70b",
	}
	for n := range 16 {
		jn := &api.JobNode{Node: fmt.Sprintf("node-%03d", n), Gpus: []uint32{0, 1, 2, 3, 4, 5, 6, 7}}
		for r := range 8 {
			jn.Ranks = append(jn.Ranks, &api.JobRank{Rank: int32(n*8 + r), LocalRank: int32(r), Gpu: uint32(r), Pid: uint32(10000 + r)})
		}
		j.Placement = append(j.Placement, jn)
	}
	return j
}

func passEvent(i int) *api.Event {
	return &api.Event{Node: fmt.Sprintf("node-%03d", i%16), Job: fmt.Sprintf("j-%06d", i%20), TimeUnixNano: time.Now().UnixNano(),
		Kind: api.EventKind_EVENT_KIND_JOB, Message: fmt.Sprintf("rank %d started on GPU %d (pid %d), attempt 3", i, i%8, 10000+i)}
}

// BenchmarkPassCommit is the write latency of one scheduling pass (20
// jobs and 40 events in one Update) and of one PutJob, on bbolt (a file,
// fsync per commit) and on a 3-member in-process etcd (raft quorum plus a
// WAL fsync per member); the etcd runs report their ratio to bbolt's.
func BenchmarkPassCommit(b *testing.B) {
	b.Logf("one job record: %d bytes", proto.Size(passJob(0)))
	bolt, err := store.OpenBolt(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bolt.Close() })
	c := etcdtest.Start(b, 3)
	etcd := openFenced(b, c.Client(b), Options{})

	pass := func(s store.Store) func(*testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				if err := s.Update(func(tx store.Tx) error {
					for i := range 20 {
						if err := tx.PutJob(passJob(i)); err != nil {
							return err
						}
					}
					for i := range 40 {
						if err := tx.AppendEvent(passEvent(i)); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	putJob := func(s store.Store) func(*testing.B) {
		return func(b *testing.B) {
			j := passJob(0)
			for b.Loop() {
				if err := s.PutJob(j); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, kind := range []struct {
		name string
		run  func(store.Store) func(*testing.B)
	}{{"pass", pass}, {"putjob", putJob}} {
		var boltNs float64
		b.Run(kind.name+"/bbolt", func(b *testing.B) {
			kind.run(bolt)(b)
			boltNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		b.Run(kind.name+"/etcd3", func(b *testing.B) {
			kind.run(etcd)(b)
			if boltNs > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/boltNs, "x_bbolt")
			}
		})
	}
}
