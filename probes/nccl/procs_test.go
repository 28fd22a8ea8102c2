package nccl

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseEnviron(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want procEnv
	}{
		{"all set", "PATH=/bin\x00GPUCTL_JOB=llama\x00RANK=3\x00GPUCTL_NODE=n1\x00", procEnv{job: "llama", rank: 3, node: "n1"}},
		{"none set", "HOME=/root\x00", procEnv{rank: -1}},
		{"first duplicate wins", "RANK=1\x00RANK=2\x00", procEnv{rank: 1}},
		{"bad rank", "RANK=x\x00GPUCTL_JOB=j", procEnv{job: "j", rank: -1}},
		{"negative rank", "RANK=-4", procEnv{rank: -1}},
		{"value with =", "GPUCTL_JOB=a=b\x00", procEnv{job: "a=b", rank: -1}},
		{"no separator", "GARBAGE\x00RANK=0", procEnv{rank: 0}},
		{"empty", "", procEnv{rank: -1}},
		{"plain Slurm task", "SLURM_JOB_ID=7\x00SLURM_PROCID=2\x00SLURMD_NODENAME=node3\x00", procEnv{job: "slurm-7", rank: 2, node: "node3"}},
		{"gpuctl's rank under Slurm", "SLURM_JOB_ID=7\x00SLURM_PROCID=2\x00SLURMD_NODENAME=node3\x00GPUCTL_JOB=j\x00RANK=5\x00GPUCTL_NODE=node3\x00",
			procEnv{job: "j", rank: 5, node: "node3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseEnviron([]byte(tc.in)); got != tc.want {
				t.Errorf("parseEnviron = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseEnviron(f *testing.F) {
	f.Add([]byte("GPUCTL_JOB=a\x00RANK=2\x00GPUCTL_NODE=n\x00"))
	f.Add([]byte("RANK=99999999999\x00"))
	f.Add([]byte("=\x00\x00="))
	f.Fuzz(func(t *testing.T, b []byte) {
		env := parseEnviron(b)
		if env.rank < -1 {
			t.Fatalf("rank %d below -1", env.rank)
		}
	})
}

func fakeProc(t *testing.T, root string, pid, env string, start string) {
	t.Helper()
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(filepath.Join(dir, "task", pid), 0o755); err != nil {
		t.Fatal(err)
	}
	stat := pid + " (rank) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 " + start + " 0 0\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestProcTable(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, "10", "GPUCTL_JOB=j1\x00RANK=0\x00GPUCTL_NODE=node-a\x00", "100")
	fakeProc(t, root, "11", "GPUCTL_JOB=j2\x00RANK=1\x00GPUCTL_NODE=node-b\x00", "100")
	fakeProc(t, root, "12", "RANK=5\x00", "100")
	p := NewProcTable(root, "node-a")

	for _, tc := range []struct {
		pid  uint32
		job  string
		rank int32
		keep bool
	}{
		{10, "j1", 0, true},
		{11, "j2", 1, false}, // another node's rank on a shared host
		{12, "", 5, true},    // GPUCTL_NODE unset: reported
		{13, "", -1, true},   // no such process
	} {
		job, rank, keep := p.Lookup(tc.pid)
		if job != tc.job || rank != tc.rank || keep != tc.keep {
			t.Errorf("Lookup(%d) = %q, %d, %v; want %q, %d, %v", tc.pid, job, rank, keep, tc.job, tc.rank, tc.keep)
		}
	}
	strict := NewStrictProcTable(root, "node-a")
	for _, tc := range []struct {
		pid  uint32
		keep bool
	}{
		{10, true},  // launched for this node
		{11, false}, // another node's
		{12, false}, // launched by nobody: another test's, on a shared host
		{13, false}, // unreadable
	} {
		if _, _, keep := strict.Lookup(tc.pid); keep != tc.keep {
			t.Errorf("strict Lookup(%d) keep = %v, want %v", tc.pid, keep, tc.keep)
		}
	}
	// Two clusters on one host with the same node names: only this
	// cluster's rank is ours once the cluster is known.
	fakeProc(t, root, "14", "GPUCTL_JOB=j4\x00RANK=0\x00GPUCTL_NODE=node-a\x00GPUCTL_CLUSTER=c-other\x00", "100")
	fakeProc(t, root, "15", "GPUCTL_JOB=j5\x00RANK=0\x00GPUCTL_NODE=node-a\x00GPUCTL_CLUSTER=c-mine\x00", "100")
	if _, _, keep := p.Lookup(14); !keep {
		t.Error("before the cluster is known a process of node-a is reported")
	}
	p.SetCluster("c-mine")
	for _, tc := range []struct {
		pid  uint32
		keep bool
	}{{14, false}, {15, true}, {10, true}, {12, true}} {
		if _, _, keep := p.Lookup(tc.pid); keep != tc.keep {
			t.Errorf("with cluster c-mine, Lookup(%d) keep = %v, want %v", tc.pid, keep, tc.keep)
		}
	}
	if !p.alive(10, 10) || p.alive(10, 99) {
		t.Error("alive disagrees with the task directories")
	}

	// Pid 10 exits and the pid is reused by another process: after Prune
	// the new process's environment is read.
	fakeProc(t, root, "10", "GPUCTL_JOB=j9\x00RANK=4\x00", "200")
	if job, _, _ := p.Lookup(10); job != "j1" {
		t.Fatalf("cached Lookup(10) job = %q before Prune, want j1", job)
	}
	p.Prune()
	if job, rank, _ := p.Lookup(10); job != "j9" || rank != 4 {
		t.Errorf("Lookup(10) after pid reuse = %q, %d; want j9, 4", job, rank)
	}
	if err := os.RemoveAll(filepath.Join(root, "12")); err != nil {
		t.Fatal(err)
	}
	p.Prune()
	if _, ok := p.cache[12]; ok {
		t.Error("Prune kept an exited process")
	}
}
