package demo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/client"
)

// TestHAClientWithFirstServerGone is failover as an operator sees it: the
// CLI is given both servers (admin.yaml lists them, the leader first) and
// the leader is killed with SIGKILL, or stopped with SIGSTOP; once the
// standby leads, a new `gpuctl jobs` (the real binary, a new process with
// an empty cache dir and with one that remembers the dead leader) answers
// within a second, not after the first server's dial timeout.
func TestHAClientWithFirstServerGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"SIGKILL", syscall.SIGKILL},
		{"SIGSTOP", syscall.SIGSTOP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newHACluster(t, 0)
			remembers := t.TempDir()
			// Run while the first server leads: the cache remembers it.
			if took, out, err := c.cli(remembers, "jobs"); err != nil {
				t.Fatalf("gpuctl jobs before the failover (%s): %v\n%s", took, err, out)
			}
			standby := c.dialOnly(c.addrs[1])
			defer standby.Close()
			if err := c.servers[0].Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			signalled := time.Now()
			if tc.sig == syscall.SIGKILL {
				<-c.servers[0].done
			}
			c.waitLeader(standby, serverName(1), 15*time.Second)
			t.Logf("%s leads %.2fs after the %s of %s", serverName(1), time.Since(signalled).Seconds(), tc.name, serverName(0))
			for _, run := range []struct{ what, cache string }{
				{"remembering the old leader", remembers},
				{"with nothing remembered", t.TempDir()},
				{"again", remembers},
			} {
				took, out, err := c.cli(run.cache, "jobs")
				t.Logf("gpuctl jobs %s: %s", run.what, took.Round(time.Millisecond))
				if err != nil {
					t.Fatalf("gpuctl jobs %s: %v\n%s\n%s", run.what, err, out, c.logs())
				}
				if took > time.Second {
					t.Errorf("gpuctl jobs %s took %s with %s gone, want within 1s", run.what, took.Round(time.Millisecond), serverName(0))
				}
			}
		})
	}
}

// cli runs the gpuctl binary with the administrator's config (both
// servers) and cacheDir as its cache, and says how long it took.
func (c *haCluster) cli(cacheDir string, args ...string) (time.Duration, []byte, error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.gpuctl, args...)
	cmd.Env = append(os.Environ(), client.EnvConfig+"="+c.config(), "XDG_CACHE_HOME="+cacheDir)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return took, out, fmt.Errorf("%s after %s: %w", args, took.Round(time.Millisecond), err)
	}
	return took, out, nil
}
