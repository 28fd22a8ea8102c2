package jobs

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/store"
)

// scaleNodes is a registry stand-in for a large cluster: every node ready
// with 8 GPUs, every rank reporting.
type scaleNodes struct {
	nodes []*api.NodeStatus
	ranks []nodes.NodeRanks
}

func (s *scaleNodes) Nodes() []*api.NodeStatus       { return s.nodes }
func (s *scaleNodes) Ranks(string) []nodes.NodeRanks { return s.ranks }
func (s *scaleNodes) SetCordon(string, string, string) (*api.NodeStatus, error) {
	return nil, nil
}
func (s *scaleNodes) Command(context.Context, string, *api.Command) (*api.CommandAck, error) {
	return &api.CommandAck{}, nil
}

// scaleCluster stores jobs running 16 GPUs each on pairs of nodes, and
// returns a registry stand-in whose nodes run them.
func scaleCluster(tb testing.TB, st store.Store, nodeCount, jobCount int) *scaleNodes {
	return scaleClusterOf(tb, st, nodeCount, jobCount, false)
}

// scaleClusterOf is scaleCluster; mixed makes every other pair of nodes
// A100s and every job allow h100 and a100, with a plan for each.
func scaleClusterOf(tb testing.TB, st store.Store, nodeCount, jobCount int, mixed bool) *scaleNodes {
	tb.Helper()
	s := &scaleNodes{}
	for i := range nodeCount {
		name := fmt.Sprintf("n%04d", i)
		n := &api.NodeStatus{Registration: &api.NodeRegistration{Name: name, Labels: map[string]string{
			"rack": fmt.Sprintf("r%d", i/16), "switch": fmt.Sprintf("s%d", i/32)}},
			State: api.NodeState_NODE_STATE_READY, Connected: true, RemoteAddr: "127.0.0.1:1"}
		model := "NVIDIA H100 80GB HBM3"
		if mixed && i/2%2 == 1 {
			model = "NVIDIA A100-SXM4-80GB"
		}
		for g := range 8 {
			n.Gpus = append(n.Gpus, &api.GPUStatus{Healthy: true, Info: &api.GPUInfo{Index: uint32(g), Model: model},
				Last: &api.GPUSample{Index: uint32(g), EnergyMj: 1000}})
		}
		s.nodes = append(s.nodes, n)
	}
	byNode := map[string]*nodes.NodeRanks{}
	err := st.Update(func(tx store.Tx) error {
		for k := range jobCount {
			id := fmt.Sprintf("j-%06d", k)
			spec := fmt.Sprintf("name: scale-%d\nnodes: 2\ngpus_per_node: 8\ncommand: [/bin/true]\ncheckpoint: {dir: /ckpt/%d}\n", k, k)
			j := &api.Job{Id: id, Name: fmt.Sprintf("scale-%d", k), SpecYaml: spec, SpecSource: "bench",
				Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 16, Source: "gpus"}, State: api.JobState_JOB_STATE_RUNNING,
				Attempt: 1, SubmitUnixNano: int64(k), StartUnixNano: 1, FirstStartUnixNano: 1, CheckpointDir: "/ckpt", FullGpus: 16,
				Attempts: []*api.JobAttempt{{Attempt: 1, StartUnixNano: 1, Gpus: 16, Dp: 16}}}
			if mixed {
				j.SpecYaml += "gpu_models: [h100, a100]\n"
				j.TypePlans = []*api.JobTypePlan{
					{GpuModel: "h100", Plan: &api.JobPlan{Tp: 8, Pp: 1, Dp: 2, Source: "planner", StepSeconds: 1}},
					{GpuModel: "a100-80gb", Plan: &api.JobPlan{Tp: 8, Pp: 1, Dp: 2, Source: "planner", StepSeconds: 2.5}},
				}
				j.GpuType = "h100"
				if k%2 == 1 {
					j.GpuType = "a100-80gb"
				}
			}
			rank := int32(0)
			for _, ni := range []int{2 * k % nodeCount, (2*k + 1) % nodeCount} {
				node := s.nodes[ni].GetRegistration().GetName()
				jn := &api.JobNode{Node: node}
				nr := byNode[node]
				if nr == nil {
					nr = &nodes.NodeRanks{Node: node}
					byNode[node] = nr
				}
				for g := range 8 {
					pid := uint32(10000 + k*16 + int(rank))
					jn.Gpus = append(jn.Gpus, uint32(g))
					jn.Ranks = append(jn.Ranks, &api.JobRank{Rank: rank, LocalRank: int32(g), Gpu: uint32(g), Pid: pid})
					nr.Ranks = append(nr.Ranks, &api.RankStatus{Job: id, Attempt: 1, Rank: rank, Pid: pid, ProcState: "R", Step: 100})
					rank++
				}
				j.Placement = append(j.Placement, jn)
			}
			if err := tx.PutJob(j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	for _, nr := range byNode {
		s.ranks = append(s.ranks, *nr)
	}
	return s
}

// BenchmarkOwnerLoop drives the job owner of a cluster of 2,000 nodes and
// 1,000 running jobs, scheduling every second as in production, with a
// stream of node events (each a checkpoint a job's rank-0 node reports:
// it changes the job and is committed) as fast as the owner takes them,
// while a client makes a request every 5 ms. It reports the messages the
// owner applied per second and the client requests' p99 latency.
func BenchmarkOwnerLoop(b *testing.B) {
	const nodeCount, jobCount = 2000, 1000
	st, err := store.OpenBolt(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cl := scaleCluster(b, st, nodeCount, jobCount)
	m, err := New(Config{Store: st, Nodes: cl, Every: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	// Let the first passes settle (placements, pending reasons).
	if _, err := m.Checkpoint(ctx, "j-000000"); err != nil {
		b.Fatal(err)
	}

	var (
		mu   sync.Mutex
		lats []time.Duration
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		k := 0
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			start := time.Now()
			if _, err := m.Checkpoint(ctx, fmt.Sprintf("j-%06d", k%jobCount)); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			lats = append(lats, time.Since(start))
			mu.Unlock()
			k++
		}
	}()
	b.ResetTimer()
	start := time.Now()
	const batch = 64
	for i := 0; i < b.N; i += batch {
		for k := range min(batch, b.N-i) {
			job := (i + k) % jobCount
			node := cl.nodes[2*job%nodeCount].GetRegistration().GetName()
			m.NodeEvents(node, []*api.Event{{Node: node, Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: fmt.Sprintf("j-%06d", job),
				Rank: 0, Step: int64(1000 + i + k), Seconds: 1}})
		}
		// Wait for the owner to drain what was posted, as a sender that
		// must not run ahead of it without bound would.
		for m.pending() > 4*batch {
			time.Sleep(50 * time.Microsecond)
		}
	}
	for m.pending() > 0 {
		time.Sleep(50 * time.Microsecond)
	}
	// The last messages are applied once their step commits: ask the
	// owner for one more answer to be sure.
	if _, err := m.Checkpoint(ctx, "j-000001"); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "p99-request-ms")
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "p50-request-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPass is one scheduling pass over 2,000 nodes and 1,000 running
// jobs: snapshot, stops, recoveries, the scheduler, every job's counters.
func BenchmarkPass(b *testing.B) { benchmarkPass(b, false) }

// BenchmarkPassHetero is BenchmarkPass on half H100 and half A100 nodes,
// every job allowing both with a plan for each, under max-throughput type
// allocation.
func BenchmarkPassHetero(b *testing.B) { benchmarkPass(b, true) }

func benchmarkPass(b *testing.B, mixed bool) {
	st, err := store.OpenBolt(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cl := scaleClusterOf(b, st, 2000, 1000, mixed)
	cfg := Config{Store: st, Nodes: cl}
	if mixed {
		p, _ := scheduler.PolicyByName(scheduler.DefaultPolicy)
		cfg.Policy = scheduler.WithHetero(p, scheduler.MaxThroughput)
	}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	m.disp.sync = true
	m.step(true)
	b.ResetTimer()
	for range b.N {
		m.step(true)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/pass")
}

// pending is how many messages wait in the owner's inbox.
func (m *Manager) pending() int {
	m.in.mu.Lock()
	defer m.in.mu.Unlock()
	return len(m.in.q)
}
