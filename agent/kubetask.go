package agent

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// KubeTaskCommand is the nodemon subcommand each pod of a job gpuctl runs
// on Kubernetes starts as (`nodemon kube-task -- CMD…`): one pod per node,
// it takes its node's launch from its environment by the pod's completion
// index and runs each of the node's ranks under the rank shim with exactly
// api.RankEnv, their logs and exit status in the run dir (a host path, so
// that nodemon --kube-node on the host finds the ranks in /proc and reads
// both, as it does Slurm's). A stop (SIGTERM) reaches every rank; the
// first rank to fail stops the others, and the pod exits with its status,
// so Kubernetes sees the node's ranks fail as one. A checkpoint (SIGUSR1)
// comes from nodemon on the host, straight to the ranks.
const KubeTaskCommand = "kube-task"

// RunKubeTask runs the task with the arguments after KubeTaskCommand and
// returns its exit status.
func RunKubeTask(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(KubeTaskCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	runDir := fs.String("run-dir", api.DefaultKubeRunDir, "where rank logs and exit status files go (<dir>/<job>-a<attempt>/), a host path nodemon reads too")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nodemon kube-task: "+format+"\n", a...)
		return 2
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return fail("usage: %s [--run-dir DIR] -- COMMAND [ARG…]", KubeTaskCommand)
	}
	ranks, err := kubeTaskRanks(os.Environ(), *runDir)
	if err != nil {
		return fail("%v", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail("find nodemon's own binary: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(ranks[0].status), 0o755); err != nil {
		return fail("%v", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// The checkpoint signal is nodemon's to send to the ranks; the task
	// must only outlive a copy sent to the pod.
	signal.Ignore(syscall.SIGUSR1)
	shims := make([]*exec.Cmd, 0, len(ranks))
	for _, r := range ranks {
		cmd := exec.Command(self, append([]string{ShimCommand, "--exit-code", "--log", r.log, "--status", r.status, "--"}, argv...)...)
		cmd.Env, cmd.Stdout, cmd.Stderr = r.env, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			signalAll(shims, syscall.SIGTERM)
			return fail("start a rank's shim: %v", err)
		}
		shims = append(shims, cmd)
	}
	exits := make(chan error, len(shims))
	for _, cmd := range shims {
		go func() { exits <- cmd.Wait() }()
	}
	// The ranks' output goes to their logs on the host; the pod's own
	// output (kubectl logs) follows them, each line with its rank.
	echoed := echoRankLogs(ranks, os.Stdout)
	defer echoed()
	code := 0
	for left := len(shims); left > 0; {
		select {
		case sig := <-sigs:
			signalAll(shims, sig)
		case err := <-exits:
			left--
			if c := exitCode(err); c != 0 && code == 0 {
				code = c
				fmt.Fprintf(stderr, "nodemon kube-task: a rank failed (%v): stopping the node's other ranks\n", err)
				signalAll(shims, syscall.SIGTERM)
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

// kubeRank is one rank a pod runs: its environment and where its shim
// writes.
type kubeRank struct {
	env         []string
	log, status string
}

// kubeTaskRanks are the ranks of the node the pod's completion index
// names, each with the pod's environment, then api.RankEnv, then where its
// log and status go (later names replace earlier ones).
func kubeTaskRanks(environ []string, runDir string) ([]kubeRank, error) {
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
	parts, err := api.DecodeLaunch(api.KubeLaunchEnv, enc)
	if err != nil {
		return nil, err
	}
	part, err := api.NodeAt(parts, get(api.KubeIndexEnv))
	if err != nil {
		return nil, err
	}
	l := part.Launch
	if len(l.GetRanks()) == 0 {
		return nil, fmt.Errorf("node %s's launch has no ranks", part.Node)
	}
	dir := filepath.Join(runDir, api.KubeRunName(l.GetJob(), l.GetAttempt()))
	out := make([]kubeRank, 0, len(l.GetRanks()))
	for _, r := range l.GetRanks() {
		kr := kubeRank{log: filepath.Join(dir, fmt.Sprintf("rank-%d.log", r.GetRank())), status: filepath.Join(dir, fmt.Sprintf("rank-%d.status", r.GetRank()))}
		add := append(api.RankEnv(part.Node, get(api.KubeClusterEnv), l, r), api.RankLogEnv+"="+kr.log, api.RankStatusEnv+"="+kr.status)
		kr.env = mergeEnv(environ, add)
		out = append(out, kr)
	}
	return out, nil
}

// echoRankLogs follows the ranks' logs into w, each line prefixed with
// its rank, until the returned stop is called (which reads them to their
// ends first).
func echoRankLogs(ranks []kubeRank, w io.Writer) (stop func()) {
	tails := make([]*logTail, len(ranks))
	sinks := make([]*prefixLines, len(ranks))
	for i, r := range ranks {
		tails[i] = &logTail{path: r.log}
		sinks[i] = &prefixLines{w: w, prefix: []byte(fmt.Sprintf("[rank %s] ", rankOf(r.env)))}
	}
	pollAll := func() {
		for i, t := range tails {
			t.poll(sinks[i], time.Now())
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				pollAll()
			case <-done:
				pollAll()
				for i, t := range tails {
					sinks[i].flush()
					t.close()
				}
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

func rankOf(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "RANK="); ok {
			return v
		}
	}
	return "?"
}

// prefixLines writes whole lines, each with prefix, to w (the ranks'
// sinks are all fed from echoRankLogs' one goroutine).
type prefixLines struct {
	w       io.Writer
	prefix  []byte
	partial []byte
}

func (p *prefixLines) feed(b []byte, _ time.Time) {
	p.partial = append(p.partial, b...)
	var out []byte
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		out = append(append(out, p.prefix...), p.partial[:i+1]...)
		p.partial = p.partial[i+1:]
	}
	if len(p.partial) > maxLogLine {
		out = append(append(append(out, p.prefix...), p.partial...), '\n')
		p.partial = p.partial[:0]
	}
	p.write(out)
}

func (p *prefixLines) flush() {
	if len(p.partial) > 0 {
		p.write(append(append(append([]byte{}, p.prefix...), p.partial...), '\n'))
		p.partial = nil
	}
}

func (p *prefixLines) write(b []byte) {
	if len(b) > 0 {
		p.w.Write(b)
	}
}
