package nccl

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// Environment variables that tie a process to gpuctl's view of it.
const (
	EnvJob  = "GPUCTL_JOB"
	EnvRank = "RANK"
	EnvNode = "GPUCTL_NODE"
	// EnvCluster names the cluster (its CA) a rank was launched for, so
	// that nodemons of two clusters sharing a host (two demos) and a node
	// name each report only their own ranks.
	EnvCluster = "GPUCTL_CLUSTER"
)

// ProcTable resolves a pid to the job and rank in its environment and says
// whether this node should report it. Results are cached per pid; Prune
// drops processes that exited or whose pid was reused.
type ProcTable struct {
	root string
	node string
	// strict reports only processes whose GPUCTL_NODE is node.
	strict bool

	mu      sync.Mutex
	cluster string
	cache   map[uint32]procEntry
}

// SetCluster names this node's cluster: from then on a process launched
// for another cluster (GPUCTL_CLUSTER set to something else) is not
// reported, whatever its GPUCTL_NODE says.
func (p *ProcTable) SetCluster(cluster string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cluster = cluster
	clear(p.cache)
}

type procEntry struct {
	start uint64 // start time from /proc/PID/stat, to tell a reused pid apart
	job   string
	rank  int32
	keep  bool
}

// NewProcTable returns a table reading the proc filesystem at root
// (normally "/proc"). When node is set, processes whose GPUCTL_NODE names a
// different node are not reported: several nodemons may share one test host.
func NewProcTable(root, node string) *ProcTable {
	return &ProcTable{root: root, node: node, cache: make(map[uint32]procEntry)}
}

// NewStrictProcTable is NewProcTable that also leaves out processes with no
// GPUCTL_NODE at all: on a host shared by several nodemons (the demo, tests)
// only the ranks a nodemon launched are its own.
func NewStrictProcTable(root, node string) *ProcTable {
	p := NewProcTable(root, node)
	p.strict = node != ""
	return p
}

// Lookup returns pid's job and rank (-1 when RANK is unset or not a number)
// and whether to report it. A process that cannot be read (it exited, or
// lives in a pid namespace this one cannot see) is reported with no job and
// is not cached, so a later lookup may still find it.
func (p *ProcTable) Lookup(pid uint32) (job string, rank int32, keep bool) {
	p.mu.Lock()
	e, ok := p.cache[pid]
	p.mu.Unlock()
	if ok {
		return e.job, e.rank, e.keep
	}
	dir := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))
	environ, err := os.ReadFile(filepath.Join(dir, "environ"))
	if err != nil {
		return "", -1, !p.strict
	}
	st, err := procfs.ReadStat(p.root, int(pid))
	if err != nil {
		return "", -1, !p.strict
	}
	start := st.StartTicks
	env := parseEnviron(environ)
	p.mu.Lock()
	ours := p.cluster == "" || env.cluster == "" || env.cluster == p.cluster
	p.mu.Unlock()
	mine := ours && (p.node == "" || env.node == p.node || env.node == "" && !p.strict)
	e = procEntry{start: start, job: env.job, rank: env.rank, keep: mine}
	p.mu.Lock()
	p.cache[pid] = e
	p.mu.Unlock()
	return e.job, e.rank, e.keep
}

// Prune forgets processes that exited or whose pid now names another process.
func (p *ProcTable) Prune() {
	p.mu.Lock()
	pids := make(map[uint32]uint64, len(p.cache))
	for pid, e := range p.cache {
		pids[pid] = e.start
	}
	p.mu.Unlock()
	for pid, start := range pids {
		now, err := procfs.ReadStat(p.root, int(pid))
		if err == nil && now.StartTicks == start {
			continue
		}
		p.mu.Lock()
		if e, ok := p.cache[pid]; ok && e.start == start {
			delete(p.cache, pid)
		}
		p.mu.Unlock()
	}
}

// alive reports whether the thread tid of process pid still exists.
func (p *ProcTable) alive(pid, tid uint32) bool {
	_, err := os.Stat(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "task", strconv.FormatUint(uint64(tid), 10)))
	return err == nil
}

type procEnv struct {
	job     string
	rank    int32
	node    string
	cluster string
}

// parseEnviron picks gpuctl's variables out of a NUL-separated
// /proc/PID/environ. The first of duplicate names wins, as with glibc's getenv.
func parseEnviron(b []byte) (env procEnv) {
	env = procEnv{rank: -1}
	seen := make(map[string]bool, 3)
	slurm := map[string]string{}
	defer func() {
		// A task of a Slurm job submitted without gpuctl: its job is
		// api.SlurmJobName's, its rank SLURM_PROCID, its node the slurmd's.
		if _, isJob := seen[EnvJob]; isJob || slurm["SLURM_JOB_ID"] == "" || slurm["SLURM_PROCID"] == "" {
			return
		}
		env.job, env.node = api.SlurmJobName(slurm["SLURM_JOB_ID"]), slurm["SLURMD_NODENAME"]
		if r, err := strconv.ParseInt(slurm["SLURM_PROCID"], 10, 32); err == nil && r >= 0 {
			env.rank = int32(r)
		}
	}()
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte{'='})
		if !ok || seen[string(k)] {
			continue
		}
		switch string(k) {
		case EnvJob, EnvNode, EnvRank, EnvCluster:
			seen[string(k)] = true
		}
		switch string(k) {
		case "SLURM_JOB_ID", "SLURM_PROCID", "SLURMD_NODENAME":
			if _, ok := slurm[string(k)]; !ok {
				slurm[string(k)] = string(v)
			}
		case EnvJob:
			env.job = string(v)
		case EnvCluster:
			env.cluster = string(v)
		case EnvNode:
			env.node = string(v)
		case EnvRank:
			r, err := strconv.ParseInt(string(v), 10, 32)
			if err != nil || r < 0 {
				env.rank = -1
			} else {
				env.rank = int32(r)
			}
		}
	}
	return env
}
