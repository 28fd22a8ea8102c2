package app

import (
	"sync"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
)

// HistoryLen is how many samples a sparkline shows.
const HistoryLen = 40

// Ring is the last HistoryLen values of one series, oldest first.
//
// A copy of a Ring is a snapshot of it that later Adds to the original do
// not change: Add only writes past the end any copy reads (a full buffer
// is replaced, not reused), so one writer can go on while readers hold
// copies, without a lock.
type Ring struct {
	buf    *[2 * HistoryLen]float32
	lo, hi int32
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
	if r.buf == nil || int(r.hi) == len(r.buf) {
		nb := new([2 * HistoryLen]float32)
		if r.buf != nil {
			// Keep the newest HistoryLen-1 values; the one added now is the last.
			r.hi = int32(copy(nb[:], r.buf[r.hi-(HistoryLen-1):r.hi]))
		}
		r.buf, r.lo = nb, 0
	}
	r.buf[r.hi] = float32(x)
	r.hi++
	if r.hi-r.lo > HistoryLen {
		r.lo++
	}
}

// Values returns the series oldest first.
func (r *Ring) Values() []float64 {
	out := make([]float64, r.hi-r.lo)
	for i := range out {
		out[i] = float64(r.buf[int(r.lo)+i])
	}
	return out
}

// Last returns the newest value, 0 when empty.
func (r *Ring) Last() float64 {
	if r.hi == r.lo {
		return 0
	}
	return float64(r.buf[r.hi-1])
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

// History is what successive snapshots said, for sparklines: a snapshot
// itself holds only the latest sample. A History is read-only: a Recorder
// makes a new one for every snapshot it observes, so any number of
// consoles can read the one a feed publishes while it records the next.
type History struct {
	Node map[string]*Ring
	GPU  map[string][]GPUSeries
	Job  map[string]*JobSeries

	mu      sync.Mutex
	derived map[any]*derived
}

type derived struct {
	once sync.Once
	v    any
}

// Derive returns what fn works out from the snapshot this history goes
// with, worked out once for every console that reads this history: the
// first to ask works it out, the others wait for it and share it, so it
// must be read-only too. key names what is worked out (a comparable value
// of a type of the caller's own).
func (h *History) Derive(key any, fn func() any) any {
	h.mu.Lock()
	if h.derived == nil {
		h.derived = map[any]*derived{}
	}
	d := h.derived[key]
	if d == nil {
		d = &derived{}
		h.derived[key] = d
	}
	h.mu.Unlock()
	d.once.Do(func() { d.v = fn() })
	return d.v
}

// NewHistory returns an empty history.
func NewHistory() *History {
	return &History{Node: map[string]*Ring{}, GPU: map[string][]GPUSeries{}, Job: map[string]*JobSeries{}}
}

// Recorder folds successive snapshots into a History. It is not safe for
// concurrent use: one goroutine records, and hands out what Observe
// returns.
type Recorder struct {
	node map[string]*nodeSeries
	job  map[string]*JobSeries
}

type nodeSeries struct {
	util Ring
	gpu  []GPUSeries
}

// NewRecorder returns a recorder that has seen nothing yet.
func NewRecorder() *Recorder {
	return &Recorder{node: map[string]*nodeSeries{}, job: map[string]*JobSeries{}}
}

// Observe folds in a snapshot taken at now (unix nanoseconds) and returns
// the history of the nodes and jobs it holds; nodes and jobs it no longer
// holds are forgotten.
func (rec *Recorder) Observe(s *client.Snapshot, now int64) *History {
	h := &History{Node: make(map[string]*Ring, len(s.Nodes)), GPU: make(map[string][]GPUSeries, len(s.Nodes)),
		Job: make(map[string]*JobSeries, len(s.Jobs))}
	ngpu := 0
	for _, n := range s.Nodes {
		ngpu += len(n.GetGpus())
	}
	// One allocation each for the copies readers get.
	rings := make([]Ring, len(s.Nodes))
	gpus := make([]GPUSeries, 0, ngpu)
	seen := make(map[string]bool, len(s.Nodes))
	for i, n := range s.Nodes {
		name := n.GetRegistration().GetName()
		seen[name] = true
		ns := rec.node[name]
		if ns == nil {
			ns = &nodeSeries{}
			rec.node[name] = ns
		}
		if len(ns.gpu) != len(n.GetGpus()) {
			ns.gpu = make([]GPUSeries, len(n.GetGpus()))
		}
		var sum float64
		var at int64
		for gi, g := range n.GetGpus() {
			l := g.GetLast()
			t := l.GetTimeUnixNano()
			at = max(at, t)
			sum += float64(l.GetUtilGpuPercent())
			gs := &ns.gpu[gi]
			gs.Util.Add(t, float64(l.GetUtilGpuPercent()))
			gs.Mem.Add(t, frac(float64(l.GetMemUsedBytes()), float64(l.GetMemTotalBytes()))*100)
			gs.Power.Add(t, float64(l.GetPowerMw())/1000)
			gs.Temp.Add(t, float64(l.GetTempC()))
			gs.NVLink.Add(t, float64(l.GetNvlinkTxBytesPerSec()+l.GetNvlinkRxBytesPerSec()))
			gs.PCIe.Add(t, float64(l.GetPcieTxBytesPerSec()+l.GetPcieRxBytesPerSec()))
		}
		if k := len(n.GetGpus()); k > 0 {
			ns.util.Add(at, sum/float64(k))
		}
		rings[i] = ns.util
		h.Node[name] = &rings[i]
		start := len(gpus)
		gpus = append(gpus, ns.gpu...)
		h.GPU[name] = gpus[start:len(gpus):len(gpus)]
	}
	for name := range rec.node {
		if !seen[name] {
			delete(rec.node, name)
		}
	}
	jobs := make([]JobSeries, 0, len(s.Jobs))
	live := make(map[string]bool, len(s.Jobs))
	for _, j := range s.Jobs {
		live[j.GetId()] = true
		js := rec.job[j.GetId()]
		switch {
		case js == nil:
			js = &JobSeries{lastStep: j.GetStep(), lastAt: now}
			rec.job[j.GetId()] = js
		case j.GetStep() == js.lastStep:
			if now-js.lastAt > 5e9 {
				// No step for 5 s: the rate is zero, not the last one.
				js.Rate.Add(now, 0)
				js.lastAt = now
			}
		default:
			if dt := float64(now-js.lastAt) / 1e9; dt > 0 && j.GetStep() > js.lastStep {
				js.Rate.Add(now, float64(j.GetStep()-js.lastStep)/dt)
			}
			js.lastStep, js.lastAt = j.GetStep(), now
		}
		jobs = append(jobs, *js)
		h.Job[j.GetId()] = &jobs[len(jobs)-1]
	}
	for id := range rec.job {
		if !live[id] {
			delete(rec.job, id)
		}
	}
	return h
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
