package scheduler

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// Scored orders pending jobs by a learned linear score of what the queue
// knows of each, lowest first: the logarithms of its GPUs, its expected
// remaining runtime, the GPU-seconds it has had and how long it has
// waited. SJF is the score (0, 1, 0, 0); LAS roughly (0, 0, 1, 0); the
// weights are chosen in the trace simulator against a trace's first part
// (simulate.LearnPolicy), not by hand. A job without an estimate counts
// as one of Scored.Unknown seconds.
type Scored struct {
	Weights ScoreWeights
}

// ScoreWeights are a Scored policy's weights and its estimate for jobs
// without one.
type ScoreWeights struct {
	Version  int     `json:"version"`
	GPUs     float64 `json:"gpus"`
	Estimate float64 `json:"estimate"`
	Attained float64 `json:"attained"`
	Wait     float64 `json:"wait"`
	// Unknown is the runtime (seconds) assumed of a job without an
	// estimate.
	Unknown float64 `json:"unknown_estimate_seconds"`
}

// ScoreWeightsVersion is the weights file's format.
const ScoreWeightsVersion = 1

// Name returns "learned".
func (Scored) Name() string { return "learned" }

// Score is a job's score at now: lower starts first.
func (p Scored) Score(now int64, r *JobRequest) float64 {
	w := p.Weights
	est := float64(r.Estimate)
	if est <= 0 {
		est = w.Unknown
	}
	wait := float64(max(now-r.Submit, 0))
	return w.GPUs*math.Log2(float64(max(r.GPUs, 1))) + w.Estimate*math.Log1p(max(est, 0)) +
		w.Attained*math.Log1p(max(r.Attained, 0)) - w.Wait*math.Log1p(wait)
}

// Order sorts by score, ties by submission.
func (p Scored) Order(s *Snapshot, pending []*JobRequest) {
	sortKeyed(pending, func(r *JobRequest) (float64, float64) { return p.Score(s.Now, r), 0 })
}

// WriteWeights encodes w as JSON.
func WriteWeights(out io.Writer, w ScoreWeights) error {
	w.Version = ScoreWeightsVersion
	enc := json.NewEncoder(out)
	enc.SetIndent("", " ")
	if err := enc.Encode(w); err != nil {
		return fmt.Errorf("write policy weights: %w", err)
	}
	return nil
}

// ReadWeights decodes weights written by WriteWeights, refusing ones it
// cannot use.
func ReadWeights(in io.Reader) (ScoreWeights, error) {
	var w ScoreWeights
	dec := json.NewDecoder(io.LimitReader(in, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return ScoreWeights{}, fmt.Errorf("policy weights: %w (learn them with `gpuctl simulate train --policy-out`)", err)
	}
	if w.Version != ScoreWeightsVersion {
		return ScoreWeights{}, fmt.Errorf("policy weights: format version %d, this gpuctl reads %d: learn them again with this gpuctl", w.Version, ScoreWeightsVersion)
	}
	for name, v := range map[string]float64{"gpus": w.GPUs, "estimate": w.Estimate, "attained": w.Attained, "wait": w.Wait} {
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e3 {
			return ScoreWeights{}, fmt.Errorf("policy weights: %s weight %v, want a finite number within ±1000", name, v)
		}
	}
	if math.IsNaN(w.Unknown) || w.Unknown < 0 || w.Unknown > 1e9 {
		return ScoreWeights{}, fmt.Errorf("policy weights: unknown_estimate_seconds %v, want 0 to 1e9", w.Unknown)
	}
	return w, nil
}
