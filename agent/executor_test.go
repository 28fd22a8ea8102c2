package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

type eventLog struct {
	mu     sync.Mutex
	events []*api.Event
}

func (l *eventLog) add(e *api.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// waitFor polls until an event satisfies ok or the deadline passes.
func (l *eventLog) waitFor(t *testing.T, what string, ok func(*api.Event) bool) *api.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, e := range l.events {
			if ok(e) {
				l.mu.Unlock()
				return e
			}
		}
		l.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %s event within 10s", what)
	return nil
}

func newTestExecutor(t *testing.T) (*Executor, *eventLog, string) {
	t.Helper()
	dir := t.TempDir()
	events := &eventLog{}
	x := NewExecutor(slog.New(slog.NewTextHandler(io.Discard, nil)), "node-a", dir, events.add)
	t.Cleanup(func() { x.StopAll(time.Second) })
	return x, events, dir
}

func TestExecutorLaunchSetsRankEnvironment(t *testing.T) {
	x, events, dir := newTestExecutor(t)
	l := &api.LaunchRanks{
		Job: "j1", Attempt: 1, Command: []string{"/bin/sh", "-c", "env; exit 3"},
		Env: map[string]string{"NCCL_DEBUG": "WARN"}, WorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29500,
		CheckpointDir: "/tmp/ckpt", ResumeStep: 40,
		Ranks: []*api.RankSpec{{Rank: 2, LocalRank: 0, Gpus: []uint32{4, 5}}},
	}
	if err := x.Launch(l); err != nil {
		t.Fatal(err)
	}
	ev := events.waitFor(t, "exit", func(e *api.Event) bool { return e.Kind == api.EventKind_EVENT_KIND_PROCESS_EXIT })
	if ev.ExitCode != 3 || ev.Rank != 2 || ev.Job != "j1" {
		t.Fatalf("exit event = %v", ev)
	}
	out, err := os.ReadFile(filepath.Join(dir, "j1", "rank-2.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RANK=2", "LOCAL_RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
		"MASTER_PORT=29500", "CUDA_VISIBLE_DEVICES=4,5", "GPUCTL_JOB=j1", "GPUCTL_NODE=node-a", "NCCL_DEBUG=WARN",
		"GPUCTL_CHECKPOINT_DIR=/tmp/ckpt", "GPUCTL_RESUME_STEP=40"} {
		if !strings.Contains(string(out), "\n"+want+"\n") {
			t.Errorf("rank environment lacks %s", want)
		}
	}
}

func TestExecutorLaunchIsIdempotentAndSignals(t *testing.T) {
	x, events, _ := newTestExecutor(t)
	l := &api.LaunchRanks{Job: "j2", Attempt: 1, Command: []string{"/bin/sleep", "60"}, WorldSize: 1,
		Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{0}}}}
	for i := 0; i < 2; i++ {
		if err := x.Launch(l); err != nil {
			t.Fatal(err)
		}
	}
	if got := x.GPUProcesses()[0]; len(got) != 1 {
		t.Fatalf("GPU 0 has %d processes after a repeated launch, want 1", len(got))
	}
	if err := x.Signal(&api.SignalRanks{Job: "j2", Signal: "SIGBOGUS"}); err == nil {
		t.Fatal("unknown signal accepted")
	}
	if err := x.Signal(&api.SignalRanks{Job: "nope", Signal: "SIGTERM"}); err == nil {
		t.Fatal("signal to an unknown job accepted")
	}
	if err := x.Signal(&api.SignalRanks{Job: "j2", Signal: "sigkill"}); err != nil {
		t.Fatal(err)
	}
	ev := events.waitFor(t, "exit", func(e *api.Event) bool { return e.Kind == api.EventKind_EVENT_KIND_PROCESS_EXIT })
	if ev.Signal != "SIGKILL" {
		t.Fatalf("exit signal = %q, want SIGKILL", ev.Signal)
	}
	if got := x.GPUProcesses()[0]; len(got) != 0 {
		t.Fatalf("exited rank still listed on GPU 0: %v", got)
	}
}

func TestExecutorRefusesBadLaunch(t *testing.T) {
	x, _, _ := newTestExecutor(t)
	tests := []struct {
		name string
		l    *api.LaunchRanks
	}{
		{"no command", &api.LaunchRanks{Job: "j", Ranks: []*api.RankSpec{{}}}},
		{"no ranks", &api.LaunchRanks{Job: "j", Command: []string{"/bin/true"}}},
		{"missing binary", &api.LaunchRanks{Job: "j", Command: []string{"/no/such/bin"}, Ranks: []*api.RankSpec{{}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := x.Launch(tc.l); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
