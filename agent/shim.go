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
	fs := flag.NewFlagSet(ShimCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		logPath    = fs.String("log", "", "rank log file")
		statusPath = fs.String("status", "", "file the exit status is written to")
		exe        = fs.String("exe", "", "resolved path of the command (default: looked up from its first word)")
		maxBytes   = fs.Int64("log-max-bytes", DefaultLogMaxBytes, "rotate the log past this size")
		keep       = fs.Int("log-keep", DefaultLogKeep, "rotated log files kept")
		cgroup     = fs.String("cgroup", "", "cgroup v2 directory to start the rank in")
		helloFD    = fs.Int("hello-fd", -1, "inherited pipe to report the rank's pid on")
		uid        = fs.Int("uid", -1, "user id to run the rank as (default: the shim's own)")
		gid        = fs.Int("gid", -1, "group id to run the rank as (with --uid)")
		groups     = fs.String("groups", "", "supplementary group ids, comma-separated (with --uid)")
		dir        = fs.String("dir", "", "working directory of the rank (default: the shim's)")
		leasePath  = fs.String("lease", "", "lease file: the rank is stopped once the deadline in it has passed")
		exitCode   = fs.Bool("exit-code", false, "exit with the rank's status (128+signal when killed), for Slurm to see")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	// nodemon passes a pipe to say hello on; a shim started by hand has
	// none.
	var hello *os.File
	if *helloFD > 2 {
		// Inherited without close-on-exec: set it, or the rank would hold
		// the pipe open too.
		syscall.CloseOnExec(*helloFD)
		hello = os.NewFile(uintptr(*helloFD), "hello")
	}
	say := func(h shimHello) {
		if hello == nil {
			return
		}
		b, _ := json.Marshal(h)
		hello.Write(append(b, '\n'))
		hello.Close()
		hello = nil
	}
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintln(stderr, "rank-shim:", msg)
		say(shimHello{Error: msg})
		return 2
	}
	if *logPath == "" || *statusPath == "" || len(argv) == 0 {
		return fail("usage: %s --log FILE --status FILE [--exe PATH] [--cgroup DIR] -- COMMAND [ARG…]", ShimCommand)
	}
	if *exe == "" {
		p, err := exec.LookPath(argv[0])
		if err != nil {
			return fail("command %q: %v", argv[0], err)
		}
		*exe = p
	}
	var lease *leaseWatch
	if *leasePath != "" {
		// A rank is never started without a lease it can be held to.
		lease = &leaseWatch{path: *leasePath}
		if lease.expired(time.Now()); lease.readErr != nil {
			return fail("%v", lease.readErr)
		}
	}
	cred, err := shimCredential(*uid, *gid, *groups)
	if err != nil {
		return fail("%v", err)
	}
	w, err := openRotating(*logPath, *maxBytes, *keep, cred)
	if err != nil {
		return fail("%v", err)
	}
	defer w.Close()
	note := func(format string, a ...any) {
		fmt.Fprintf(w, "gpuctl: "+format+"\n", a...)
	}
	// Under Slurm, scancel --signal=USR1 (a checkpoint request) reaches
	// every process of the step, this shim too: the rank gets its own
	// copy, and the shim must not die of it (USR1's default action).
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
		}
	}()
	// Pdeathsig is tied to the thread that starts the child: keep this
	// goroutine on its thread for the shim's life so the rank dies with
	// the shim and never with an idle runtime thread.
	runtime.LockOSThread()
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail("output pipe: %v", err)
	}
	cmd, cgErr, err := startRank(*exe, argv, pw, *cgroup, cred, *dir)
	pw.Close()
	if err != nil {
		pr.Close()
		note("rank could not start: %v", err)
		return fail("start %s: %v", argv[0], err)
	}
	pid := cmd.Process.Pid
	st, err := procfs.ReadStat("/proc", pid)
	if err != nil {
		// Not reaped yet, so its /proc entry exists; this cannot fail short
		// of /proc missing.
		return fail("read start time of rank pid %d: %v", pid, err)
	}
	// gpuctl's own line is escaped always: the command comes from the job
	// file, and `gpuctl logs --raw` must not pass it to a terminal as
	// gpuctl's word.
	note("rank %s of job %s (attempt %s) started: pid %d: %s", os.Getenv("RANK"), os.Getenv("GPUCTL_JOB"),
		os.Getenv("GPUCTL_ATTEMPT"), pid, api.EscapeText(strings.Join(argv, " ")))
	h := shimHello{PID: pid, StartTicks: st.StartTicks}
	if cgErr != nil {
		h.CgroupError = cgErr.Error()
		note("rank runs outside its cgroup: %v", cgErr)
	}
	say(h)

	copied := make(chan struct{})
	go func() {
		io.Copy(w, pr)
		close(copied)
	}()
	// Termination signals sent to the shim itself are passed on, so no one
	// can stop the shim and leave the rank behind.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	stopped := make(chan string, 1)
	go func() {
		for s := range sigs {
			select {
			case stopped <- signalName(s.(syscall.Signal)):
			default:
			}
			syscall.Kill(-pid, s.(syscall.Signal))
		}
	}()
	rankDone := make(chan struct{})
	fenced := make(chan string, 1)
	if lease != nil {
		go enforceLease(lease, pid, *cgroup != "" && cgErr == nil, *cgroup, rankDone, fenced, note)
	}
	waitErr := cmd.Wait()
	close(rankDone)
	status := shimStatus{RankPID: pid, EndedUnixNano: time.Now().UnixNano()}
	select {
	case status.Fenced = <-fenced:
	default:
		// A rank that ended on its own once its lease had passed (a peer's
		// shim stopped the peer, and the gang stopped with it) ended
		// fenced too: its attempt did not finish.
		if lease != nil && lease.expired(time.Now()) {
			status.Fenced = fmt.Sprintf("lease expired at %s, before the rank ended", lease.deadline.UTC().Format(time.RFC3339Nano))
		}
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		status.ExitCode, status.Signal, status.CoreDumped = -1, signalName(ws.Signal()), ws.CoreDump()
	} else {
		status.ExitCode = cmd.ProcessState.ExitCode()
	}
	if *exitCode {
		select {
		case status.Stopped = <-stopped:
		default:
		}
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		status.Error = waitErr.Error()
	}
	// Whatever the rank left running in its group or cgroup goes with it:
	// a rank's helpers must not outlive it and hold its GPUs.
	syscall.Kill(-pid, syscall.SIGKILL)
	if *cgroup != "" && cgErr == nil {
		killCgroup(*cgroup)
	}
	select {
	case <-copied:
	case <-time.After(2 * time.Second):
		// A process outside the group still holds the pipe open.
		pr.Close()
		<-copied
	}
	pr.Close()
	switch {
	case status.Fenced != "":
		note("rank %s stopped by its shim: %s", os.Getenv("RANK"), status.Fenced)
	case status.Signal != "":
		note("rank %s exited: killed by %s", os.Getenv("RANK"), status.Signal)
	default:
		note("rank %s exited with code %d", os.Getenv("RANK"), status.ExitCode)
	}
	if err := writeFileAtomic(*statusPath, mustJSON(status)); err != nil {
		note("write exit status: %v", err)
		fmt.Fprintln(stderr, "rank-shim:", err)
		return 1
	}
	if *exitCode {
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return status.ExitCode
	}
	return 0
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
