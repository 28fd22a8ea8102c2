package kube

import (
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options are gpuctl serve's Kubernetes settings.
type Options struct {
	// Kubeconfig is the client config file; "" is the pod's own service
	// account (gpuctl serve running in the cluster).
	Kubeconfig string
	// Client, when set, is used instead (tests in process).
	Client    kubernetes.Interface
	Spec      Spec
	StopGrace time.Duration
}

// NewClient connects with kubeconfig, or in the cluster without one.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes: no --kubeconfig, and not running in a pod (%w): name the cluster's kubeconfig file", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubernetes: --kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpuctl"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return cs, nil
}
