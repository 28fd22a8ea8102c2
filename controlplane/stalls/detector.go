// Package stalls runs the NCCL stall detector: every pass it reads the
// ranks of the running jobs from the node registry, hands them to the pure
// analysis (scheduler/stall), and gives what it declared and cleared to the
// job owner (events, the jobs' stalled flag, auto recovery) and to watchers.
package stalls

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
	"github.com/gpuctl/gpuctl/scheduler/stall"
)

// Jobs is what the detector needs of the job owner.
type Jobs interface {
	StallTargets() []jobs.StallTarget
	Stalls(ctx context.Context, declared []*api.Stall, stalled map[string]bool, events []*api.Event, slow []failslow.Finding) error
}

// Nodes is what the detector needs of the node registry.
type Nodes interface {
	Progress(attempts map[string]uint32) map[string][]nodes.RankProgress
}

// Publisher takes stalls as they are declared and cleared.
type Publisher interface {
	PublishStall(key string, s *api.Stall)
	DeleteStall(key string)
}

// Detector is the stall detector's loop and its current list.
type Detector struct {
	jobs  Jobs
	nodes Nodes
	pub   Publisher
	now   func() time.Time
	log   *slog.Logger
	det   *stall.Detector
	slow  *FailSlow

	mu     sync.Mutex
	listed []*api.Stall
	keys   map[string]bool
}

// New returns a detector; pub may be nil.
func New(j Jobs, n Nodes, pub Publisher, now func() time.Time, log *slog.Logger) *Detector {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Passes made outside Run come at any time: no pause is credited.
	rule := stall.DefaultRule
	rule.Pass = 0
	return &Detector{jobs: j, nodes: n, pub: pub, now: now, log: log, det: stall.NewRule(rule), keys: map[string]bool{}}
}

// Run makes a pass every period until ctx ends. The rule credits a pass
// late by more than half a second past every as the server standing still.
func (d *Detector) Run(ctx context.Context, every time.Duration) {
	rule := stall.DefaultRule
	rule.Pass = every
	d.det = stall.NewRule(rule)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := d.Pass(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("stall pass", "err", err)
			}
		}
	}
}

// Pass is one pass of the detector. A stall shows in List only once the
// job owner has stored its event and marked its job.
func (d *Detector) Pass(ctx context.Context) error {
	now := d.now()
	targets := d.jobs.StallTargets()
	attempts := make(map[string]uint32, len(targets))
	for _, t := range targets {
		attempts[t.Job] = t.Attempt
	}
	progress := d.nodes.Progress(attempts)
	in := make([]stall.Job, 0, len(targets))
	for _, t := range targets {
		j := stall.Job{ID: t.Job, Attempt: t.Attempt, Threshold: t.Threshold}
		for _, rp := range progress[t.Job] {
			r := stall.Rank{Rank: rp.Status.GetRank(), Node: rp.Node, Pid: rp.Status.GetPid(),
				ProcState: rp.Status.GetProcState(), CPU: rp.Status.GetCpuSeconds()}
			for _, c := range rp.Comms {
				sc := stall.Comm{Handle: c.Handle, Created: c.Created, Done: c.Done, DoneOp: c.DoneOp.Short()}
				if c.In != nil {
					sc.In = &stall.Call{Op: c.In.GetOp().Short(), Seq: c.In.GetSeq(), Bytes: c.In.GetBytes()}
				}
				r.Comms = append(r.Comms, sc)
			}
			stall.SortComms(r.Comms)
			j.Ranks = append(j.Ranks, r)
		}
		sortRanks(j.Ranks)
		in = append(in, j)
	}
	changes := d.det.Update(now, in)
	var (
		declared []*api.Stall
		events   []*api.Event
	)
	for _, ch := range changes {
		st := toAPI(&ch.Stall)
		e := &api.Event{TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_STALL, Job: st.GetJob(),
			Attrs: map[string]string{"comm": fmt.Sprintf("%#x", st.GetComm())}}
		if first := firstRank(st); first != nil {
			e.Node, e.Pid, e.Rank = first.GetNode(), first.GetPid(), first.GetRank()
		}
		if ch.Cleared {
			e.Severity = api.Severity_SEVERITY_INFO
			e.Message = fmt.Sprintf("NCCL stall cleared after %s: %s (was: %s)", ch.Lasted.Round(100*time.Millisecond), ch.Why, st.GetDiagnosis())
			d.log.Info("stall cleared", "job", st.GetJob(), "comm", e.Attrs["comm"], "why", ch.Why)
		} else {
			e.Severity = api.Severity_SEVERITY_CRITICAL
			e.Message = "NCCL stall: " + st.GetDiagnosis() + " (" + ch.Stall.Limit.String() + ")"
			e.Attrs["limit"] = ch.Stall.Limit.Basis
			d.log.Warn("stall declared", "job", st.GetJob(), "comm", e.Attrs["comm"], "diagnosis", st.GetDiagnosis(), "limit", ch.Stall.Limit.String())
			declared = append(declared, st)
		}
		events = append(events, e)
	}
	now2 := d.det.Declared("")
	stalled := map[string]bool{}
	list := make([]*api.Stall, 0, len(now2))
	keys := map[string]bool{}
	for i := range now2 {
		st := toAPI(&now2[i])
		stalled[st.GetJob()] = true
		list = append(list, st)
		keys[Key(&now2[i])] = true
	}
	var slow []failslow.Finding
	if d.slow != nil {
		events = append(events, d.slow.pass(now, targets, progress)...)
		slow = d.slow.Findings()
	}
	if err := d.jobs.Stalls(ctx, declared, stalled, events, slow); err != nil {
		return err
	}
	d.mu.Lock()
	old := d.keys
	d.listed, d.keys = list, keys
	d.mu.Unlock()
	if d.pub != nil {
		for i := range now2 {
			d.pub.PublishStall(Key(&now2[i]), list[i])
		}
		for k := range old {
			if !keys[k] {
				d.pub.DeleteStall(k)
			}
		}
	}
	return nil
}

// Key names a stall for watchers: its job and communicator index.
func Key(s *stall.Stall) string { return fmt.Sprintf("%s/%d", s.Job, s.Comm) }

// List returns the declared stalls of job ("" = every job), by job,
// oldest first. The stalls are shared: callers must not modify them.
func (d *Detector) List(job string) []*api.Stall {
	d.mu.Lock()
	defer d.mu.Unlock()
	if job == "" {
		return d.listed
	}
	var out []*api.Stall
	for _, s := range d.listed {
		if s.GetJob() == job {
			out = append(out, s)
		}
	}
	return out
}

func sortRanks(rs []stall.Rank) {
	for i := 1; i < len(rs); i++ {
		for k := i; k > 0 && rs[k].Rank < rs[k-1].Rank; k-- {
			rs[k], rs[k-1] = rs[k-1], rs[k]
		}
	}
}

func toAPI(s *stall.Stall) *api.Stall {
	out := &api.Stall{Job: s.Job, Comm: s.Handle, SinceUnixNano: s.Since.UnixNano(), ThresholdNs: int64(s.Threshold), Diagnosis: s.Diagnosis}
	for _, r := range s.Lagging {
		out.LaggingRanks = append(out.LaggingRanks, rankAPI(r))
	}
	for _, r := range s.Waiting {
		out.WaitingRanks = append(out.WaitingRanks, rankAPI(r))
	}
	return out
}

func rankAPI(r stall.StalledRank) *api.StalledRank {
	op, _ := api.ParseNCCLOp(r.Op)
	return &api.StalledRank{Rank: r.Rank, Node: r.Node, Pid: r.Pid, Op: op, Seq: r.Seq, InCall: r.InCall, ProcState: r.ProcState}
}

// firstRank is the rank an event about the stall names: the first
// lagging one, else the first waiting one.
func firstRank(st *api.Stall) *api.StalledRank {
	if len(st.GetLaggingRanks()) > 0 {
		return st.GetLaggingRanks()[0]
	}
	if len(st.GetWaitingRanks()) > 0 {
		return st.GetWaitingRanks()[0]
	}
	return nil
}
