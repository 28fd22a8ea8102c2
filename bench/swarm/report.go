package swarm

import (
	"fmt"
	"io"
	"text/tabwriter"
)

func drops(n *uint64) string {
	if n == nil {
		return "unknown"
	}
	return fmt.Sprint(*n)
}

// WriteTable prints the report as a two-column table.
func (r *Report) WriteTable(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	mib := func(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	lat := func(l Latency) string {
		if l.Count == 0 {
			return "-"
		}
		return fmt.Sprintf("p50 %.1f ms  p99 %.1f ms  max %.1f ms  (n=%d)", l.P50Seconds*1e3, l.P99Seconds*1e3, l.MaxSeconds*1e3, l.Count)
	}
	rows := [][2]string{
		{"nodes registered", fmt.Sprintf("%d of %d (%d GPUs each)", r.Registered, r.Nodes, r.GPUsPerNode)},
		{"join, connect", fmt.Sprintf("%.1f s, %.1f s", r.JoinSeconds, r.ConnectSeconds)},
		{"window", fmt.Sprintf("%.1f s", r.WindowSeconds)},
		{"server CPU", fmt.Sprintf("%.3f cores (%.3f per 1,000 nodes)", r.ServerCPUCores, r.ServerCPUCoresPer1000)},
		{"server RSS", fmt.Sprintf("%s (%s per 1,000 nodes; %s at the window's start, %s before nodes)", mib(r.ServerRSSBytes),
			mib(r.ServerRSSBytesPer1000), mib(r.ServerRSSStartBytes), mib(r.ServerRSSIdleBytes))},
		{"generator CPU", fmt.Sprintf("%.3f cores", r.GeneratorCPUCores)},
		{"samples/s", fmt.Sprintf("%.0f sent, %.0f visible", r.SamplesSentPerSec, r.SamplesVisiblePerSec)},
		{"sample → visible", lat(r.Visibility)},
		{"command RTT, quiet", lat(r.CommandQuiet)},
		{"command RTT, loaded", lat(r.CommandLoaded)},
		{"API RTT, loaded", lat(r.APILoaded)},
		{"nodes down, node errors", fmt.Sprintf("%d, %d", r.NodesDown, r.NodeErrors)},
		{"generator's own silences", fmt.Sprintf("%d nodes beat > 2 intervals apart (longest gap %.1f s)", r.SelfSilent, r.SelfSilentMaxSeconds)},
		{"watch resyncs", fmt.Sprint(r.WatchResyncs)},
		{"UDP receive drops", drops(r.UDPReceiveDrops)},
	}
	if s := r.Shed; s != nil {
		rows = append(rows, [2]string{"telemetry shed", fmt.Sprintf("%d GPU samples, %d batches (%d NCCL calls)", s.GPUSamples, s.Batches, s.Collectives)})
	}
	if r.Pace > 1 || r.PacedBatches > 0 {
		rows = append(rows, [2]string{"telemetry paced", fmt.Sprintf("%d batches not sent in the window at the server's pace; %d times less often at its end", r.PacedBatches, r.Pace)})
	}
	if r.Store != "" {
		rows = append(rows, [2]string{"store", r.Store})
	}
	if f := r.Failover; f != nil {
		rows = append(rows, [2]string{"failover", fmt.Sprintf("new server in %.1f s; %d of %d nodes registered %.1f s after they redialled; %d down in the 5 s after",
			f.RestartSeconds, f.Registered, r.Nodes, f.ReconnectSeconds, f.NodesDownAfter)})
	}
	if r.FirstNodeError != nil {
		rows = append(rows, [2]string{"first node error", *r.FirstNodeError})
	}
	for _, row := range rows {
		fmt.Fprintf(w, "%s\t%s\n", row[0], row[1])
	}
	return w.Flush()
}
