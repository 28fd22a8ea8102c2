package app

import (
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
)

// HistoryLen is how many samples a sparkline shows.
const HistoryLen = 40

// Ring is the last HistoryLen values of one series, oldest first.
type Ring struct {
	v    [HistoryLen]float32
	n    int
	next int
	// at is the sample time of the last value, so one sample seen in
	// several snapshots is counted once.
	at int64
}

// Add appends x sampled at t (unix nanoseconds); a repeat of t is ignored.
func (r *Ring) Add(t int64, x float64) {
	if t != 0 && t == r.at {
		return
	}
	r.at = t
	r.v[r.next] = float32(x)
	r.next = (r.next + 1) % HistoryLen
	if r.n < HistoryLen {
		r.n++
	}
}

// Values returns the series oldest first.
func (r *Ring) Values() []float64 {
	out := make([]float64, r.n)
	start := (r.next - r.n + HistoryLen) % HistoryLen
	for i := range r.n {
		out[i] = float64(r.v[(start+i)%HistoryLen])
	}
	return out
}

// Last returns the newest value, 0 when empty.
func (r *Ring) Last() float64 {
	if r.n == 0 {
		return 0
	}
	return float64(r.v[(r.next-1+HistoryLen)%HistoryLen])
}

// GPUSeries are the sparklines of one GPU.
type GPUSeries struct {
	Util, Mem, Power, Temp, NVLink, PCIe Ring
}

// JobSeries are the sparklines of one job: steps per second and step.
type JobSeries struct {
	Rate     Ring
	lastStep int64
	lastAt   int64
}

// History remembers what successive snapshots said, for sparklines: the
// snapshot itself holds only the latest sample.
type History struct {
	Node map[string]*Ring
	GPU  map[string][]GPUSeries
	Job  map[string]*JobSeries
}

// NewHistory returns an empty history.
func NewHistory() *History {
	return &History{Node: map[string]*Ring{}, GPU: map[string][]GPUSeries{}, Job: map[string]*JobSeries{}}
}

// Observe folds in a snapshot taken at now (unix nanoseconds).
func (h *History) Observe(s *client.Snapshot, now int64) {
	for _, n := range s.Nodes {
		name := n.GetRegistration().GetName()
		gs := h.GPU[name]
		if len(gs) != len(n.GetGpus()) {
			gs = make([]GPUSeries, len(n.GetGpus()))
			h.GPU[name] = gs
		}
		var sum float64
		var at int64
		for i, g := range n.GetGpus() {
			l := g.GetLast()
			t := l.GetTimeUnixNano()
			at = max(at, t)
			sum += float64(l.GetUtilGpuPercent())
			gs[i].Util.Add(t, float64(l.GetUtilGpuPercent()))
			gs[i].Mem.Add(t, frac(float64(l.GetMemUsedBytes()), float64(l.GetMemTotalBytes()))*100)
			gs[i].Power.Add(t, float64(l.GetPowerMw())/1000)
			gs[i].Temp.Add(t, float64(l.GetTempC()))
			gs[i].NVLink.Add(t, float64(l.GetNvlinkTxBytesPerSec()+l.GetNvlinkRxBytesPerSec()))
			gs[i].PCIe.Add(t, float64(l.GetPcieTxBytesPerSec()+l.GetPcieRxBytesPerSec()))
		}
		r := h.Node[name]
		if r == nil {
			r = &Ring{}
			h.Node[name] = r
		}
		if k := len(n.GetGpus()); k > 0 {
			r.Add(at, sum/float64(k))
		}
	}
	for _, j := range s.Jobs {
		js := h.Job[j.GetId()]
		if js == nil {
			js = &JobSeries{lastStep: j.GetStep(), lastAt: now}
			h.Job[j.GetId()] = js
			continue
		}
		if j.GetStep() == js.lastStep {
			if now-js.lastAt > 5e9 {
				// No step for 5 s: the rate is zero, not the last one.
				js.Rate.Add(now, 0)
				js.lastAt = now
			}
			continue
		}
		if dt := float64(now-js.lastAt) / 1e9; dt > 0 && j.GetStep() > js.lastStep {
			js.Rate.Add(now, float64(j.GetStep()-js.lastStep)/dt)
		}
		js.lastStep, js.lastAt = j.GetStep(), now
	}
}

func frac(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// GPUFaulty reports whether a GPU needs attention: unhealthy, lost, or with
// uncorrectable ECC errors.
func GPUFaulty(g *api.GPUStatus) bool {
	l := g.GetLast()
	return !g.GetHealthy() || l.GetLost() || l.GetEcc().GetVolatileUncorrected() > 0 || l.GetRemapFailure()
}
