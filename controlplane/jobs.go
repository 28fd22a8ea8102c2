package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/store"
)

// DefaultPolicy is the scheduling policy gpuctl serve uses without --policy:
// priorities with aging (no starvation), preemption of checkpointing jobs,
// and EASY backfill so small jobs use GPUs a blocked big job cannot.
const DefaultPolicy = "priority+backfill"

// jobConfig tunes the job manager; zero fields take the defaults noted.
type jobConfig struct {
	// Policy orders the queue, default DefaultPolicy.
	Policy scheduler.Policy
	// Every is the scheduling period, default 1 s; changes also kick a pass.
	Every time.Duration
	// PortBase and PortRange bound the ports handed to jobs (a pair each,
	// MASTER_PORT and MASTER_PORT+1), default 29500 and 1000.
	PortBase, PortRange int
	// CheckpointRoot holds <job>/ for jobs that name no checkpoint dir.
	CheckpointRoot string
	// MoveGrace is how long a move waits for its checkpoint before it
	// stops the ranks anyway, default 2 min.
	MoveGrace time.Duration
	// KillAfter is how long ranks have after SIGTERM before SIGKILL,
	// default 30 s.
	KillAfter time.Duration
	// CommandTimeout bounds one command to one node, default 10 s.
	CommandTimeout time.Duration
	// SignalTimeout bounds a signal fan-out, default 2 s: stops resend, and
	// a failed node must not hold up the scheduling pass.
	SignalTimeout time.Duration
	// MaxMoves bounds a rebalance plan, default 8.
	MaxMoves int
	// MaxExplained bounds how many pending jobs per pass get a placer
	// explanation, default 64; the rest read "queued".
	MaxExplained int
	// ValidateCommand is the short all-reduce run on nodes new to a
	// recovering job before it lands there (one rank per node); empty
	// skips it, leaving NVML health as the only check.
	ValidateCommand []string
	// ValidateTimeout bounds a validation gang, default 30 s.
	ValidateTimeout time.Duration
	// MaxValidations bounds the validation rounds of one recovery, default 3.
	MaxValidations int
	// RecoveryKillAfter is how long a recovering job's surviving ranks
	// have after SIGTERM before SIGKILL, default 5 s: they are stuck in a
	// collective with a dead peer, not saving anything.
	RecoveryKillAfter time.Duration
	// ReconnectGrace is added to twice a node's heartbeat to bound how long
	// a disconnected node may hold live ranks (after a server restart,
	// before it reconnects) until it counts as down; default 5 s.
	ReconnectGrace time.Duration
}

func (c *jobConfig) defaults() {
	if c.Policy == nil {
		c.Policy, _ = scheduler.PolicyByName(DefaultPolicy)
	}
	if c.Every <= 0 {
		c.Every = time.Second
	}
	if c.PortBase <= 0 {
		c.PortBase = 29500
	}
	if c.PortRange <= 0 {
		c.PortRange = 1000
	}
	if c.MoveGrace <= 0 {
		c.MoveGrace = 2 * time.Minute
	}
	if c.KillAfter <= 0 {
		c.KillAfter = 30 * time.Second
	}
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = 10 * time.Second
	}
	if c.SignalTimeout <= 0 {
		c.SignalTimeout = 2 * time.Second
	}
	if c.MaxMoves <= 0 {
		c.MaxMoves = 8
	}
	if c.MaxExplained <= 0 {
		c.MaxExplained = 64
	}
	if c.ValidateTimeout <= 0 {
		c.ValidateTimeout = 30 * time.Second
	}
	if c.MaxValidations <= 0 {
		c.MaxValidations = 3
	}
	if c.RecoveryKillAfter <= 0 {
		c.RecoveryKillAfter = 5 * time.Second
	}
	if c.ReconnectGrace <= 0 {
		c.ReconnectGrace = 5 * time.Second
	}
}

// commander sends one command to a node and waits for its ack; the Server
// is one, tests use a recording fake.
type commander interface {
	Command(ctx context.Context, node string, c *api.Command) error
}

// jobEntry is one job: its persisted record and its parsed job file.
type jobEntry struct {
	job *api.Job
	// spec is nil only for a stored job whose file no longer parses; such
	// a job is failed on load.
	spec *jobspec.Spec
	// resume, when resumeSet, is the step the next start resumes from
	// (recovery decided it); otherwise the latest checkpoint is used.
	resume    int64
	resumeSet bool
	// killSent is set once a stop has sent SIGKILL.
	killSent bool
}

// jobManager owns jobs: it persists them, runs the scheduler over live
// nodes, and carries out its decisions through the nodemons. The scheduler
// stays pure; time and side effects live here. Every state change is
// written to the store before a command acts on it or a client hears of it.
type jobManager struct {
	cfg   jobConfig
	log   *slog.Logger
	store store.Store
	cmd   commander
	nodes func() []*api.NodeStatus
	now   func() time.Time
	kick  chan struct{}

	// ranks returns the live rank statuses nodes report (state.jobRanks).
	ranks func(job string) []NodeRanks
	// cordon takes a failed node out of scheduling; nil when the server
	// cannot.
	cordon func(node, reason string) error
	// loadedAt is when the manager loaded the store: nodes holding ranks
	// must reconnect within their grace of it.
	loadedAt time.Time

	mu   sync.Mutex
	jobs map[string]*jobEntry
	// moves are the rebalance moves not yet begun; they run one at a time.
	moves []scheduler.Move
	// recs are the recoveries in progress, vals the validation gangs.
	recs map[string]*recovery
	vals map[string]*validation
	prog map[string]*jobProgress
	// later holds side effects decided outside reconcile (event handlers),
	// carried out by the next pass.
	later []action
}

// newJobManager loads every stored job. A job whose stored file no longer
// parses cannot be launched again, so it is failed (with why) rather than
// silently dropped.
func newJobManager(cfg jobConfig, log *slog.Logger, st store.Store, cmd commander, nodes func() []*api.NodeStatus, now func() time.Time) (*jobManager, error) {
	cfg.defaults()
	m := &jobManager{cfg: cfg, log: log, store: st, cmd: cmd, nodes: nodes, now: now, loadedAt: now(),
		kick: make(chan struct{}, 1), jobs: map[string]*jobEntry{},
		recs: map[string]*recovery{}, vals: map[string]*validation{}, prog: map[string]*jobProgress{}}
	stored, err := st.Jobs()
	if err != nil {
		return nil, fmt.Errorf("load jobs: %w", err)
	}
	for _, j := range stored {
		en := &jobEntry{job: j}
		spec, err := jobspec.Parse(j.GetSpecSource(), []byte(j.GetSpecYaml()))
		if err == nil {
			en.spec = spec
		} else if !terminal(j.GetState()) {
			m.finalFailLocked(en, fmt.Sprintf("stored job file no longer parses: %v", err), now())
			m.persistLocked(en)
		}
		if en.spec != nil && j.GetState() == api.JobState_JOB_STATE_RECOVERING {
			// The recovery restarts from its first step: stop what is
			// left, choose nodes, validate, relaunch.
			m.recs[j.GetId()] = &recovery{failure: scheduler.Failure{Kind: scheduler.FailRankExit}, reason: strings.TrimPrefix(j.GetReason(), "recovering: "),
				since: now(), stepAt: j.GetStep(), resume: -1, cordon: map[string]string{}}
		}
		m.jobs[j.GetId()] = en
	}
	return m, nil
}

// run schedules every period and whenever something changed, until ctx ends.
func (m *jobManager) run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Every)
	defer t.Stop()
	for {
		m.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
	}
}

// poke asks for a scheduling pass soon.
func (m *jobManager) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func terminal(s api.JobState) bool {
	return s == api.JobState_JOB_STATE_SUCCEEDED || s == api.JobState_JOB_STATE_FAILED || s == api.JobState_JOB_STATE_CANCELLED
}

// stateName is a job state as people and scripts read it.
func stateName(s api.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

func liveRanks(j *api.Job) int {
	n := 0
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				n++
			}
		}
	}
	return n
}

func jobGPUs(j *api.Job) int {
	n := 0
	for _, jn := range j.GetPlacement() {
		n += len(jn.GetRanks())
	}
	return n
}

// persistLocked writes the job; a failure is logged and returned, since
// callers that are about to act on the change must not.
func (m *jobManager) persistLocked(en *jobEntry) error {
	if err := m.store.PutJob(en.job); err != nil {
		m.log.Error("persist job", "job", en.job.GetId(), "err", err)
		return err
	}
	return nil
}

// newID returns a short unused job id.
func (m *jobManager) newIDLocked() (string, error) {
	for range 16 {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("job id: %w", err)
		}
		id := "j-" + hex.EncodeToString(b[:])
		if _, taken := m.jobs[id]; !taken {
			return id, nil
		}
	}
	return "", errors.New("job id: no free id after 16 tries")
}

// ------------------------------------------------------------- node events

// onEvent is the control plane's hook for every persisted event: rank
// starts and exits move jobs along, a node going down fails its jobs.
func (m *jobManager) onEvent(e *api.Event) {
	switch e.GetKind() {
	case api.EventKind_EVENT_KIND_JOB:
		m.rankStarted(e)
	case api.EventKind_EVENT_KIND_PROCESS_EXIT:
		m.rankExited(e)
	case api.EventKind_EVENT_KIND_NODE_DOWN:
		m.nodeDown(e.GetNode(), e.GetMessage())
	case api.EventKind_EVENT_KIND_NODE_UP, api.EventKind_EVENT_KIND_NODE_JOINED:
		m.nodeUp(e.GetNode())
		m.reconcileRegistration(e.GetNode())
	case api.EventKind_EVENT_KIND_CHECKPOINT:
		m.checkpointed(e)
	case api.EventKind_EVENT_KIND_XID, api.EventKind_EVENT_KIND_ECC, api.EventKind_EVENT_KIND_GPU_LOST:
		m.gpuFault(e)
	}
}

// findRank returns the current attempt's rank on node, or nil.
func findRank(j *api.Job, node string, rank int32) *api.JobRank {
	for _, jn := range j.GetPlacement() {
		if jn.GetNode() != node {
			continue
		}
		for _, r := range jn.GetRanks() {
			if r.GetRank() == rank {
				return r
			}
		}
	}
	return nil
}

func (m *jobManager) rankStarted(e *api.Event) {
	if e.GetPid() == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.validationEventLocked(e) {
		return
	}
	en := m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	r := findRank(en.job, e.GetNode(), e.GetRank())
	if r == nil || r.GetExited() || r.GetPid() != 0 {
		return
	}
	r.Pid = e.GetPid()
	m.persistLocked(en)
}

// rankExited records an exit of the current attempt; an exit whose pid is
// not the one recorded belongs to an earlier attempt and is ignored.
func (m *jobManager) rankExited(e *api.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.validationEventLocked(e) {
		m.poke()
		return
	}
	en := m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	j := en.job
	r := findRank(j, e.GetNode(), e.GetRank())
	if r == nil || r.GetExited() || r.GetPid() != e.GetPid() {
		return
	}
	r.Exited, r.ExitCode, r.Signal = true, e.GetExitCode(), e.GetSignal()
	// The exit carries the last step the rank printed, fresher than the
	// last rank status: it bounds the steps a restart loses.
	if e.GetStep() > j.GetStep() {
		j.Step = e.GetStep()
	}
	if rec := m.recs[j.GetId()]; rec != nil && e.GetStep() > rec.stepAt {
		rec.stepAt = e.GetStep()
	}
	now := m.now()
	if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() == api.JobStop_JOB_STOP_NONE {
		switch {
		case e.GetExitCode() != 0 || e.GetSignal() != "":
			m.failLocked(en, scheduler.Failure{Kind: scheduler.FailRankExit},
				fmt.Sprintf("rank %d on %s (pid %d) %s", e.GetRank(), e.GetNode(), e.GetPid(), describeExit(e.GetExitCode(), e.GetSignal())), now)
		case liveRanks(j) == 0:
			j.State = api.JobState_JOB_STATE_SUCCEEDED
			j.EndUnixNano = now.UnixNano()
			j.Reason = fmt.Sprintf("all %d ranks exited with code 0", jobGPUs(j))
			m.log.Info("job succeeded", "job", j.GetId(), "attempt", j.GetAttempt())
		}
	}
	m.persistLocked(en)
	m.poke()
}

func describeExit(code int32, signal string) string {
	if signal != "" {
		return "was killed by " + signal
	}
	return fmt.Sprintf("exited with code %d", code)
}

// nodeDown marks the ranks on a lost node gone and fails their jobs.
func (m *jobManager) nodeDown(node, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodeDownLocked(node, why, m.now())
	m.poke()
}

func (m *jobManager) nodeDownLocked(node, why string, now time.Time) {
	for _, v := range m.vals {
		if r := v.ranks[node]; r != nil && !r.exited {
			r.exited, r.code, r.err = true, -1, "node went down ("+why+")"
		}
	}
	for _, en := range m.sortedLocked() {
		j := en.job
		hit := false
		for _, jn := range j.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if !r.GetExited() {
					r.Exited, r.ExitCode, r.Signal = true, -1, lostRank
					hit = true
				}
			}
		}
		if !hit {
			continue
		}
		f := scheduler.Failure{Kind: scheduler.FailNodeDown, Nodes: []string{node}}
		reason := fmt.Sprintf("node %s went down (%s)", node, why)
		switch {
		case j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() == api.JobStop_JOB_STOP_NONE,
			j.GetState() == api.JobState_JOB_STATE_RECOVERING:
			m.failLocked(en, f, reason, now)
		}
		m.persistLocked(en)
	}
}

// lostRank marks a rank given up with its node: not seen to exit, so its
// pid may still show on the node's GPUs when the node returns.
const lostRank = "node down"

// nodeUp kills what may be left of ranks given up when the node went down:
// their jobs have moved on, and the GPUs must not run two jobs.
func (m *jobManager) nodeUp(node string) {
	m.mu.Lock()
	var jobs []string
	for _, en := range m.sortedLocked() {
		for _, jn := range en.job.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if r.GetSignal() == lostRank && !slices.Contains(jobs, en.job.GetId()) {
					jobs = append(jobs, en.job.GetId())
				}
			}
		}
	}
	m.mu.Unlock()
	for _, id := range jobs {
		errs := m.fanOut(context.Background(), []string{node}, func(string) *api.Command {
			return &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: id, Signal: "SIGKILL"}}}
		})
		m.log.Info("killed ranks left from before the node went down", "job", id, "node", node, "err", errs[node])
	}
}

// --------------------------------------------------------------- the loop

// action is a side effect decided under the lock and carried out after.
type action func(ctx context.Context)

// reconcile is one pass: move stops along, begin the next rebalance move,
// schedule, and refresh progress; commands go out after the lock is released.
func (m *jobManager) reconcile(ctx context.Context) {
	m.mu.Lock()
	now := m.now()
	acts := m.later
	m.later = nil
	m.lostNodesLocked(now)
	acts = append(acts, m.stopsLocked(now)...)
	acts = append(acts, m.recoveriesLocked(ctx, now)...)
	acts = append(acts, m.movesLocked(now)...)
	acts = append(acts, m.scheduleLocked(now)...)
	acts = append(acts, m.metricsLocked(now)...)
	m.mu.Unlock()
	for _, a := range acts {
		a(ctx)
	}
}

func (m *jobManager) sortedLocked() []*jobEntry {
	out := make([]*jobEntry, 0, len(m.jobs))
	for _, en := range m.jobs {
		out = append(out, en)
	}
	slices.SortFunc(out, func(a, b *jobEntry) int {
		if c := a.job.GetSubmitUnixNano() - b.job.GetSubmitUnixNano(); c != 0 {
			if c < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.job.GetId(), b.job.GetId())
	})
	return out
}

// preemptGrace is how long a preempted job may take to checkpoint.
func (m *jobManager) preemptGrace() time.Duration {
	if p, ok := m.cfg.Policy.(scheduler.Preemptor); ok && p.Grace() > 0 {
		return time.Duration(p.Grace()) * time.Second
	}
	return m.cfg.MoveGrace
}

// stopsLocked drives every stopping job: SIGTERM once its checkpoint
// landed (or its grace ran out), SIGKILL if ranks outlive KillAfter, and
// the next state once every rank is gone.
func (m *jobManager) stopsLocked(now time.Time) []action {
	var acts []action
	for _, en := range m.sortedLocked() {
		j := en.job
		if j.GetStopping() == api.JobStop_JOB_STOP_NONE {
			continue
		}
		if liveRanks(j) == 0 {
			acts = append(acts, m.finishStopLocked(en, now)...)
			continue
		}
		changed := false
		if j.GetTermSentUnixNano() == 0 {
			term := true
			switch j.GetStopping() {
			case api.JobStop_JOB_STOP_PREEMPT, api.JobStop_JOB_STOP_MOVE:
				grace := m.cfg.MoveGrace
				if j.GetStopping() == api.JobStop_JOB_STOP_PREEMPT {
					grace = m.preemptGrace()
				}
				step, _ := readLatest(j.GetCheckpointDir())
				term = step > j.GetStopCheckpointStep() || now.Sub(time.Unix(0, j.GetStopSinceUnixNano())) >= grace
			}
			if term {
				en.killSent = false
				j.TermSentUnixNano = now.UnixNano()
				acts = append(acts, m.signalAction(j, "SIGTERM"))
				changed = true
			}
		} else if grace := m.killAfter(j); now.Sub(time.Unix(0, j.GetTermSentUnixNano())) >= grace {
			if en.killSent {
				// SIGKILL cannot be ignored: a rank still counted live a
				// grace after it is one its node no longer has (its exit
				// was lost with a restarted nodemon).
				m.giveUpRanksLocked(en)
			} else {
				m.log.Warn("ranks outlived SIGTERM; killing", "job", j.GetId(), "live", liveRanks(j))
				acts = append(acts, m.signalAction(j, "SIGKILL"))
				en.killSent = true
			}
			j.TermSentUnixNano = now.UnixNano()
			changed = true
		}
		if changed {
			m.persistLocked(en)
		}
	}
	return acts
}

// killAfter is how long a stopping job's ranks have after SIGTERM.
func (m *jobManager) killAfter(j *api.Job) time.Duration {
	if j.GetState() == api.JobState_JOB_STATE_RECOVERING {
		return m.cfg.RecoveryKillAfter
	}
	return m.cfg.KillAfter
}

// giveUpRanksLocked marks exited the ranks a SIGKILL and a grace did not
// account for. A rank on a connected node that is still counted live then
// is one its nodemon no longer knows (the exit was lost when it restarted).
func (m *jobManager) giveUpRanksLocked(en *jobEntry) {
	j := en.job
	connected := map[string]bool{}
	for _, n := range m.nodes() {
		connected[n.GetRegistration().GetName()] = n.GetConnected()
	}
	var gone []string
	for _, jn := range j.GetPlacement() {
		if !connected[jn.GetNode()] {
			// Its ranks may still run there: they count gone only with
			// the node (lostNodesLocked).
			continue
		}
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				r.Exited, r.ExitCode, r.Signal = true, -1, "unaccounted after SIGKILL"
				gone = append(gone, fmt.Sprintf("%s rank %d (pid %d)", jn.GetNode(), r.GetRank(), r.GetPid()))
			}
		}
	}
	m.log.Warn("ranks unaccounted for a grace after SIGKILL; counting them gone", "job", j.GetId(), "ranks", gone)
}

// finishStopLocked moves a job whose ranks are all gone to its next state.
func (m *jobManager) finishStopLocked(en *jobEntry, now time.Time) []action {
	j := en.job
	en.killSent = false
	stop := j.GetStopping()
	j.Stopping, j.TermSentUnixNano, j.StopSinceUnixNano = api.JobStop_JOB_STOP_NONE, 0, 0
	var acts []action
	switch stop {
	case api.JobStop_JOB_STOP_PREEMPT:
		m.requeueLocked(en, now)
		j.Preemptions++
	case api.JobStop_JOB_STOP_MOVE:
		target := j.GetMoveTarget()
		j.MoveTarget = nil
		pl := placementOf(target, shapeOf(j))
		if why := m.targetBusyLocked(j.GetId(), &pl); why != "" {
			m.requeueLocked(en, now)
			j.Reason = "move target no longer free (" + why + "); back in the queue, resumes from its checkpoint"
		} else {
			m.addAttainedLocked(j, now)
			if a := m.startLocked(en, pl, now); a != nil {
				acts = append(acts, a)
			}
			return acts
		}
	}
	m.persistLocked(en)
	return acts
}

func (m *jobManager) addAttainedLocked(j *api.Job, now time.Time) {
	if j.GetStartUnixNano() > 0 {
		j.AttainedGpuSeconds += now.Sub(time.Unix(0, j.GetStartUnixNano())).Seconds() * float64(jobGPUs(j))
	}
}

// requeueLocked puts a stopped job back in the queue; it resumes from its
// checkpoint when it starts again.
func (m *jobManager) requeueLocked(en *jobEntry, now time.Time) {
	j := en.job
	m.addAttainedLocked(j, now)
	j.State = api.JobState_JOB_STATE_PENDING
	j.Placement = nil
	j.StartUnixNano = 0
	j.PendingReason = "waiting for the scheduler"
}

// targetBusyLocked says why a placement's GPUs cannot take job id now, or "".
func (m *jobManager) targetBusyLocked(id string, pl *scheduler.Placement) string {
	snap := m.snapshotLocked(m.now())
	nodes := map[string]*scheduler.Node{}
	for i := range snap.Nodes {
		nodes[snap.Nodes[i].Name] = &snap.Nodes[i]
	}
	for _, s := range pl.Ranks {
		n := nodes[s.Node]
		if n == nil || n.State != scheduler.NodeReady {
			return "node " + s.Node + " is not ready"
		}
		for _, g := range n.GPUs {
			if g.Index != s.GPU {
				continue
			}
			if !g.Healthy {
				return fmt.Sprintf("GPU %d of %s is unhealthy", s.GPU, s.Node)
			}
			if g.Job != "" && g.Job != id {
				return fmt.Sprintf("GPU %d of %s is taken by %s", s.GPU, s.Node, g.Job)
			}
		}
	}
	return ""
}

// signalAction sends sig to the job's ranks on every node that still has
// live ones. Failures are logged: the stop timers send again.
func (m *jobManager) signalAction(j *api.Job, sig string) action {
	id := j.GetId()
	var nodes []string
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				nodes = append(nodes, jn.GetNode())
				break
			}
		}
	}
	return func(ctx context.Context) {
		// A node that does not ack soon is likely the one that failed; the
		// stop timers send again, so the pass need not wait long for it.
		ctx, cancel := context.WithTimeout(ctx, m.cfg.SignalTimeout)
		defer cancel()
		errs := m.fanOut(ctx, nodes, func(node string) *api.Command {
			return &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: id, Signal: sig}}}
		})
		for node, err := range errs {
			m.log.Warn("signal ranks", "job", id, "node", node, "signal", sig, "err", err)
		}
		m.log.Info("signalled ranks", "job", id, "signal", sig, "nodes", nodes)
	}
}

// fanOut sends one command per node in parallel and returns the failures.
func (m *jobManager) fanOut(ctx context.Context, nodes []string, mk func(node string) *api.Command) map[string]error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs = map[string]error{}
	)
	for _, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, m.cfg.CommandTimeout)
			defer cancel()
			if err := m.cmd.Command(cctx, node, mk(node)); err != nil {
				mu.Lock()
				errs[node] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}

// movesLocked begins the next rebalance move once none is in flight:
// checkpoint (SIGUSR1) now, SIGTERM when it lands, relaunch when all
// ranks are gone.
func (m *jobManager) movesLocked(now time.Time) []action {
	for _, en := range m.jobs {
		if en.job.GetStopping() == api.JobStop_JOB_STOP_MOVE {
			return nil
		}
	}
	for len(m.moves) > 0 {
		mv := m.moves[0]
		m.moves = m.moves[1:]
		en := m.jobs[mv.Job]
		if en == nil || en.job.GetState() != api.JobState_JOB_STATE_RUNNING || en.job.GetStopping() != api.JobStop_JOB_STOP_NONE {
			continue
		}
		j := en.job
		cur := placementOf(j.GetPlacement(), shapeOf(j))
		if !slices.Equal(cur.Ranks, mv.From.Ranks) {
			m.log.Info("rebalance move skipped: job moved since the plan", "job", j.GetId())
			continue
		}
		j.Stopping = api.JobStop_JOB_STOP_MOVE
		j.MoveTarget = jobNodes(&mv.To)
		j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
		j.StopCheckpointStep, _ = readLatest(j.GetCheckpointDir())
		j.Reason = "moving to " + strings.Join(mv.To.Nodes(), ",") + " (rebalance): checkpointing"
		if m.persistLocked(en) != nil {
			continue
		}
		return []action{m.signalAction(j, "SIGUSR1")}
	}
	return nil
}

// scheduleLocked runs the scheduler over the live snapshot and applies its
// decisions, then explains why each job still pending waits.
func (m *jobManager) scheduleLocked(now time.Time) []action {
	snap := m.snapshotLocked(now)
	// A job that cannot fit even the idle cluster would block the queue
	// head forever; it waits aside, with why, until the cluster grows.
	never := map[string]string{}
	idle := idleCopy(&snap)
	queue := snap.Pending[:0:0]
	for _, r := range snap.Pending {
		if _, err := scheduler.Place(&idle, &r); err != nil {
			never[r.ID] = neverFitReason(err, &r, &idle)
			continue
		}
		queue = append(queue, r)
	}
	snap.Pending = queue
	var (
		acts    []action
		started = map[string]bool{}
		reserve *scheduler.Reserve
		preempt []string
	)
	for _, d := range scheduler.Schedule(&snap, m.cfg.Policy) {
		en := m.jobs[d.JobID()]
		if en == nil {
			continue
		}
		switch d := d.(type) {
		case scheduler.Start:
			if a := m.startLocked(en, d.Placement, now); a != nil {
				acts = append(acts, a)
				started[d.Job] = true
			}
		case scheduler.Preempt:
			if a := m.preemptLocked(en, d, now); a != nil {
				acts = append(acts, a)
				preempt = append(preempt, d.Job)
			}
		case scheduler.Reserve:
			reserve = &d
		case scheduler.Reject:
			m.finalFailLocked(en, "rejected by the scheduler: "+d.Err.Error(), now)
			m.persistLocked(en)
		}
	}
	m.explainLocked(now, started, never, reserve, preempt)
	return acts
}

// startLocked persists a new attempt on pl, then returns the launch.
func (m *jobManager) startLocked(en *jobEntry, pl scheduler.Placement, now time.Time) action {
	if en.spec == nil || len(pl.Ranks) == 0 {
		return nil
	}
	j := en.job
	prev := proto.Clone(j).(*api.Job)
	j.Attempt++
	if pl.Shape.DP > 0 {
		j.Plan.Dp = int32(pl.Shape.DP)
	}
	j.Placement = jobNodes(&pl)
	j.MasterAddr = m.addrOf(pl.Ranks[0].Node)
	j.MasterPort = m.portLocked(j.GetId(), j.GetAttempt())
	j.ResumeStep = 0
	switch {
	case en.resumeSet:
		j.ResumeStep = en.resume
		en.resume, en.resumeSet = 0, false
	case j.GetAttempt() > 1:
		j.ResumeStep = m.resumeStepLocked(en)
	}
	j.State = api.JobState_JOB_STATE_RUNNING
	j.StartUnixNano = now.UnixNano()
	if j.GetFirstStartUnixNano() == 0 {
		j.FirstStartUnixNano = now.UnixNano()
	}
	j.Stalled = false
	j.PendingReason, j.Hold = "", false
	j.Stopping, j.TermSentUnixNano, j.StopSinceUnixNano, j.MoveTarget = api.JobStop_JOB_STOP_NONE, 0, 0, nil
	j.Reason = fmt.Sprintf("attempt %d started on %s", j.GetAttempt(), strings.Join(pl.Nodes(), ","))
	if j.GetResumeStep() > 0 {
		j.Reason += fmt.Sprintf(", resuming from step %d", j.GetResumeStep())
	}
	if err := m.persistLocked(en); err != nil {
		en.job = prev
		return nil
	}
	launches := map[string]*api.LaunchRanks{}
	var nodes []string
	for _, jn := range j.GetPlacement() {
		l := &api.LaunchRanks{Job: j.GetId(), Attempt: j.GetAttempt(), Command: en.spec.Command, Env: en.spec.Env,
			WorldSize: int32(len(pl.Ranks)), MasterAddr: j.GetMasterAddr(), MasterPort: j.GetMasterPort(),
			CheckpointDir: j.GetCheckpointDir(), ResumeStep: j.GetResumeStep()}
		for _, r := range jn.GetRanks() {
			l.Ranks = append(l.Ranks, &api.RankSpec{Rank: r.GetRank(), LocalRank: r.GetLocalRank(), Gpus: []uint32{r.GetGpu()}})
		}
		launches[jn.GetNode()] = l
		nodes = append(nodes, jn.GetNode())
	}
	id, attempt := j.GetId(), j.GetAttempt()
	m.log.Info("job starting", "job", id, "attempt", attempt, "nodes", nodes, "master", fmt.Sprintf("%s:%d", j.GetMasterAddr(), j.GetMasterPort()))
	return func(ctx context.Context) {
		errs := m.fanOut(ctx, nodes, func(node string) *api.Command {
			return &api.Command{Body: &api.Command_Launch{Launch: launches[node]}}
		})
		if len(errs) > 0 {
			m.launchFailed(id, attempt, errs)
		}
	}
}

// launchFailed fails an attempt some node would not launch; its ranks
// there never started, the others are stopped.
func (m *jobManager) launchFailed(id string, attempt uint32, errs map[string]error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en := m.jobs[id]
	if en == nil || en.job.GetAttempt() != attempt {
		return
	}
	j := en.job
	var msgs []string
	for _, jn := range j.GetPlacement() {
		err, ok := errs[jn.GetNode()]
		if !ok {
			continue
		}
		msgs = append(msgs, fmt.Sprintf("%s: %v", jn.GetNode(), err))
		for _, r := range jn.GetRanks() {
			if !r.GetExited() && r.GetPid() == 0 {
				r.Exited, r.ExitCode, r.Signal = true, -1, "not launched"
			}
		}
	}
	if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStopping() == api.JobStop_JOB_STOP_NONE {
		var refused []string
		for node := range errs {
			refused = append(refused, node)
		}
		slices.Sort(refused)
		m.failLocked(en, scheduler.Failure{Kind: scheduler.FailNodeDown, Nodes: refused}, "launch failed on "+strings.Join(msgs, "; "), m.now())
	}
	m.persistLocked(en)
	m.poke()
}

// preemptLocked begins stopping a job the scheduler preempts: checkpoint
// first when it checkpoints, then SIGTERM (stopsLocked), then back to the
// queue once its ranks are gone.
func (m *jobManager) preemptLocked(en *jobEntry, d scheduler.Preempt, now time.Time) action {
	j := en.job
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE {
		return nil
	}
	j.Stopping = api.JobStop_JOB_STOP_PREEMPT
	j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	j.StopCheckpointStep, _ = readLatest(j.GetCheckpointDir())
	j.Reason = fmt.Sprintf("preempted for %s: %s", d.For, d.Reason)
	sig := "SIGUSR1"
	if !d.CheckpointFirst {
		sig = "SIGTERM"
		j.TermSentUnixNano = now.UnixNano()
	}
	if m.persistLocked(en) != nil {
		return nil
	}
	m.log.Info("preempting job", "job", j.GetId(), "for", d.For, "signal", sig)
	return m.signalAction(j, sig)
}

// readLatest returns the step in a checkpoint dir's `latest` marker.
func readLatest(dir string) (int64, bool) {
	if dir == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dir, "latest"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// portLocked picks the attempt's MASTER_PORT: a hash of job and attempt
// into the configured range, stepping past ports of jobs still holding
// ranks, so a relaunch never meets its predecessor's listener. Each job
// gets a pair, MASTER_PORT and MASTER_PORT+1, since trainers (ringtrain
// among them) meet on a second communicator at the next port.
func (m *jobManager) portLocked(id string, attempt uint32) uint32 {
	used := map[int]bool{}
	for _, en := range m.jobs {
		if en.job.GetId() != id && liveRanks(en.job) > 0 {
			used[int(en.job.GetMasterPort())] = true
		}
	}
	pairs := max(m.cfg.PortRange/2, 1)
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	off := int(h.Sum32() % uint32(pairs))
	for i := range pairs {
		p := m.cfg.PortBase + 2*((off+i)%pairs)
		if !used[p] {
			return uint32(p)
		}
	}
	return uint32(m.cfg.PortBase + 2*off)
}

// addrOf is the address ranks dial for node: the host its nodemon
// connects from, else its hostname, else its name.
func (m *jobManager) addrOf(node string) string {
	for _, n := range m.nodes() {
		if n.GetRegistration().GetName() != node {
			continue
		}
		if host, _, err := splitHost(n.GetRemoteAddr()); err == nil && host != "" {
			return host
		}
		if h := n.GetRegistration().GetHostname(); h != "" {
			return h
		}
	}
	return node
}

// list returns copies of the jobs matching key (id or name; "" = all),
// oldest first.
func (m *jobManager) list(key string) []*api.Job {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*api.Job
	for _, en := range m.sortedLocked() {
		if key == "" || en.job.GetId() == key || en.job.GetName() == key {
			out = append(out, proto.Clone(en.job).(*api.Job))
		}
	}
	return out
}

// findLocked resolves an id or a name. A name matching several jobs picks
// the one still active, and is an error when that is ambiguous.
func (m *jobManager) findLocked(key string) (*jobEntry, error) {
	if en, ok := m.jobs[key]; ok {
		return en, nil
	}
	var all, active []*jobEntry
	for _, en := range m.sortedLocked() {
		if en.job.GetName() == key {
			all = append(all, en)
			if !terminal(en.job.GetState()) {
				active = append(active, en)
			}
		}
	}
	switch {
	case len(all) == 0:
		return nil, fmt.Errorf("unknown job %q: `gpuctl jobs` lists them", key)
	case len(all) == 1:
		return all[0], nil
	case len(active) == 1:
		return active[0], nil
	}
	ids := make([]string, len(all))
	for i, en := range all {
		ids[i] = en.job.GetId() + " (" + stateName(en.job.GetState()) + ")"
	}
	return nil, fmt.Errorf("job name %q matches %s: name one by id", key, strings.Join(ids, ", "))
}
