package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

// benchCluster is 1,250 nodes of 8 GPUs in racks of 32 nodes and switches of
// 4 racks, about 70% allocated in whole and partial nodes, with 1,000 jobs
// queued.
func benchCluster() *Snapshot {
	rng := rand.New(rand.NewPCG(1, 2))
	s := &Snapshot{Now: 100000}
	for i := 0; i < 1250; i++ {
		rack := i / 32
		n := Node{
			Name:     fmt.Sprintf("node%04d", i),
			Labels:   map[string]string{LabelRack: fmt.Sprintf("rack%02d", rack), LabelSwitch: fmt.Sprintf("sw%d", rack/4), "site": []string{"a", "b"}[i*2/1250]},
			GPUModel: "H100",
		}
		used := 0
		if rng.Float64() < 0.7 {
			used = []int{8, 8, 8, 4, 2}[rng.IntN(5)]
		}
		job := fmt.Sprintf("run%d", i)
		rj := RunningJob{Request: JobRequest{ID: job, GPUs: used, Estimate: int64(rng.IntN(50000))}, Start: s.Now - int64(rng.IntN(10000))}
		for g := 0; g < 8; g++ {
			gpu := GPU{Index: g, Healthy: true}
			if g < used {
				gpu.Job = job
				rj.Placement.Ranks = append(rj.Placement.Ranks, Slot{Node: n.Name, GPU: g})
			}
			n.GPUs = append(n.GPUs, gpu)
		}
		if used > 0 {
			rj.Placement.Shape = Shape{1, 1, used}
			s.Running = append(s.Running, rj)
		}
		s.Nodes = append(s.Nodes, n)
	}
	for i := 0; i < 1000; i++ {
		s.Pending = append(s.Pending, JobRequest{
			ID: fmt.Sprintf("q%d", i), Submit: int64(i), GPUs: []int{8, 16, 64, 256, 2048}[rng.IntN(5)],
			Estimate: int64(600 + rng.IntN(100000)), Tenant: fmt.Sprintf("t%d", i%5),
		})
	}
	return s
}

func BenchmarkPlace(b *testing.B) {
	s := benchCluster()
	req := &JobRequest{ID: "bench", Shape: Shape{TP: 8, PP: 4, DP: 4}}
	b.ResetTimer()
	for b.Loop() {
		if _, err := Place(s, req); err != nil {
			b.Fatal(err)
		}
	}
	perOp := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(perOp*1e3, "ms/decision")
	b.ReportMetric(1/perOp, "decisions/s")
}

// benchIntensity gives site=a a midday dip and site=b a flat curve.
func benchIntensity() *carbon.Intensities {
	a := "site=a" + strings.Repeat(" 400", 10) + strings.Repeat(" 100", 6) + strings.Repeat(" 400", 8)
	in, err := carbon.Parse(strings.NewReader(a+"\nsite=b"+strings.Repeat(" 250", 24)), "bench")
	if err != nil {
		panic(err)
	}
	return in
}

// mixTypes makes every other node an A100 node and every other queued job
// allow both models, with a plan per model and an H100 speedup of 1.2 to
// 3 (the spread of docs/scheduling.md's study).
func mixTypes(s *Snapshot) {
	for i := range s.Nodes {
		if i%2 == 1 {
			s.Nodes[i].GPUModel = "A100"
		}
	}
	for i := range s.Pending {
		r := &s.Pending[i]
		if i%2 == 1 {
			continue
		}
		g := r.GPUs
		r.Types = []TypeOption{
			{Model: "H100", Shape: Shape{TP: 8, PP: 1, DP: g / 8}, Rate: 1.2 + float64(i%10)*0.2},
			{Model: "A100", Shape: Shape{TP: 4, PP: 1, DP: g / 4}, Rate: 1},
		}
	}
}

// BenchmarkSchedule's "+carbon" runs mark every third queued job deferrable
// by a day, so the carbon rule is asked for a third of the queue each pass.
// Its "mixed" runs make half the cluster A100s and half the queue allow
// both models (mixTypes), without and with type allocation.
func BenchmarkSchedule(b *testing.B) {
	in := benchIntensity()
	type run struct {
		name string
		p    Policy
	}
	runs := []run{}
	for _, p := range []Policy{FIFO{}, EASY{Base: FIFO{}}, FairShare{}, WithCarbon(FIFO{}, in), WithCarbon(EASY{Base: FIFO{}}, in)} {
		runs = append(runs, run{p.Name(), p})
	}
	for _, p := range []Policy{FIFO{}, WithHetero(FIFO{}, MaxThroughput), WithHetero(FIFO{}, MaxMinFair), WithHetero(EASY{Base: FIFO{}}, MaxThroughput)} {
		runs = append(runs, run{"mixed/" + p.Name(), p})
	}
	for _, r := range runs {
		p := r.p
		b.Run(r.name, func(b *testing.B) {
			s := benchCluster()
			if strings.HasPrefix(r.name, "mixed/") {
				mixTypes(s)
			}
			if strings.HasSuffix(r.name, "+carbon") {
				for i := range s.Pending {
					if i%3 == 0 {
						s.Pending[i].Until = s.Now + 86400
					}
				}
			}
			for b.Loop() {
				Schedule(s, p)
			}
			perOp := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(perOp*1e3, "ms/pass")
			b.ReportMetric(float64(len(s.Pending)), "queued")
		})
	}
}
