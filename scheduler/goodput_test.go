package scheduler

import (
	"math"
	"testing"
)

func TestYoungDaly(t *testing.T) {
	cases := []struct {
		name          string
		c, mtbf, want float64
	}{
		{"no checkpoint cost yet", 0, 3600, 0},
		{"no MTBF", 10, 0, 0},
		{"18 s every hour", 18, 3600, 360},
		{"a minute, daily failures", 60, 86400, math.Sqrt(2 * 60 * 86400)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := YoungDaly(c.c, c.mtbf); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("YoungDaly(%g, %g) = %g, want %g", c.c, c.mtbf, got, c.want)
			}
		})
	}
}

func TestGPUMTBF(t *testing.T) {
	cases := []struct {
		name       string
		failures   int
		gpuSeconds float64
		want       float64
	}{
		{"no history is the prior", 0, 0, PriorGPUMTBFSeconds},
		{"failures move it off the prior", 3, 1e6, (PriorGPUMTBFSeconds + 1e6) / 4},
		{"negative inputs count as none", -1, -5, PriorGPUMTBFSeconds},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := GPUMTBF(c.failures, c.gpuSeconds); math.Abs(got-c.want) > 1e-6 {
				t.Errorf("GPUMTBF(%d, %g) = %g, want %g", c.failures, c.gpuSeconds, got, c.want)
			}
		})
	}
}
