// Package testbin finds the programs that integration tests run as real
// processes: gpuctl and nodemon from $GPUCTL_BIN, where `make test` built
// them, else built into bin/ as make build does; and the workload (libnccl.so.2,
// ringtrain).
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuctl/gpuctl/workload"
)

// Root is the repository's top directory: the one holding go.mod, found
// from the test's working directory (its package's directory).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testbin: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// Dir is the directory holding gpuctl and nodemon: $GPUCTL_BIN, else the
// repository's bin/, built there as `make build` does (gpuctl demo finds
// the workload beside its own bin/ directory).
func Dir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("GPUCTL_BIN"); dir != "" {
		return dir
	}
	root := Root(t)
	dir := filepath.Join(root, "bin")
	for _, cmd := range []string{"gpuctl", "nodemon"} {
		c := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
		c.Dir = root
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", cmd, err, out)
		}
	}
	// nodemon finds gpuctl's NCCL profiler plugin beside itself.
	plugin := filepath.Join(filepath.Dir(Ringtrain(t)), workload.ProfilerName)
	if out, err := exec.Command("cp", plugin, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy %s beside nodemon: %v\n%s", plugin, err, out)
	}
	return dir
}

// Gpuctl is the gpuctl binary.
func Gpuctl(t testing.TB) string { t.Helper(); return filepath.Join(Dir(t), "gpuctl") }

// Nodemon is the nodemon binary.
func Nodemon(t testing.TB) string { t.Helper(); return filepath.Join(Dir(t), "nodemon") }

// Ringtrain is workload/build/ringtrain, with libnccl.so.2 beside it:
// made first unless $GPUCTL_BIN says `make test` built everything.
func Ringtrain(t testing.TB) string {
	t.Helper()
	root := Root(t)
	if os.Getenv("GPUCTL_BIN") != "" {
		return filepath.Join(root, "workload", "build", "ringtrain")
	}
	if out, err := exec.Command("make", "-C", filepath.Join(root, "workload")).CombinedOutput(); err != nil {
		t.Fatalf("make -C workload: %v\n%s", err, out)
	}
	return filepath.Join(root, "workload", "build", "ringtrain")
}
