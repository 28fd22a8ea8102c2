package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// Ranks that Slurm or Kubernetes starts are not nodemon's children:
// nodemon finds them in /proc by their environment and reports them like
// the ranks it launched. A Slurm task is known by SLURM_JOB_ID,
// SLURM_PROCID and SLURMD_NODENAME (which tells apart the nodes of several
// slurmd on one host); a rank of a pod of gpuctl's by api.KubePodEnv and
// GPUCTL_NODE. A task of a job gpuctl started runs the rank shim (nodemon
// slurm-task, nodemon kube-task), whose status file gives the real exit
// status; a task of a job submitted with plain sbatch is reported as rank
// SLURM_PROCID of job api.SlurmJobName(id), its exit status unknown.

// foundTask is what a found task's environment says of it.
type foundTask struct {
	// slurmJob or pod: who started it.
	slurmJob, pod string
	job           string
	attempt       uint32
	rank          int32
	local         int32
	gpus          []uint32
	// logPath and statusPath are the shim's (gpuctl's jobs only).
	logPath, statusPath string
	ckptDir             string
	// shimmed: a gpuctl job's task, whose process is the rank shim.
	shimmed bool
}

// slurmTaskOf reads a process environment: ok when it is a Slurm task of
// node. env holds the first value of each name, as getenv reads it.
func slurmTaskOf(env map[string]string, node string) (foundTask, bool) {
	id, procID := env["SLURM_JOB_ID"], env["SLURM_PROCID"]
	if id == "" || procID == "" || env["SLURMD_NODENAME"] != node || node == "" {
		return foundTask{}, false
	}
	if env["SLURM_STEP_ID"] == "" {
		// The batch script itself (or its non-srun children): not a rank.
		return foundTask{}, false
	}
	if env[api.SlurmLaunchEnv] != "" {
		// nodemon slurm-task before it execs the rank shim: found again,
		// as the shim, on a later scan.
		return foundTask{}, false
	}
	t := foundTask{slurmJob: id}
	if env[api.RankStatusEnv] != "" && env["GPUCTL_JOB"] != "" {
		return shimmedTask(t, env)
	}
	rank, err := strconv.Atoi(procID)
	if err != nil || rank < 0 {
		return foundTask{}, false
	}
	local, _ := strconv.Atoi(env["SLURM_LOCALID"])
	restarts, _ := strconv.Atoi(env["SLURM_RESTART_COUNT"])
	t.job, t.rank, t.local, t.attempt = api.SlurmJobName(id), int32(rank), int32(local), uint32(restarts+1)
	t.gpus = parseGPUs(env["CUDA_VISIBLE_DEVICES"])
	return t, true
}

// kubeTaskOf reads a process environment: ok when it is the shim of a
// rank of a pod of gpuctl's on node.
func kubeTaskOf(env map[string]string, node string) (foundTask, bool) {
	pod := env[api.KubePodEnv]
	if pod == "" || node == "" || env["GPUCTL_NODE"] != node || env[api.RankStatusEnv] == "" || env["GPUCTL_JOB"] == "" {
		return foundTask{}, false
	}
	return shimmedTask(foundTask{pod: pod}, env)
}

// shimmedTask completes t from the environment gpuctl gave a task's rank
// shim (api.RankEnv, the log and the status file).
func shimmedTask(t foundTask, env map[string]string) (foundTask, bool) {
	rank, err1 := strconv.Atoi(env["RANK"])
	local, err2 := strconv.Atoi(env["LOCAL_RANK"])
	attempt, err3 := strconv.Atoi(env["GPUCTL_ATTEMPT"])
	if err1 != nil || err2 != nil || err3 != nil || rank < 0 || local < 0 || attempt < 0 {
		return foundTask{}, false
	}
	t.job, t.rank, t.local, t.attempt = env["GPUCTL_JOB"], int32(rank), int32(local), uint32(attempt)
	t.logPath, t.statusPath, t.ckptDir, t.shimmed = env[api.RankLogEnv], env[api.RankStatusEnv], env["GPUCTL_CHECKPOINT_DIR"], true
	t.gpus = parseGPUs(env["CUDA_VISIBLE_DEVICES"])
	return t, true
}

func parseGPUs(s string) []uint32 {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32); err == nil {
			out = append(out, uint32(n))
		}
	}
	return out
}

// readEnv reads /proc/PID/environ: the first value of each name.
func readEnv(root string, pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "environ"))
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte{'='})
		if ok {
			if _, dup := env[string(k)]; !dup {
				env[string(k)] = string(v)
			}
		}
	}
	return env, nil
}

func comm(root string, pid int) string {
	b, _ := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}

// scanTasks adopts the tasks of this node it does not know yet: Slurm's
// (processes whose parent is slurmstepd: the task itself, not what it
// starts) with a Slurm node, and the rank shims of gpuctl's pods (whose
// parent is nodemon kube-task) with a Kubernetes node. For a shimmed task
// the rank is the shim's child.
func (x *Executor) scanTasks(now time.Time) {
	root := x.opts.ProcRoot
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	known := map[int]bool{}
	for _, p := range x.live() {
		known[p.rec.ShimPID], known[p.rec.PID] = true, true
	}
	self := os.Getpid()
	children := map[int][]procfs.Stat{}
	var tasks []procfs.Stat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procfs.ReadStat(root, pid)
		if err != nil || st.Exited() {
			continue
		}
		children[st.PPID] = append(children[st.PPID], st)
		if known[pid] || st.PPID <= 1 || st.PPID == self {
			continue
		}
		switch comm(root, st.PPID) {
		case "slurmstepd":
			if x.opts.SlurmNode != "" {
				tasks = append(tasks, st)
			}
		case "nodemon":
			if x.opts.KubeNode != "" {
				tasks = append(tasks, st)
			}
		}
	}
	for _, st := range tasks {
		env, err := readEnv(root, st.PID)
		if err != nil {
			continue
		}
		t, ok := slurmTaskOf(env, x.opts.SlurmNode)
		if !ok {
			t, ok = kubeTaskOf(env, x.opts.KubeNode)
		}
		if !ok {
			continue
		}
		rec := rankRecord{Job: t.job, Attempt: t.attempt, Rank: t.rank, LocalRank: t.local, GPUs: t.gpus,
			PID: st.PID, StartTicks: st.StartTicks, ShimPID: st.PID, ShimStartTicks: st.StartTicks,
			LogPath: t.logPath, StatusPath: t.statusPath, CheckpointDir: t.ckptDir,
			LastCheckpointStep: -1, CheckpointReported: -1, LaunchedUnixNano: now.UnixNano(), SlurmJob: t.slurmJob, Pod: t.pod}
		if t.shimmed {
			kids := children[st.PID]
			if len(kids) == 0 {
				continue // the shim has not started the rank yet: next poll
			}
			rec.PID, rec.StartTicks = kids[0].PID, kids[0].StartTicks
		} else if out, err := os.Readlink(filepath.Join(root, strconv.Itoa(st.PID), "fd", "1")); err == nil && strings.HasPrefix(out, "/") {
			// A plain sbatch job's rank prints into Slurm's output file.
			rec.LogPath = out
		}
		x.adoptFound(rec, now)
	}
}

func (x *Executor) adoptFound(rec rankRecord, now time.Time) {
	if old := x.ranks[rec.Job][rec.Rank]; old != nil && !old.exited() {
		return
	}
	p := &rankProc{rec: rec, adopted: true, done: make(chan struct{}), tail: openLogTail(rec.LogPath), parser: newLogParser()}
	if err := p.tail.catchUp(p.parser, rec.PID, now); err != nil {
		x.log.Warn("read found rank's log", "job", rec.Job, "rank", rec.Rank, "err", err)
	}
	if x.ranks[rec.Job] == nil {
		x.ranks[rec.Job] = map[int32]*rankProc{}
	}
	x.ranks[rec.Job][rec.Rank] = p
	if rec.Rank == 0 && rec.CheckpointDir != "" {
		w := newCkptWatch(rec.CheckpointDir, readMarker(rec.CheckpointDir))
		x.ckpt[rec.Job] = w
		p.rec.CheckpointReported = w.reported
	}
	x.pass.save = true
	x.act(func() { x.opts.OnAdopt(rec.PID) })
	attrs := map[string]string{"attempt": strconv.Itoa(int(rec.Attempt))}
	by := "Slurm job " + rec.SlurmJob
	if rec.Pod != "" {
		attrs["pod"], by = rec.Pod, "pod "+rec.Pod
	} else {
		attrs["slurm_job"] = rec.SlurmJob
	}
	x.log.Info("rank found", "job", rec.Job, "by", by, "rank", rec.Rank, "pid", rec.PID, "attempt", rec.Attempt)
	x.raise(&api.Event{
		TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_JOB, Severity: api.Severity_SEVERITY_INFO,
		Pid: uint32(rec.PID), Job: rec.Job, Rank: rec.Rank, Attrs: attrs,
		Message: fmt.Sprintf("rank %d started (pid %d, attempt %d, %s)", rec.Rank, rec.PID, rec.Attempt, by),
	})
}

// TaskScanEvery is how often nodemon --slurm-node or --kube-node looks for
// new tasks in /proc (at most its poll).
const TaskScanEvery = 250 * time.Millisecond
