package jobs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// Executor starts and signals the owner's attempts somewhere other than
// through nodemon's own launches: Slurm (controlplane/slurm) or Kubernetes
// (controlplane/kube). The owner
// still decides the plan and the placement; the executor only carries them
// out, off the owner's goroutine, and its answers come back as messages
// (launch refusals as msgLaunched; what it learns later through
// ExecutorFailed and ExternalJobs). Config.Executor nil is nodemon: each
// node's commands through the dispatcher, as always.
type Executor interface {
	// Launch starts one attempt. It returns the nodes it could not start
	// on, with why.
	Launch(ctx context.Context, a AttemptLaunch) map[string]error
	// Signal sends sig (SIGUSR1: checkpoint, SIGTERM: stop, SIGKILL) to
	// one attempt of job (0: every attempt) on nodes.
	Signal(ctx context.Context, job string, attempt uint32, nodes []string, sig string) map[string]error
}

// NodemonSignals is an Executor that leaves some signals to nodemon on
// the ranks' nodes (Kubernetes' API cannot send SIGUSR1 into a pod;
// nodemon finds the ranks and sends it).
type NodemonSignals interface {
	ViaNodemon(sig string) bool
}

// AttemptLaunch is one attempt as the owner placed it.
type AttemptLaunch struct {
	Job     string
	Attempt uint32
	// Nodes in rank order; Ranks holds each node's launch.
	Nodes []string
	Ranks map[string]*api.LaunchRanks
	// Exclude are the nodes the job must avoid (it failed on them).
	Exclude []string
}

// launchOn runs one attempt's launch through the executor, or nodemon.
func (d *dispatcher) launchOn(a AttemptLaunch, timeout time.Duration, done func(map[string]error)) {
	if d.exec != nil {
		d.async(func() {
			ctx, cancel := context.WithTimeout(d.context(), max(timeout, ExecutorTimeout))
			defer cancel()
			done(d.exec.Launch(ctx, a))
		})
		return
	}
	d.fanOut(a.Nodes, func(node string) *api.Command {
		return &api.Command{Body: &api.Command_Launch{Launch: a.Ranks[node]}}
	}, timeout, done)
}

// signalOn sends sig to an attempt's ranks through the executor, or
// nodemon.
func (d *dispatcher) signalOn(job string, attempt uint32, nodes []string, sig string, timeout time.Duration, done func(map[string]error)) {
	viaNodemon := func(done func(map[string]error)) {
		d.fanOut(nodes, func(string) *api.Command {
			return &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: job, Signal: sig, Attempt: attempt}}}
		}, timeout, done)
	}
	if d.exec == nil {
		viaNodemon(done)
		return
	}
	if n, ok := d.exec.(NodemonSignals); ok && n.ViaNodemon(sig) {
		viaNodemon(done)
		return
	}
	if sig == "SIGKILL" {
		// nodemon kills the ranks it reports too: a node whose slurmd is
		// gone still runs them, and Slurm cannot reach them there.
		viaNodemon(nil)
	}
	d.async(func() {
		ctx, cancel := context.WithTimeout(d.context(), max(timeout, ExecutorTimeout))
		defer cancel()
		done(d.exec.Signal(ctx, job, attempt, nodes, sig))
	})
}

// ExecutorTimeout is the least time one executor call (an sbatch or a
// scancel for every node of the attempt) has, whatever bounds one node's
// command: Slurm's controller can take seconds to answer when busy.
const ExecutorTimeout = 30 * time.Second

func (d *dispatcher) context() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctx
}

// ErrExecutorUnavailable marks a launch the executor could not make for
// reasons of its own (Slurm's controller not answering, its tools
// missing): neither the nodes nor the job are at fault, so the attempt
// goes back to the queue and is tried again, with why.
var ErrExecutorUnavailable = errors.New("executor unavailable")

// ErrNotStarted marks a node of an attempt an executor refused as a whole
// because of other nodes: its own error is not held against it.
var ErrNotStarted = errors.New("not started: the attempt was refused on another node")

func executorUnavailable(errs map[string]error) bool {
	for _, err := range errs {
		if !errors.Is(err, ErrExecutorUnavailable) {
			return false
		}
	}
	return len(errs) > 0
}

// ExecutorRetry is the first wait before a job the executor could not
// start is tried again; each failure in a row doubles it, up to
// ExecutorRetryMax.
const (
	ExecutorRetry    = 2 * time.Second
	ExecutorRetryMax = time.Minute
)

// executorWatch applies what an executor (Slurm) reports for the owner:
// attempts it placed or could not start, and the jobs it runs that gpuctl
// did not submit, which it keeps. The jobs and the current step are the
// owner's, reached through m. It runs on the owner's goroutine only.
type executorWatch struct {
	m *Manager
	// externals are the executor's jobs gpuctl did not submit (listed,
	// never scheduled): ExternalJobs.
	externals map[string]*api.Job
}

// requeue puts an attempt that never started back in the queue
// (a preemption with no rank to stop), to be tried again after a backoff.
func (ex *executorWatch) requeue(en *entry, why string, now time.Time) {
	j := en.job
	en.retryAt = now.Add(min(ExecutorRetry<<min(en.retries, 6), ExecutorRetryMax))
	en.retryWhy = why
	en.retries++
	from := phaseOf(j)
	j.Stopping, j.StopSinceUnixNano = api.JobStop_JOB_STOP_PREEMPT, now.UnixNano()
	ex.m.check(from, EvPreempt, j)
	preemptions := j.GetPreemptions()
	ex.m.stops.finishStop(en, now)
	j.Preemptions = preemptions
	j.Reason = "not started, back in the queue: " + why
	ex.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_JOB, Severity: api.Severity_SEVERITY_WARNING, Job: j.GetId(), Message: j.GetReason()})
	ex.m.log.Warn("attempt not started; requeued", "job", j.GetId(), "why", why)
}

type msgExecutorFailed struct {
	job     string
	attempt uint32
	nodes   []string
	reason  string
}

// ExecutorFailed tells the owner that the executor saw an attempt fail on
// nodes (Slurm set them down, a Kubernetes Node went NotReady): the job
// recovers as from lost nodes. No nodes: the job's own fault (its batch
// script failed before any rank started), so it fails with reason rather
// than retrying the same way. It only queues, so an executor built before
// the owner is given the Front.
func (f *Front) ExecutorFailed(job string, attempt uint32, nodes []string, reason string) {
	f.in.post(msgExecutorFailed{job: job, attempt: attempt, nodes: nodes, reason: reason})
}

func (ex *executorWatch) failed(msg msgExecutorFailed) {
	en := ex.m.jobs[msg.job]
	if en == nil || en.job.GetAttempt() != msg.attempt {
		return
	}
	if !active(en.job) && ex.m.rec.recs[msg.job] == nil {
		// Stopping, or ended; a recovery already under way (the ranks'
		// exits came first) still learns which nodes to avoid.
		return
	}
	if len(msg.nodes) == 0 {
		ex.m.rec.giveUp(en, msg.reason, ex.m.now())
	} else {
		ex.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailNodeDown, Nodes: msg.nodes}, msg.reason, ex.m.now())
	}
	ex.m.kick()
}

type msgPlaced struct {
	job     string
	attempt uint32
	nodes   []string
}

// ExecutorPlaced tells the owner where the executor ran an attempt whose
// nodes it chose itself (Slurm placement): nodes in rank order, as many as
// the owner placed. The owner's placement follows, ranks and GPUs kept by
// position.
func (m *Manager) ExecutorPlaced(job string, attempt uint32, nodes []string) {
	m.in.post(msgPlaced{job: job, attempt: attempt, nodes: nodes})
}

func (ex *executorWatch) placed(msg msgPlaced) {
	en := ex.m.jobs[msg.job]
	if en == nil || en.job.GetAttempt() != msg.attempt || !active(en.job) {
		return
	}
	j := en.job
	if len(msg.nodes) != len(j.GetPlacement()) {
		ex.m.log.Warn("executor placed an attempt on a different number of nodes; placement kept", "job", j.GetId(), "nodes", msg.nodes)
		return
	}
	if slices.Equal(msg.nodes, nodesOfJob(j)) {
		return
	}
	for i, jn := range j.GetPlacement() {
		jn.Node = msg.nodes[i]
	}
	j.MasterAddr = ex.m.launcher.addrOf(msg.nodes[0])
	if n := len(j.GetAttempts()); n > 0 {
		j.Attempts[n-1].Nodes = slices.Clone(msg.nodes)
	}
	// Rank starts reported before the placement was known found no rank
	// to match: take their pids from what the nodes report now.
	for _, nr := range ex.m.cfg.Nodes.Ranks(j.GetId()) {
		for _, st := range nr.Ranks {
			if r := findRank(j, nr.Node, st.GetRank()); r != nil && st.GetAttempt() == j.GetAttempt() && r.GetPid() == 0 && !r.GetExited() {
				r.Pid = st.GetPid()
			}
		}
	}
	j.Reason = fmt.Sprintf("attempt %d placed by Slurm on %s", j.GetAttempt(), strings.Join(msg.nodes, ","))
	ex.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_JOB, Job: j.GetId(), Message: j.GetReason()})
	ex.m.save(en)
	ex.m.kick()
}

func nodesOfJob(j *api.Job) []string {
	out := make([]string, len(j.GetPlacement()))
	for i, jn := range j.GetPlacement() {
		out[i] = jn.GetNode()
	}
	return out
}

type msgExternal struct{ jobs []*api.Job }

// ExternalJobs replaces the jobs the executor runs that gpuctl did not
// submit (plain sbatch): they are listed and described with the others,
// never scheduled or recovered, and not stored (the executor is where
// they live). The jobs are not modified afterwards.
func (f *Front) ExternalJobs(jobs []*api.Job) { f.in.post(msgExternal{jobs: jobs}) }

func (ex *executorWatch) external(msg msgExternal) {
	next := make(map[string]*api.Job, len(msg.jobs))
	for _, j := range msg.jobs {
		if ex.m.jobs[j.GetId()] != nil {
			ex.m.log.Warn("an external job has the id of a gpuctl job; not listed", "job", j.GetId())
			continue
		}
		next[j.GetId()] = j
	}
	changed := len(next) != len(ex.externals)
	for id, j := range next {
		if old := ex.externals[id]; old == nil || !equalJob(old, j) {
			changed = true
			if ex.m.cfg.Publish != nil {
				ex.m.cfg.Publish.PublishJob(j)
			}
		}
	}
	if !changed {
		return
	}
	ex.externals = next
	ex.m.publishView()
}

func equalJob(a, b *api.Job) bool { return proto.Equal(a, b) }

// sorted lists the external jobs by id.
func (ex *executorWatch) sorted() []*api.Job {
	ids := slices.Sorted(maps.Keys(ex.externals))
	out := make([]*api.Job, len(ids))
	for i, id := range ids {
		out[i] = ex.externals[id]
	}
	return out
}
