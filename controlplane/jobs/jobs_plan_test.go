package jobs

import (
	"math"
	"testing"

	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

func TestCalibrateFeedsMeasuredStepBack(t *testing.T) {
	withModel, err := jobspec.Parse("job.yaml", []byte(`name: llm
gpus: 64
command: [python, train.py]
model: {preset: llama2-70b, global_batch: 512}
plan: {tp: 8, pp: 4, dp: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := jobspec.Parse("job.yaml", []byte("name: plain\ngpus: 8\ncommand: [python, train.py]\n"))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planFor(withModel)
	if err != nil {
		t.Fatal(err)
	}
	predicted := plan.GetStepSeconds()
	if predicted <= 0 {
		t.Fatalf("no predicted step time for a job with a model: %v", plan)
	}
	def := costmodel.DefaultTunables().Efficiency
	tests := []struct {
		name     string
		spec     *jobspec.Spec
		measured float64
		wantEff  func(float64) bool
		wantNote bool
	}{
		{"as predicted keeps the default efficiency", withModel, predicted, func(e float64) bool { return math.Abs(e-def) < 1e-6 }, false},
		{"slower than predicted lowers it", withModel, 2 * predicted, func(e float64) bool { return e > 0 && e < def }, false},
		{"faster than communication alone is explained", withModel, predicted / 1000, func(e float64) bool { return e == 0 }, true},
		{"no model: measured only", plain, 1.5, func(e float64) bool { return e == 0 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planFor(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			calibrate(tc.spec, p, tc.measured)
			if p.GetMeasuredStepSeconds() != tc.measured {
				t.Errorf("measured = %v, want %v", p.GetMeasuredStepSeconds(), tc.measured)
			}
			if !tc.wantEff(p.GetCalibratedComputeScale()) {
				t.Errorf("calibrated compute scale %v (default %v)", p.GetCalibratedComputeScale(), def)
			}
			if p.GetCalibratedComputeScale() > 0 && p.GetCalibratedTerm() == "" {
				t.Error("a calibration that moved a term does not say which")
			}
			if (p.GetCalibrationNote() != "") != tc.wantNote {
				t.Errorf("calibration note %q", p.GetCalibrationNote())
			}
		})
	}
}
