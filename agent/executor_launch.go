package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

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

// Launch starts the ranks of l that are not already running. A repeated
// launch of the same job attempt, or of a rank a restarted nodemon
// adopted, starts nothing new; a launch of a new attempt while the old one
// still runs is refused.
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
	_, err = x.do(func() (any, error) { return nil, x.launch(l, exe, cred) })
	if errors.Is(err, errClosed) {
		return fmt.Errorf("launch: %w", err)
	}
	return err
}

// launch starts, on the owner, the ranks of l not already running.
func (x *Executor) launch(l *api.LaunchRanks, exe string, cred *rankCred) error {
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
	x.pass.save = true
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
			x.dropLease(l.GetJob(), l.GetAttempt())
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
	logPath, statusPath, err := x.rankFiles(job, rank, cred)
	if err != nil {
		return fail(err)
	}
	// The tail starts at the log's end now, before the rank can print.
	tail := openLogTail(logPath)
	cmd, cgDir := x.shimCommand(l, r, exe, cred, logPath, statusPath, leasePath)
	h, err := x.startShim(cmd)
	if err != nil {
		tail.close()
		return fail(err)
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
	x.raise(&api.Event{
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
		// A closed executor drops it: that nodemon is gone as far as
		// anyone knows, and the next one reads the status file.
		x.post(msgExited{p: p, shimSignal: shimSig})
	}()
	return p, nil
}

// rankFiles makes a rank's log (owned by the account it runs as) and
// clears the status file an earlier run of the rank left.
func (x *Executor) rankFiles(job string, rank int32, cred *rankCred) (logPath, statusPath string, err error) {
	var owner *syscall.Credential
	if cred != nil {
		owner = &syscall.Credential{Uid: cred.uid, Gid: cred.gid}
	}
	if err := rankLogDir(filepath.Join(x.logDir, job), owner); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Join(x.runDir, job), 0o755); err != nil {
		return "", "", err
	}
	logPath = filepath.Join(x.logDir, job, fmt.Sprintf("rank-%d.log", rank))
	statusPath = filepath.Join(x.runDir, job, fmt.Sprintf("rank-%d.status", rank))
	if err := os.Remove(statusPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	lf, err := openRankLog(logPath, owner)
	if err != nil {
		return "", "", err
	}
	lf.Close()
	return logPath, statusPath, nil
}

// shimCommand is the rank shim's command line and environment for one
// rank; cgDir is the rank's cgroup ("" when it runs outside one).
func (x *Executor) shimCommand(l *api.LaunchRanks, r *api.RankSpec, exe string, cred *rankCred, logPath, statusPath, leasePath string) (cmd *exec.Cmd, cgDir string) {
	args := append([]string{}, x.opts.Shim[1:]...)
	args = append(args, "--log", logPath, "--status", statusPath, "--exe", exe, "--hello-fd", "3",
		"--log-max-bytes", strconv.FormatInt(x.opts.LogMaxBytes, 10), "--log-keep", strconv.Itoa(x.opts.LogKeep))
	if x.cg.enabled() {
		var err error
		if cgDir, err = x.cg.rankDir(l.GetJob(), r.GetRank()); err != nil {
			x.log.Warn("rank runs outside a cgroup", "job", l.GetJob(), "rank", r.GetRank(), "err", err)
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
	cmd = exec.Command(x.opts.Shim[0], args...)
	cmd.Env = rankEnv(x.opts.Node, x.clusterID(), x.opts.Env, l, r)
	if cred != nil {
		cmd.Env = append(cmd.Env, cred.env()...)
	}
	// Its own session: the shim and the rank outlive nodemon, and no
	// signal meant for nodemon's group reaches them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd, cgDir
}

// startShim starts cmd and waits for the shim's hello: the rank's pid, or
// why it did not start (then the shim is gone when it returns).
func (x *Executor) startShim(cmd *exec.Cmd) (shimHello, error) {
	hr, hw, err := os.Pipe()
	if err != nil {
		return shimHello{}, err
	}
	defer hr.Close()
	cmd.ExtraFiles = []*os.File{hw}
	err = cmd.Start()
	hw.Close()
	if err != nil {
		return shimHello{}, fmt.Errorf("start rank shim %s: %w", x.opts.Shim[0], err)
	}
	hr.SetReadDeadline(time.Now().Add(15 * time.Second))
	b, rerr := bufio.NewReader(io.LimitReader(hr, 64<<10)).ReadBytes('\n')
	if rerr == io.EOF {
		rerr = nil // the shim exited without a whole line; b says what it got
	}
	var h shimHello
	if jerr := json.Unmarshal(b, &h); rerr == nil && jerr == nil && h.Error == "" && h.PID > 0 {
		return h, nil
	}
	cmd.Process.Kill()
	cmd.Wait()
	switch {
	case h.Error != "":
		return h, errors.New(h.Error)
	case rerr != nil:
		return h, fmt.Errorf("rank shim did not report the rank's pid: %w", rerr)
	}
	return h, fmt.Errorf("rank shim exited without starting the rank (%q)", strings.TrimSpace(string(b)))
}

// exited reports a rank's exit once, from the status its shim wrote.
// shimSignal is what killed the shim when it did not exit by itself.
func (x *Executor) exited(p *rankProc, shimSignal string) {
	if p.exited() {
		return
	}
	close(p.done)
	w := x.ckpt[p.rec.Job]
	now := time.Now()
	p.pollLog(now)
	if p.rec.Rank == 0 && w != nil {
		// The last checkpoint (the one a stop asks for) lands just before
		// the exit: report it first.
		x.checkCheckpoint(p.rec.Job, w, p, now, true)
	}
	ev := x.exitEvent(p, now, shimSignal)
	x.log.Info("rank exited", "job", p.rec.Job, "rank", p.rec.Rank, "pid", p.rec.PID, "code", ev.ExitCode, "signal", ev.Signal)
	x.raise(ev)
	os.Remove(p.rec.StatusPath)
	x.cg.removeRank(p.rec.Cgroup)
	x.dropLease(p.rec.Job, p.rec.Attempt)
	if x.ckpt[p.rec.Job] == w && p.rec.Rank == 0 {
		delete(x.ckpt, p.rec.Job)
	}
	p.tail.close()
	x.pass.save = true
}

func (x *Executor) exitEvent(p *rankProc, now time.Time, shimSignal string) *api.Event {
	r := p.rec
	ev := &api.Event{
		TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Severity: api.Severity_SEVERITY_INFO,
		Pid: uint32(r.PID), Job: r.Job, Rank: r.Rank, Attrs: map[string]string{"attempt": strconv.Itoa(int(r.Attempt))},
	}
	ev.Step = p.parser.step
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
		ev.Message = fmt.Sprintf("rank %d (pid %d) exited with code %d after it was sent %s", r.Rank, r.PID, st.ExitCode, st.Stopped)
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

// rankEnv is the environment of one rank: the host's, nodemon's own
// additions (extra), then what api.RankEnv defines.
func rankEnv(node, cluster string, extra []string, l *api.LaunchRanks, r *api.RankSpec) []string {
	env := append(os.Environ(), extra...)
	return append(env, api.RankEnv(node, cluster, l, r)...)
}
