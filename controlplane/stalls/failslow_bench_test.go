package stalls

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// BenchmarkFailSlowServer is the server's cost of the fail-slow analysis at
// 2,000 nodes × 8 ranks at the demo's collective rate (8 steps a second of
// a 4 MiB and an 8-byte all-reduce on every rank), beside the cost the
// server pays for the same records without it: reading them off the wire
// (each node's second of calls as one telemetry frame, decoded). Both run
// in one benchmark so the ratio comes from one machine state. One op is one
// second of input, after a minute of warming up; cpu-share is seconds of
// CPU per second of input.
func BenchmarkFailSlowServer(b *testing.B) {
	const nodeCount, ranksPerNode, stepsPerSec, passesPerSec = 2000, 8, 8, 4
	targets := make([]jobs.StallTarget, nodeCount)
	progress := make(map[string][]nodes.RankProgress, nodeCount)
	names := make([]string, nodeCount)
	for n := range nodeCount {
		names[n] = fmt.Sprintf("node-%04d", n)
		job := fmt.Sprintf("job-%04d", n)
		targets[n] = jobs.StallTarget{Job: job, Attempt: 1}
		for r := range ranksPerNode {
			progress[job] = append(progress[job], nodes.RankProgress{Node: names[n], Status: &api.RankStatus{Pid: uint32(1000 + r)},
				Comms: []nodes.CommProgress{{Handle: 0xa0, Created: 1}, {Handle: 0xb0, Created: 2}}})
		}
	}
	t0 := int64(1_700_000_000_000_000_000)
	// second returns each node's frame of one second of calls.
	second := func(s int) [][]byte {
		frames := make([][]byte, nodeCount)
		for n := range nodeCount {
			tel := &api.Telemetry{}
			for step := range stepsPerSec {
				seq := uint64(s*stepsPerSec + step + 1)
				t := t0 + int64(seq)*int64(time.Second/stepsPerSec)
				for r := range ranksPerNode {
					enter := t + int64(r%7)*100_000
					tel.Collectives = append(tel.Collectives,
						&api.CollectiveRecord{Job: targets[n].Job, Pid: uint32(1000 + r), Rank: int32(r), CommNranks: ranksPerNode, Comm: 0xa0, Seq: seq,
							Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Bytes: 4 << 20, StartUnixNano: enter, DurationNs: t + 7_000_000 - enter},
						&api.CollectiveRecord{Job: targets[n].Job, Pid: uint32(1000 + r), Rank: int32(r), CommNranks: ranksPerNode, Comm: 0xb0, Seq: seq,
							Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Bytes: 8, StartUnixNano: t + 7_100_000, DurationNs: 300_000})
				}
			}
			var buf bytes.Buffer
			if err := api.WriteFrame(&buf, &api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: tel}}); err != nil {
				b.Fatal(err)
			}
			frames[n] = buf.Bytes()
		}
		return frames
	}
	decode := func(frame []byte) *api.Telemetry {
		var m api.AgentMessage
		if err := api.NewFrameReader(bytes.NewReader(frame)).Read(&m); err != nil {
			b.Fatal(err)
		}
		return m.GetTelemetry()
	}
	const warm, measured = 60, 5
	var input [][][]byte
	for s := range warm + measured {
		input = append(input, second(s))
	}
	share := map[string]float64{}
	for _, analyse := range []bool{false, true} {
		name := "decode"
		if analyse {
			name = "decode+failslow"
		}
		b.Run(name, func(b *testing.B) {
			var busy time.Duration
			for range b.N {
				f := NewFailSlow(nil, nil, nil)
				now := time.Unix(0, t0)
				run := func(frames [][]byte) {
					for n, fr := range frames {
						tel := decode(fr)
						if analyse {
							f.Calls(names[n], tel.GetCollectives())
						}
					}
					if analyse {
						for range passesPerSec {
							now = now.Add(time.Second / passesPerSec)
							f.pass(now, targets, progress)
						}
					}
				}
				for _, frames := range input[:warm] {
					run(frames)
				}
				start := time.Now()
				for _, frames := range input[warm:] {
					run(frames)
				}
				busy += time.Since(start)
			}
			share[name] = busy.Seconds() / float64(b.N*measured)
			b.ReportMetric(share[name], "cpu-share")
			b.ReportMetric(0, "ns/op")
		})
	}
	if d := share["decode"]; d > 0 {
		b.Logf("fail-slow analysis: %.3f of a core at %d nodes x %d ranks; the server with it %.2fx the server reading the same records without it",
			share["decode+failslow"]-d, nodeCount, ranksPerNode, share["decode+failslow"]/d)
	}
}
