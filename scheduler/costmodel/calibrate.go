package costmodel

import (
	"cmp"
	"fmt"
	"math"
)

// Calibration terms: the tunable Calibrate moved.
const (
	TermCompute = "compute_scale"
	TermComm    = "comm_scale"
)

// Calibration reports what Calibrate changed to make the model predict a
// measured step.
type Calibration struct {
	// Term is the tunable moved: compute_scale (the kernels are slower or
	// faster than fitted) or comm_scale (the measured step is faster than
	// the kernels alone allow, so communication must be cheaper).
	Term string `json:"term"`
	// From and To are its value before and after.
	From float64 `json:"from"`
	To   float64 `json:"to"`
	// ComputeScale and CommScale are both scales after calibration (a
	// comm_scale calibration first takes compute_scale to its limit).
	ComputeScale float64 `json:"compute_scale"`
	CommScale    float64 `json:"comm_scale"`
	// Stack is the training stack whose overlaps the calibration kept:
	// calibration moves one scale, never an overlap term.
	Stack string `json:"stack"`
	// PredictedStepSec is the prediction before calibration.
	PredictedStepSec float64 `json:"predicted_step_seconds"`
	MeasuredStepSec  float64 `json:"measured_step_seconds"`
}

// Calibrate sets the tunables so that Evaluate(p) predicts the measured
// step time (see CalibrateReport).
func (c *Config) Calibrate(p Plan, measuredStepSeconds float64) error {
	_, err := c.CalibrateReport(p, measuredStepSeconds)
	return err
}

// CalibrateReport moves one term so that Evaluate(p) predicts the measured
// step, and says which. A slower step than predicted lowers compute_scale.
// A faster one raises it, as far as keeping every kernel at or under peak
// allows; past that, communication must be cheaper than modelled: the
// kernels stay at their limit and comm_scale comes down. A step faster
// than the kernels at peak with no communication at all is an error that
// points at the peak, the plan or the batch. On error c is unchanged.
func (c *Config) CalibrateReport(p Plan, measuredStepSeconds float64) (Calibration, error) {
	if measuredStepSeconds <= 0 || math.IsNaN(measuredStepSeconds) || math.IsInf(measuredStepSeconds, 0) {
		return Calibration{}, fmt.Errorf("calibrate: measured step time must be a positive number of seconds, got %g", measuredStepSeconds)
	}
	if err := c.Validate(); err != nil {
		return Calibration{}, fmt.Errorf("calibrate: %w", err)
	}
	p, err := c.normalize(p)
	if err != nil {
		return Calibration{}, fmt.Errorf("calibrate: %w", err)
	}
	step := func(compute, comm float64) float64 {
		x := *c
		x.Tunables.Efficiency, x.Tunables.CommScale = compute, comm
		return x.engine(p).step().step
	}
	tu := c.Tunables
	pred := step(tu.Efficiency, tu.CommScale)
	cal := Calibration{Term: TermCompute, Stack: cmp.Or(c.Training.Stack, DefaultStack), From: tu.Efficiency, To: tu.Efficiency, ComputeScale: tu.Efficiency, CommScale: tu.CommScale,
		PredictedStepSec: pred, MeasuredStepSec: measuredStepSeconds}
	if math.Abs(pred-measuredStepSeconds) <= 1e-9*measuredStepSeconds {
		return cal, nil
	}
	// The largest compute scale keeps every kernel at or under peak.
	hw := c.Hardware
	cmax := 1 / (tu.StackComputeScale * math.Max(hw.GEMMEfficiency, math.Max(hw.FlashAttentionEfficiency, hw.ElementwiseEfficiency)))
	switch {
	case measuredStepSeconds > pred:
		cal.To = bisect(func(s float64) float64 { return step(s, tu.CommScale) - measuredStepSeconds }, 1e-6, tu.Efficiency)
	case step(cmax, tu.CommScale) <= measuredStepSeconds:
		cal.To = bisect(func(s float64) float64 { return step(s, tu.CommScale) - measuredStepSeconds }, tu.Efficiency, cmax)
	case step(cmax, 0) <= measuredStepSeconds:
		cal.Term, cal.From, cal.ComputeScale = TermComm, tu.CommScale, cmax
		cal.To = bisect(func(s float64) float64 { return step(cmax, s) - measuredStepSeconds }, 0, tu.CommScale)
	default:
		return Calibration{}, fmt.Errorf("calibrate: measured %.3gs is faster than the kernels at peak with no communication (%.3gs): check the gpu's peak TFLOP/s, the plan or the global batch",
			measuredStepSeconds, step(cmax, 0))
	}
	if cal.Term == TermCompute {
		cal.ComputeScale = cal.To
	} else {
		cal.CommScale = cal.To
	}
	c.Tunables.Efficiency, c.Tunables.CommScale = cal.ComputeScale, cal.CommScale
	return cal, nil
}

// bisect finds x in [lo, hi] where f changes sign; f is monotone there.
func bisect(f func(float64) float64, lo, hi float64) float64 {
	flo := f(lo)
	for range 200 {
		mid := (lo + hi) / 2
		fm := f(mid)
		if (fm > 0) == (flo > 0) {
			lo, flo = mid, fm
		} else {
			hi = mid
		}
		if hi-lo <= 1e-12*math.Max(1, math.Abs(hi)) {
			break
		}
	}
	return (lo + hi) / 2
}
