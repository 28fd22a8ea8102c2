package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// rankProc is one rank this nodemon launched or adopted.
type rankProc struct {
	rec rankRecord
	// adopted: started by an earlier nodemon, so not this one's child; its
	// exit is noticed by polling its shim.
	adopted bool
	// fenced: the server said its attempt is superseded; its lease is
	// never renewed again.
	fenced bool
	done   chan struct{}
	tail   *logTail
	parser *logParser
}

func (p *rankProc) exited() bool { return isClosed(p.done) }

// isClosed says whether done, which is only ever closed, is.
func isClosed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// pollLog reads what the rank printed since the last poll.
func (p *rankProc) pollLog(now time.Time) {
	p.tail.poll(p.parser, now)
}

// ExecutorOptions configures an Executor.
type ExecutorOptions struct {
	// Node is this node's name, given to ranks as GPUCTL_NODE.
	Node string
	// DataDir holds ranks.json, the rank logs (logs/<job>/rank-R.log) and
	// the shims' exit status files (run/<job>/).
	DataDir string
	// OnEvent receives rank start, exit and checkpoint events.
	OnEvent func(*api.Event)
	Log     *slog.Logger
	// Shim is the command line that runs a rank shim; default this
	// executable with ShimCommand.
	Shim []string
	// LogMaxBytes and LogKeep set rank log rotation, default 64 MiB and 3.
	LogMaxBytes int64
	LogKeep     int
	// CgroupRoot is the cgroup v2 mount, default /sys/fs/cgroup; "off"
	// turns job cgroups off.
	CgroupRoot string
	// Poll is how often rank logs, checkpoint markers and adopted ranks
	// are checked, default 1 s.
	Poll time.Duration
	// ProcRoot is where /proc is, for tests.
	ProcRoot string
	// AllowRootRanks lets ranks run as root: a job that names no user
	// while nodemon runs as root, or that names root. Off, such a launch is
	// refused.
	AllowRootRanks bool
	// Env is added to every rank's environment after the host's and
	// before api.RankEnv's (the simulated GPUs' kernel time dir).
	Env []string
	// SlurmNode, when set, is this node's Slurm name: the Slurm tasks
	// whose SLURMD_NODENAME it is are found in /proc every Poll and
	// reported as this node's ranks.
	SlurmNode string
	// KubeNode, when set, is this node's Kubernetes Node name: the ranks
	// of gpuctl's pods on it (nodemon kube-task's shims) are found in
	// /proc as Slurm's are.
	KubeNode string
	// BeforeLaunch, when set, runs before a job's ranks start (nodemon
	// attaches its NCCL probes to the libraries the command links).
	BeforeLaunch func(*api.LaunchRanks)
	// OnAdopt, when set, hears the pid of each rank found rather than
	// launched (a Slurm task): nodemon attaches its NCCL probes to the
	// libraries it mapped. It runs on the executor's owner goroutine, so
	// it is given here, before the owner starts, never assigned later.
	OnAdopt func(pid int)
}

// Executor launches a job's ranks on this host, reports their exits and
// checkpoints, and finds them again after a nodemon restart.
//
// One goroutine, the owner (Executor.run), owns the ranks, the checkpoint
// watches and the leases; everything else sends it a message and, when it
// needs an answer, waits on the message's reply channel. Each step takes
// what is queued, applies it, then commits: ranks.json is written, and
// only then are the step's effects run, its events reported and its
// replies sent. It is the node-side twin of the server's job owner
// (controlplane/jobs.Manager).
type Executor struct {
	opts      ExecutorOptions
	log       *slog.Logger
	logDir    string
	runDir    string
	statePath string
	cg        *jobCgroups
	cluster   atomic.Pointer[string]

	in       chan any      // messages to the owner
	stop     chan struct{} // closed by Close
	done     chan struct{} // closed once the owner has returned
	stopOnce sync.Once

	// Everything below belongs to the owner goroutine (to NewExecutor
	// until it starts).
	ranks map[string]map[int32]*rankProc // job → rank → process
	ckpt  map[string]*ckptWatch          // job → watcher, for jobs whose rank 0 runs here
	lease leaseState
	// pass gathers the current step's changes until they are committed.
	pass txn
}

// errClosed answers a request sent to an executor that was closed.
var errClosed = errors.New("nodemon is shutting down")

// NewExecutor returns an executor for opts. It re-adopts the ranks an
// earlier nodemon left running (reporting those that are gone), then
// starts the owner, which watches logs and checkpoints; Close stops it.
func NewExecutor(opts ExecutorOptions) (*Executor, error) {
	if opts.DataDir == "" {
		return nil, errors.New("executor: a data directory is required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.OnEvent == nil {
		opts.OnEvent = func(*api.Event) {}
	}
	if opts.BeforeLaunch == nil {
		opts.BeforeLaunch = func(*api.LaunchRanks) {}
	}
	if opts.OnAdopt == nil {
		opts.OnAdopt = func(int) {}
	}
	if opts.LogMaxBytes <= 0 {
		opts.LogMaxBytes = DefaultLogMaxBytes
	}
	if opts.LogKeep <= 0 {
		opts.LogKeep = DefaultLogKeep
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if len(opts.Shim) == 0 {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("executor: find nodemon's own binary to run rank shims: %w", err)
		}
		opts.Shim = []string{self, ShimCommand}
	}
	x := &Executor{
		opts: opts, log: opts.Log,
		logDir: filepath.Join(opts.DataDir, "logs"), runDir: filepath.Join(opts.DataDir, "run"),
		statePath: filepath.Join(opts.DataDir, "ranks.json"),
		ranks:     map[string]map[int32]*rankProc{}, ckpt: map[string]*ckptWatch{},
		in: make(chan any), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if opts.CgroupRoot == "off" {
		x.cg = &jobCgroups{off: "turned off (--cgroup-root off)"}
	} else {
		x.cg = newJobCgroups(opts.CgroupRoot)
	}
	if !x.cg.enabled() {
		x.log.Info("job cgroups off", "why", x.cg.off)
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	if err := x.recoverRanks(); err != nil {
		return nil, err
	}
	x.dropStaleLeases()
	x.commit()
	go x.run()
	return x, nil
}

// Close stops the owner and leaves the ranks running, as a nodemon crash
// would; the next executor on the same data directory adopts them. What
// the owner had not committed is dropped: the next one reads it back
// from the ranks' status files.
func (x *Executor) Close() {
	x.stopOnce.Do(func() { close(x.stop) })
	<-x.done
}

// run is the owner: it applies messages as they come, polls the ranks
// every Poll and, with a Slurm or Kubernetes node, looks for its tasks.
func (x *Executor) run() {
	defer close(x.done)
	t := time.NewTicker(x.opts.Poll)
	defer t.Stop()
	// Slurm's and Kubernetes' ranks are found by looking: more often than
	// the logs are read, so that a rank they start is reported soon.
	var scan <-chan time.Time
	if x.opts.SlurmNode != "" || x.opts.KubeNode != "" {
		st := time.NewTicker(min(x.opts.Poll, TaskScanEvery))
		defer st.Stop()
		scan = st.C
	}
	for {
		select {
		case <-x.stop:
			return
		case msg := <-x.in:
			x.step(msg)
		case <-t.C:
			x.poll(time.Now())
		case <-scan:
			x.scanTasks(time.Now())
		}
		x.commit()
	}
}

// step applies msg and whatever else is already queued behind it, so
// that a burst (every rank of a job exiting) is committed once.
func (x *Executor) step(msg any) {
	for {
		x.handle(msg)
		select {
		case msg = <-x.in:
		default:
			return
		}
	}
}

// ------------------------------------------------------------ messages

type (
	// msgCall runs fn on the owner (a request from another goroutine);
	// its answer goes out once the step is committed.
	msgCall struct {
		fn    func() (any, error)
		reply chan reply
	}
	// msgExited is a launched rank's shim gone (its wait goroutine);
	// shimSignal is what killed the shim when it did not exit by itself.
	msgExited struct {
		p          *rankProc
		shimSignal string
	}
)

type reply struct {
	v   any
	err error
}

func (x *Executor) handle(msg any) {
	switch msg := msg.(type) {
	case msgCall:
		v, err := msg.fn()
		x.pass.replies = append(x.pass.replies, pendingReply{ch: msg.reply, r: reply{v: v, err: err}})
	case msgExited:
		x.exited(msg.p, msg.shimSignal)
	default:
		x.log.Error("executor got an unknown message", "type", fmt.Sprintf("%T", msg))
	}
}

// post queues msg for the owner; false once the owner is gone.
func (x *Executor) post(msg any) bool {
	select {
	case x.in <- msg:
		return true
	case <-x.done:
		return false
	}
}

// do runs fn on the owner and returns its answer once its changes are
// committed, or errClosed when the executor is closed first.
func (x *Executor) do(fn func() (any, error)) (any, error) {
	ch := make(chan reply, 1)
	if !x.post(msgCall{fn: fn, reply: ch}) {
		return nil, errClosed
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-x.done:
		select {
		case r := <-ch:
			return r.v, r.err
		default:
			return nil, errClosed
		}
	}
}

// query is do for a request that cannot fail but for a closed executor:
// it answers the zero T then.
func query[T any](x *Executor, fn func() T) T {
	v, err := x.do(func() (any, error) { return fn(), nil })
	if err != nil {
		var zero T
		return zero
	}
	return v.(T)
}

// ---------------------------------------------------------- transactions

// txn is the changes of one step: whether ranks.json must be written, the
// effects to run and events to report once it is, and the replies that
// wait for all of that.
type txn struct {
	save    bool
	effects []func()
	events  []*api.Event
	replies []pendingReply
}

type pendingReply struct {
	ch chan reply
	r  reply
}

// raise adds a rank event to the current step.
func (x *Executor) raise(e *api.Event) { x.pass.events = append(x.pass.events, e) }

// act adds an effect to run once the step is committed.
func (x *Executor) act(f func()) { x.pass.effects = append(x.pass.effects, f) }

// commit writes ranks.json when the step changed it, then runs the step's
// effects, reports its events and sends its replies, in that order.
func (x *Executor) commit() {
	t := x.pass
	x.pass = txn{}
	if t.save {
		x.saveRanks()
	}
	for _, f := range t.effects {
		f()
	}
	for _, e := range t.events {
		x.opts.OnEvent(e)
	}
	for _, r := range t.replies {
		r.ch <- r.r
	}
}

// poll reads the live ranks' logs, notices adopted ranks that are gone
// and reports the checkpoints that landed.
func (x *Executor) poll(now time.Time) {
	for _, p := range x.live() {
		p.pollLog(now)
		if last := p.parser.lastCkpt; last != p.rec.LastCheckpointStep {
			p.rec.LastCheckpointStep, x.pass.save = last, true
		}
		if p.adopted && !processAlive(x.opts.ProcRoot, p.rec.ShimPID, p.rec.ShimStartTicks) {
			if processAlive(x.opts.ProcRoot, p.rec.PID, p.rec.StartTicks) {
				// The shim is gone but the rank is not: nothing would ever
				// report it, so it must not run on unseen.
				x.log.Warn("rank outlived its shim; killing it", "job", p.rec.Job, "rank", p.rec.Rank, "pid", p.rec.PID)
				syscall.Kill(-p.rec.PID, syscall.SIGKILL)
				continue
			}
			x.exited(p, "")
		}
	}
	for job, w := range x.ckpt {
		if p0 := x.ranks[job][0]; p0 != nil && !p0.exited() {
			x.checkCheckpoint(job, w, p0, now, false)
		}
	}
}

// SetCluster names the cluster this node joined (transport.ClusterID),
// given to the ranks it launches from then on as GPUCTL_CLUSTER.
func (x *Executor) SetCluster(id string) { x.cluster.Store(&id) }

func (x *Executor) clusterID() string {
	if p := x.cluster.Load(); p != nil {
		return *p
	}
	return ""
}

// target is a live rank as the owner saw it, for a caller that signals
// it and waits, off the owner, for its exit.
type target struct {
	rec  rankRecord
	done <-chan struct{}
}

// targets returns the live ranks of job named by ranks (all when empty)
// of attempt (all when 0).
func (x *Executor) targets(job string, ranks []int32, attempt uint32) ([]target, error) {
	running, ok := x.ranks[job]
	if !ok {
		return nil, fmt.Errorf("job %q has no ranks on node %s", job, x.opts.Node)
	}
	want := map[int32]bool{}
	for _, r := range ranks {
		want[r] = true
	}
	var out []target
	for rank, p := range running {
		if len(want) > 0 && !want[rank] || p.exited() || attempt != 0 && p.rec.Attempt != attempt {
			continue
		}
		out = append(out, p.target())
	}
	return out, nil
}

func (p *rankProc) target() target { return target{rec: p.rec, done: p.done} }

func (t target) exited() bool { return isClosed(t.done) }

// live returns the ranks that have not exited.
func (x *Executor) live() []*rankProc {
	var live []*rankProc
	for _, job := range x.ranks {
		for _, p := range job {
			if !p.exited() {
				live = append(live, p)
			}
		}
	}
	return live
}

// GPUProcesses maps each GPU index to the pids of live ranks using it,
// adopted ones included.
func (x *Executor) GPUProcesses() map[uint32][]uint32 {
	return query(x, func() map[uint32][]uint32 {
		out := map[uint32][]uint32{}
		for _, p := range x.live() {
			for _, g := range p.rec.GPUs {
				out[g] = append(out[g], uint32(p.rec.PID))
			}
		}
		return out
	})
}

// RankStatuses reports every live rank: its process state and CPU time
// from /proc, and its progress from its log.
func (x *Executor) RankStatuses() []*api.RankStatus {
	return query(x, func() []*api.RankStatus {
		now := time.Now()
		live := x.live()
		sort.Slice(live, func(i, j int) bool {
			a, b := live[i].rec, live[j].rec
			return a.Job < b.Job || a.Job == b.Job && a.Rank < b.Rank
		})
		out := make([]*api.RankStatus, 0, len(live))
		for _, p := range live {
			p.pollLog(now)
			st := &api.RankStatus{Job: p.rec.Job, Attempt: p.rec.Attempt, Rank: p.rec.Rank, Pid: uint32(p.rec.PID)}
			if ps, err := procfs.ReadStat(x.opts.ProcRoot, p.rec.PID); err == nil && ps.StartTicks == p.rec.StartTicks {
				st.ProcState, st.CpuSeconds = ps.State, ps.CPUSeconds()
			}
			if p.parser.step >= 0 {
				st.Step, st.StepUnixNano = p.parser.step, p.parser.stepAt.UnixNano()
			}
			if p.parser.lastCkpt >= 0 {
				st.LastCheckpointStep = p.parser.lastCkpt
			}
			out = append(out, st)
		}
		return out
	})
}
