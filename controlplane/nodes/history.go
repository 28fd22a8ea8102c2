package nodes

import (
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// HistoryConfig sizes each GPU's history: the newest samples at the rate
// nodes send them, then averages over coarser periods, so a GPU's memory
// stays bounded however long the server runs and however many nodes it
// holds (about 13 KiB per GPU with the defaults: 215 MiB at 2,000 nodes of
// 8 GPUs).
type HistoryConfig struct {
	// Recent is how many samples are kept as sent, default 60.
	Recent int
	// Tiers are coarser averages, finest first, default 10 s × 60 (10
	// min) then 1 min × 120 (2 h).
	Tiers []Tier
}

// Tier is one level of averaged history.
type Tier struct {
	Every time.Duration
	Keep  int
}

func (c *HistoryConfig) defaults() {
	if c.Recent <= 0 {
		c.Recent = 60
	}
	if c.Tiers == nil {
		c.Tiers = []Tier{{Every: 10 * time.Second, Keep: 60}, {Every: time.Minute, Keep: 120}}
	}
}

// point is a compact GPU sample: what the history charts show.
type point struct {
	t          int64
	energyMJ   uint64
	throttle   uint64
	memUsedMiB uint32
	powerMW    uint32
	nvTx, nvRx float32
	pcTx, pcRx float32
	smClock    uint16
	memClock   uint16
	util       uint8
	memUtil    uint8
	temp       uint8
}

func pointOf(s *api.GPUSample) point {
	return point{
		t: s.GetTimeUnixNano(), energyMJ: s.GetEnergyMj(), throttle: s.GetThrottleReasons(),
		memUsedMiB: uint32(s.GetMemUsedBytes() >> 20), powerMW: s.GetPowerMw(),
		nvTx: float32(s.GetNvlinkTxBytesPerSec()), nvRx: float32(s.GetNvlinkRxBytesPerSec()),
		pcTx: float32(s.GetPcieTxBytesPerSec()), pcRx: float32(s.GetPcieRxBytesPerSec()),
		smClock: uint16(min(s.GetSmClockMhz(), 65535)), memClock: uint16(min(s.GetMemClockMhz(), 65535)),
		util: uint8(min(s.GetUtilGpuPercent(), 100)), memUtil: uint8(min(s.GetUtilMemPercent(), 100)),
		temp: uint8(min(s.GetTempC(), 255)),
	}
}

func (p point) sample(index uint32, memTotal uint64) *api.GPUSample {
	return &api.GPUSample{
		Index: index, TimeUnixNano: p.t, UtilGpuPercent: uint32(p.util), UtilMemPercent: uint32(p.memUtil),
		MemUsedBytes: uint64(p.memUsedMiB) << 20, MemTotalBytes: memTotal, PowerMw: p.powerMW, EnergyMj: p.energyMJ,
		TempC: uint32(p.temp), SmClockMhz: uint32(p.smClock), MemClockMhz: uint32(p.memClock), ThrottleReasons: p.throttle,
		NvlinkTxBytesPerSec: uint64(p.nvTx), NvlinkRxBytesPerSec: uint64(p.nvRx),
		PcieTxBytesPerSec: uint64(p.pcTx), PcieRxBytesPerSec: uint64(p.pcRx),
	}
}

// points is a bounded FIFO of points.
type points struct {
	buf   []point
	start int
	n     int
}

func (r *points) push(p point) {
	if len(r.buf) == 0 {
		return
	}
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = p
		r.n++
		return
	}
	r.buf[r.start] = p
	r.start = (r.start + 1) % len(r.buf)
}

func (r *points) at(i int) point { return r.buf[(r.start+i)%len(r.buf)] }

// accum averages the samples of one tier's current period.
type accum struct {
	start                      int64
	n                          int
	util, memUtil, temp        float64
	memUsed, power             float64
	smClock, memClock          float64
	nvTx, nvRx, pcTx, pcRx     float64
	throttle, energy, lastTime uint64
}

func (a *accum) add(p point) {
	if a.n == 0 {
		a.start = p.t
	}
	a.n++
	a.util += float64(p.util)
	a.memUtil += float64(p.memUtil)
	a.temp += float64(p.temp)
	a.memUsed += float64(p.memUsedMiB)
	a.power += float64(p.powerMW)
	a.smClock += float64(p.smClock)
	a.memClock += float64(p.memClock)
	a.nvTx += float64(p.nvTx)
	a.nvRx += float64(p.nvRx)
	a.pcTx += float64(p.pcTx)
	a.pcRx += float64(p.pcRx)
	a.throttle |= p.throttle
	a.energy = p.energyMJ
	a.lastTime = uint64(p.t)
}

// mean is the period's point: averages of gauges, the last reading of the
// energy counter, every throttle reason seen.
func (a *accum) mean() point {
	n := float64(a.n)
	return point{
		t: int64(a.lastTime), energyMJ: a.energy, throttle: a.throttle,
		memUsedMiB: uint32(a.memUsed / n), powerMW: uint32(a.power / n),
		nvTx: float32(a.nvTx / n), nvRx: float32(a.nvRx / n), pcTx: float32(a.pcTx / n), pcRx: float32(a.pcRx / n),
		smClock: uint16(a.smClock / n), memClock: uint16(a.memClock / n),
		util: uint8(a.util/n + 0.5), memUtil: uint8(a.memUtil/n + 0.5), temp: uint8(a.temp/n + 0.5),
	}
}

// history is one GPU's samples: recent ones as sent, then averaged tiers.
type history struct {
	cfg    *HistoryConfig
	recent points
	tiers  []points
	acc    []accum
}

func newHistory(cfg *HistoryConfig) *history {
	h := &history{cfg: cfg, recent: points{buf: make([]point, cfg.Recent)}, tiers: make([]points, len(cfg.Tiers)), acc: make([]accum, len(cfg.Tiers))}
	for i, t := range cfg.Tiers {
		h.tiers[i] = points{buf: make([]point, t.Keep)}
	}
	return h
}

func (h *history) push(s *api.GPUSample) {
	p := pointOf(s)
	h.recent.push(p)
	for i, t := range h.cfg.Tiers {
		a := &h.acc[i]
		if a.n > 0 && p.t-a.start >= int64(t.Every) {
			h.tiers[i].push(a.mean())
			*a = accum{}
		}
		a.add(p)
	}
}

// samples returns the history oldest first: each coarser tier up to where
// the next finer one begins, then the recent samples.
func (h *history) samples(index uint32, memTotal uint64) []*api.GPUSample {
	var out []*api.GPUSample
	// until is the time the finer levels start at; coarse points from then
	// on would repeat them.
	levels := make([]*points, 0, len(h.tiers)+1)
	for i := len(h.tiers) - 1; i >= 0; i-- {
		levels = append(levels, &h.tiers[i])
	}
	levels = append(levels, &h.recent)
	for li, lv := range levels {
		until := int64(1<<63 - 1)
		for _, finer := range levels[li+1:] {
			if finer.n > 0 {
				until = min(until, finer.at(0).t)
				break
			}
		}
		for i := 0; i < lv.n; i++ {
			if p := lv.at(i); p.t < until {
				out = append(out, p.sample(index, memTotal))
			}
		}
	}
	return out
}
