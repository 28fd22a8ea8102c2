package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// DefaultCgroupRoot is where cgroup v2 is mounted on a unified host.
const DefaultCgroupRoot = "/sys/fs/cgroup"

// jobCgroups keeps each rank in a cgroup v2 group of its own under its
// job's, <root>/gpuctl/<job>/rank-<R>: writing 1 to a group's cgroup.kill
// kills every process in it at once, children that left the rank's
// process group included, and a job's group kills all its ranks on the
// node. Ranks live in leaves only, as cgroup v2 requires once controllers
// are enabled.
type jobCgroups struct {
	base string // <root>/gpuctl; empty when job cgroups are off
	off  string // why they are off
}

// newJobCgroups turns job cgroups on where root is a cgroup v2 mount that
// nodemon may write.
func newJobCgroups(root string) *jobCgroups {
	if root == "" {
		root = DefaultCgroupRoot
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		return &jobCgroups{off: fmt.Sprintf("%s is not a cgroup v2 mount (it has no cgroup.controllers; the host runs cgroup v1): "+
			"ranks are killed by process group only, and a child that leaves its rank's group can outlive it", root)}
	}
	base := filepath.Join(root, "gpuctl")
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return &jobCgroups{off: fmt.Sprintf("cannot create %s (%v): run nodemon as root or delegate that cgroup to it", base, err)}
	}
	return &jobCgroups{base: base}
}

func (c *jobCgroups) enabled() bool { return c.base != "" }

// rankDir creates and returns the cgroup of one rank.
func (c *jobCgroups) rankDir(job string, rank int32) (string, error) {
	dir := filepath.Join(c.base, job, "rank-"+strconv.Itoa(int(rank)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup of job %s rank %d: %w", job, rank, err)
	}
	return dir, nil
}

// removeRank removes a rank's cgroup, and its job's once that is empty.
// A group that still holds a process stays (rmdir says EBUSY).
func (c *jobCgroups) removeRank(dir string) {
	if dir == "" {
		return
	}
	if err := syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
		syscall.Rmdir(filepath.Dir(dir))
		return
	}
	// A fake tree in tests holds the files a real cgroupfs would drop.
	if entries, err := os.ReadDir(dir); err == nil && onlyFiles(entries) {
		os.RemoveAll(dir)
		syscall.Rmdir(filepath.Dir(dir))
	}
}

func onlyFiles(entries []os.DirEntry) bool {
	for _, e := range entries {
		if e.IsDir() {
			return false
		}
	}
	return true
}

// killCgroup kills every process in a cgroup v2 group (Linux 5.14+).
func killCgroup(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	return nil
}
