package nvml

import (
	"os"
	"testing"
	"time"
)

// BenchmarkSample8GPUs measures one Sample of a DGX H100 with one process on
// every GPU, the model advancing one second per sample as at nodemon's 1 s
// interval. The cost includes the simulated host's own work (reading /proc
// for the processes), so it bounds nodemon's share from above.
func BenchmarkSample8GPUs(b *testing.B) {
	clk := newFakeClock()
	sim, err := NewSim("dgx-h100", SimOptions{Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	for gpu := range sim.GPUCount() {
		if err := sim.SetProcesses(gpu, []uint32{uint32(os.Getpid())}); err != nil {
			b.Fatal(err)
		}
	}
	s := NewSampler(sim.NVML(), nil)
	if _, err := s.Sample(clk.Now()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Sample(clk.Advance(time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	perSample := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perSample, "ns/sample")
	b.ReportMetric(perSample/8, "ns/GPU")
	// Share of one core spent sampling once a second.
	b.ReportMetric(perSample/1e9*100, "%core@1Hz")
}

// BenchmarkSample8GPUsIdle is the same without processes: the sampler's own
// cost over the NVML interface, with the simulated host doing no I/O.
func BenchmarkSample8GPUsIdle(b *testing.B) {
	clk := newFakeClock()
	sim, err := NewSim("dgx-h100", SimOptions{Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	s := NewSampler(sim.NVML(), nil)
	if _, err := s.Sample(clk.Now()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Sample(clk.Advance(time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	perSample := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perSample, "ns/sample")
	b.ReportMetric(perSample/8, "ns/GPU")
	b.ReportMetric(perSample/1e9*100, "%core@1Hz")
}
