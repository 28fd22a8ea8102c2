package controlplane

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/controlplane/slurm"
)

// TestExecutorConfig: an unknown executor, Slurm placement, Kubernetes
// pull policy, a Kubernetes executor with no image or with a kubeconfig
// that cannot be read is refused at start, saying what to use.
func TestExecutorConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Executor: "pbs"}, "use nodemon, slurm or kubernetes"},
		{Config{Executor: "slurm", Slurm: slurm.Config{Placement: "random"}}, "--slurm-placement \"random\""},
		{Config{Executor: "kubernetes", Kube: kube.Options{Kubeconfig: "/nonexistent/kubeconfig", Spec: kube.Spec{Image: "i"}}}, "--kubeconfig /nonexistent/kubeconfig"},
		{Config{Executor: "kubernetes", Kube: kube.Options{}}, "--kube-image is empty"},
		{Config{Executor: "kubernetes", Kube: kube.Options{Spec: kube.Spec{Image: "i", PullPolicy: "Sometimes"}}},
			"--kube-pull-policy \"Sometimes\": use Always, IfNotPresent or Never"},
	} {
		tc.cfg.DataDir, tc.cfg.Listen = t.TempDir(), "127.0.0.1:0"
		s, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			if s != nil {
				s.store.Close()
			}
			t.Errorf("New(%s) err = %v, want %q", tc.cfg.Executor, err, tc.want)
		}
	}
	s, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Executor: "slurm", Slurm: slurm.Config{RunDir: t.TempDir()}})
	if err != nil || s.slurm == nil {
		t.Fatalf("New with --executor slurm: %v (poller %v)", err, s != nil && s.slurm != nil)
	}
	s.store.Close()
}
