package slurm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// Placement modes.
const (
	// PlaceGpuctl: gpuctl's scheduler places, Slurm gets --nodelist.
	PlaceGpuctl = "gpuctl"
	// PlaceSlurm: Slurm picks the nodes of each attempt.
	PlaceSlurm = "slurm"
)

// Config configures the Slurm executor.
type Config struct {
	CLI CLI
	// Partition, when set, is sbatch's --partition.
	Partition string
	// Placement is PlaceGpuctl (default) or PlaceSlurm.
	Placement string
	// Task is how srun starts each task, default "nodemon slurm-task";
	// the job's command follows after --.
	Task []string
	// RunDir is where tasks keep rank logs and status files, and sbatch
	// writes the job's output (slurm-<id>.out); default
	// agent.DefaultSlurmRunDir's /tmp/gpuctl-slurm.
	RunDir string
	// Cluster is the cluster id the ranks' environment names.
	Cluster func() string
	// Poll is how often squeue and sinfo are read, default 1 s.
	Poll time.Duration
	Log  *slog.Logger
}

// Executor runs gpuctl's attempts as Slurm jobs: one sbatch per attempt,
// marked --comment=gpuctl:<job>:<attempt>, whose one srun step runs a task
// per rank; signals are scancel.
type Executor struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// ids maps job → attempt → Slurm job id, from sbatch's answers and
	// squeue's comments (after a server restart).
	ids map[string]map[uint32]string
}

// New returns the executor.
func New(cfg Config) *Executor {
	if cfg.Placement == "" {
		cfg.Placement = PlaceGpuctl
	}
	if len(cfg.Task) == 0 {
		cfg.Task = []string{"nodemon", "slurm-task"}
	}
	if cfg.RunDir == "" {
		cfg.RunDir = "/tmp/gpuctl-slurm"
	}
	if cfg.Cluster == nil {
		cfg.Cluster = func() string { return "" }
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	// Where Slurm writes the job output: made here for the usual case of a
	// file system the Slurm nodes share with this host; elsewhere it must
	// exist on the nodes (sbatch fails the job, and the poller says so).
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		cfg.Log.Warn("make the Slurm run dir", "dir", cfg.RunDir, "err", err)
	} else if err := os.Chmod(cfg.RunDir, 0o777|os.ModeSticky); err != nil {
		// Jobs run as their users: writable by all, sticky as /tmp.
		cfg.Log.Warn("make the Slurm run dir writable by the jobs' users", "dir", cfg.RunDir, "err", err)
	}
	return &Executor{cfg: cfg, log: cfg.Log, ids: map[string]map[uint32]string{}}
}

// Comment is the --comment gpuctl marks its Slurm jobs with.
func Comment(job string, attempt uint32) string {
	return fmt.Sprintf("gpuctl:%s:%d", job, attempt)
}

// ParseComment reads Comment's mark; ok is false for a job gpuctl did not
// submit.
func ParseComment(c string) (job string, attempt uint32, ok bool) {
	rest, ok := strings.CutPrefix(c, "gpuctl:")
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(rest[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return rest[:i], uint32(n), true
}

// Batch is what one attempt's sbatch gets: its arguments and script.
func (x *Executor) Batch(a jobs.AttemptLaunch) (args []string, script string, env []string, err error) {
	job, attempt, nodes, launches := a.Job, a.Attempt, a.Nodes, a.Ranks
	if len(nodes) == 0 {
		return nil, "", nil, fmt.Errorf("slurm: attempt %d of %s has no nodes", attempt, job)
	}
	perNode := len(launches[nodes[0]].GetRanks())
	parts := make([]api.NodeLaunch, 0, len(nodes))
	for _, n := range nodes {
		l := launches[n]
		if len(l.GetRanks()) != perNode {
			return nil, "", nil, fmt.Errorf("slurm: job %s has %d ranks on %s and %d on %s: Slurm starts the same number of tasks on every node (--ntasks-per-node); give the job whole nodes",
				job, len(l.GetRanks()), n, perNode, nodes[0])
		}
		node := n
		if x.cfg.Placement == PlaceSlurm {
			node = ""
		}
		parts = append(parts, api.NodeLaunch{Node: node, Launch: l})
	}
	enc, err := api.EncodeLaunch(parts)
	if err != nil {
		return nil, "", nil, err
	}
	args = []string{"--parsable", "--job-name=gpuctl-" + job, "--comment=" + Comment(job, attempt),
		// gpuctl recovers its jobs itself: Slurm must not rerun one behind it.
		"--no-requeue",
		"--nodes=" + strconv.Itoa(len(nodes)), "--ntasks-per-node=" + strconv.Itoa(perNode),
		"--gres=gpu:" + strconv.Itoa(perNode), "--output=" + x.cfg.RunDir + "/slurm-%j.out", "--export=ALL"}
	if x.cfg.Placement != PlaceSlurm {
		// gpuctl's placement, in rank order; the tasks take their ranks by
		// node name, so Slurm's sorted order does not matter.
		args = append(args, "--nodelist="+strings.Join(nodes, ","))
	}
	if u := launches[nodes[0]].GetRunAsUser(); u != "" {
		// The account gpuctl's run-as policy chose: Slurm starts the job as
		// it (sbatch --uid needs the server to run as root or SlurmUser).
		args = append(args, "--uid="+u)
		if g := launches[nodes[0]].GetRunAsGroup(); g != "" {
			args = append(args, "--gid="+g)
		}
	}
	if len(a.Exclude) > 0 {
		// The nodes the job failed on: Slurm must not pick them (with
		// gpuctl's placement they are not in --nodelist anyway).
		args = append(args, "--exclude="+strings.Join(a.Exclude, ","))
	}
	if x.cfg.Partition != "" {
		args = append(args, "--partition="+x.cfg.Partition)
	}
	words := append(append([]string{"srun", "--kill-on-bad-exit=1"}, x.cfg.Task...), "--run-dir", x.cfg.RunDir, "--")
	words = append(words, launches[nodes[0]].GetCommand()...)
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = shellQuote(w)
	}
	script = "#!/bin/sh\n# gpuctl job " + job + " attempt " + strconv.Itoa(int(attempt)) + "\n"
	if x.cfg.Placement == PlaceSlurm {
		// Rank 0 runs on the first node Slurm gave: its address is the
		// ranks' MASTER_ADDR.
		script += `first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)` + "\n" +
			`export ` + api.SlurmMasterEnv + `=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')` + "\n"
	}
	script += "exec " + strings.Join(quoted, " ") + "\n"
	// Through the environment (--export=ALL), not --export=…, whose
	// commas would split the launch.
	env = []string{api.SlurmLaunchEnv + "=" + enc, api.SlurmClusterEnv + "=" + x.cfg.Cluster()}
	return args, script, env, nil
}

// Launch submits the attempt with sbatch. A failed sbatch refuses the
// attempt on every node, saying why.
func (x *Executor) Launch(ctx context.Context, a jobs.AttemptLaunch) map[string]error {
	job, attempt, targets := a.Job, a.Attempt, a.Nodes
	fail := func(err error) map[string]error {
		x.log.Error("Slurm submit failed", "job", job, "attempt", attempt, "err", err)
		errs := map[string]error{}
		var ce *CLIError
		for _, n := range targets {
			switch {
			case errors.As(err, &ce) && ce.Unavailable:
				errs[n] = fmt.Errorf("submit attempt %d to Slurm: %w (%w)", attempt, err, jobs.ErrExecutorUnavailable)
			default:
				// Slurm refused the job itself (bad gres, no such
				// partition): retrying it would fail the same way.
				errs[n] = &nodes.CommandError{Node: n, Msg: fmt.Sprintf("Slurm refused attempt %d: %v", attempt, err), JobFault: true}
			}
		}
		return errs
	}
	args, script, env, err := x.Batch(a)
	if err != nil {
		return fail(err)
	}
	if errs := x.downNodes(ctx, a); errs != nil {
		return errs
	}
	out, err := x.cfg.CLI.Run(ctx, []byte(script), env, "sbatch", args...)
	if err != nil {
		return fail(err)
	}
	id, err := ParseSbatch(out)
	if err != nil {
		// sbatch said something else than an id: the job may be in
		// Slurm all the same, and must not be submitted twice. Its
		// comment finds it.
		if rerr := x.Refresh(ctx); rerr == nil && x.SlurmID(job, attempt) != "" {
			x.log.Warn("sbatch's answer was not an id; found the job by its comment", "job", job, "attempt", attempt, "answer", out)
			return nil
		}
		return fail(&CLIError{Msg: err.Error() + ": is this Slurm's sbatch?", Unavailable: true})
	}
	x.remember(job, attempt, id)
	x.log.Info("submitted to Slurm", "job", job, "attempt", attempt, "slurm_job", id, "nodes", targets)
	return nil
}

// downNodes refuses an attempt gpuctl placed on a node Slurm has down or
// drained (the poller may not have told gpuctl yet): Slurm would hold the
// job pending. The down nodes are blamed, the others not. A sinfo that
// fails refuses nothing: sbatch will say what is wrong.
func (x *Executor) downNodes(ctx context.Context, a jobs.AttemptLaunch) map[string]error {
	if x.cfg.Placement == PlaceSlurm {
		return nil // Slurm picks among the nodes it has up
	}
	out, err := x.cfg.CLI.Run(ctx, nil, nil, "sinfo", "-h", "-N", "-n", strings.Join(a.Nodes, ","), "-o", NodeFormat)
	if err != nil {
		return nil
	}
	states, err := ParseSinfo(out)
	if err != nil {
		return nil
	}
	down := map[string]NodeState{}
	for _, s := range states {
		if s.Unavailable() {
			down[s.Name] = s
		}
	}
	if len(down) == 0 {
		return nil
	}
	errs := map[string]error{}
	for _, n := range a.Nodes {
		if s, ok := down[n]; ok {
			errs[n] = fmt.Errorf("not submitted to Slurm: %s", slurmWhy(s))
		} else {
			errs[n] = jobs.ErrNotStarted
		}
	}
	x.log.Warn("attempt placed on nodes Slurm has out; not submitted", "job", a.Job, "attempt", a.Attempt, "down", slices.Sorted(maps.Keys(down)))
	return errs
}

// Signal maps gpuctl's signals onto scancel: SIGTERM cancels the Slurm job
// (Slurm sends SIGTERM, and SIGKILL after its KillWait), others are sent
// to the job's steps as they are (SIGUSR1: checkpoint).
func (x *Executor) Signal(ctx context.Context, job string, attempt uint32, nodes []string, sig string) map[string]error {
	ids := x.idsOf(job, attempt)
	if len(ids) == 0 {
		if err := x.Refresh(ctx); err == nil {
			ids = x.idsOf(job, attempt)
		}
	}
	if len(ids) == 0 {
		return nil // nothing of it is in Slurm: nothing to signal
	}
	args := []string{"--signal=" + strings.TrimPrefix(sig, "SIG")}
	if sig == "SIGTERM" {
		args = nil
	}
	_, err := x.cfg.CLI.Run(ctx, nil, nil, "scancel", append(args, ids...)...)
	if err == nil || strings.Contains(err.Error(), "already completing or completed") || strings.Contains(err.Error(), "Invalid job id") {
		return nil
	}
	errs := map[string]error{}
	for _, n := range nodes {
		errs[n] = fmt.Errorf("scancel %s of job %s: %w", sig, job, err)
	}
	return errs
}

// Refresh learns the Slurm ids of gpuctl's jobs from squeue.
func (x *Executor) Refresh(ctx context.Context) error {
	out, err := x.cfg.CLI.Run(ctx, nil, nil, "squeue", "-h", "--states=all", "-o", QueueFormat)
	if err != nil {
		return err
	}
	jobs, err := ParseSqueue(out)
	if err != nil {
		return fmt.Errorf("%w: is this squeue from Slurm 20.11 or later?", err)
	}
	x.learn(jobs)
	return nil
}

func (x *Executor) learn(jobs []QueueJob) {
	for _, q := range jobs {
		if job, attempt, ok := ParseComment(q.Comment); ok {
			x.remember(job, attempt, q.ID)
		}
	}
}

func (x *Executor) remember(job string, attempt uint32, id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ids[job] == nil {
		x.ids[job] = map[uint32]string{}
	}
	x.ids[job][attempt] = id
}

// SlurmID is the Slurm job id of an attempt, "" when unknown.
func (x *Executor) SlurmID(job string, attempt uint32) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ids[job][attempt]
}

func (x *Executor) idsOf(job string, attempt uint32) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ids []string
	for a, id := range x.ids[job] {
		if attempt == 0 || a == attempt {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
