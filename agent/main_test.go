package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/workload"
)

// TestMain lets the test binary stand in for nodemon as the rank shim:
// the executor under test re-executes it with ShimCommand, as nodemon
// re-executes itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimCommand {
		os.Exit(RunShim(os.Args[2:], os.Stderr))
	}
	os.Exit(m.Run())
}

var (
	workloadOnce sync.Once
	workloadArt  workload.Artifacts
	workloadErr  error
)

// ringtrain returns the reference trainer, building it when missing.
func ringtrain(t *testing.T) string {
	t.Helper()
	workloadOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		workloadArt, workloadErr = workload.Build(ctx, workload.SourceDir())
	})
	if workloadErr != nil {
		t.Fatalf("reference workload unavailable: %v", workloadErr)
	}
	return workloadArt.RingTrain
}

// freePort returns a TCP port on loopback that was free a moment ago.
func freePort(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func logPath(dir, job string, rank int) string {
	return filepath.Join(dir, "logs", job, "rank-"+strconv.Itoa(rank)+".log")
}
