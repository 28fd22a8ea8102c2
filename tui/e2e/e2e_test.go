// Package e2e drives the real gpuctl binary's console in tmux against a
// real demo cluster, locally and over SSH, as an operator would.
package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// need finds a tool, failing in CI (where .ci/run installs it) and
// skipping with the reason elsewhere.
func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed: .ci/run installs it", tool)
		}
		t.Skipf("%s is not installed (apt-get install tmux openssh-client)", tool)
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func keygen(t *testing.T, path string) string {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(pub))
	return f[0] + " " + f[1]
}

// tmux is one tmux server of the test, on its own socket.
type tmux struct {
	t      *testing.T
	socket string
}

func (m *tmux) run(args ...string) string {
	m.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", m.socket}, args...)...).CombinedOutput()
	if err != nil {
		m.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (m *tmux) start(name, command string) {
	m.run("new-session", "-d", "-s", name, "-x", "160", "-y", "48", command)
}

func (m *tmux) keys(name string, keys ...string) {
	m.run(append([]string{"send-keys", "-t", name}, keys...)...)
}

func (m *tmux) screen(name string) string { return m.run("capture-pane", "-p", "-t", name) }

// waitFor polls the pane until ok says yes or the limit passes.
func (m *tmux) waitFor(name, what string, limit time.Duration, ok func(string) bool) string {
	m.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		s := m.screen(name)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s: %s not seen within %s; the screen:\n%s", name, what, limit, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (m *tmux) waitText(name, text string, limit time.Duration) string {
	m.t.Helper()
	return m.waitFor(name, strconv.Quote(text), limit, func(s string) bool { return strings.Contains(s, text) })
}

// pastGrace waits out a dialog's grace against keys in flight.
func pastGrace() { time.Sleep(400 * time.Millisecond) }

var ckptCol = regexp.MustCompile(`demo-ringtrain\s+running\s+\S+\s+\d+\s+(\d+)\s+\S*\s+\S+\s+(\d+)`)

// checkpointShown reads the demo job's step and last checkpoint step
// from the jobs table.
func checkpointShown(s string) (step, ckpt int, ok bool) {
	m := ckptCol.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, false
	}
	step, _ = strconv.Atoi(m[1])
	ckpt, _ = strconv.Atoi(m[2])
	return step, ckpt, true
}

// operate goes through the operator's round: overview, a node, the
// jobs, a checkpoint that lands, a cordon whose badge changes.
func operate(t *testing.T, parent *tmux, pane, cordonNode string) {
	m := &tmux{t: t, socket: parent.socket}
	m.waitText(pane, "GPUs 24:", 30*time.Second)
	m.waitText(pane, "nodes 3:", 5*time.Second)
	m.keys(pane, "Enter")
	m.waitText(pane, "node-00 [ready]", 10*time.Second)
	m.waitText(pane, "recent events", 5*time.Second)
	m.keys(pane, ":jobs", "Enter")
	s := m.waitFor(pane, "the demo job's row", 10*time.Second, func(s string) bool { _, _, ok := checkpointShown(s); return ok })
	step0, ckpt0, _ := checkpointShown(s)
	m.keys(pane, "C")
	m.waitText(pane, "checkpoint demo-ringtrain?", 5*time.Second)
	pastGrace()
	m.keys(pane, "Tab", "Enter")
	m.waitText(pane, "checkpoint requested for", 10*time.Second)
	m.waitFor(pane, fmt.Sprintf("a checkpoint after step %d", step0), 30*time.Second, func(s string) bool {
		_, c, ok := checkpointShown(s)
		return ok && c > ckpt0 && c >= step0
	})
	m.keys(pane, ":nodes", "Enter")
	m.waitText(pane, cordonNode, 10*time.Second)
	for range nodeIndex(cordonNode) {
		m.keys(pane, "Down")
	}
	m.keys(pane, "c")
	m.waitText(pane, "cordon 1 node(s)?", 5*time.Second)
	pastGrace()
	m.keys(pane, "-l", "e2e check")
	m.keys(pane, "Tab", "Enter")
	m.waitFor(pane, cordonNode+" cordoned", 15*time.Second, func(s string) bool {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), cordonNode) && strings.Contains(l, "cordoned") {
				return true
			}
		}
		return false
	})
}

func nodeIndex(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "node-"))
	return n
}

func TestConsoleEndToEnd(t *testing.T) {
	need(t, "tmux")
	need(t, "ssh")
	need(t, "ssh-keygen")
	bin := testbin.Dir(t)
	dir := t.TempDir()
	opKey, viewKey := filepath.Join(dir, "op"), filepath.Join(dir, "view")
	keys := "role=operator " + keygen(t, opKey) + " alice\nrole=viewer " + keygen(t, viewKey) + " bob\n"
	if err := os.WriteFile(filepath.Join(dir, "console_keys"), []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	_, cfg := startDemo(t, filepath.Join(dir, "demo"), "--nodes", "3",
		"--ssh-listen", fmt.Sprintf("127.0.0.1:%d", port), "--ssh-authorized-keys", filepath.Join(dir, "console_keys"))

	m := &tmux{t: t, socket: filepath.Join(dir, "tmux.sock")}
	t.Cleanup(func() { exec.Command("tmux", "-S", m.socket, "kill-server").Run() })
	m.start("local", fmt.Sprintf("env GPUCTL_CONFIG=%s TERM=xterm-256color %s --log-file %s", cfg, filepath.Join(bin, "gpuctl"),
		filepath.Join(dir, "console.log")))
	t.Run("local", func(t *testing.T) { operate(t, m, "local", "node-01") })

	// A 256-colour terminal is drawn a line at a time by the SSH server, a
	// 16-colour one by bubbletea's renderer: the operator works on the
	// first, the viewer looks on the second.
	sshCmd := func(term, key string) string {
		return fmt.Sprintf("env TERM=%s ssh -tt -i %s -p %d -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR ops@127.0.0.1",
			term, key, port)
	}
	m.start("operator", sshCmd("xterm-256color", opKey))
	t.Run("ssh operator", func(t *testing.T) {
		m.waitText("operator", "alice@ssh (operator)", 30*time.Second)
		operate(t, m, "operator", "node-02")
	})
	m.start("viewer", sshCmd("xterm", viewKey))
	t.Run("ssh viewer", func(t *testing.T) {
		m.waitText("viewer", "bob@ssh (viewer)", 30*time.Second)
		m.keys("viewer", ":jobs", "Enter")
		s := m.waitText("viewer", "demo-ringtrain", 10*time.Second)
		if strings.Contains(s, "checkpoint") || strings.Contains(s, "cancel job") {
			t.Errorf("the viewer is offered actions:\n%s", s)
		}
		m.keys("viewer", "C", "?")
		s = m.waitText("viewer", "keys of jobs", 5*time.Second)
		for _, a := range []string{"checkpoint", "restart", "cancel job", "submit", "assign"} {
			if strings.Contains(s, a) {
				t.Errorf("the viewer's help lists %q:\n%s", a, s)
			}
		}
	})
}

// TestSlowGPUInConsole: `gpuctl fault NODE slow --gpu N --factor 0.7` on
// the GPU of the demo job's rank 3 shows as a banner naming the rank; the
// Stalls view lists it, and @ opens that GPU with its clock and the
// hw_slowdown throttle reason, and the job's ranks table marks rank 3
// slow with its lateness. The finding needs the ranks' NCCL calls
// traced (eBPF, root).
func TestSlowGPUInConsole(t *testing.T) {
	need(t, "tmux")
	bin := testbin.Dir(t)
	dir := t.TempDir()
	_, cfg := startDemo(t, filepath.Join(dir, "demo"), "--nodes", "2")
	gpuctl := func(args ...string) string {
		cmd := exec.Command(filepath.Join(bin, "gpuctl"), args...)
		cmd.Env = append(os.Environ(), "GPUCTL_CONFIG="+cfg)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gpuctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// Rank 3 of the demo job runs on node-01's GPU 1 (2 ranks per node).
	traced := time.Now().Add(30 * time.Second)
	for !strings.Contains(gpuctl("collectives", "--job", "demo-ringtrain"), "allreduce") {
		if time.Now().After(traced) {
			needs.EBPF.Skip(t, "no NCCL calls traced in 30 s: the fail-slow analysis has nothing to read")
		}
		time.Sleep(500 * time.Millisecond)
	}
	m := &tmux{t: t, socket: filepath.Join(dir, "tmux.sock")}
	t.Cleanup(func() { exec.Command("tmux", "-S", m.socket, "kill-server").Run() })
	m.start("console", fmt.Sprintf("env GPUCTL_CONFIG=%s TERM=xterm-256color %s --log-file %s", cfg, filepath.Join(bin, "gpuctl"),
		filepath.Join(dir, "console.log")))
	m.waitText("console", "GPUs 16:", 30*time.Second)
	m.waitText("console", "every node is ready", 10*time.Second)
	if s := m.screen("console"); strings.Contains(s, "SLOW") {
		t.Fatalf("a slow finding before any fault:\n%s", s)
	}
	gpuctl("fault", "node-01", "slow", "--gpu", "1", "--factor", "0.7")
	m.waitText("console", "SLOW RANK r3@node-01 of", 45*time.Second)
	m.keys("console", ":stalls", "Enter")
	m.waitFor("console", "the slow rank's row", 10*time.Second, func(s string) bool {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "slow rank") && strings.Contains(l, "r3@node-01") && strings.Contains(l, "late") {
				return true
			}
		}
		return false
	})
	m.keys("console", "@")
	m.waitText("console", "node-01 GPU 1 ·", 10*time.Second)
	m.waitText("console", "throttle hw_slowdown", 10*time.Second)
	// The ranks table's lateness column, from the server's per-rank figure.
	m.keys("console", ":job demo-ringtrain", "Enter")
	late := regexp.MustCompile(`(?m)^\s+3\s.*node-01.*\sslow \d+ms\s`)
	m.waitFor("console", "rank 3 marked slow with its lateness", 10*time.Second, late.MatchString)
}
