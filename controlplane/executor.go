package controlplane

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/controlplane/slurm"
	"github.com/gpuctl/gpuctl/transport"
)

// slurmExecutor is the Slurm executor Config.Executor asks for; nil for
// nodemon (the job owner's own launches).
func slurmExecutor(cfg Config, auth *transport.Authority) (*slurm.Executor, error) {
	switch cfg.Executor {
	case "", "nodemon", "kubernetes":
		return nil, nil
	case "slurm":
	default:
		return nil, fmt.Errorf("--executor %q: use nodemon, slurm or kubernetes", cfg.Executor)
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

// kubeExecutor is the Kubernetes executor Config.Executor asks for; nil
// otherwise. It follows the Nodes into the registry and tells the job
// owner's front door what it learns, so it is built before the owner.
func kubeExecutor(cfg Config, auth *transport.Authority, reg *nodes.Registry, front *jobs.Front) (*kube.Executor, error) {
	if cfg.Executor != "kubernetes" {
		return nil, nil
	}
	o := cfg.Kube
	if o.Spec.Image == "" {
		return nil, fmt.Errorf("--executor kubernetes: --kube-image is empty: name the image that holds nodemon and the jobs' programs")
	}
	switch o.Spec.PullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return nil, fmt.Errorf("--kube-pull-policy %q: use Always, IfNotPresent or Never", o.Spec.PullPolicy)
	}
	if o.Client == nil {
		cs, err := kube.NewClient(o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		o.Client = cs
	}
	if ca := auth.CACert(); ca != nil && o.Spec.Cluster == "" {
		// The ranks name their cluster as nodemon's do.
		o.Spec.Cluster = transport.ClusterID(ca)
	}
	return kube.New(kube.Config{Client: o.Client, Spec: o.Spec, StopGrace: o.StopGrace, Registry: reg, Owner: front,
		Log: cfg.Log.With("part", "kubernetes")}), nil
}
