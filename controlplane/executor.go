package controlplane

import (
	"fmt"

	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/controlplane/slurm"
	"github.com/gpuctl/gpuctl/transport"
)

// slurmExecutor is the Slurm executor Config.Executor asks for; nil for
// nodemon (the job owner's own launches).
func slurmExecutor(cfg Config, auth *transport.Authority) (*slurm.Executor, error) {
	switch cfg.Executor {
	case "", "nodemon":
		return nil, nil
	case "slurm":
	default:
		return nil, fmt.Errorf("--executor %q: use nodemon or slurm", cfg.Executor)
	}
	sc := cfg.Slurm
	sc.Log = cfg.Log.With("part", "slurm")
	if sc.Placement != "" && sc.Placement != slurm.PlaceGpuctl && sc.Placement != slurm.PlaceSlurm {
		return nil, fmt.Errorf("--slurm-placement %q: use %s or %s", sc.Placement, slurm.PlaceGpuctl, slurm.PlaceSlurm)
	}
	if ca := auth.CACert(); ca != nil {
		// The ranks name their cluster as nodemon's do.
		id := transport.ClusterID(ca)
		sc.Cluster = func() string { return id }
	}
	return slurm.New(sc), nil
}

// slurmPoller reads Slurm's view into the registry and the job owner; nil
// without a Slurm executor.
func slurmPoller(cfg Config, sx *slurm.Executor, reg *nodes.Registry, mgr *jobs.Manager) *slurm.Poller {
	if sx == nil {
		return nil
	}
	return &slurm.Poller{X: sx, Registry: reg, Owner: mgr, Every: cfg.Slurm.Poll, Log: cfg.Log.With("part", "slurm")}
}
