package workload

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
)

// Artifacts are the absolute paths of the built workload.
type Artifacts struct {
	Dir       string // the build directory
	Lib       string // libnccl.so.2
	Profiler  string // libnccl-profiler-gpuctl.so, gpuctl's NCCL profiler plugin
	RingTrain string
	NCCLBench string
	CollTest  string
}

// ProfilerName is the file name of gpuctl's NCCL profiler plugin, in NCCL's
// libnccl-profiler-NAME.so pattern, so NCCL_PROFILER_PLUGIN=gpuctl finds it
// on the library path too.
const ProfilerName = "libnccl-profiler-gpuctl.so"

// SourceDir returns the workload source folder of the tree this package was
// compiled from, so tests anywhere in the module can build it.
func SourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Build runs make in the workload source folder dir and returns the paths of
// what it built. A lock file serializes concurrent builds (test binaries of
// several packages may call Build at once); make itself skips what is fresh.
func Build(ctx context.Context, dir string) (Artifacts, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Artifacts{}, fmt.Errorf("build workload: %w", err)
	}
	build := filepath.Join(dir, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return Artifacts{}, fmt.Errorf("build workload: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(build, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Artifacts{}, fmt.Errorf("build workload: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Artifacts{}, fmt.Errorf("build workload: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	out, err := exec.CommandContext(ctx, "make", "-C", dir).CombinedOutput()
	if err != nil {
		return Artifacts{}, fmt.Errorf("build workload: make -C %s: %w (needs make and a C compiler)\n%s", dir, err, out)
	}
	a := Artifacts{
		Dir:       build,
		Lib:       filepath.Join(build, "libnccl.so.2"),
		Profiler:  filepath.Join(build, ProfilerName),
		RingTrain: filepath.Join(build, "ringtrain"),
		NCCLBench: filepath.Join(build, "ncclbench"),
		CollTest:  filepath.Join(build, "colltest"),
	}
	for _, p := range []string{a.Lib, a.Profiler, a.RingTrain, a.NCCLBench, a.CollTest} {
		if _, err := os.Stat(p); err != nil {
			return Artifacts{}, fmt.Errorf("build workload: make succeeded but %w", err)
		}
	}
	return a, nil
}
