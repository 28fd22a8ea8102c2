package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

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
			x.raise(&api.Event{
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
		x.raise(ev)
		os.Remove(r.StatusPath)
		x.cg.removeRank(r.Cgroup)
	}
	x.pass.save = true
	return nil
}
