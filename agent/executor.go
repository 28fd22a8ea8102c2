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

	mu     sync.Mutex // guards tail and parser
	tail   *logTail
	parser *logParser
}

func (p *rankProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pollLog reads what the rank printed since the last poll.
func (p *rankProc) pollLog(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
	// BeforeLaunch, when set, runs before a job's ranks start (nodemon
	// attaches its NCCL probes to the libraries the command links).
	BeforeLaunch func(*api.LaunchRanks)
	// OnAdopt, when set, hears the pid of each rank found rather than
	// launched (a Slurm task): nodemon attaches its NCCL probes to the
	// libraries it mapped. It runs on the executor's monitor, so it is
	// given here, before the monitor starts, never assigned later.
	OnAdopt func(pid int)
}

// Executor launches a job's ranks on this host, reports their exits and
// checkpoints, and finds them again after a nodemon restart.
type Executor struct {
	opts      ExecutorOptions
	log       *slog.Logger
	logDir    string
	runDir    string
	statePath string
	cg        *jobCgroups
	cluster   atomic.Pointer[string]

	mu     sync.Mutex
	ranks  map[string]map[int32]*rankProc // job → rank → process
	ckpt   map[string]*ckptWatch          // job → watcher, for jobs whose rank 0 runs here
	lease  leaseState
	closed bool

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// NewExecutor returns an executor for opts. It re-adopts the ranks an
// earlier nodemon left running (reporting those that are gone) and starts
// watching logs and checkpoints; Close stops watching.
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
		stop: make(chan struct{}),
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
	x.mu.Lock()
	x.dropStaleLeasesLocked()
	x.mu.Unlock()
	x.wg.Add(1)
	go x.monitor()
	return x, nil
}

// Close stops watching the ranks and leaves them running, as a nodemon
// crash would; the next executor on the same data directory adopts them.
func (x *Executor) Close() {
	x.mu.Lock()
	x.closed = true
	x.mu.Unlock()
	x.stopOnce.Do(func() { close(x.stop) })
	x.wg.Wait()
}

// monitor polls rank logs, adopted ranks and checkpoint markers.
func (x *Executor) monitor() {
	defer x.wg.Done()
	t := time.NewTicker(x.opts.Poll)
	defer t.Stop()
	// Slurm's ranks are found by looking: more often than the logs are
	// read, so that a rank Slurm starts is reported soon.
	var slurm <-chan time.Time
	if x.opts.SlurmNode != "" {
		st := time.NewTicker(min(x.opts.Poll, SlurmScanEvery))
		defer st.Stop()
		slurm = st.C
	}
	for {
		select {
		case <-x.stop:
			return
		case <-t.C:
			x.pollOnce(time.Now())
		case <-slurm:
			x.scanSlurm(time.Now())
		}
	}
}

func (x *Executor) pollOnce(now time.Time) {
	x.mu.Lock()
	live := x.liveLocked()
	watches := map[string]*ckptWatch{}
	for job, w := range x.ckpt {
		watches[job] = w
	}
	x.mu.Unlock()
	dirty := false
	for _, p := range live {
		p.pollLog(now)
		p.mu.Lock()
		last := p.parser.lastCkpt
		p.mu.Unlock()
		x.mu.Lock()
		if last != p.rec.LastCheckpointStep {
			p.rec.LastCheckpointStep, dirty = last, true
		}
		x.mu.Unlock()
		if p.adopted && !processAlive(x.opts.ProcRoot, p.rec.ShimPID, p.rec.ShimStartTicks) {
			if processAlive(x.opts.ProcRoot, p.rec.PID, p.rec.StartTicks) {
				// The shim is gone but the rank is not: nothing would ever
				// report it, so it must not run on unseen.
				x.log.Warn("rank outlived its shim; killing it", "job", p.rec.Job, "rank", p.rec.Rank, "pid", p.rec.PID)
				syscall.Kill(-p.rec.PID, syscall.SIGKILL)
				continue
			}
			x.finish(p, "")
		}
	}
	for job, w := range watches {
		x.mu.Lock()
		p0 := x.ranks[job][0]
		x.mu.Unlock()
		if p0 != nil && !p0.exited() {
			x.checkCheckpoint(job, w, p0, now, false)
		}
	}
	if dirty {
		x.mu.Lock()
		x.saveLocked()
		x.mu.Unlock()
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

// targets returns the live ranks of job named by ranks (all when empty)
// of attempt (all when 0).
func (x *Executor) targetsLocked(job string, ranks []int32, attempt uint32) ([]*rankProc, error) {
	running, ok := x.ranks[job]
	if !ok {
		return nil, fmt.Errorf("job %q has no ranks on node %s", job, x.opts.Node)
	}
	want := map[int32]bool{}
	for _, r := range ranks {
		want[r] = true
	}
	var out []*rankProc
	for rank, p := range running {
		if len(want) > 0 && !want[rank] || p.exited() || attempt != 0 && p.rec.Attempt != attempt {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// liveLocked returns the ranks that have not exited; x.mu is held.
func (x *Executor) liveLocked() []*rankProc {
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
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[uint32][]uint32{}
	for _, p := range x.liveLocked() {
		for _, g := range p.rec.GPUs {
			out[g] = append(out[g], uint32(p.rec.PID))
		}
	}
	return out
}

// RankStatuses reports every live rank: its process state and CPU time
// from /proc, and its progress from its log.
func (x *Executor) RankStatuses() []*api.RankStatus {
	now := time.Now()
	x.mu.Lock()
	live := x.liveLocked()
	x.mu.Unlock()
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
		p.mu.Lock()
		if p.parser.step >= 0 {
			st.Step, st.StepUnixNano = p.parser.step, p.parser.stepAt.UnixNano()
		}
		if p.parser.lastCkpt >= 0 {
			st.LastCheckpointStep = p.parser.lastCkpt
		}
		p.mu.Unlock()
		out = append(out, st)
	}
	return out
}
