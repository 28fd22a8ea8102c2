package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gpuctl/gpuctl/api"
)

// KubeTaskCommand is the nodemon subcommand each pod of a job gpuctl runs
// on Kubernetes starts as (`nodemon kube-task -- CMD…`): one pod per node,
// it takes its node's launch from its environment by the pod's completion
// index and runs each of the node's ranks with exactly api.RankEnv. The
// signals the pod gets (SIGTERM at a stop, SIGUSR1 for a checkpoint) reach
// every rank; the first rank to fail stops the others, and the pod exits
// with its status, so Kubernetes sees the node's ranks fail as one.
const KubeTaskCommand = "kube-task"

// RunKubeTask runs the task with the arguments after KubeTaskCommand and
// returns its exit status.
func RunKubeTask(args []string, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nodemon kube-task: "+format+"\n", a...)
		return 2
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return fail("usage: %s -- COMMAND [ARG…]", KubeTaskCommand)
	}
	envs, err := kubeTaskEnvs(os.Environ())
	if err != nil {
		return fail("%v", err)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return fail("the job's command: %v", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2)
	ranks := make([]*exec.Cmd, 0, len(envs))
	for _, env := range envs {
		cmd := exec.Command(path, args[1:]...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			signalAll(ranks, syscall.SIGKILL)
			return fail("start a rank: %v", err)
		}
		ranks = append(ranks, cmd)
	}
	exits := make(chan error, len(ranks))
	for _, cmd := range ranks {
		go func() { exits <- cmd.Wait() }()
	}
	code := 0
	for left := len(ranks); left > 0; {
		select {
		case sig := <-sigs:
			signalAll(ranks, sig)
		case err := <-exits:
			left--
			if c := exitCode(err); c != 0 && code == 0 {
				code = c
				fmt.Fprintf(stderr, "nodemon kube-task: a rank failed (%v): stopping the node's other ranks\n", err)
				signalAll(ranks, syscall.SIGTERM)
			}
		}
	}
	return code
}

func signalAll(ranks []*exec.Cmd, sig os.Signal) {
	for _, r := range ranks {
		if r.ProcessState == nil {
			r.Process.Signal(sig)
		}
	}
}

// exitCode is a rank's exit status as a shell reports it (128+signal).
func exitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return 1
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// kubeTaskEnvs is each rank's environment, for the node the pod's
// completion index names: the pod's, then api.RankEnv (later names
// replace earlier ones).
func kubeTaskEnvs(environ []string) ([][]string, error) {
	get := func(k string) string {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	enc := get(api.KubeLaunchEnv)
	if enc == "" {
		return nil, fmt.Errorf("%s is empty: the pod was not created by gpuctl serve --executor kubernetes", api.KubeLaunchEnv)
	}
	parts, err := api.DecodeSlurmLaunch(enc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api.KubeLaunchEnv, err)
	}
	part, err := api.NodeAt(parts, get(api.KubeIndexEnv))
	if err != nil {
		return nil, err
	}
	if len(part.Launch.GetRanks()) == 0 {
		return nil, fmt.Errorf("node %s's launch has no ranks", part.Node)
	}
	out := make([][]string, 0, len(part.Launch.GetRanks()))
	for _, r := range part.Launch.GetRanks() {
		out = append(out, mergeEnv(environ, api.RankEnv(part.Node, get(api.KubeClusterEnv), part.Launch, r)))
	}
	return out, nil
}
