package controlplane

import (
	"github.com/gpuctl/gpuctl/controlplane/metrics"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
)

// Slowness is what the fail-slow analysis says now, for the exporter
// (metrics.SlowSource).
func (s *Server) Slowness() metrics.Slowness {
	out := metrics.Slowness{Findings: map[string]int{}, Lateness: map[string]map[int32]float64{}, Slowdown: s.slow.Slowdown()}
	for _, c := range failslow.Classes {
		out.Findings[string(c)] = 0
	}
	for _, f := range s.slow.Findings() {
		out.Findings[string(f.Class)]++
	}
	for job, ranks := range s.slow.Lateness() {
		m := make(map[int32]float64, len(ranks))
		for r, d := range ranks {
			m[r] = d.Seconds()
		}
		out.Lateness[job] = m
	}
	return out
}
