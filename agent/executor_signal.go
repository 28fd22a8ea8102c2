package agent

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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

func signalName(s syscall.Signal) string {
	for n, v := range signals {
		if v == s {
			return n
		}
	}
	return "signal " + strconv.Itoa(int(s))
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
	procs, err := x.targetsOf(s.GetJob(), s.GetRanks(), s.GetAttempt())
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
	v, err := x.do(func() (any, error) {
		procs, _ := x.targets(s.GetJob(), s.GetRanks(), s.GetAttempt())
		for _, p := range procs {
			x.ranks[p.rec.Job][p.rec.Rank].fenced = true
		}
		return procs, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fence %s attempt %d: %w", s.GetJob(), s.GetAttempt(), err)
	}
	procs := v.([]target)
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

// targetsOf asks the owner for targets.
func (x *Executor) targetsOf(job string, ranks []int32, attempt uint32) ([]target, error) {
	v, err := x.do(func() (any, error) { return x.targets(job, ranks, attempt) })
	if err != nil {
		return nil, err
	}
	return v.([]target), nil
}

func signalProcs(procs []target, sig syscall.Signal) []error {
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
	procs, err := x.targetsOf(job, ranks, 0)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return stopProcs(procs, grace, x.opts.Poll)
}

func stopProcs(procs []target, grace, poll time.Duration) error {
	signalProcs(procs, syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	var left []target
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

// StopAll stops every live rank: SIGTERM, SIGKILL after grace.
func (x *Executor) StopAll(grace time.Duration) {
	procs := query(x, func() []target {
		var out []target
		for _, p := range x.live() {
			out = append(out, p.target())
		}
		return out
	})
	if err := stopProcs(procs, grace, x.opts.Poll); err != nil {
		x.log.Error("stop ranks", "err", err)
	}
}
