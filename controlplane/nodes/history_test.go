package nodes

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// at1Hz is n samples one second apart from t=0, util cycling 0..99 and
// the energy counter rising by 1 J a second.
func at1Hz(n int) []*api.GPUSample {
	out := make([]*api.GPUSample, n)
	for i := range out {
		out[i] = &api.GPUSample{Index: 0, TimeUnixNano: int64(i) * int64(time.Second), UtilGpuPercent: uint32(i % 100),
			EnergyMj: uint64(i) * 1000, PowerMw: 500000}
	}
	return out
}

func fill(cfg HistoryConfig, samples []*api.GPUSample) []*api.GPUSample {
	cfg.defaults()
	h := newHistory(&cfg)
	for _, s := range samples {
		h.push(s)
	}
	return h.samples(0, 80<<30)
}

// TestHistoryTiers: recent samples come back as sent, older ones as
// period means from the finest tier that still holds them, oldest first,
// never overlapping, and never more than the configured bound.
func TestHistoryTiers(t *testing.T) {
	small := HistoryConfig{Recent: 5, Tiers: []Tier{{Every: 10 * time.Second, Keep: 3}, {Every: time.Minute, Keep: 2}}}
	type want struct {
		n       int
		times   []int64 // seconds of each returned sample, when listed
		recentN int     // how many of the newest must equal what was sent
	}
	cases := []struct {
		name string
		cfg  HistoryConfig
		sent int
		want want
	}{
		{"empty", small, 0, want{n: 0}},
		{"fewer than recent: all as sent", small, 3, want{n: 3, times: []int64{0, 1, 2}, recentN: 3}},
		{"recent full, no period closed", small, 9, want{n: 5, times: []int64{4, 5, 6, 7, 8}, recentN: 5}},
		// Periods [0,9] and [10,19] closed (means stamped 9 s and 19 s),
		// recent holds 20..24.
		{"two 10 s means then recent", small, 25, want{n: 7, times: []int64{9, 19, 20, 21, 22, 23, 24}, recentN: 5}},
		// 10 s tier keeps the last 3 closed periods (ending 29, 39, 49 s
		// of 0..54's six periods; 49 < recent's 50), the minute tier has
		// none closed yet: the oldest periods are gone.
		{"10 s tier rolls over", small, 55, want{n: 8, times: []int64{29, 39, 49, 50, 51, 52, 53, 54}, recentN: 5}},
		// After 300 s: minute means at 119, 179, 239 are kept 2 (179,
		// 239), 10 s means 269, 279, 289, then recent 295..299. The
		// minute mean at 299 is not closed yet.
		{"three levels", small, 300, want{n: 10, times: []int64{179, 239, 269, 279, 289, 295, 296, 297, 298, 299}, recentN: 5}},
		// 60 recent, then the 55 of 60 ten-second means older than them,
		// then the 110 of 120 minute means older than those.
		{"defaults bounded after 3 h", HistoryConfig{}, 3 * 3600, want{n: 60 + 55 + 110, recentN: 60}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sent := at1Hz(c.sent)
			got := fill(c.cfg, sent)
			if len(got) != c.want.n {
				t.Fatalf("%d samples, want %d: %v", len(got), c.want.n, secondsOf(got))
			}
			for i := 1; i < len(got); i++ {
				if got[i].TimeUnixNano <= got[i-1].TimeUnixNano {
					t.Fatalf("not strictly oldest first at %d: %v", i, secondsOf(got))
				}
			}
			if c.want.times != nil {
				if s := secondsOf(got); !slices.Equal(s, c.want.times) {
					t.Fatalf("times %v, want %v", s, c.want.times)
				}
			}
			for i := 0; i < c.want.recentN; i++ {
				g, s := got[len(got)-1-i], sent[len(sent)-1-i]
				if g.TimeUnixNano != s.TimeUnixNano || g.UtilGpuPercent != s.UtilGpuPercent || g.EnergyMj != s.EnergyMj {
					t.Fatalf("recent sample %d changed: got %v, sent %v", i, g, s)
				}
			}
		})
	}
}

// TestHistoryMeans: a period's point averages the gauges, keeps the last
// energy reading (a counter) and ORs the throttle reasons.
func TestHistoryMeans(t *testing.T) {
	cfg := HistoryConfig{Recent: 1, Tiers: []Tier{{Every: 4 * time.Second, Keep: 4}}}
	var in []*api.GPUSample
	for i, util := range []uint32{10, 20, 30, 41, 99} {
		s := &api.GPUSample{TimeUnixNano: int64(i) * int64(time.Second), UtilGpuPercent: util, TempC: 60 + uint32(i),
			PowerMw: 100000 * uint32(i+1), EnergyMj: uint64(1000 * (i + 1)), MemUsedBytes: uint64(i+1) << 30}
		if i == 1 {
			s.ThrottleReasons = 0x4
		}
		if i == 2 {
			s.ThrottleReasons = 0x20
		}
		in = append(in, s)
	}
	got := fill(cfg, in)
	if len(got) != 2 {
		t.Fatalf("%d samples, want the mean of 0..3 s and the recent one: %v", len(got), got)
	}
	m := got[0]
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"util mean of 10,20,30,41 rounded", uint64(m.UtilGpuPercent), 25},
		{"temp mean of 60..63 rounded", uint64(m.TempC), 62},
		{"power mean", uint64(m.PowerMw), 250000},
		{"energy last reading", m.EnergyMj, 4000},
		{"throttle reasons OR", m.ThrottleReasons, 0x24},
		{"memory used mean (MiB resolution)", m.MemUsedBytes, 2560 << 20},
		{"stamped at the period's last sample", uint64(m.TimeUnixNano), uint64(3 * time.Second)},
		{"memory total from the GPU's info", m.MemTotalBytes, 80 << 30},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, c.got, c.want)
		}
	}
	if got[1].UtilGpuPercent != 99 {
		t.Errorf("recent sample util %d, want 99", got[1].UtilGpuPercent)
	}
}

// TestRegistryGPUHistoryIsTiered: the reader the API (and so `gpuctl
// describe`, the console's GPU view) uses returns the tiered history of a
// GPU fed through telemetry batches.
func TestRegistryGPUHistoryIsTiered(t *testing.T) {
	c := &clock{t: time.Unix(1, 0)}
	r, err := New(Config{Store: newStore(t), Now: c.now, History: HistoryConfig{Recent: 10, Tiers: []Tier{{Every: 10 * time.Second, Keep: 6}}}})
	if err != nil {
		t.Fatal(err)
	}
	sess := registerIdle(t, r, reg("a", 2, 1000))
	for _, s := range at1Hz(120) {
		r.ingest("a", sess, &api.Telemetry{Gpus: []*api.GPUSample{s}})
	}
	h, err := r.GPUHistory("a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 16 {
		t.Fatalf("%d samples, want 6 means + 10 recent: %v", len(h), secondsOf(h))
	}
	if h[0].TimeUnixNano != 59*int64(time.Second) || h[len(h)-1].TimeUnixNano != 119*int64(time.Second) {
		t.Fatalf("span %v", secondsOf(h))
	}
	if h, err := r.GPUHistory("a", 1); err != nil || len(h) != 0 {
		t.Fatalf("GPU 1 never sampled: %v, %v", h, err)
	}
}

// historyBytesPerGPU is the heap one GPU's history holds once full, with
// the default tiers, measured over gpus histories.
func historyBytesPerGPU(gpus int) float64 {
	cfg := HistoryConfig{}
	cfg.defaults()
	samples := at1Hz(3 * 3600)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	hs := make([]*history, gpus)
	for i := range hs {
		hs[i] = newHistory(&cfg)
		// Full: enough samples to fill every level (2 h of minutes).
		for _, s := range samples[:2*3600+120] {
			hs[i].push(s)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// The samples were live at the first reading: keep them so they are
	// not counted as freed.
	runtime.KeepAlive(samples)
	runtime.KeepAlive(hs)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(gpus)
}

// TestHistoryMemoryPerGPU: a full history with the default tiers stays
// under 16 KiB a GPU (256 MiB for 2,000 nodes of 8 GPUs), and pushing more
// samples does not grow it.
func TestHistoryMemoryPerGPU(t *testing.T) {
	per := historyBytesPerGPU(500)
	t.Logf("history: %.0f bytes per GPU, %.0f MiB for 2,000 nodes x 8 GPUs", per, per*16000/(1<<20))
	if per > 16<<10 || per <= 0 {
		t.Fatalf("%.0f bytes per GPU, want (0, 16 KiB]", per)
	}
	cfg := HistoryConfig{}
	cfg.defaults()
	h := newHistory(&cfg)
	for _, s := range at1Hz(24 * 3600) {
		h.push(s)
	}
	if n := len(h.samples(0, 0)); n > 240 {
		t.Fatalf("a day of samples keeps %d points, want at most 240", n)
	}
}

// BenchmarkHistoryMemory reports a full history's heap per GPU and what
// 2,000 nodes of 8 GPUs hold.
func BenchmarkHistoryMemory(b *testing.B) {
	var per float64
	for i := 0; i < b.N; i++ {
		per = historyBytesPerGPU(1000)
	}
	b.ReportMetric(per, "bytes/gpu")
	b.ReportMetric(per*16000/(1<<20), "MiB/16000gpus")
}

func secondsOf(s []*api.GPUSample) []int64 {
	out := make([]int64, len(s))
	for i, x := range s {
		out[i] = x.TimeUnixNano / int64(time.Second)
	}
	return out
}
