package simulate

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

// Learning sets how LearnPolicy searches.
type Learning struct {
	// Iterations of the search, Samples tried in each, and the Elite kept
	// of them to aim the next (defaults 12, 16, 4).
	Iterations, Samples, Elite int
	Seed                       uint64
	// Backfill learns the order for EASY backfill over it.
	Backfill bool
}

// LearnPolicy chooses a scheduler.Scored policy's weights for a trace by
// the cross-entropy method: each iteration draws weight vectors from a
// normal distribution, replays the jobs under each (cfg as given, its
// Policy replaced) and moves the distribution to the Elite with the
// lowest mean JCT. It starts from SJF, so it can only match or beat it on
// the jobs it learns from. It returns the best weights found, and the mean
// JCT of SJF's order followed by the best after each iteration.
func LearnPolicy(jobs []trace.Job, cfg Config, l Learning) (scheduler.ScoreWeights, []float64, error) {
	if l.Iterations <= 0 {
		l.Iterations = 12
	}
	if l.Samples <= 0 {
		l.Samples = 16
	}
	if l.Elite <= 0 || l.Elite > l.Samples {
		l.Elite = min(4, l.Samples)
	}
	if len(jobs) == 0 {
		return scheduler.ScoreWeights{}, nil, fmt.Errorf("learn policy: no jobs")
	}
	logSum := 0.0
	for _, tj := range jobs {
		logSum += math.Log(float64(max(tj.Runtime, 1)))
	}
	unknown := math.Exp(logSum / float64(len(jobs)))
	weights := func(v [4]float64) scheduler.ScoreWeights {
		return scheduler.ScoreWeights{Version: scheduler.ScoreWeightsVersion, GPUs: v[0], Estimate: v[1], Attained: v[2], Wait: v[3], Unknown: unknown}
	}
	score := func(v [4]float64) (float64, error) {
		c := cfg
		var p scheduler.Policy = scheduler.Scored{Weights: weights(v)}
		if l.Backfill {
			p = scheduler.EASY{Base: p}
		}
		c.Policy = p
		res, err := Run(jobs, c)
		if err != nil {
			return 0, err
		}
		return res.MeanJCT, nil
	}
	rng := rand.New(rand.NewPCG(l.Seed, 0x2545f4914f6cdd1d))
	mean, sd := [4]float64{0, 1, 0, 0}, [4]float64{1, 1, 1, 1}
	best := mean
	bestJCT, err := score(best)
	if err != nil {
		return scheduler.ScoreWeights{}, nil, err
	}
	curve := []float64{bestJCT}
	type tried struct {
		v   [4]float64
		jct float64
	}
	for range l.Iterations {
		var batch []tried
		for range l.Samples {
			var v [4]float64
			for i := range v {
				v[i] = mean[i] + sd[i]*rng.NormFloat64()
			}
			jct, err := score(v)
			if err != nil {
				return scheduler.ScoreWeights{}, nil, err
			}
			batch = append(batch, tried{v, jct})
			if jct < bestJCT {
				best, bestJCT = v, jct
			}
		}
		slices.SortFunc(batch, func(a, b tried) int { return cmp.Compare(a.jct, b.jct) })
		for i := range mean {
			m, s := 0.0, 0.0
			for _, t := range batch[:l.Elite] {
				m += t.v[i]
			}
			m /= float64(l.Elite)
			for _, t := range batch[:l.Elite] {
				s += (t.v[i] - m) * (t.v[i] - m)
			}
			// A floor keeps the search from freezing on a lucky few.
			mean[i], sd[i] = m, max(math.Sqrt(s/float64(l.Elite)), 0.05)
		}
		curve = append(curve, bestJCT)
	}
	return weights(best), curve, nil
}
