// Package needs gates tests on what the machine has. A test that lacks a
// feature skips and says why, unless the feature's GPUCTL_REQUIRE_*
// variable says this machine must have it (CI sets them): then the skip is
// a failure, so a broken feature cannot pass as a missing one. Every skip
// for a missing feature goes through here.
package needs

import (
	"fmt"
	"os"
	"testing"
)

// Feature is what a test may need, named by the variable that makes it
// required.
type Feature string

// The features tests are gated on.
const (
	// EBPF is eBPF: uprobes on a rank's NCCL, tracepoints, and NCCL calls
	// actually traced.
	EBPF Feature = "GPUCTL_REQUIRE_EBPF"
	// Root is running as root: creating users, cgroups, ranks run as
	// another user.
	Root Feature = "GPUCTL_REQUIRE_ROOT"
	// NVML is the real NVIDIA management library (a GPU machine).
	NVML Feature = "GPUCTL_REQUIRE_NVML"
	// Prometheus is the prometheus binary.
	Prometheus Feature = "GPUCTL_REQUIRE_PROMETHEUS"
	// Slurm is a Slurm installation (slurmctld, slurmd, munged, the CLI).
	Slurm Feature = "GPUCTL_REQUIRE_SLURM"
	// Kube is Kubernetes: kube-apiserver, kube-controller-manager and
	// kubelet built by make kube, and containerd, runc, the CNI plugins
	// and buildah for the kubelets.
	Kube Feature = "GPUCTL_REQUIRE_KUBE"
)

// Required reports whether this machine must have f: its variable is set
// to anything but "" or "0".
func (f Feature) Required() bool {
	v := os.Getenv(string(f))
	return v != "" && v != "0"
}

// Skip skips t because f is missing, for the reason given, or fails t
// loudly when f is required here.
func (f Feature) Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if f.Required() {
		t.Fatalf("FORBIDDEN SKIP: %s=%s says this machine must have it, but: %s", f, os.Getenv(string(f)), reason)
	}
	t.Skipf("%s (set %s=1 to make this a failure)", reason, f)
}

// RootUser skips t unless it runs as root (fails when Root is required).
func RootUser(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Root.Skip(t, "needs root to %s (running as uid %d)", why, os.Geteuid())
	}
}
