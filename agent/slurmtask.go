package agent

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gpuctl/gpuctl/api"
)

// SlurmTaskCommand is the nodemon subcommand Slurm runs as each task of a
// job gpuctl submitted (`srun nodemon slurm-task -- CMD…`): it picks its
// rank from the launch in its environment (api.SlurmTask), sets exactly
// api.RankEnv, and becomes the rank shim, which runs the rank, copies its
// output into the rank log and writes its exit status. nodemon finds the
// rank in /proc (its environment names the log and the status file) and
// reports it as one of its own.
const SlurmTaskCommand = "slurm-task"

// DefaultSlurmRunDir holds the Slurm ranks' logs and status files:
// <dir>/<slurm job>/rank-R.log and .status.
const DefaultSlurmRunDir = "/tmp/gpuctl-slurm"

// RunSlurmTask runs the task with the arguments after SlurmTaskCommand;
// it returns only when it could not become the shim.
func RunSlurmTask(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(SlurmTaskCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	runDir := fs.String("run-dir", DefaultSlurmRunDir, "where rank logs and exit status files go (<dir>/<slurm job>/)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nodemon slurm-task: "+format+"\n", a...)
		return 2
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return fail("usage: %s [--run-dir DIR] -- COMMAND [ARG…]", SlurmTaskCommand)
	}
	env, logPath, statusPath, err := slurmTaskEnv(os.Environ(), *runDir)
	if err != nil {
		return fail("%v", err)
	}
	if err := os.MkdirAll(filepath.Dir(statusPath), 0o755); err != nil {
		return fail("%v", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail("find nodemon's own binary: %v", err)
	}
	shim := append([]string{self, ShimCommand, "--exit-code", "--log", logPath, "--status", statusPath, "--"}, argv...)
	// The task's pid stays the one srun waits on.
	err = syscall.Exec(self, shim, env)
	return fail("exec the rank shim %s: %v", self, err)
}

// slurmTaskEnv is a task's environment: Slurm's, then api.RankEnv for the
// rank SLURMD_NODENAME/SLURM_NODEID and SLURM_LOCALID name, then where its
// log and status go. Later names replace earlier ones (exec keeps
// duplicates, and getenv would read the first).
func slurmTaskEnv(environ []string, runDir string) (env []string, logPath, statusPath string, err error) {
	get := func(k string) string {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	parts, err := api.DecodeLaunch(api.SlurmLaunchEnv, get(api.SlurmLaunchEnv))
	if err != nil {
		return nil, "", "", err
	}
	node, job := get("SLURMD_NODENAME"), get("SLURM_JOB_ID")
	if node == "" || job == "" {
		return nil, "", "", fmt.Errorf("SLURMD_NODENAME and SLURM_JOB_ID are unset: run under srun in a Slurm job")
	}
	l, r, err := api.SlurmTask(parts, node, get("SLURM_NODEID"), get("SLURM_LOCALID"), get(api.SlurmMasterEnv))
	if err != nil {
		return nil, "", "", err
	}
	dir := filepath.Join(runDir, job)
	logPath = filepath.Join(dir, fmt.Sprintf("rank-%d.log", r.GetRank()))
	statusPath = filepath.Join(dir, fmt.Sprintf("rank-%d.status", r.GetRank()))
	add := append(api.RankEnv(node, get(api.SlurmClusterEnv), l, r), api.RankLogEnv+"="+logPath, api.RankStatusEnv+"="+statusPath)
	return mergeEnv(environ, add), logPath, statusPath, nil
}

// mergeEnv is base with add applied: a name in add replaces base's.
func mergeEnv(base, add []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range append(append([]string{}, base...), add...) {
		k, _, _ := strings.Cut(kv, "=")
		if k == api.SlurmLaunchEnv || k == api.KubeLaunchEnv {
			continue // read; the rank needs it no more than its children
		}
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}
