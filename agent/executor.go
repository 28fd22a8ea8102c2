package agent

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// signals nodemon accepts by name in SignalRanks.
var signals = map[string]syscall.Signal{
	"SIGUSR1": syscall.SIGUSR1,
	"SIGTERM": syscall.SIGTERM,
	"SIGKILL": syscall.SIGKILL,
	"SIGSTOP": syscall.SIGSTOP,
	"SIGCONT": syscall.SIGCONT,
	"SIGINT":  syscall.SIGINT,
}

// rankRecord is what nodemon keeps of a live rank in ranks.json, so that
// a restarted nodemon finds it again.
type rankRecord struct {
	Job       string   `json:"job"`
	Attempt   uint32   `json:"attempt"`
	Rank      int32    `json:"rank"`
	LocalRank int32    `json:"local_rank"`
	GPUs      []uint32 `json:"gpus"`
	// PID and StartTicks name the rank process; ShimPID and ShimStartTicks
	// its shim. A pid alone could have been reused since.
	PID            int    `json:"pid"`
	StartTicks     uint64 `json:"start_ticks"`
	ShimPID        int    `json:"shim_pid"`
	ShimStartTicks uint64 `json:"shim_start_ticks"`
	LogPath        string `json:"log_path"`
	StatusPath     string `json:"status_path"`
	CheckpointDir  string `json:"checkpoint_dir,omitempty"`
	Cgroup         string `json:"cgroup,omitempty"`
	// LastCheckpointStep is the last `checkpoint step=N` the rank printed;
	// CheckpointReported the last checkpoint this node reported for the
	// job (rank 0 only). -1: none.
	LastCheckpointStep int64 `json:"last_checkpoint_step"`
	CheckpointReported int64 `json:"checkpoint_reported"`
	LaunchedUnixNano   int64 `json:"launched_unix_nano"`
	// SlurmJob is the Slurm job of a rank Slurm started (found, not
	// launched): Slurm stops it, so it holds no lease.
	SlurmJob string `json:"slurm_job,omitempty"`
	// Witnesses vouch for the rank's attempt while the server is away, for
	// leases of LeaseMs (the server's lease when it was launched), so a
	// nodemon restarted with no server to talk to can still renew it.
	Witnesses []witnessRecord `json:"witnesses,omitempty"`
	LeaseMs   int64           `json:"lease_ms,omitempty"`
}

// witnessRecord is a witness of a rank's attempt (api.Witness).
type witnessRecord struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// ranksFile is the layout of <data-dir>/ranks.json.
type ranksFile struct {
	Version int          `json:"version"`
	Ranks   []rankRecord `json:"ranks"`
}

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

// leaseState is what the executor knows of the server's lease.
type leaseState struct {
	// dur is the lease the server grants; 0: none, ranks run unfenced.
	dur time.Duration
	// deadline is the latest end of lease the server confirmed; floor the
	// one a rank launched in this session starts with (the session's start
	// plus the lease: the server heard the node then).
	deadline, floor time.Time
	// peer is, per attempt, the latest end of lease a quorum of its
	// witnesses confirmed (peer lease: the ranks outlive a silent server).
	peer map[attemptKey]time.Time
}

// attemptKey names one attempt of a job.
type attemptKey struct {
	job     string
	attempt uint32
}

// of is the deadline of an attempt's lease file: the later of the
// server's and its witnesses'.
func (l leaseState) of(k attemptKey) time.Time {
	if p := l.peer[k]; p.After(l.deadline) {
		return p
	}
	return l.deadline
}

// start returns the deadline a rank launched now starts with.
func (l leaseState) start() time.Time {
	if l.floor.After(l.deadline) {
		return l.floor
	}
	return l.deadline
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

// validJobName refuses job names that would escape the log directory.
func validJobName(job string) error {
	switch {
	case job == "":
		return errors.New("the job name is empty")
	case job == "." || job == ".." || strings.ContainsAny(job, "/\x00") || strings.HasPrefix(job, "."):
		return fmt.Errorf("job name %q cannot name a directory (no '/', no leading '.')", job)
	}
	return nil
}

// Launch starts the ranks of l that are not already running. A repeated
// launch of the same job attempt, or of a rank a restarted nodemon
// adopted, starts nothing new; a launch of a new attempt while the old one
// still runs is refused.
// JobError is a launch refused because of the job (its command, user,
// checkpoint dir), not because of this node: the server fails the job
// rather than suspect the node.
type JobError struct{ Err error }

func (e *JobError) Error() string { return e.Err.Error() }
func (e *JobError) Unwrap() error { return e.Err }

// NodeRefusal is a launch refused by this node's own policy (no
// --allow-root-ranks, or a nodemon that is not root asked for another
// account): the job may run on other nodes, so the server places it
// without this one rather than fail it or suspect the node.
type NodeRefusal struct{ Err error }

func (e *NodeRefusal) Error() string { return e.Err.Error() }
func (e *NodeRefusal) Unwrap() error { return e.Err }

func (x *Executor) Launch(l *api.LaunchRanks) error {
	if l.GetJob() == "" || len(l.GetCommand()) == 0 || len(l.GetRanks()) == 0 {
		return &JobError{errors.New("launch: job, command and at least one rank are required")}
	}
	if err := validJobName(l.GetJob()); err != nil {
		return &JobError{fmt.Errorf("launch: %w", err)}
	}
	exe, err := exec.LookPath(l.GetCommand()[0])
	if err != nil {
		return &JobError{fmt.Errorf("launch %s: command %q not found on node %s: %w", l.GetJob(), l.GetCommand()[0], x.opts.Node, err)}
	}
	if exe, err = filepath.Abs(exe); err != nil {
		return fmt.Errorf("launch %s: %w", l.GetJob(), err)
	}
	cred, err := x.runAs(l)
	if err != nil {
		if nr := (*NodeRefusal)(nil); errors.As(err, &nr) {
			return &NodeRefusal{fmt.Errorf("launch %s: %w", l.GetJob(), err)}
		}
		return &JobError{fmt.Errorf("launch %s: %w", l.GetJob(), err)}
	}
	if cred != nil {
		if err := prepareCheckpointDir(l.GetCheckpointDir(), cred); err != nil {
			return &JobError{fmt.Errorf("launch %s: %w", l.GetJob(), err)}
		}
	}
	x.opts.BeforeLaunch(l)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return errors.New("launch: nodemon is shutting down")
	}
	running := x.ranks[l.GetJob()]
	if running == nil {
		running = map[int32]*rankProc{}
		x.ranks[l.GetJob()] = running
	}
	for _, r := range l.GetRanks() {
		if p, ok := running[r.GetRank()]; ok && !p.exited() {
			if p.rec.Attempt == l.GetAttempt() {
				continue
			}
			return fmt.Errorf("launch %s attempt %d: rank %d of attempt %d still runs (pid %d) on node %s; stop it first",
				l.GetJob(), l.GetAttempt(), r.GetRank(), p.rec.Attempt, p.rec.PID, x.opts.Node)
		}
	}
	defer x.saveLocked()
	var leasePath string
	if x.lease.dur > 0 {
		if err := os.MkdirAll(filepath.Join(x.runDir, l.GetJob()), 0o755); err != nil {
			return fmt.Errorf("launch %s: %w", l.GetJob(), err)
		}
		leasePath = x.leasePath(l.GetJob(), l.GetAttempt())
		if err := writeLease(leasePath, x.lease.start()); err != nil {
			return fmt.Errorf("launch %s: %w", l.GetJob(), err)
		}
	}
	for _, r := range l.GetRanks() {
		if p, ok := running[r.GetRank()]; ok && !p.exited() {
			continue
		}
		p, err := x.start(l, r, exe, cred, leasePath)
		if err != nil {
			x.dropLeaseLocked(l.GetJob(), l.GetAttempt())
			return err
		}
		running[r.GetRank()] = p
		if r.GetRank() == 0 && l.GetCheckpointDir() != "" {
			// Checkpoints already there (the one this attempt resumes from)
			// were reported before.
			x.ckpt[l.GetJob()] = newCkptWatch(l.GetCheckpointDir(), readMarker(l.GetCheckpointDir()))
			p.rec.CheckpointReported = x.ckpt[l.GetJob()].reported
		}
	}
	return nil
}

func (x *Executor) start(l *api.LaunchRanks, r *api.RankSpec, exe string, cred *rankCred, leasePath string) (*rankProc, error) {
	job, rank := l.GetJob(), r.GetRank()
	fail := func(err error) (*rankProc, error) {
		return nil, fmt.Errorf("launch %s rank %d: %w", job, rank, err)
	}
	var owner *syscall.Credential
	if cred != nil {
		owner = &syscall.Credential{Uid: cred.uid, Gid: cred.gid}
	}
	if err := rankLogDir(filepath.Join(x.logDir, job), owner); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(filepath.Join(x.runDir, job), 0o755); err != nil {
		return fail(err)
	}
	logPath := filepath.Join(x.logDir, job, fmt.Sprintf("rank-%d.log", rank))
	statusPath := filepath.Join(x.runDir, job, fmt.Sprintf("rank-%d.status", rank))
	if err := os.Remove(statusPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	// The tail starts at the log's end now, before the rank can print.
	lf, err := openRankLog(logPath, owner)
	if err != nil {
		return fail(err)
	}
	lf.Close()
	tail := openLogTail(logPath)
	args := append([]string{}, x.opts.Shim[1:]...)
	args = append(args, "--log", logPath, "--status", statusPath, "--exe", exe, "--hello-fd", "3",
		"--log-max-bytes", strconv.FormatInt(x.opts.LogMaxBytes, 10), "--log-keep", strconv.Itoa(x.opts.LogKeep))
	var cgDir string
	if x.cg.enabled() {
		if cgDir, err = x.cg.rankDir(job, rank); err != nil {
			x.log.Warn("rank runs outside a cgroup", "job", job, "rank", rank, "err", err)
		} else {
			args = append(args, "--cgroup", cgDir)
		}
	}
	if cred != nil {
		args = append(args, cred.shimArgs()...)
	}
	if leasePath != "" {
		args = append(args, "--lease", leasePath)
	}
	args = append(args, "--")
	args = append(args, l.GetCommand()...)
	hr, hw, err := os.Pipe()
	if err != nil {
		tail.close()
		return fail(err)
	}
	defer hr.Close()
	cmd := exec.Command(x.opts.Shim[0], args...)
	cmd.Env = rankEnv(x.opts.Node, x.clusterID(), x.opts.Env, l, r)
	if cred != nil {
		cmd.Env = append(cmd.Env, cred.env()...)
	}
	cmd.ExtraFiles = []*os.File{hw}
	// Its own session: the shim and the rank outlive nodemon, and no
	// signal meant for nodemon's group reaches them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	hw.Close()
	if err != nil {
		tail.close()
		return fail(fmt.Errorf("start rank shim %s: %w", x.opts.Shim[0], err))
	}
	hr.SetReadDeadline(time.Now().Add(15 * time.Second))
	b, rerr := bufio.NewReader(io.LimitReader(hr, 64<<10)).ReadBytes('\n')
	if rerr == io.EOF {
		rerr = nil // the shim exited without a whole line; b says what it got
	}
	var h shimHello
	if jerr := json.Unmarshal(b, &h); rerr != nil || jerr != nil || h.Error != "" || h.PID <= 0 {
		cmd.Process.Kill()
		cmd.Wait()
		tail.close()
		switch {
		case h.Error != "":
			return fail(errors.New(h.Error))
		case rerr != nil:
			return fail(fmt.Errorf("rank shim did not report the rank's pid: %w", rerr))
		}
		return fail(fmt.Errorf("rank shim exited without starting the rank (%q)", strings.TrimSpace(string(b))))
	}
	if h.CgroupError != "" {
		x.log.Warn("rank runs outside its cgroup", "job", job, "rank", rank, "err", h.CgroupError)
		cgDir = ""
	}
	shimStat, _ := procfs.ReadStat(x.opts.ProcRoot, cmd.Process.Pid)
	var witnesses []witnessRecord
	if leasePath != "" {
		for _, w := range l.GetWitnesses() {
			witnesses = append(witnesses, witnessRecord{Name: w.GetName(), Addr: w.GetAddr()})
		}
	}
	p := &rankProc{
		rec: rankRecord{
			Job: job, Attempt: l.GetAttempt(), Rank: rank, LocalRank: r.GetLocalRank(), GPUs: r.GetGpus(),
			PID: h.PID, StartTicks: h.StartTicks, ShimPID: cmd.Process.Pid, ShimStartTicks: shimStat.StartTicks,
			LogPath: logPath, StatusPath: statusPath, CheckpointDir: l.GetCheckpointDir(), Cgroup: cgDir,
			LastCheckpointStep: -1, CheckpointReported: -1, LaunchedUnixNano: time.Now().UnixNano(),
			LeaseMs: x.lease.dur.Milliseconds(), Witnesses: witnesses,
		},
		done: make(chan struct{}), tail: tail, parser: newLogParser(),
	}
	runAs := "nodemon's user"
	if cred != nil {
		runAs = cred.String()
	}
	x.log.Info("rank started", "job", job, "rank", rank, "pid", h.PID, "shim", cmd.Process.Pid, "gpus", r.GetGpus(), "as", runAs)
	x.opts.OnEvent(&api.Event{
		TimeUnixNano: time.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_JOB, Severity: api.Severity_SEVERITY_INFO,
		Pid: uint32(h.PID), Job: job, Rank: rank, Attrs: map[string]string{"attempt": strconv.Itoa(int(l.GetAttempt()))},
		Message: fmt.Sprintf("rank %d started (pid %d, attempt %d)", rank, h.PID, l.GetAttempt()),
	})
	go func() {
		cmd.Wait()
		var shimSig string
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			shimSig = signalName(ws.Signal())
		}
		x.finish(p, shimSig)
	}()
	return p, nil
}

// finish reports a rank's exit once, from the status its shim wrote.
// shimSignal is what killed the shim when it did not exit by itself.
func (x *Executor) finish(p *rankProc, shimSignal string) {
	x.mu.Lock()
	if p.exited() {
		x.mu.Unlock()
		return
	}
	close(p.done)
	closed := x.closed
	w := x.ckpt[p.rec.Job]
	x.mu.Unlock()
	if closed {
		// This nodemon is gone as far as anyone knows; the next one reads
		// the status file.
		return
	}
	now := time.Now()
	p.pollLog(now)
	if p.rec.Rank == 0 && w != nil {
		// The last checkpoint (the one a stop asks for) lands just before
		// the exit: report it first.
		x.checkCheckpoint(p.rec.Job, w, p, now, true)
	}
	ev := x.exitEvent(p, now, shimSignal)
	x.log.Info("rank exited", "job", p.rec.Job, "rank", p.rec.Rank, "pid", p.rec.PID, "code", ev.ExitCode, "signal", ev.Signal)
	x.opts.OnEvent(ev)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return
	}
	os.Remove(p.rec.StatusPath)
	x.cg.removeRank(p.rec.Cgroup)
	x.dropLeaseLocked(p.rec.Job, p.rec.Attempt)
	if x.ckpt[p.rec.Job] == w && p.rec.Rank == 0 {
		delete(x.ckpt, p.rec.Job)
	}
	p.mu.Lock()
	p.tail.close()
	p.mu.Unlock()
	x.saveLocked()
}

func (x *Executor) exitEvent(p *rankProc, now time.Time, shimSignal string) *api.Event {
	r := p.rec
	ev := &api.Event{
		TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Severity: api.Severity_SEVERITY_INFO,
		Pid: uint32(r.PID), Job: r.Job, Rank: r.Rank, Attrs: map[string]string{"attempt": strconv.Itoa(int(r.Attempt))},
	}
	p.mu.Lock()
	ev.Step = p.parser.step
	p.mu.Unlock()
	st, err := readShimStatus(r.StatusPath)
	switch {
	case err == nil && st.Fenced != "":
		// However the rank ended (a trainer may exit 0 on SIGTERM), its
		// attempt did not finish: the signal says so.
		ev.ExitCode, ev.Signal, ev.Severity = int32(st.ExitCode), LeaseSignal, api.Severity_SEVERITY_WARNING
		ev.Attrs["fenced"] = st.Fenced
		ev.Message = fmt.Sprintf("rank %d (pid %d) stopped by its shim: %s", r.Rank, r.PID, st.Fenced)
	case err == nil && st.Signal == "" && st.Stopped != "":
		ev.ExitCode, ev.Signal, ev.Severity = int32(st.ExitCode), st.Stopped, api.Severity_SEVERITY_WARNING
		ev.Message = fmt.Sprintf("rank %d (pid %d) exited with code %d after Slurm sent it %s", r.Rank, r.PID, st.ExitCode, st.Stopped)
	case err == nil && st.Signal != "":
		ev.ExitCode, ev.Signal, ev.Severity = -1, st.Signal, api.Severity_SEVERITY_WARNING
		ev.Message = fmt.Sprintf("rank %d (pid %d) killed by %s", r.Rank, r.PID, st.Signal)
	case err == nil:
		ev.ExitCode = int32(st.ExitCode)
		ev.Message = fmt.Sprintf("rank %d (pid %d) exited with code %d", r.Rank, r.PID, st.ExitCode)
		if st.ExitCode != 0 {
			ev.Severity = api.Severity_SEVERITY_WARNING
		}
	case shimSignal != "":
		// The shim was killed; the rank died with it (parent-death signal).
		ev.ExitCode, ev.Signal, ev.Severity = -1, shimSignal, api.Severity_SEVERITY_WARNING
		ev.Message = fmt.Sprintf("rank %d (pid %d) killed: its shim was killed by %s", r.Rank, r.PID, shimSignal)
	default:
		ev.ExitCode, ev.Severity = -1, api.Severity_SEVERITY_WARNING
		ev.Message = fmt.Sprintf("rank %d (pid %d) exited; its exit status is unknown (%v)", r.Rank, r.PID, err)
	}
	if p.adopted {
		ev.Attrs["adopted"] = "true"
	}
	return ev
}

// recoverRanks reads ranks.json: ranks still running are adopted, the
// others reported lost.
func (x *Executor) recoverRanks() error {
	b, err := os.ReadFile(x.statePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("executor: read %s: %w", x.statePath, err)
	}
	var f ranksFile
	if err := json.Unmarshal(b, &f); err != nil {
		// Written by rename, so only a hand edit breaks it; the ranks in it
		// cannot be found, so say which file to check.
		return fmt.Errorf("executor: %s is damaged (%v): check for ranks still running, then remove it", x.statePath, err)
	}
	now := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range f.Ranks {
		rankAlive := processAlive(x.opts.ProcRoot, r.PID, r.StartTicks)
		shimAlive := processAlive(x.opts.ProcRoot, r.ShimPID, r.ShimStartTicks)
		if rankAlive || shimAlive {
			p := &rankProc{rec: r, adopted: true, done: make(chan struct{}), tail: openLogTail(r.LogPath), parser: newLogParser()}
			p.parser.lastCkpt = r.LastCheckpointStep
			if err := p.tail.catchUp(p.parser, r.PID, now); err != nil {
				x.log.Warn("read adopted rank's log", "job", r.Job, "rank", r.Rank, "err", err)
			}
			if x.ranks[r.Job] == nil {
				x.ranks[r.Job] = map[int32]*rankProc{}
			}
			x.ranks[r.Job][r.Rank] = p
			if r.Rank == 0 && r.CheckpointDir != "" {
				x.ckpt[r.Job] = newCkptWatch(r.CheckpointDir, r.CheckpointReported)
			}
			x.log.Info("rank adopted", "job", r.Job, "rank", r.Rank, "pid", r.PID, "attempt", r.Attempt)
			x.opts.OnEvent(&api.Event{
				TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_JOB, Severity: api.Severity_SEVERITY_INFO,
				Pid: uint32(r.PID), Job: r.Job, Rank: r.Rank,
				Attrs:   map[string]string{"attempt": strconv.Itoa(int(r.Attempt)), "adopted": "true"},
				Message: fmt.Sprintf("rank %d (pid %d, attempt %d) still running after a nodemon restart: adopted", r.Rank, r.PID, r.Attempt),
			})
			continue
		}
		ev := &api.Event{
			TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Severity: api.Severity_SEVERITY_WARNING,
			Pid: uint32(r.PID), Job: r.Job, Rank: r.Rank, ExitCode: -1, Signal: "LOST",
			Attrs:   map[string]string{"attempt": strconv.Itoa(int(r.Attempt))},
			Message: "rank was not running when nodemon restarted",
		}
		// The shim may have recorded how it ended; the signal stays LOST so
		// the server treats every such rank alike.
		if st, err := readShimStatus(r.StatusPath); err == nil {
			ev.ExitCode = int32(st.ExitCode)
			how := fmt.Sprintf("exit code %d", st.ExitCode)
			if st.Signal != "" {
				how = "killed by " + st.Signal
			}
			ev.Attrs["exit_status"] = how
			ev.Message += " (it ended while nodemon was down: " + how + ")"
		}
		x.log.Warn("rank lost while nodemon was down", "job", r.Job, "rank", r.Rank, "pid", r.PID)
		x.opts.OnEvent(ev)
		os.Remove(r.StatusPath)
		x.cg.removeRank(r.Cgroup)
	}
	x.saveLocked()
	return nil
}

// saveLocked writes the live ranks to ranks.json (tmp file and rename).
func (x *Executor) saveLocked() {
	if x.closed {
		return
	}
	f := ranksFile{Version: 1, Ranks: []rankRecord{}}
	for _, p := range x.liveLocked() {
		f.Ranks = append(f.Ranks, p.rec)
	}
	sort.Slice(f.Ranks, func(i, j int) bool {
		a, b := f.Ranks[i], f.Ranks[j]
		return a.Job < b.Job || a.Job == b.Job && a.Rank < b.Rank
	})
	if err := writeFileAtomic(x.statePath, mustJSON(f)); err != nil {
		x.log.Error("save launched ranks; a nodemon restart will not find them", "err", err)
	}
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

// SlurmScanEvery is how often nodemon --slurm-node looks for new Slurm
// tasks in /proc (at most its poll).
const SlurmScanEvery = 250 * time.Millisecond

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

func signalName(s syscall.Signal) string {
	for n, v := range signals {
		if v == s {
			return n
		}
	}
	return "signal " + strconv.Itoa(int(s))
}

// rankEnv is the environment of one rank: the host's, nodemon's own
// additions (extra), then what api.RankEnv defines.
func rankEnv(node, cluster string, extra []string, l *api.LaunchRanks, r *api.RankSpec) []string {
	env := append(os.Environ(), extra...)
	return append(env, api.RankEnv(node, cluster, l, r)...)
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

// Signal sends a named signal to the job's ranks on this host (all of
// them when s names none), to each rank's whole process group. SIGKILL
// also kills each rank's cgroup where job cgroups are on, which reaches
// children that left the group.
func (x *Executor) Signal(s *api.SignalRanks) error {
	sig, ok := signals[strings.ToUpper(s.GetSignal())]
	if !ok {
		return fmt.Errorf("signal %s: unknown signal %q (use SIGUSR1, SIGTERM, SIGKILL, SIGSTOP, SIGCONT or SIGINT)", s.GetJob(), s.GetSignal())
	}
	x.mu.Lock()
	procs, err := x.targetsLocked(s.GetJob(), s.GetRanks(), s.GetAttempt())
	x.mu.Unlock()
	if err != nil {
		return fmt.Errorf("signal: %w", err)
	}
	return errors.Join(signalProcs(procs, sig)...)
}

// Fence kills the ranks of a superseded attempt (every attempt of the job
// when s names none) and returns once they are gone: their leases are
// never renewed again, SIGKILL goes to each rank's group and cgroup, and
// what it returns are the ranks it killed. A job with no ranks here is
// already fenced.
func (x *Executor) Fence(s *api.SignalRanks) ([]*api.RankStatus, error) {
	x.mu.Lock()
	procs, _ := x.targetsLocked(s.GetJob(), s.GetRanks(), s.GetAttempt())
	for _, p := range procs {
		p.fenced = true
	}
	x.mu.Unlock()
	killed := make([]*api.RankStatus, 0, len(procs))
	for _, p := range procs {
		killed = append(killed, &api.RankStatus{Job: p.rec.Job, Attempt: p.rec.Attempt, Rank: p.rec.Rank, Pid: uint32(p.rec.PID)})
		x.log.Warn("fencing rank of a superseded attempt", "job", p.rec.Job, "attempt", p.rec.Attempt, "rank", p.rec.Rank, "pid", p.rec.PID)
	}
	if err := stopProcs(procs, 0, x.opts.Poll); err != nil {
		return killed, fmt.Errorf("fence %s attempt %d: %w", s.GetJob(), s.GetAttempt(), err)
	}
	return killed, nil
}

// LeaseSignal is the signal of an exit event whose rank its shim stopped
// because its lease ran out.
const LeaseSignal = "LEASE"

// leasePath is the lease file of one job attempt.
func (x *Executor) leasePath(job string, attempt uint32) string {
	return filepath.Join(x.runDir, job, "lease-"+strconv.FormatUint(uint64(attempt), 10))
}

// dropLeaseLocked removes an attempt's lease file once none of its ranks
// runs here: no shim reads it any more, and run/<job>/ should not collect
// one file per attempt a long job ever had.
func (x *Executor) dropLeaseLocked(job string, attempt uint32) {
	for _, p := range x.ranks[job] {
		if p.rec.Attempt == attempt && !p.exited() {
			return
		}
	}
	delete(x.lease.peer, attemptKey{job, attempt})
	if err := os.Remove(x.leasePath(job, attempt)); err != nil && !errors.Is(err, os.ErrNotExist) {
		x.log.Warn("remove lease file", "job", job, "attempt", attempt, "err", err)
	}
}

// dropStaleLeasesLocked removes, once the ranks are adopted, the lease
// files of attempts with no rank here: left by ranks that ended while
// nodemon was down (it never saw them exit) or by a nodemon older than
// this cleanup. No shim reads them any more.
func (x *Executor) dropStaleLeasesLocked() {
	paths, err := filepath.Glob(filepath.Join(x.runDir, "*", "lease-*"))
	if err != nil {
		return
	}
	for _, path := range paths {
		attempt, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(path), "lease-"), 10, 32)
		if err != nil {
			continue // not a lease file of ours
		}
		x.dropLeaseLocked(filepath.Base(filepath.Dir(path)), uint32(attempt))
	}
}

// BeginLease starts a session with a server that grants leases of d (0:
// none): ranks launched in it start with a lease from start, when the
// node said hello.
func (x *Executor) BeginLease(d time.Duration, start time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lease.dur = d
	x.lease.floor = time.Time{}
	if d > 0 {
		x.lease.floor = start.Add(d)
	}
}

// RenewLeases extends the lease of every live rank not fenced to
// deadline (a deadline no later than one already written changes
// nothing).
func (x *Executor) RenewLeases(deadline time.Time) {
	x.mu.Lock()
	if x.lease.dur <= 0 || !deadline.After(x.lease.deadline) {
		x.mu.Unlock()
		return
	}
	x.lease.deadline = deadline
	paths := map[string]time.Time{}
	for _, p := range x.liveLocked() {
		if !p.fenced && p.rec.SlurmJob == "" {
			k := attemptKey{p.rec.Job, p.rec.Attempt}
			paths[x.leasePath(k.job, k.attempt)] = x.lease.of(k)
		}
	}
	x.mu.Unlock()
	x.writeLeases(paths)
}

func (x *Executor) writeLeases(paths map[string]time.Time) {
	for path, deadline := range paths {
		if err := writeLease(path, deadline); err != nil {
			x.log.Error("renew rank lease; its ranks stop when it runs out", "err", err)
		}
	}
}

// PeerAttempt is an attempt with live ranks here whose lease its
// witnesses may renew.
type PeerAttempt struct {
	Job       string
	Attempt   uint32
	Lease     time.Duration
	Witnesses []*api.Witness
}

// PeerAttempts lists the attempts whose ranks run here, not fenced, with
// witnesses and a lease.
func (x *Executor) PeerAttempts() []PeerAttempt {
	x.mu.Lock()
	defer x.mu.Unlock()
	seen := map[attemptKey]bool{}
	var out []PeerAttempt
	for _, p := range x.liveLocked() {
		k := attemptKey{p.rec.Job, p.rec.Attempt}
		if p.fenced || p.rec.SlurmJob != "" || len(p.rec.Witnesses) == 0 || p.rec.LeaseMs <= 0 || seen[k] {
			continue
		}
		seen[k] = true
		pa := PeerAttempt{Job: k.job, Attempt: k.attempt, Lease: time.Duration(p.rec.LeaseMs) * time.Millisecond}
		for _, w := range p.rec.Witnesses {
			pa.Witnesses = append(pa.Witnesses, &api.Witness{Name: w.Name, Addr: w.Addr})
		}
		out = append(out, pa)
	}
	slices.SortFunc(out, func(a, b PeerAttempt) int {
		return cmp.Or(cmp.Compare(a.Job, b.Job), cmp.Compare(a.Attempt, b.Attempt))
	})
	return out
}

// RenewPeerLease extends one attempt's lease to deadline, which a quorum
// of its witnesses confirmed; a fenced attempt is never renewed.
func (x *Executor) RenewPeerLease(job string, attempt uint32, deadline time.Time) {
	k := attemptKey{job, attempt}
	x.mu.Lock()
	if !deadline.After(x.lease.peer[k]) {
		x.mu.Unlock()
		return
	}
	live := false
	for _, p := range x.ranks[job] {
		if p.rec.Attempt == attempt && !p.exited() && !p.fenced {
			live = true
		}
	}
	if !live {
		delete(x.lease.peer, k)
		x.mu.Unlock()
		return
	}
	if x.lease.peer == nil {
		x.lease.peer = map[attemptKey]time.Time{}
	}
	x.lease.peer[k] = deadline
	paths := map[string]time.Time{x.leasePath(job, attempt): x.lease.of(k)}
	x.mu.Unlock()
	x.writeLeases(paths)
}

func signalProcs(procs []*rankProc, sig syscall.Signal) []error {
	var errs []error
	for _, p := range procs {
		if err := syscall.Kill(-p.rec.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("rank %d: %w", p.rec.Rank, err))
		}
		if sig == syscall.SIGKILL && p.rec.Cgroup != "" {
			if err := killCgroup(p.rec.Cgroup); err != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", p.rec.Rank, err))
			}
		}
	}
	return errs
}

// Stop ends the job's ranks on this host (all of them when ranks is
// empty): SIGTERM, then SIGKILL to those still alive after grace, and
// waits until every one is reported gone. It is the escalation the server
// drives with two SignalRanks commands, for nodemon's own shutdown.
func (x *Executor) Stop(job string, ranks []int32, grace time.Duration) error {
	x.mu.Lock()
	procs, err := x.targetsLocked(job, ranks, 0)
	x.mu.Unlock()
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return stopProcs(procs, grace, x.opts.Poll)
}

func stopProcs(procs []*rankProc, grace, poll time.Duration) error {
	signalProcs(procs, syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	var left []*rankProc
	for _, p := range procs {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		if !p.exited() {
			left = append(left, p)
		}
	}
	errs := signalProcs(left, syscall.SIGKILL)
	// A killed rank is reported within a poll (adopted) or at once (child).
	deadline := time.NewTimer(poll + 10*time.Second)
	defer deadline.Stop()
	for _, p := range left {
		select {
		case <-p.done:
		case <-deadline.C:
			return fmt.Errorf("stop: rank %d of job %s (pid %d) still there after SIGKILL", p.rec.Rank, p.rec.Job, p.rec.PID)
		}
	}
	return errors.Join(errs...)
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

// StopAll stops every live rank: SIGTERM, SIGKILL after grace.
func (x *Executor) StopAll(grace time.Duration) {
	x.mu.Lock()
	procs := x.liveLocked()
	x.mu.Unlock()
	if err := stopProcs(procs, grace, x.opts.Poll); err != nil {
		x.log.Error("stop ranks", "err", err)
	}
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
