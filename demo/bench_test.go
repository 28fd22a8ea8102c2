package demo

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/procfs"
)

// procCPU returns a process's user+system CPU time and resident memory.
func procCPU(t testing.TB, pid int) (cpu time.Duration, rssBytes int64) {
	t.Helper()
	st, err := procfs.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(st.CPUSeconds() * float64(time.Second)), int64(st.RSSPages) * int64(os.Getpagesize())
}

// BenchmarkNodemonFootprint runs one nodemon with a simulated 8-GPU host at
// 1 s sampling, connected to a real server, and reports its CPU share and
// resident memory over a 10 s window: with eBPF tracing off (the baseline)
// and on.
func BenchmarkNodemonFootprint(b *testing.B) {
	for _, mode := range []string{"off", "required"} {
		b.Run("ebpf="+mode, func(b *testing.B) {
			if mode == "required" && os.Geteuid() != 0 {
				needs.EBPF.Skip(b, "eBPF needs root")
			}
			for i := 0; i < b.N; i++ {
				opts := DefaultOptions()
				opts.Nodes, opts.JobNodes, opts.EBPF = 1, 0, mode
				opts.Nodemon, opts.Ringtrain = binaries(b)
				opts.DataDir = b.TempDir()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				c, err := Start(ctx, opts)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				pid := c.NodemonPID(c.NodeNames[0])
				time.Sleep(2 * time.Second) // past start-up
				cpu0, _ := procCPU(b, pid)
				const window = 10 * time.Second
				time.Sleep(window)
				cpu1, rss := procCPU(b, pid)
				c.Stop()
				b.ReportMetric(100*cpu1.Seconds()/window.Seconds()-100*cpu0.Seconds()/window.Seconds(), "cpu_%")
				b.ReportMetric(float64(rss)/(1<<20), "rss_MiB")
			}
		})
	}
}
