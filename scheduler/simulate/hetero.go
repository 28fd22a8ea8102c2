package simulate

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

// Mix makes the simulated cluster heterogeneous: the nodes are cut into
// equal runs, one per model in Models (in name order), and every job may
// run on any of them.
type Mix struct {
	// Models are hardware profile names; a trace's runtime is a job's work
	// on the first.
	Models []string
	// Rates is a job's throughput on each model, in Models' order. A job
	// runs its work Rates[k]/Rates[0] times as fast on model k.
	Rates func(tj trace.Job) []float64
	// Reshardable lets a job restart on another model than it started on
	// (its checkpoint can be resharded for that model's plan); otherwise
	// it restarts only on its first model.
	Reshardable bool
}

// speed is how many seconds of work one second on model runs.
func (m *Mix) speed(rates []float64, model string) float64 {
	for k, name := range m.Models {
		if name == model {
			return rates[k] / rates[0]
		}
	}
	return 1
}

// types is a job's options: on each model the data-parallel shape the
// trace gives (a trace job is placed as its GPUs) at its rate there. Each
// job lists the models starting at one drawn by a hash of its id, as
// users list them in no particular order: a type-agnostic placement,
// which breaks ties by the job's order, then favours no model.
func (m *Mix) types(id string, gpus int, rates []float64) []scheduler.TypeOption {
	out := make([]scheduler.TypeOption, len(m.Models))
	first := int(mixHash(0, id) % uint64(len(m.Models)))
	for i := range m.Models {
		k := (first + i) % len(m.Models)
		out[i] = scheduler.TypeOption{Model: m.Models[k], Shape: scheduler.Shape{TP: 1, PP: 1, DP: gpus}, Rate: rates[k]}
	}
	return out
}

// studyModels are GPT-3's smaller shapes (Brown et al. 2020, Table 2.1):
// what a job of a few to a hundred GPUs trains. The trace keeps no model,
// so each job is given one (CostRates).
var studyModels = []costmodel.Model{
	{Name: "gpt3-350m", Layers: 24, Hidden: 1024, Heads: 16, SeqLen: 2048, Vocab: 50257, TiedEmbeddings: true, LearnedPositions: true},
	{Name: "gpt3-1.3b", Layers: 24, Hidden: 2048, Heads: 16, SeqLen: 2048, Vocab: 50257, TiedEmbeddings: true, LearnedPositions: true},
	{Name: "gpt3-2.7b", Layers: 32, Hidden: 2560, Heads: 32, SeqLen: 2048, Vocab: 50257, TiedEmbeddings: true, LearnedPositions: true},
	{Name: "gpt3-6.7b", Layers: 32, Hidden: 4096, Heads: 32, SeqLen: 2048, Vocab: 50257, TiedEmbeddings: true, LearnedPositions: true},
	{Name: "gpt3-13b", Layers: 40, Hidden: 5120, Heads: 40, SeqLen: 2048, Vocab: 50257, TiedEmbeddings: true, LearnedPositions: true},
}

// sequencesPerGPU sizes a job's global batch: weak scaling, as a job given
// more GPUs is usually given a larger batch.
const sequencesPerGPU = 16

// CostRates derives each job's throughput per model from the cost model,
// for a trace without GPU types: a job trains one of studyModels, drawn by
// a hash of seed and its id among those whose plan fits its GPUs on the
// first model, with a global batch of 16 sequences per GPU; its rate on a
// model is one over the planner's best effective step time there. Plans
// are searched once per model, GPU count and profile.
func CostRates(models []string, seed uint64) (func(trace.Job) []float64, error) {
	if len(models) < 2 {
		return nil, errors.New("simulate: a mixed cluster needs at least two GPU models")
	}
	hws := make([]costmodel.Hardware, len(models))
	for k, m := range models {
		hw, err := costmodel.LookupHardware(m)
		if err != nil {
			return nil, fmt.Errorf("simulate: mixed cluster: %w", err)
		}
		hws[k] = hw
	}
	_, tr, err := costmodel.LookupModel("gpt3-175b")
	if err != nil {
		return nil, err
	}
	type key struct{ model, gpus int }
	cache := map[key][]float64{} // nil: does not fit
	rates := func(mi, gpus int) []float64 {
		k := key{mi, gpus}
		if r, ok := cache[k]; ok {
			return r
		}
		t := tr
		t.GlobalBatch = sequencesPerGPU * gpus
		var out []float64
		for _, hw := range hws {
			ranked, _ := planner.Search(planner.Request{Model: studyModels[mi], Training: t, Hardware: hw,
				Tunables: planner.Tunables(), GPUs: gpus})
			if len(ranked) == 0 {
				out = nil
				break
			}
			out = append(out, 1/planner.Effective(&ranked[0]))
		}
		cache[k] = out
		return out
	}
	return func(tj trace.Job) []float64 {
		start := int(mixHash(seed, tj.ID) % uint64(len(studyModels)))
		// The drawn model, else the next smaller one that fits.
		for d := range studyModels {
			mi := (start - d + len(studyModels)) % len(studyModels)
			if r := rates(mi, tj.GPUs); r != nil {
				return r
			}
		}
		out := make([]float64, len(models))
		for k := range out {
			out[k] = 1
		}
		return out
	}, nil
}

// mixHash is a job's draw under seed, the same under every policy.
func mixHash(seed uint64, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	// splitmix64's finaliser: FNV's high bits are poorly mixed for ids
	// that differ only in their last characters.
	x := h.Sum64() ^ seed*0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// takes everything.
func jain(xs []float64) float64 {
	var s, sq float64
	for _, x := range xs {
		s += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * sq)
}

// HeteroRun is one policy of the mixed-cluster study: means over seeds,
// each with its 95% confidence half-width.
type HeteroRun struct {
	Policy                               string
	MeanJCT, MeanJCTCI, P99JCT, P99JCTCI float64
	Makespan, MakespanCI                 float64
	Utilization, UtilizationCI           float64
	Fairness, FairnessCI                 float64
	BestTypeShare                        float64
}

// HeteroStudy is the type-agnostic scheduler against heterogeneity-aware
// type allocation on a mixed cluster, on a trace's held-out part.
type HeteroStudy struct {
	Models              []string
	Nodes               int
	TrainJobs, TestJobs int
	Seeds               int
	// Speedup is the mean over the held-out jobs (first seed) of each
	// model's rate over the first model's, in Models' order.
	Speedup []float64
	Runs    []HeteroRun
}

// StudyHetero runs the part of jobs after the first fraction (the part the
// estimates study holds out; nothing here is fitted, so the first part is
// only left out) on a cluster cut evenly into models, each job's rates
// from CostRates under each seed, with each base policy type-agnostic and
// under each objective. cfg sizes the cluster (Nodes 0: ClusterSize of
// the held-out jobs) and is used as is otherwise.
func StudyHetero(jobs []trace.Job, fraction float64, seeds int, models []string, bases []string, cfg Config) (HeteroStudy, error) {
	train, test, err := Split(jobs, fraction)
	if err != nil {
		return HeteroStudy{}, err
	}
	seeds = max(seeds, 1)
	cfg.GPUsPerNode = cmp.Or(cfg.GPUsPerNode, 8)
	if cfg.Nodes == 0 {
		// Every job must fit on one model's part of the cluster.
		cfg.Nodes = ClusterSize(test, cfg.GPUsPerNode)
		for _, tj := range test {
			cfg.Nodes = max(cfg.Nodes, len(models)*((tj.GPUs+cfg.GPUsPerNode-1)/cfg.GPUsPerNode))
		}
	}
	st := HeteroStudy{Models: models, Nodes: cfg.Nodes, TrainJobs: len(train), TestJobs: len(test), Seeds: seeds,
		Speedup: make([]float64, len(models))}
	rates := make([]func(trace.Job) []float64, seeds)
	for seed := range seeds {
		if rates[seed], err = CostRates(models, uint64(seed)+1); err != nil {
			return st, err
		}
	}
	for _, tj := range test {
		r := rates[0](tj)
		for k := range models {
			st.Speedup[k] += r[k] / r[0] / float64(len(test))
		}
	}
	for _, b := range bases {
		base, err := scheduler.PolicyByName(b)
		if err != nil {
			return st, err
		}
		pols := []scheduler.Policy{base}
		for _, o := range scheduler.Objectives {
			pols = append(pols, scheduler.WithHetero(base, o))
		}
		for _, p := range pols {
			var mean, p99, span, util, fair, best []float64
			for seed := range seeds {
				c := cfg
				c.Policy = p
				c.Mix = &Mix{Models: models, Rates: rates[seed], Reshardable: true}
				res, err := Run(test, c)
				if err != nil {
					return st, fmt.Errorf("%s: %w", p.Name(), err)
				}
				mean, p99 = append(mean, res.MeanJCT), append(p99, res.P99JCT)
				span, util = append(span, float64(res.Makespan)), append(util, res.Utilization)
				fair, best = append(fair, res.Fairness), append(best, res.BestTypeShare)
			}
			r := HeteroRun{Policy: p.Name(), BestTypeShare: meanOf(best)}
			if _, ok := p.(scheduler.Hetero); !ok {
				r.Policy += " (type-agnostic)"
			}
			r.MeanJCT, r.MeanJCTCI = meanCI(mean)
			r.P99JCT, r.P99JCTCI = meanCI(p99)
			r.Makespan, r.MakespanCI = meanCI(span)
			r.Utilization, r.UtilizationCI = meanCI(util)
			r.Fairness, r.FairnessCI = meanCI(fair)
			st.Runs = append(st.Runs, r)
		}
	}
	return st, nil
}
