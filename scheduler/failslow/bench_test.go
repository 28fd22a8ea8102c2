package failslow

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAnalysis is the server's cost of the analysis at 2,000 nodes ×
// 8 ranks at the demo's collective rate: every rank makes 8 steps a second
// of a 4 MiB all-reduce and an 8-byte one (16 calls a second), judged every
// 250 ms, after a minute of warming up. One op is one second of input; cpu-share is the share of one core
// it takes (seconds of CPU per second of input).
func BenchmarkAnalysis(b *testing.B) {
	for _, shape := range []struct {
		name        string
		jobs, ranks int
	}{
		{"2000 jobs of 8 ranks", 2000, 8},
		{"one job of 16000 ranks", 1, 16000},
	} {
		b.Run(shape.name, func(b *testing.B) {
			a := New(Config{})
			ids := make([]string, shape.jobs)
			in := make([]Job, shape.jobs)
			nodes := make([]string, shape.ranks)
			for i := range ids {
				ids[i] = fmt.Sprintf("job-%04d", i)
				in[i] = Job{ID: ids[i], Attempt: 1}
			}
			for r := range nodes {
				nodes[r] = fmt.Sprintf("node-%04d", r/8)
			}
			const stepsPerSec, judgesPerSec = 8, 4
			seq := uint64(0)
			t := int64(1_700_000_000_000_000_000)
			second := func() {
				for s := range stepsPerSec {
					seq++
					t += int64(time.Second / stepsPerSec)
					for _, id := range ids {
						for r := range shape.ranks {
							enter := t + int64(r%7)*100_000
							a.Add(id, 1, Call{Comm: 0, NRanks: int32(shape.ranks), Seq: seq, Rank: int32(r), Node: nodes[r],
								Op: "allreduce", Bytes: 4 << 20, Enter: enter, Exit: t + 7_000_000})
							a.Add(id, 1, Call{Comm: 1, NRanks: int32(shape.ranks), Seq: seq, Rank: int32(r), Node: nodes[r],
								Op: "allreduce", Bytes: 8, Enter: t + 7_100_000, Exit: t + 7_400_000})
						}
					}
					if s%(stepsPerSec/judgesPerSec) == 1 {
						a.Judge(in)
					}
				}
			}
			// A server runs for weeks: measure it past the first minute,
			// once every slot, window and baseline is full.
			for range 60 {
				second()
			}
			b.ResetTimer()
			for range b.N {
				second()
			}
			b.StopTimer()
			perSec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(perSec, "cpu-share")
			b.ReportMetric(float64(shape.jobs*shape.ranks*stepsPerSec*2), "calls/s-of-input")
			b.ReportMetric(0, "ns/op")
		})
	}
}
