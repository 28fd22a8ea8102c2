package agent

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// ShimCommand is the nodemon subcommand that runs one rank: nodemon
// starts `nodemon rank-shim --log … --status … -- CMD…`, and the shim
// starts the rank, copies its output into the rotating log, waits for it
// and writes its exit status to the status file. The shim lives in its
// own session, so it and the rank outlive a nodemon crash or restart, and
// the next nodemon reads the real exit status from the file.
const ShimCommand = "rank-shim"

// shimHello is the one line the shim writes on fd 3 once the rank runs
// (or could not start), so Launch can answer the server synchronously.
type shimHello struct {
	PID        int    `json:"pid,omitempty"`
	StartTicks uint64 `json:"start_ticks,omitempty"`
	// CgroupError says why the rank is not in its cgroup; it runs anyway.
	CgroupError string `json:"cgroup_error,omitempty"`
	Error       string `json:"error,omitempty"`
}

// shimStatus is the status file the shim writes when the rank exits.
type shimStatus struct {
	RankPID       int    `json:"rank_pid"`
	ExitCode      int    `json:"exit_code"`
	Signal        string `json:"signal,omitempty"`
	CoreDumped    bool   `json:"core_dumped,omitempty"`
	EndedUnixNano int64  `json:"ended_unix_nano"`
	Error         string `json:"error,omitempty"`
	// Fenced says why the shim stopped the rank itself: its lease ran out.
	Fenced string `json:"fenced,omitempty"`
	// Stopped is the signal the shim was sent and passed on, under Slurm
	// (--exit-code): Slurm stopped the job (a lost node, scancel), so even
	// a rank that then exits 0 did not finish.
	Stopped string `json:"stopped,omitempty"`
}

// RunShim runs the rank shim with the arguments after ShimCommand and
// returns the process exit status. Its own diagnostics go to stderr before
// the log is open, and into the rank log after.
func RunShim(args []string, stderr io.Writer) int {
	f, err := parseShimFlags(args, stderr)
	if err != nil {
		return 2
	}
	s := &shim{flags: f, stderr: stderr, hello: helloPipe(f.helloFD)}
	if err := s.prepare(); err != nil {
		return s.fail(err)
	}
	if s.log, err = openRotating(f.log, f.maxBytes, f.keep, s.cred); err != nil {
		return s.fail(err)
	}
	defer s.log.Close()
	survivePassedUSR1()
	// Pdeathsig is tied to the thread that starts the child: keep this
	// goroutine on its thread for the shim's life so the rank dies with
	// the shim and never with an idle runtime thread.
	runtime.LockOSThread()
	if err := s.start(); err != nil {
		return s.fail(err)
	}
	s.passOnSignals()
	s.holdToLease()
	status := s.wait()
	s.reapLeftovers()
	return s.report(status)
}

// shimFlags is the shim's command line.
type shimFlags struct {
	log, status, exe, cgroup string
	maxBytes                 int64
	keep, helloFD            int
	uid, gid                 int
	groups, dir, lease       string
	exitCode                 bool
	argv                     []string
}

func parseShimFlags(args []string, stderr io.Writer) (shimFlags, error) {
	fs := flag.NewFlagSet(ShimCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f shimFlags
	fs.StringVar(&f.log, "log", "", "rank log file")
	fs.StringVar(&f.status, "status", "", "file the exit status is written to")
	fs.StringVar(&f.exe, "exe", "", "resolved path of the command (default: looked up from its first word)")
	fs.Int64Var(&f.maxBytes, "log-max-bytes", DefaultLogMaxBytes, "rotate the log past this size")
	fs.IntVar(&f.keep, "log-keep", DefaultLogKeep, "rotated log files kept")
	fs.StringVar(&f.cgroup, "cgroup", "", "cgroup v2 directory to start the rank in")
	fs.IntVar(&f.helloFD, "hello-fd", -1, "inherited pipe to report the rank's pid on")
	fs.IntVar(&f.uid, "uid", -1, "user id to run the rank as (default: the shim's own)")
	fs.IntVar(&f.gid, "gid", -1, "group id to run the rank as (with --uid)")
	fs.StringVar(&f.groups, "groups", "", "supplementary group ids, comma-separated (with --uid)")
	fs.StringVar(&f.dir, "dir", "", "working directory of the rank (default: the shim's)")
	fs.StringVar(&f.lease, "lease", "", "lease file: the rank is stopped once the deadline in it has passed")
	fs.BoolVar(&f.exitCode, "exit-code", false, "exit with the rank's status (128+signal when killed), for Slurm to see")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	f.argv = fs.Args()
	return f, nil
}

// shim is one run of the rank shim: what each step leaves for the next.
type shim struct {
	flags  shimFlags
	stderr io.Writer
	// hello is the pipe nodemon waits on for the rank's pid; nil once
	// said, or for a shim started by hand.
	hello *os.File
	lease *leaseWatch
	cred  *syscall.Credential
	log   *rotatingWriter

	cmd   *exec.Cmd
	pid   int
	cgErr error // why the rank is not in its cgroup
	// output is the rank's stdout and stderr; copied is closed once all
	// of it is in the log.
	output *os.File
	copied chan struct{}
	// stopped is the first termination signal passed on to the rank;
	// fenced why the lease stopped it; rankDone is closed once it exited.
	stopped  chan string
	fenced   chan string
	rankDone chan struct{}
}

// helloPipe is the pipe nodemon passes to say hello on (fd > 2).
func helloPipe(fd int) *os.File {
	if fd <= 2 {
		return nil
	}
	// Inherited without close-on-exec: set it, or the rank would hold the
	// pipe open too.
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "hello")
}

// say writes the hello line, once.
func (s *shim) say(h shimHello) {
	if s.hello == nil {
		return
	}
	b, _ := json.Marshal(h)
	s.hello.Write(append(b, '\n'))
	s.hello.Close()
	s.hello = nil
}

// fail reports why the rank did not start, to stderr and on the hello
// pipe, and returns the shim's exit status.
func (s *shim) fail(err error) int {
	fmt.Fprintln(s.stderr, "rank-shim:", err)
	s.say(shimHello{Error: err.Error()})
	return 2
}

// note writes a line of gpuctl's own into the rank log.
func (s *shim) note(format string, a ...any) {
	fmt.Fprintf(s.log, "gpuctl: "+format+"\n", a...)
}

// prepare checks the command line and resolves what the rank needs: its
// executable, its lease, its credentials.
func (s *shim) prepare() error {
	f := &s.flags
	if f.log == "" || f.status == "" || len(f.argv) == 0 {
		return fmt.Errorf("usage: %s --log FILE --status FILE [--exe PATH] [--cgroup DIR] -- COMMAND [ARG…]", ShimCommand)
	}
	if f.exe == "" {
		p, err := exec.LookPath(f.argv[0])
		if err != nil {
			return fmt.Errorf("command %q: %v", f.argv[0], err)
		}
		f.exe = p
	}
	if f.lease != "" {
		// A rank is never started without a lease it can be held to.
		s.lease = &leaseWatch{path: f.lease}
		if s.lease.expired(time.Now()); s.lease.readErr != nil {
			return s.lease.readErr
		}
	}
	var err error
	s.cred, err = shimCredential(f.uid, f.gid, f.groups)
	return err
}

// survivePassedUSR1 keeps the shim alive through SIGUSR1: under Slurm,
// scancel --signal=USR1 (a checkpoint request) reaches every process of
// the step, this shim too; the rank gets its own copy, and the shim must
// not die of it (USR1's default action).
func survivePassedUSR1() {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
		}
	}()
}

// start starts the rank with its output copied into the log, and
// says its pid on the hello pipe.
func (s *shim) start() error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("output pipe: %v", err)
	}
	s.cmd, s.cgErr, err = startRank(s.flags.exe, s.flags.argv, pw, s.flags.cgroup, s.cred, s.flags.dir)
	pw.Close()
	if err != nil {
		pr.Close()
		s.note("rank could not start: %v", err)
		return fmt.Errorf("start %s: %v", s.flags.argv[0], err)
	}
	s.pid = s.cmd.Process.Pid
	st, err := procfs.ReadStat("/proc", s.pid)
	if err != nil {
		// Not reaped yet, so its /proc entry exists; this cannot fail short
		// of /proc missing.
		return fmt.Errorf("read start time of rank pid %d: %v", s.pid, err)
	}
	// gpuctl's own line is escaped always: the command comes from the job
	// file, and `gpuctl logs --raw` must not pass it to a terminal as
	// gpuctl's word.
	s.note("rank %s of job %s (attempt %s) started: pid %d: %s", os.Getenv("RANK"), os.Getenv("GPUCTL_JOB"),
		os.Getenv("GPUCTL_ATTEMPT"), s.pid, api.EscapeText(strings.Join(s.flags.argv, " ")))
	h := shimHello{PID: s.pid, StartTicks: st.StartTicks}
	if s.cgErr != nil {
		h.CgroupError = s.cgErr.Error()
		s.note("rank runs outside its cgroup: %v", s.cgErr)
	}
	s.say(h)
	s.output, s.copied = pr, make(chan struct{})
	go func() {
		io.Copy(s.log, pr)
		close(s.copied)
	}()
	return nil
}

// inCgroup says whether the rank runs in the cgroup it was given.
func (s *shim) inCgroup() bool { return s.flags.cgroup != "" && s.cgErr == nil }

// passOnSignals passes termination signals sent to the shim itself on to
// the rank's group, so no one can stop the shim and leave the rank behind.
func (s *shim) passOnSignals() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	s.stopped = make(chan string, 1)
	go func() {
		for sig := range sigs {
			select {
			case s.stopped <- signalName(sig.(syscall.Signal)):
			default:
			}
			syscall.Kill(-s.pid, sig.(syscall.Signal))
		}
	}()
}

// holdToLease stops the rank once its lease has passed, when it has one.
func (s *shim) holdToLease() {
	s.rankDone, s.fenced = make(chan struct{}), make(chan string, 1)
	if s.lease != nil {
		go enforceLease(s.lease, s.pid, s.inCgroup(), s.flags.cgroup, s.rankDone, s.fenced, s.note)
	}
}

// wait waits for the rank and says how it ended.
func (s *shim) wait() shimStatus {
	waitErr := s.cmd.Wait()
	close(s.rankDone)
	status := shimStatus{RankPID: s.pid, EndedUnixNano: time.Now().UnixNano()}
	select {
	case status.Fenced = <-s.fenced:
	default:
		// A rank that ended on its own once its lease had passed (a peer's
		// shim stopped the peer, and the gang stopped with it) ended
		// fenced too: its attempt did not finish.
		if s.lease != nil && s.lease.expired(time.Now()) {
			status.Fenced = fmt.Sprintf("lease expired at %s, before the rank ended", s.lease.deadline.UTC().Format(time.RFC3339Nano))
		}
	}
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		status.ExitCode, status.Signal, status.CoreDumped = -1, signalName(ws.Signal()), ws.CoreDump()
	} else {
		status.ExitCode = s.cmd.ProcessState.ExitCode()
	}
	if s.flags.exitCode {
		select {
		case status.Stopped = <-s.stopped:
		default:
		}
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		status.Error = waitErr.Error()
	}
	return status
}

// reapLeftovers kills whatever the rank left running in its group or
// cgroup (a rank's helpers must not outlive it and hold its GPUs), and
// waits for the rest of its output.
func (s *shim) reapLeftovers() {
	syscall.Kill(-s.pid, syscall.SIGKILL)
	if s.inCgroup() {
		killCgroup(s.flags.cgroup)
	}
	select {
	case <-s.copied:
	case <-time.After(2 * time.Second):
		// A process outside the group still holds the pipe open.
		s.output.Close()
		<-s.copied
	}
	s.output.Close()
}

// report writes how the rank ended into its log and its status file,
// and returns the shim's exit status.
func (s *shim) report(status shimStatus) int {
	switch {
	case status.Fenced != "":
		s.note("rank %s stopped by its shim: %s", os.Getenv("RANK"), status.Fenced)
	case status.Signal != "":
		s.note("rank %s exited: killed by %s", os.Getenv("RANK"), status.Signal)
	default:
		s.note("rank %s exited with code %d", os.Getenv("RANK"), status.ExitCode)
	}
	if err := writeFileAtomic(s.flags.status, mustJSON(status)); err != nil {
		s.note("write exit status: %v", err)
		fmt.Fprintln(s.stderr, "rank-shim:", err)
		return 1
	}
	if !s.flags.exitCode {
		return 0
	}
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return status.ExitCode
}

// enforceLease stops the rank (its whole process group, and its cgroup
// when it is in one) once its lease has passed: SIGTERM, then SIGKILL
// after leaseGrace. It says why on fenced before the first signal, so the
// status written after the rank's exit carries it.
func enforceLease(lease *leaseWatch, pid int, inCgroup bool, cgroup string, rankDone <-chan struct{}, fenced chan<- string, note func(string, ...any)) {
	t := time.NewTicker(leaseCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-rankDone:
			return
		case now := <-t.C:
			if !lease.expired(now) {
				continue
			}
			why := fmt.Sprintf("lease expired at %s with no word from the server since (fenced: the server may run this attempt's successor elsewhere)",
				lease.deadline.UTC().Format(time.RFC3339Nano))
			fenced <- why
			note("%s; stopping rank pid %d: SIGTERM, SIGKILL after %s", why, pid, leaseGrace)
			syscall.Kill(-pid, syscall.SIGTERM)
			select {
			case <-rankDone:
			case <-time.After(leaseGrace):
				syscall.Kill(-pid, syscall.SIGKILL)
				if inCgroup {
					killCgroup(cgroup)
				}
			}
			return
		}
	}
}

// startRank starts the rank in its own process group with its output on
// out, inside cgroupDir when one is given. When the kernel cannot start it
// there directly (CLONE_INTO_CGROUP needs Linux 5.7), the rank is moved in
// just after it starts; cgErr says why when neither worked.
func startRank(exe string, argv []string, out *os.File, cgroupDir string, cred *syscall.Credential, dir string) (cmd *exec.Cmd, cgErr, err error) {
	mk := func() *exec.Cmd {
		c := &exec.Cmd{Path: exe, Args: argv, Stdout: out, Stderr: out, Dir: dir}
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
		return c
	}
	if cgroupDir != "" {
		dir, oerr := os.Open(cgroupDir)
		if oerr == nil {
			c := mk()
			c.SysProcAttr.UseCgroupFD, c.SysProcAttr.CgroupFD = true, int(dir.Fd())
			err = c.Start()
			dir.Close()
			if err == nil {
				return c, nil, nil
			}
		}
	}
	cmd = mk()
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	if cgroupDir != "" {
		cgErr = os.WriteFile(filepath.Join(cgroupDir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
		if cgErr != nil {
			cgErr = fmt.Errorf("move pid %d into %s: %w", cmd.Process.Pid, cgroupDir, cgErr)
		}
	}
	return cmd, cgErr, nil
}

// shimCredential is the account the shim's flags name, or nil for the
// shim's own.
func shimCredential(uid, gid int, groups string) (*syscall.Credential, error) {
	if uid < 0 {
		return nil, nil
	}
	if gid < 0 {
		return nil, errors.New("--uid needs --gid")
	}
	c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	for _, g := range strings.Split(groups, ",") {
		if g == "" {
			continue
		}
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--groups: %q is not a group id", g)
		}
		c.Groups = append(c.Groups, uint32(n))
	}
	return c, nil
}

// readShimStatus reads the status file a shim wrote.
func readShimStatus(path string) (shimStatus, error) {
	var s shimStatus
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("rank status %s: %w", path, err)
	}
	return s, nil
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err) // only plain structs are marshalled here
	}
	return append(b, '\n')
}

// writeFileAtomic writes path through a temporary file and a rename, so a
// reader sees the old content or the new, never a torn one.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
