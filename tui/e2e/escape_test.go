package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/testbin"
)

// startDemo starts `gpuctl demo --headless` in a process group of its own
// and returns it with its client config once it is ready; the test's end
// stops it.
func startDemo(t *testing.T, dataDir string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	testbin.Ringtrain(t) // gpuctl demo runs it
	demo := exec.Command(testbin.Gpuctl(t), append([]string{"demo", "--headless", "--data-dir", dataDir}, args...)...)
	demo.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	demo.Stderr = os.Stderr
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { demo.Wait(); close(done) }()
	t.Cleanup(func() {
		demo.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-demo.Process.Pid, syscall.SIGKILL)
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if cfg, ok := strings.CutPrefix(sc.Text(), "gpuctl demo ready config="); ok {
				ready <- cfg
			}
		}
	}()
	select {
	case cfg := <-ready:
		return demo, cfg
	case <-done:
		t.Fatal("gpuctl demo --headless exited before it was ready")
	case <-time.After(120 * time.Second):
		t.Fatal("gpuctl demo --headless did not get ready in 120 s")
	}
	return nil, ""
}

// processesOf returns the pids of the processes whose command line or
// environment names dir: what a demo on dir started (nodemons, rank
// shims, ranks).
func processesOf(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(st, ')'); i < 0 || bytes.HasPrefix(st[i+1:], []byte(" Z")) {
			continue // gone, or a zombie: it runs nothing
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if bytes.Contains(cmdline, []byte(dir)) || bytes.Contains(environ, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestLogsEscapedAndDemoStopsWhatItStarted runs the real gpuctl against a
// real demo: a job that prints escape sequences, and whose command holds
// one, cannot set a terminal's title or clear it through `gpuctl logs`
// (tmux is the terminal); into a pipe the bytes go as written. The demo's
// nodemons hold no join token in their argv, and a SIGKILL of the demo's
// process group leaves none of its processes behind.
func TestLogsEscapedAndDemoStopsWhatItStarted(t *testing.T) {
	need(t, "tmux")
	gpuctl := testbin.Gpuctl(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "demo")
	demo, cfg := startDemo(t, dataDir, "--nodes", "2", "--metrics-base-port", "0")
	cli := func(args ...string) ([]byte, error) {
		return exec.Command(gpuctl, append([]string{"--config", cfg}, args...)...).Output()
	}
	out, err := cli("submit", "-o", "json", "--name", "noisy", "--nodes", "1", "--gpus-per-node", "1", "--",
		"/bin/sh", "-c", `printf 'hello\033]0;pwned\007\033[2J\033[Hcleared\342\200\256\n'; exec sleep 300`, "\x1b]0;argv\x07")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, err.(*exec.ExitError).Stderr)
	}
	var sub struct {
		Jobs []struct{ ID string } `json:"jobs"`
	}
	if err := json.Unmarshal(out, &sub); err != nil || len(sub.Jobs) != 1 {
		t.Fatalf("submit -o json: %v\n%s", err, out)
	}
	job := sub.Jobs[0].ID
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ = cli("logs", job)
		if bytes.Contains(out, []byte("cleared\u202e\n")) { // the job's line, not the command in gpuctl's
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's line is not in its log after 60 s:\n%q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("pipe gets the bytes, --raw=false escapes", func(t *testing.T) {
		if !bytes.Contains(out, []byte("hello\x1b]0;pwned\x07\x1b[2J\x1b[Hcleared\u202e\n")) {
			t.Errorf("gpuctl logs into a pipe changed the rank's bytes:\n%q", out)
		}
		esc, err := cli("logs", "--raw=false", job)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.ContainsAny(esc, "\x1b\x07") || !bytes.Contains(esc, []byte(`hello\x1b]0;pwned\x07\x1b[2J\x1b[Hcleared\u202e`+"\n")) {
			t.Errorf("gpuctl logs --raw=false:\n%q", esc)
		}
	})

	t.Run("terminal escaped, header escaped always", func(t *testing.T) {
		m := &tmux{t: t, socket: filepath.Join(dir, "tmux.sock")}
		t.Cleanup(func() { exec.Command("tmux", "-S", m.socket, "kill-server").Run() })
		title := func(pane string) string {
			return strings.TrimSpace(m.run("display-message", "-p", "-t", pane, "#{pane_title}"))
		}
		show := func(pane string, args ...string) string {
			m.start(pane, fmt.Sprintf("sh -c 'echo before-logs; %s --config %s logs %s %s; echo after-logs; exec sleep 300'",
				gpuctl, cfg, strings.Join(args, " "), job))
			m.waitText(pane, "after-logs", 30*time.Second)
			return m.run("capture-pane", "-p", "-J", "-t", pane) // long lines joined
		}
		s := show("escaped")
		for _, want := range []string{"before-logs", `hello\x1b]0;pwned\x07\x1b[2J\x1b[Hcleared\u202e`,
			`exec sleep 300 \x1b]0;argv\x07`} {
			if !strings.Contains(s, want) {
				t.Errorf("the terminal does not show %q:\n%s", want, s)
			}
		}
		if tt := title("escaped"); tt == "pwned" || tt == "argv" {
			t.Errorf("gpuctl logs set the pane's title to %q", tt)
		}
		// --raw passes the bytes on: the title changes and the screen is
		// cleared, all but gpuctl's own (escaped) line.
		s = show("raw", "--raw")
		if tt := title("raw"); tt != "pwned" {
			t.Errorf("with --raw the pane's title is %q, want the job's %q", tt, "pwned")
		}
		if strings.Contains(s, "before-logs") || !strings.Contains(s, "cleared") {
			t.Errorf("with --raw the job's escapes did not reach the terminal:\n%s", s)
		}
	})

	t.Run("no token in nodemon argv", func(t *testing.T) {
		nodemons := 0
		for _, pid := range processesOf(dataDir) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
			if filepath.Base(args[0]) != "nodemon" || len(args) < 2 || args[1] == "rank-shim" {
				continue
			}
			nodemons++
			for i, a := range args {
				if strings.HasPrefix(a, "gpj") || (a == "--token" && (i+1 == len(args) || args[i+1] != "-")) || strings.HasPrefix(a, "--token=") {
					t.Errorf("nodemon pid %d has the join token in its argv: %q", pid, args)
				}
			}
		}
		if nodemons != 2 {
			t.Errorf("found %d nodemon processes of the demo, want 2", nodemons)
		}
	})

	t.Run("SIGKILL of the demo's group", func(t *testing.T) {
		if len(processesOf(dataDir)) == 0 {
			t.Fatal("no process of the demo found")
		}
		if err := syscall.Kill(-demo.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			left := processesOf(dataDir)
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				var names []string
				for _, pid := range left {
					cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					names = append(names, fmt.Sprintf("%d %q", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
				}
				for _, pid := range left {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				t.Fatalf("30 s after the demo's group was killed, its processes still run:\n%s", strings.Join(names, "\n"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}
