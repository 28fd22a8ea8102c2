package agent

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestSlurmTaskOf(t *testing.T) {
	base := map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "node2", "CUDA_VISIBLE_DEVICES": "0,1"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		node string
		ok   bool
		want foundTask
	}{
		{name: "plain sbatch task", env: base, node: "node2", ok: true,
			want: foundTask{slurmJob: "7", job: "slurm-7", attempt: 1, rank: 3, local: 1, gpus: []uint32{0, 1}}},
		{name: "requeued plain task", env: with("SLURM_RESTART_COUNT", "2"), node: "node2", ok: true,
			want: foundTask{slurmJob: "7", job: "slurm-7", attempt: 3, rank: 3, local: 1, gpus: []uint32{0, 1}}},
		// Several slurmd on one host: another node's task is not ours.
		{name: "other node", env: base, node: "node1"},
		{name: "batch script", env: with("SLURM_STEP_ID", ""), node: "node2"},
		// Caught between srun's start and its exec of the rank shim.
		{name: "slurm-task before exec", env: with(api.SlurmLaunchEnv, "node2:AA"), node: "node2"},
		{name: "not slurm", env: map[string]string{"RANK": "0"}, node: "node2"},
		{name: "gpuctl job", node: "node2", ok: true,
			env: with(api.RankStatusEnv, "/r/7/rank-5.status", api.RankLogEnv, "/r/7/rank-5.log", "GPUCTL_JOB", "j-1", "RANK", "5",
				"LOCAL_RANK", "1", "GPUCTL_ATTEMPT", "2", "GPUCTL_CHECKPOINT_DIR", "/ck", "CUDA_VISIBLE_DEVICES", "6"),
			want: foundTask{slurmJob: "7", job: "j-1", attempt: 2, rank: 5, local: 1, gpus: []uint32{6},
				logPath: "/r/7/rank-5.log", statusPath: "/r/7/rank-5.status", ckptDir: "/ck", shimmed: true}},
		{name: "gpuctl job, bad rank", node: "node2",
			env: with(api.RankStatusEnv, "/s", "GPUCTL_JOB", "j-1", "RANK", "x", "LOCAL_RANK", "1", "GPUCTL_ATTEMPT", "2")},
	} {
		got, ok := slurmTaskOf(tc.env, tc.node)
		if ok != tc.ok {
			t.Errorf("%s: ok = %v, want %v", tc.name, ok, tc.ok)
			continue
		}
		if ok && (got.job != tc.want.job || got.rank != tc.want.rank || got.attempt != tc.want.attempt || got.local != tc.want.local ||
			!slices.Equal(got.gpus, tc.want.gpus) || got.statusPath != tc.want.statusPath || got.logPath != tc.want.logPath ||
			got.ckptDir != tc.want.ckptDir || got.shimmed != tc.want.shimmed || got.slurmJob != tc.want.slurmJob) {
			t.Errorf("%s: got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestSlurmTaskEnvIsRankEnv(t *testing.T) {
	l0 := &api.LaunchRanks{Job: "j-1", Attempt: 2, WorldSize: 4, NodeRank: 0, NumNodes: 2, MasterAddr: "10.0.0.2", MasterPort: 29500,
		Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{0}}, {Rank: 1, LocalRank: 1, Gpus: []uint32{1}}}}
	l1 := &api.LaunchRanks{Job: "j-1", Attempt: 2, WorldSize: 4, NodeRank: 1, NumNodes: 2, MasterAddr: "10.0.0.2", MasterPort: 29500,
		Ranks: []*api.RankSpec{{Rank: 2, Gpus: []uint32{4}}, {Rank: 3, LocalRank: 1, Gpus: []uint32{5}}}}
	enc, err := api.EncodeLaunch([]api.NodeLaunch{{Node: "node2", Launch: l0}, {Node: "node1", Launch: l1}})
	if err != nil {
		t.Fatal(err)
	}
	// Slurm numbers node1 first (sorted); gpuctl's order made node2 rank 0.
	environ := []string{"PATH=/bin", "CUDA_VISIBLE_DEVICES=0,1", api.SlurmLaunchEnv + "=" + enc, api.SlurmClusterEnv + "=c1",
		"SLURM_JOB_ID=9", "SLURMD_NODENAME=node1", "SLURM_NODEID=0", "SLURM_LOCALID=1", "SLURM_PROCID=1"}
	env, logPath, statusPath, err := slurmTaskEnv(environ, "/run/g")
	if err != nil {
		t.Fatal(err)
	}
	if logPath != "/run/g/9/rank-3.log" || statusPath != "/run/g/9/rank-3.status" {
		t.Errorf("paths %s %s", logPath, statusPath)
	}
	want := api.RankEnv("node1", "c1", l1, l1.Ranks[1])
	for _, kv := range want {
		if !slices.Contains(env, kv) {
			t.Errorf("env lacks %s: %v", kv, env)
		}
	}
	seen := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if seen[k] {
			t.Errorf("%s twice in %v", k, env)
		}
		seen[k] = true
		if k == api.SlurmLaunchEnv {
			t.Errorf("the launch is passed on to the rank")
		}
	}
	if _, _, _, err := slurmTaskEnv([]string{"SLURM_JOB_ID=9"}, "/run/g"); err == nil || !strings.Contains(err.Error(), "not submitted by gpuctl") {
		t.Errorf("task without a launch: err = %v", err)
	}
}

// fakeProc writes one process into a fake /proc.
func fakeProc(t *testing.T, root string, pid, ppid int, comm string, env map[string]string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Fields 3..24 of proc(5): state ppid pgrp … starttime (22) vsize rss.
	stat := fmt.Sprintf("%d (%s) S %d %d 0 0 0 0 0 0 0 0 5 3 0 0 20 0 1 0 %d 0 100\n", pid, comm, ppid, pid, 1000+pid)
	var environ []byte
	for k, v := range env {
		environ = append(environ, k+"="+v+"\x00"...)
	}
	for name, data := range map[string][]byte{"stat": []byte(stat), "comm": []byte(comm + "\n"), "environ": environ} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestScanSlurmAdoptsThisNodesTasks: the executor finds the Slurm tasks of
// its node in /proc (the rank under a gpuctl task's shim; a plain task
// itself), reports each once, and leaves other nodes' tasks and batch
// scripts alone.
func TestScanSlurmAdoptsThisNodesTasks(t *testing.T) {
	root := t.TempDir()
	task := map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "node2"}
	fakeProc(t, root, 100, 1, "slurmstepd", nil)
	// A plain sbatch task of node2, rank 1.
	fakeProc(t, root, 101, 100, "sh", task)
	// The same job's task on node1 (another slurmd on this host).
	other := maps.Clone(task)
	other["SLURMD_NODENAME"], other["SLURM_PROCID"] = "node1", "0"
	fakeProc(t, root, 102, 100, "sh", other)
	// A gpuctl job's task: the shim (under slurmstepd) and its rank.
	shim := maps.Clone(task)
	shim["SLURM_JOB_ID"], shim["SLURM_PROCID"] = "8", "0"
	shim[api.RankStatusEnv], shim[api.RankLogEnv] = filepath.Join(root, "rank-3.status"), filepath.Join(root, "rank-3.log")
	shim["GPUCTL_JOB"], shim["RANK"], shim["LOCAL_RANK"], shim["GPUCTL_ATTEMPT"] = "j-1", "3", "1", "2"
	fakeProc(t, root, 103, 100, "nodemon", shim)
	fakeProc(t, root, 104, 103, "ringtrain", shim)
	// The batch script: no step id.
	batch := maps.Clone(task)
	delete(batch, "SLURM_STEP_ID")
	fakeProc(t, root, 105, 100, "bash", batch)

	var events []*api.Event
	x, err := NewExecutor(ExecutorOptions{Node: "node2", DataDir: t.TempDir(), ProcRoot: root, SlurmNode: "node2", Poll: time.Hour,
		OnEvent: func(e *api.Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	onOwner(t, x, func() { x.scanTasks(time.Now()) })
	onOwner(t, x, func() { x.scanTasks(time.Now()) })
	got := map[string]uint32{}
	for _, e := range events {
		got[fmt.Sprintf("%s/%d", e.GetJob(), e.GetRank())] = e.GetPid()
	}
	want := map[string]uint32{"slurm-7/1": 101, "j-1/3": 104}
	if !maps.Equal(got, want) {
		t.Fatalf("ranks found %v, want %v (events %v)", got, want, events)
	}
	st := x.RankStatuses()
	if len(st) != 2 || st[0].GetJob() != "j-1" || st[0].GetAttempt() != 2 || st[1].GetJob() != "slurm-7" {
		t.Fatalf("rank statuses %v", st)
	}
}

// TestSlurmScanHearsCallbacksGivenAtConstruction: the executor's monitor
// scans for Slurm tasks from its first tick, so the callbacks it calls
// (OnAdopt, and BeforeLaunch on a launch at the same time) are given with
// the options; under -race, a callback assigned after NewExecutor is a
// data race with that scan.
func TestSlurmScanHearsCallbacksGivenAtConstruction(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 100, 1, "slurmstepd", nil)
	fakeProc(t, root, 101, 100, "sh", map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURMD_NODENAME": "node2"})
	adopted := make(chan int, 1)
	launching := make(chan string, 1)
	x, err := NewExecutor(ExecutorOptions{Node: "node2", DataDir: t.TempDir(), ProcRoot: root, SlurmNode: "node2",
		Poll: time.Millisecond, CgroupRoot: "off", AllowRootRanks: true,
		OnAdopt:      func(pid int) { adopted <- pid },
		BeforeLaunch: func(l *api.LaunchRanks) { launching <- l.GetJob() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only the rank launched here: pid 101 is a /proc of the test's own.
		x.Stop("j-1", nil, time.Second)
		x.Close()
	})
	launched := make(chan error, 1)
	go func() { launched <- x.Launch(sleepJob("j-1", 1, 0)) }()
	deadline := time.After(10 * time.Second)
	for got := 0; got < 2; got++ {
		select {
		case pid := <-adopted:
			if pid != 101 {
				t.Fatalf("OnAdopt heard pid %d, want 101 (the Slurm task)", pid)
			}
		case job := <-launching:
			if job != "j-1" {
				t.Fatalf("BeforeLaunch heard job %q, want j-1", job)
			}
		case <-deadline:
			t.Fatal("no OnAdopt and BeforeLaunch within 10s of NewExecutor")
		}
	}
	if err := <-launched; err != nil {
		t.Fatal(err)
	}
}

// TestScanKubeAdoptsThisNodesPods: with a Kubernetes node the executor
// finds the ranks of gpuctl's pods on it (the rank under each shim nodemon
// kube-task started), reports each once with its pod, and leaves another
// node's pods, a kube-task itself and a shim of its own alone.
func TestScanKubeAdoptsThisNodesPods(t *testing.T) {
	root := t.TempDir()
	shim := func(node string, rank int) map[string]string {
		return map[string]string{api.KubePodEnv: "gpuctl-j-1-a2-0-x", "GPUCTL_NODE": node, "GPUCTL_JOB": "j-1", "GPUCTL_ATTEMPT": "2",
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3",
			api.RankStatusEnv: fmt.Sprintf("/k/j-1-a2/rank-%d.status", rank), api.RankLogEnv: fmt.Sprintf("/k/j-1-a2/rank-%d.log", rank)}
	}
	fakeProc(t, root, 200, 1, "nodemon", map[string]string{api.KubePodEnv: "gpuctl-j-1-a2-0-x"}) // kube-task
	fakeProc(t, root, 201, 200, "nodemon", shim("kn-1", 0))
	fakeProc(t, root, 202, 201, "ringtrain", shim("kn-1", 0))
	fakeProc(t, root, 210, 1, "nodemon", nil) // another node's kube-task
	fakeProc(t, root, 211, 210, "nodemon", shim("kn-2", 2))
	fakeProc(t, root, 212, 211, "ringtrain", shim("kn-2", 2))
	fakeProc(t, root, 220, 1, "containerd-shim", nil)
	fakeProc(t, root, 221, 220, "nodemon", map[string]string{api.KubePodEnv: "p"}) // kube-task, not a shim

	var events []*api.Event
	x, err := NewExecutor(ExecutorOptions{Node: "kn-1", DataDir: t.TempDir(), ProcRoot: root, KubeNode: "kn-1", Poll: time.Hour,
		OnEvent: func(e *api.Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	onOwner(t, x, func() { x.scanTasks(time.Now()) })
	onOwner(t, x, func() { x.scanTasks(time.Now()) })
	if len(events) != 1 || events[0].GetJob() != "j-1" || events[0].GetPid() != 202 || events[0].GetAttrs()["pod"] != "gpuctl-j-1-a2-0-x" {
		t.Fatalf("events %v, want one: rank 0 of j-1, pid 202, in its pod", events)
	}
	st := x.RankStatuses()
	if len(st) != 1 || st[0].GetAttempt() != 2 || st[0].GetPid() != 202 {
		t.Fatalf("rank statuses %v", st)
	}
	// Kubernetes stops it: it holds no lease of nodemon's.
	if pa := x.PeerAttempts(); len(pa) != 0 {
		t.Fatalf("a pod's rank is a peer attempt: %v", pa)
	}
}
