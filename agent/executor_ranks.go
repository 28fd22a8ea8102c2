package agent

import (
	"sort"
)

// rankRecord is what nodemon keeps of a live rank in ranks.json, so that
// a restarted nodemon finds it again.
type rankRecord struct {
	Job       string   `json:"job"`
	Attempt   uint32   `json:"attempt"`
	Rank      int32    `json:"rank"`
	LocalRank int32    `json:"local_rank"`
	GPUs      []uint32 `json:"gpus"`
	// PID and StartTicks name the rank process; ShimPID and ShimStartTicks
	// its shim. A pid alone could have been reused since.
	PID            int    `json:"pid"`
	StartTicks     uint64 `json:"start_ticks"`
	ShimPID        int    `json:"shim_pid"`
	ShimStartTicks uint64 `json:"shim_start_ticks"`
	LogPath        string `json:"log_path"`
	StatusPath     string `json:"status_path"`
	CheckpointDir  string `json:"checkpoint_dir,omitempty"`
	Cgroup         string `json:"cgroup,omitempty"`
	// LastCheckpointStep is the last `checkpoint step=N` the rank printed;
	// CheckpointReported the last checkpoint this node reported for the
	// job (rank 0 only). -1: none.
	LastCheckpointStep int64 `json:"last_checkpoint_step"`
	CheckpointReported int64 `json:"checkpoint_reported"`
	LaunchedUnixNano   int64 `json:"launched_unix_nano"`
	// SlurmJob is the Slurm job of a rank Slurm started (found, not
	// launched): Slurm stops it, so it holds no lease.
	SlurmJob string `json:"slurm_job,omitempty"`
	// Pod is the pod of a rank Kubernetes started: Kubernetes stops it, so
	// it holds no lease either.
	Pod string `json:"pod,omitempty"`
	// Witnesses vouch for the rank's attempt while the server is away, for
	// leases of LeaseMs (the server's lease when it was launched), so a
	// nodemon restarted with no server to talk to can still renew it.
	Witnesses []witnessRecord `json:"witnesses,omitempty"`
	LeaseMs   int64           `json:"lease_ms,omitempty"`
}

// witnessRecord is a witness of a rank's attempt (api.Witness).
type witnessRecord struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// ranksFile is the layout of <data-dir>/ranks.json.
type ranksFile struct {
	Version int          `json:"version"`
	Ranks   []rankRecord `json:"ranks"`
}

// saveRanks writes the live ranks to ranks.json (tmp file and rename).
func (x *Executor) saveRanks() {
	f := ranksFile{Version: 1, Ranks: []rankRecord{}}
	for _, p := range x.live() {
		f.Ranks = append(f.Ranks, p.rec)
	}
	sort.Slice(f.Ranks, func(i, j int) bool {
		a, b := f.Ranks[i], f.Ranks[j]
		return a.Job < b.Job || a.Job == b.Job && a.Rank < b.Rank
	})
	if err := writeFileAtomic(x.statePath, mustJSON(f)); err != nil {
		x.log.Error("save launched ranks; a nodemon restart will not find them", "err", err)
	}
}

// foreign: the rank was started by Slurm or Kubernetes, which stop it; it
// holds no lease of nodemon's.
func (r rankRecord) foreign() bool { return r.SlurmJob != "" || r.Pod != "" }
