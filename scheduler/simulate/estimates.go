package simulate

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

// Features is what a trace says of a job at its submission; the hour of
// day is its wall clock's, unknown when the trace records none.
func Features(tj trace.Job) predict.Features {
	f := predict.Features{Tenant: tj.Tenant, Name: tj.Name, GPUs: tj.GPUs, Hour: -1}
	if !tj.Clock.IsZero() {
		f.Hour = tj.Clock.Hour()
	}
	return f
}

// Records are a trace's jobs as finished jobs to learn from.
func Records(jobs []trace.Job) []predict.Record {
	out := make([]predict.Record, len(jobs))
	for i, tj := range jobs {
		out[i] = predict.Record{Features: Features(tj), Runtime: tj.Runtime}
	}
	return out
}

// Split cuts a trace in time order: the first fraction of its jobs (by
// submission) to learn from, the rest to test on, their submissions
// counted again from the first tested one.
func Split(jobs []trace.Job, fraction float64) (train, test []trace.Job, err error) {
	if fraction <= 0 || fraction >= 1 {
		return nil, nil, fmt.Errorf("train fraction %v: give one between 0 and 1 (e.g. 0.6)", fraction)
	}
	sorted := slices.Clone(jobs)
	slices.SortStableFunc(sorted, func(a, b trace.Job) int { return int(a.Submit - b.Submit) })
	cut := int(float64(len(sorted)) * fraction)
	if cut < 1 || cut >= len(sorted) {
		return nil, nil, fmt.Errorf("train fraction %v of %d jobs leaves one side empty", fraction, len(sorted))
	}
	train, test = sorted[:cut], slices.Clone(sorted[cut:])
	first := test[0].Submit
	for i := range test {
		test[i].Submit -= first
	}
	return train, test, nil
}

// Limits are users' runtime limits for a trace that records none
// (predict.ModelledLimit), drawn with seed, by job id.
func Limits(jobs []trace.Job, seed uint64) map[string]int64 {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	out := make(map[string]int64, len(jobs))
	for _, tj := range jobs {
		out[tj.ID] = predict.ModelledLimit(tj.Runtime, rng.NormFloat64())
	}
	return out
}

// EstimateRun is one scheduling run of the study.
type EstimateRun struct {
	// Policy and Estimates ("exact", "limits", "predicted", "none").
	Policy, Estimates string
	// MeanJCT, P99JCT and Makespan (seconds) and Utilization: the mean
	// over seeds, each with its 95% confidence half-width.
	MeanJCT, MeanJCTCI, P99JCT, P99JCTCI float64
	Makespan, MakespanCI                 float64
	Utilization                          float64
}

// EstimateStudy is how a runtime model learned on a trace's first part
// schedules its held-out rest, against users' limits and exact runtimes.
type EstimateStudy struct {
	TrainJobs, TestJobs int
	Seeds               int
	// Accuracy on the held-out jobs: of the model capped by each job's
	// limit (what the scheduler is told), of the model alone, of users'
	// limits (the first seed's) and of one runtime for every job (the
	// training jobs' geometric mean, the baseline a model must beat).
	Predicted, Model, Limits, Mean predict.Accuracy
	Runs                           []EstimateRun
	// Learned are the scored policies learned on the first part.
	Learned []LearnedPolicy
}

// LearnedPolicy is a policy LearnPolicy chose: its weights, and the mean
// JCT on the jobs it learned from of SJF's order, then of the best after
// each iteration.
type LearnedPolicy struct {
	Name    string
	Weights scheduler.ScoreWeights
	Curve   []float64
}

// HoldOut scores model on held-out jobs (it never learned from): its
// predictions alone, and one runtime for every job (the model's overall
// one, the baseline a model must beat).
func HoldOut(model *predict.Model, test []trace.Job) (predicted, mean predict.Accuracy) {
	all := model.Overall()
	var est, means, actual []int64
	for _, tj := range test {
		est = append(est, max(model.Predict(Features(tj)).Seconds, 1))
		means = append(means, all)
		actual = append(actual, tj.Runtime)
	}
	return predict.Score(est, actual), predict.Score(means, actual)
}

// StudyEstimates learns a runtime model on the first fraction of jobs and
// runs the rest under each policy with each kind of estimate, over seeds
// (which draw users' limits; a prediction is capped by the job's limit).
// cfg sizes the cluster and is used as is otherwise.
//
// With learn, it also learns a scored policy (LearnPolicy) on the first
// part, told the first seed's users' limits, and runs it (alone and under
// backfill) on the rest with each seed's limits.
func StudyEstimates(jobs []trace.Job, fraction float64, seeds int, cfg Config, learn *Learning) (EstimateStudy, error) {
	train, test, err := Split(jobs, fraction)
	if err != nil {
		return EstimateStudy{}, err
	}
	seeds = max(seeds, 1)
	model := predict.Train(Records(train), 0)
	st := EstimateStudy{TrainJobs: len(train), TestJobs: len(test), Seeds: seeds}
	predicted := func(limits map[string]int64) func(trace.Job) int64 {
		return func(tj trace.Job) int64 {
			f := Features(tj)
			f.Limit = limits[tj.ID]
			return model.Predict(f).Seconds
		}
	}
	{
		limits := Limits(test, 1)
		var pe, le, actual []int64
		for _, tj := range test {
			pe = append(pe, predicted(limits)(tj))
			le = append(le, limits[tj.ID])
			actual = append(actual, tj.Runtime)
		}
		st.Predicted, st.Limits = predict.Score(pe, actual), predict.Score(le, actual)
		st.Model, st.Mean = HoldOut(model, test)
	}
	if cfg.Nodes == 0 {
		gpn := cfg.GPUsPerNode
		if gpn == 0 {
			gpn = 8
		}
		cfg.Nodes = ClusterSize(test, gpn)
	}
	type variant struct{ policy, estimates string }
	variants := []variant{{"fifo", "none"}, {"las", "none"}, {"fair", "none"},
		{"sjf", "limits"}, {"sjf", "predicted"}, {"sjf", "exact"},
		{"backfill", "limits"}, {"backfill", "predicted"}, {"backfill", "exact"}}
	learned := map[string]scheduler.Policy{}
	if learn != nil {
		trainLimits := Limits(train, 1)
		tc := cfg
		tc.Nodes = ClusterSize(train, cmp.Or(cfg.GPUsPerNode, 8))
		tc.Estimate = func(tj trace.Job) int64 { return trainLimits[tj.ID] }
		for _, bf := range []bool{false, true} {
			l := *learn
			l.Backfill = bf
			w, curve, err := LearnPolicy(train, tc, l)
			if err != nil {
				return st, err
			}
			var p scheduler.Policy = scheduler.Scored{Weights: w}
			name := "learned"
			if bf {
				p, name = scheduler.EASY{Base: p}, "learned+backfill"
			}
			learned[name] = p
			st.Learned = append(st.Learned, LearnedPolicy{Name: name, Weights: w, Curve: curve})
			variants = append(variants, variant{name, "limits"})
		}
	}
	for _, v := range variants {
		pol, ok := learned[v.policy]
		if !ok {
			var err error
			if pol, err = scheduler.PolicyByName(v.policy); err != nil {
				return st, err
			}
		}
		var mean, p99, span, util []float64
		for seed := range seeds {
			limits := Limits(test, uint64(seed)+1)
			c := cfg
			c.Policy, c.NoEstimates, c.Estimate = pol, v.estimates == "none", nil
			switch v.estimates {
			case "limits":
				c.Estimate = func(tj trace.Job) int64 { return limits[tj.ID] }
			case "predicted":
				c.Estimate = predicted(limits)
			}
			res, err := Run(test, c)
			if err != nil {
				return st, fmt.Errorf("%s with %s estimates: %w", v.policy, v.estimates, err)
			}
			mean, p99 = append(mean, res.MeanJCT), append(p99, res.P99JCT)
			span, util = append(span, float64(res.Makespan)), append(util, res.Utilization)
			if v.estimates == "none" || v.estimates == "exact" {
				break // nothing drawn: every seed is the same run
			}
		}
		r := EstimateRun{Policy: v.policy, Estimates: v.estimates, Utilization: meanOf(util)}
		r.MeanJCT, r.MeanJCTCI = meanCI(mean)
		r.P99JCT, r.P99JCTCI = meanCI(p99)
		r.Makespan, r.MakespanCI = meanCI(span)
		st.Runs = append(st.Runs, r)
	}
	return st, nil
}

func meanOf(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(max(len(xs), 1))
}

// meanCI is the mean and the half-width of its 95% confidence interval
// (Student's t; up to 10 samples; 0 for a single value).
func meanCI(v []float64) (float64, float64) {
	m := meanOf(v)
	if len(v) < 2 {
		return m, 0
	}
	var sq float64
	for _, x := range v {
		sq += (x - m) * (x - m)
	}
	t975 := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262}
	return m, t975[min(len(v)-2, len(t975)-1)] * math.Sqrt(sq/float64(len(v)-1)/float64(len(v)))
}
