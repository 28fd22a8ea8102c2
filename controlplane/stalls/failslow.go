package stalls

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
	"github.com/gpuctl/gpuctl/scheduler/stall"
)

// FailSlowQueue bounds the collective records waiting for the next pass;
// past it records are dropped (counted), which only delays a finding.
const FailSlowQueue = 1 << 20

// JudgeEvery is how often the fail-slow pass runs in the detector's
// passes: a slowdown is judged over tens of collectives, so judging it
// more often than the hang rule would only spend the server's CPU.
const JudgeEvery = time.Second

// Placement is what the fail-slow pass needs of the job owner: a job's
// placement (which node and GPU each rank runs on), nil when unknown.
type Placement func(job string) *api.Job

// NodeStatus is what it needs of the node registry: a node's GPUs now.
type NodeStatus func(name string) (*api.NodeStatus, error)

// FailSlow is the fail-slow pass that runs beside the stall detector: it
// takes every completed collective as nodes report it (Calls), and each
// detector pass hands the pure analysis (scheduler/failslow) the calls that
// came, with the ranks' GPU clocks as evidence, and turns what it raised
// and cleared into events.
type FailSlow struct {
	placement Placement
	node      NodeStatus
	log       *slog.Logger

	mu      sync.Mutex
	queue   []call
	dropped uint64
	// src picks the records that time each collective: completions where
	// the profiler plugin reports them, the calls elsewhere.
	src failslow.Source

	// an and judged are used by the detector's pass goroutine alone.
	an     *failslow.Analyzer
	judged time.Time

	listMu   sync.Mutex
	listed   []failslow.Finding
	lateness map[string]map[int32]time.Duration
	slowdown map[string]float64
}

type call struct {
	node string
	rec  *api.CollectiveRecord
}

// NewFailSlow returns the fail-slow pass with the rules' defaults.
func NewFailSlow(p Placement, n NodeStatus, log *slog.Logger) *FailSlow {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &FailSlow{placement: p, node: n, log: log, an: failslow.New(failslow.Config{})}
}

// Calls queues a node's batch of collective records for the next pass
// (nodes.Config.Calls). It only appends, so ingest never waits on the
// analysis.
func (f *FailSlow) Calls(node string, recs []*api.CollectiveRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range recs {
		if r.GetInProgress() || r.GetSeq() == 0 || r.GetJob() == "" || !r.GetOp().Collective() {
			continue
		}
		if !f.src.Use(failslow.Proc{Node: node, PID: r.GetPid()}, r.GetComm(), r.GetSeq(), r.GetCompletion()) {
			continue
		}
		if len(f.queue) >= FailSlowQueue {
			f.dropped++
			continue
		}
		f.queue = append(f.queue, call{node: node, rec: r})
	}
}

// WithFailSlow makes the detector run f in each of its passes.
func (d *Detector) WithFailSlow(f *FailSlow) *Detector {
	d.slow = f
	return d
}

// pass feeds the calls queued since the last pass to the analysis and
// returns the events of the findings it raised and cleared. progress is
// the detector's read of the ranks, which says which communicator (by
// creation order, the same on every rank) a call's handle is.
func (f *FailSlow) pass(now time.Time, targets []jobs.StallTarget, progress map[string][]nodes.RankProgress) []*api.Event {
	if !f.judged.IsZero() && now.Sub(f.judged) < JudgeEvery {
		return nil
	}
	f.judged = now
	f.mu.Lock()
	q := f.queue
	f.queue = make([]call, 0, len(q))
	dropped := f.dropped
	f.dropped = 0
	f.mu.Unlock()
	if dropped > 0 {
		f.log.Warn("fail-slow analysis fell behind; collective records dropped", "records", dropped)
	}

	type pidKey struct {
		node string
		pid  uint32
	}
	attempt := make(map[string]uint32, len(targets))
	for _, t := range targets {
		attempt[t.Job] = t.Attempt
	}
	// A rank has a few communicators: its handles in creation order,
	// searched, cost less than a map per rank each pass.
	commIdx := map[pidKey][]stall.Comm{}
	for _, ranks := range progress {
		for _, rp := range ranks {
			cs := make([]stall.Comm, 0, len(rp.Comms))
			for _, c := range rp.Comms {
				cs = append(cs, stall.Comm{Handle: c.Handle, Created: c.Created})
			}
			stall.SortComms(cs)
			commIdx[pidKey{rp.Node, rp.Status.GetPid()}] = cs
		}
	}
	// What ranks that are gone decided about their records goes with them.
	f.mu.Lock()
	f.src.Keep(func(p failslow.Proc) bool {
		_, live := commIdx[pidKey{p.Node, p.PID}]
		return live
	})
	f.mu.Unlock()
	for _, c := range q {
		r := c.rec
		att, ok := attempt[r.GetJob()]
		if !ok {
			continue
		}
		idx := slices.IndexFunc(commIdx[pidKey{c.node, r.GetPid()}], func(sc stall.Comm) bool { return sc.Handle == r.GetComm() })
		if idx < 0 {
			continue
		}
		// A completion's exit is when the work was done, not the return.
		exit := r.GetStartUnixNano() + r.GetDurationNs()
		if r.GetCompletion() {
			exit = r.GetGpuEndUnixNano()
		}
		f.an.Add(r.GetJob(), att, failslow.Call{Comm: idx, NRanks: r.GetCommNranks(), Seq: r.GetSeq(), Rank: r.GetRank(),
			Node: c.node, Op: r.GetOp().Short(), Bytes: r.GetBytes(),
			Enter: r.GetStartUnixNano(), Exit: exit})
	}

	in := make([]failslow.Job, 0, len(targets))
	for _, t := range targets {
		in = append(in, failslow.Job{ID: t.Job, Attempt: t.Attempt, GPUs: f.gpus(t.Job)})
	}
	changes := f.an.Judge(in)
	events := make([]*api.Event, 0, len(changes))
	for _, ch := range changes {
		events = append(events, f.event(now, ch))
	}

	late := make(map[string]map[int32]time.Duration, len(targets))
	slow := make(map[string]float64, len(targets))
	for _, t := range targets {
		late[t.Job] = maps.Clone(f.an.Lateness(t.Job))
		slow[t.Job] = f.an.Slowdown(t.Job)
	}
	f.listMu.Lock()
	f.listed, f.lateness, f.slowdown = f.an.Findings(), late, slow
	f.listMu.Unlock()
	return events
}

// gpus is the evidence job's GPUs give now: each rank's SM clock over the
// median of the job's, and its slowdown reasons.
func (f *FailSlow) gpus(job string) []failslow.GPU {
	if f.placement == nil || f.node == nil {
		return nil
	}
	j := f.placement(job)
	if j == nil {
		return nil
	}
	type rankGPU struct {
		rank    int32
		clock   float64
		reasons []string
	}
	var rs []rankGPU
	var clocks []float64
	for _, jn := range j.GetPlacement() {
		st, err := f.node(jn.GetNode())
		if err != nil || st == nil {
			continue
		}
		for _, r := range jn.GetRanks() {
			for _, g := range st.GetGpus() {
				if g.GetInfo().GetIndex() != r.GetGpu() || g.GetLast() == nil {
					continue
				}
				var reasons []string
				for _, n := range g.GetLast().GetThrottleNames() {
					if n != "gpu_idle" {
						reasons = append(reasons, n)
					}
				}
				c := float64(g.GetLast().GetSmClockMhz())
				rs = append(rs, rankGPU{rank: r.GetRank(), clock: c, reasons: reasons})
				clocks = append(clocks, c)
			}
		}
	}
	if len(clocks) == 0 {
		return nil
	}
	slices.Sort(clocks)
	med := clocks[len(clocks)/2]
	out := make([]failslow.GPU, 0, len(rs))
	for _, r := range rs {
		g := failslow.GPU{Rank: r.rank, Throttle: r.reasons}
		if med > 0 {
			g.Clock = r.clock / med
		}
		out = append(out, g)
	}
	return out
}

func (f *FailSlow) event(now time.Time, ch failslow.Change) *api.Event {
	fd := ch.Finding
	e := &api.Event{TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_SLOW, Job: fd.Job, Node: fd.Node,
		Attrs: map[string]string{"class": string(fd.Class), "comm": strconv.Itoa(fd.Comm),
			"slowdown": strconv.FormatFloat(fd.Slowdown, 'f', 2, 64), "late_ms": strconv.FormatInt(fd.Late.Milliseconds(), 10)}}
	if fd.Rank >= 0 {
		e.Rank = fd.Rank
		e.Attrs["rank"] = strconv.Itoa(int(fd.Rank))
	}
	who := describe(&fd)
	if ch.Cleared {
		e.Severity = api.Severity_SEVERITY_INFO
		e.Message = fmt.Sprintf("%s cleared: %s, %s (was: %s)", fd.Class, who, ch.Why, fd.Evidence)
		f.log.Info("fail-slow finding cleared", "job", fd.Job, "class", fd.Class, "rank", fd.Rank, "node", fd.Node, "why", ch.Why)
	} else {
		e.Severity = api.Severity_SEVERITY_WARNING
		e.Message = fmt.Sprintf("%s: %s, %.2f× slower: %s", fd.Class, who, fd.Slowdown, fd.Evidence)
		f.log.Warn("fail-slow finding", "job", fd.Job, "class", fd.Class, "rank", fd.Rank, "node", fd.Node, "evidence", fd.Evidence)
	}
	return e
}

// describe names what a finding blames.
func describe(fd *failslow.Finding) string {
	switch {
	case fd.Class == failslow.ComputeSlow:
		return fmt.Sprintf("rank %d on %s", fd.Rank, fd.Node)
	case fd.Class == failslow.CommunicationSlow && fd.Node != "":
		return fmt.Sprintf("communicator %d, node %s", fd.Comm, fd.Node)
	case fd.Class == failslow.CommunicationSlow:
		return fmt.Sprintf("communicator %d", fd.Comm)
	}
	return "every rank"
}

// Findings returns the fail-slow findings standing now, by job.
func (f *FailSlow) Findings() []failslow.Finding {
	f.listMu.Lock()
	defer f.listMu.Unlock()
	return f.listed
}

// Lateness returns each running job's ranks' rolling lateness (how far
// after the median of their peers they enter collectives), as of the last
// pass.
func (f *FailSlow) Lateness() map[string]map[int32]time.Duration {
	f.listMu.Lock()
	defer f.listMu.Unlock()
	return f.lateness
}

// Slowdown returns each running job's step time over its baseline, as of
// the last pass.
func (f *FailSlow) Slowdown() map[string]float64 {
	f.listMu.Lock()
	defer f.listMu.Unlock()
	return f.slowdown
}
