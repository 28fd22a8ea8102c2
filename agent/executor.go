package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
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

// rankProc is one launched rank.
type rankProc struct {
	job     string
	attempt uint32
	spec    *api.RankSpec
	cmd     *exec.Cmd
	done    chan struct{}
}

// Executor launches a job's ranks on this host and reports their exits.
type Executor struct {
	log     *slog.Logger
	node    string
	logDir  string
	onEvent func(*api.Event)
	// BeforeLaunch, when set, runs before a job's ranks start (nodemon
	// attaches its NCCL probes to the libraries the command links).
	BeforeLaunch func(*api.LaunchRanks)

	mu    sync.Mutex
	ranks map[string]map[int32]*rankProc // job → rank → process
}

// NewExecutor returns an executor that writes rank logs under logDir and
// hands rank start and exit events to onEvent.
func NewExecutor(log *slog.Logger, node, logDir string, onEvent func(*api.Event)) *Executor {
	return &Executor{log: log, node: node, logDir: logDir, onEvent: onEvent, ranks: map[string]map[int32]*rankProc{}}
}

// Launch starts the ranks of l that are not already running. A repeated
// launch of the same job attempt starts nothing new.
func (x *Executor) Launch(l *api.LaunchRanks) error {
	if l.GetJob() == "" || len(l.GetCommand()) == 0 || len(l.GetRanks()) == 0 {
		return errors.New("launch: job, command and at least one rank are required")
	}
	if _, err := exec.LookPath(l.GetCommand()[0]); err != nil {
		return fmt.Errorf("launch %s: command %q not found on node %s: %w", l.GetJob(), l.GetCommand()[0], x.node, err)
	}
	if x.BeforeLaunch != nil {
		x.BeforeLaunch(l)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	running := x.ranks[l.GetJob()]
	if running == nil {
		running = map[int32]*rankProc{}
		x.ranks[l.GetJob()] = running
	}
	dir := filepath.Join(x.logDir, l.GetJob())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("launch %s: %w", l.GetJob(), err)
	}
	for _, r := range l.GetRanks() {
		if p, ok := running[r.GetRank()]; ok && p.attempt == l.GetAttempt() && !p.exited() {
			continue
		}
		p, err := x.start(l, r, dir)
		if err != nil {
			return err
		}
		running[r.GetRank()] = p
	}
	return nil
}

func (x *Executor) start(l *api.LaunchRanks, r *api.RankSpec, dir string) (*rankProc, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("rank-%d.log", r.GetRank()))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("launch %s rank %d: open log: %w", l.GetJob(), r.GetRank(), err)
	}
	cmd := exec.Command(l.GetCommand()[0], l.GetCommand()[1:]...)
	cmd.Env = rankEnv(x.node, l, r)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a signal reaches the rank's children too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("launch %s rank %d: %w", l.GetJob(), r.GetRank(), err)
	}
	logf.Close()
	p := &rankProc{job: l.GetJob(), attempt: l.GetAttempt(), spec: r, cmd: cmd, done: make(chan struct{})}
	x.log.Info("rank started", "job", l.GetJob(), "rank", r.GetRank(), "pid", cmd.Process.Pid, "gpus", r.GetGpus())
	x.onEvent(&api.Event{
		TimeUnixNano: time.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_JOB, Severity: api.Severity_SEVERITY_INFO,
		Pid: uint32(cmd.Process.Pid), Job: l.GetJob(), Rank: r.GetRank(),
		Message: fmt.Sprintf("rank %d started (pid %d, attempt %d)", r.GetRank(), cmd.Process.Pid, l.GetAttempt()),
	})
	go x.wait(p)
	return p, nil
}

func (x *Executor) wait(p *rankProc) {
	err := p.cmd.Wait()
	close(p.done)
	ev := &api.Event{
		TimeUnixNano: time.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT,
		Pid: uint32(p.cmd.Process.Pid), Job: p.job, Rank: p.spec.GetRank(), Severity: api.Severity_SEVERITY_INFO,
	}
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		ev.Signal = signalName(ws.Signal())
		ev.ExitCode = -1
		ev.Severity = api.Severity_SEVERITY_WARNING
		ev.Message = fmt.Sprintf("rank %d (pid %d) killed by %s", p.spec.GetRank(), ev.Pid, ev.Signal)
	default:
		ev.ExitCode = int32(ws.ExitStatus())
		ev.Message = fmt.Sprintf("rank %d (pid %d) exited with code %d", p.spec.GetRank(), ev.Pid, ev.ExitCode)
		if ev.ExitCode != 0 {
			ev.Severity = api.Severity_SEVERITY_WARNING
		}
	}
	if err != nil && ev.Message == "" {
		ev.Message = err.Error()
	}
	x.log.Info("rank exited", "job", p.job, "rank", p.spec.GetRank(), "pid", ev.Pid, "code", ev.ExitCode, "signal", ev.Signal)
	x.onEvent(ev)
}

func (p *rankProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
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

// rankEnv is the environment of one rank: the host's, the job's, and the
// variables that tell the rank where it sits in the gang.
func rankEnv(node string, l *api.LaunchRanks, r *api.RankSpec) []string {
	gpus := make([]string, len(r.GetGpus()))
	for i, g := range r.GetGpus() {
		gpus[i] = strconv.Itoa(int(g))
	}
	env := os.Environ()
	keys := make([]string, 0, len(l.GetEnv()))
	for k := range l.GetEnv() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+l.GetEnv()[k])
	}
	env = append(env,
		"RANK="+strconv.Itoa(int(r.GetRank())),
		"LOCAL_RANK="+strconv.Itoa(int(r.GetLocalRank())),
		"WORLD_SIZE="+strconv.Itoa(int(l.GetWorldSize())),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(len(l.GetRanks())),
		"MASTER_ADDR="+l.GetMasterAddr(),
		"MASTER_PORT="+strconv.Itoa(int(l.GetMasterPort())),
		"CUDA_VISIBLE_DEVICES="+strings.Join(gpus, ","),
		"GPUCTL_JOB="+l.GetJob(),
		"GPUCTL_NODE="+node,
		"GPUCTL_ATTEMPT="+strconv.Itoa(int(l.GetAttempt())),
	)
	if l.GetCheckpointDir() != "" {
		env = append(env, "GPUCTL_CHECKPOINT_DIR="+l.GetCheckpointDir())
	}
	if l.GetResumeStep() > 0 {
		env = append(env, "GPUCTL_RESUME_STEP="+strconv.FormatInt(l.GetResumeStep(), 10))
	}
	return env
}

// Signal sends a named signal to the job's ranks on this host (all of
// them when s names none) and their process groups.
func (x *Executor) Signal(s *api.SignalRanks) error {
	sig, ok := signals[strings.ToUpper(s.GetSignal())]
	if !ok {
		return fmt.Errorf("signal %s: unknown signal %q (use SIGUSR1, SIGTERM, SIGKILL, SIGSTOP, SIGCONT or SIGINT)", s.GetJob(), s.GetSignal())
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	running, ok := x.ranks[s.GetJob()]
	if !ok {
		return fmt.Errorf("signal: job %q has no ranks on node %s", s.GetJob(), x.node)
	}
	want := map[int32]bool{}
	for _, r := range s.GetRanks() {
		want[r] = true
	}
	var errs []error
	for rank, p := range running {
		if len(want) > 0 && !want[rank] || p.exited() {
			continue
		}
		if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", rank, err))
		}
	}
	return errors.Join(errs...)
}

// GPUProcesses maps each GPU index to the pids of live ranks using it.
func (x *Executor) GPUProcesses() map[uint32][]uint32 {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[uint32][]uint32{}
	for _, job := range x.ranks {
		for _, p := range job {
			if p.exited() {
				continue
			}
			for _, g := range p.spec.GetGpus() {
				out[g] = append(out[g], uint32(p.cmd.Process.Pid))
			}
		}
	}
	return out
}

// StopAll sends SIGTERM to every live rank, then SIGKILL to those still
// alive after grace, and waits for them.
func (x *Executor) StopAll(grace time.Duration) {
	x.mu.Lock()
	var procs []*rankProc
	for _, job := range x.ranks {
		for _, p := range job {
			if !p.exited() {
				procs = append(procs, p)
			}
		}
	}
	x.mu.Unlock()
	for _, p := range procs {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	for _, p := range procs {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
