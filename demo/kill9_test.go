package demo

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// startProc starts a process in its own process group and kills the group
// when the test ends.
func startProc(t *testing.T, logPath, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return startProcess(t, logPath, bin, args...).Cmd
}

// proc is a process startProcess started; done closes once it is reaped.
type proc struct {
	*exec.Cmd
	done chan struct{}
}

// startProcess is startProc that also says when the process has ended.
func startProcess(t *testing.T, logPath, bin string, args ...string) *proc {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		// A process a test paused hears the SIGTERM only once resumed.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return &proc{Cmd: cmd, done: done}
}

// TestServerKill9LosesNothing kills a real `gpuctl serve` process with
// SIGKILL while a job runs and another waits, and starts it again on the
// same data dir: both jobs are still there, the running one with the same
// attempt and pids, and no rank was started a second time.
func TestServerKill9LosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real server, nodemon and ringtrain processes")
	}
	nodemon, ringtrain := binaries(t)
	gpuctl := testbin.Gpuctl(t)
	dir := t.TempDir()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := udp.LocalAddr().String()
	udp.Close()
	serveArgs := []string{"serve", "--data-dir", filepath.Join(dir, "server"), "--listen", addr}
	server := startProc(t, filepath.Join(dir, "serve-1.log"), gpuctl, serveArgs...)
	cfg := filepath.Join(dir, "server", "admin.yaml")
	var cl *client.Client
	poll(t, 20*time.Second, "server up", func() error {
		c, err := client.Dial(context.Background(), cfg)
		if err != nil {
			return err
		}
		cl = c
		return nil
	})
	ctx := context.Background()
	token, _, err := cl.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour, Uses: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		name := NodeName(i)
		startProc(t, filepath.Join(dir, name+".log"), nodemon, "--server", addr, "--token", token, "--name", name,
			"--data-dir", filepath.Join(dir, "nodes", name), "--sim", "dgx-h100", "--ebpf", "off", "--trace-scope", "node",
			"--allow-root-ranks")
	}
	poll(t, 30*time.Second, "2 nodes ready", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes {
			if n.GetState() == api.NodeState_NODE_STATE_READY {
				ready++
			}
		}
		if ready != 2 {
			return fmt.Errorf("%d ready", ready)
		}
		return nil
	})
	spec := fmt.Sprintf("name: survivor\nnodes: 2\ngpus_per_node: 1\ncommand: [%q, --steps, \"0\", --compute-ms, \"30\", --bytes, 64K]\n", ringtrain)
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "kill -9 test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	// A job that can never fit is refused at submit unless held: held, it
	// stays pending across the restart.
	waiting, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{Source: "kill -9 test", Hold: true,
		SpecYaml: "name: waiter\ngpus: 64\ncommand: [/bin/true]\n"})
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()

	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(500 * time.Millisecond)
	startProc(t, filepath.Join(dir, "serve-2.log"), gpuctl, serveArgs...)
	poll(t, 20*time.Second, "server back", func() error {
		c, err := client.Dial(ctx, cfg)
		if err != nil {
			return err
		}
		if _, err := c.Nodes(ctx); err != nil {
			c.Close()
			return err
		}
		cl = c
		return nil
	})
	defer cl.Close()
	// For 9 s after the kill, nothing restarted.
	for time.Since(killed) < 9*time.Second {
		js, err := cl.Jobs(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]*api.Job{}
		for _, j := range js {
			byID[j.GetId()] = j
		}
		if w := byID[waiting.GetJob().GetId()]; w == nil || w.GetState() != api.JobState_JOB_STATE_PENDING {
			t.Fatalf("acknowledged pending job after kill -9: %v", w)
		}
		j := byID[running.GetId()]
		if err := runningWith(j, 1, 2); err != nil {
			t.Fatalf("running job after kill -9: %v", err)
		}
		if !equalPIDs(rankPIDs(j), rankPIDs(running)) {
			t.Fatalf("pids changed: %v → %v", rankPIDs(running), rankPIDs(j))
		}
		time.Sleep(250 * time.Millisecond)
	}
	for rank, at := range rankPIDs(running) {
		if !alive(at.pid) {
			t.Errorf("rank %d (pid %d) died across the server's kill -9", rank, at.pid)
		}
		logPath := filepath.Join(dir, "nodes", at.node, "logs", running.GetId(), fmt.Sprintf("rank-%d.log", rank))
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "resume step="); n != 1 {
			t.Errorf("rank %d started %d times", rank, n)
		}
	}
	t.Logf("server killed with SIGKILL and restarted: both jobs kept, running job attempt 1 with pids %v for %.0fs after",
		rankPIDs(running), time.Since(killed).Seconds())
}
