package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// requireRoot skips a test that needs root, except where tests must run
// as root (GPUCTL_REQUIRE_ROOT=1, as in CI): there a skip would hide a
// regression.
func requireRoot(t *testing.T) {
	t.Helper()
	needs.RootUser(t, "create a user and start ranks as it")
}

// throwawayUser creates a system user with a group of its own and one
// more group, and removes them after the test.
func throwawayUser(t *testing.T) (u *user.User, extraGID int) {
	t.Helper()
	name := fmt.Sprintf("gpuctl-t%d", os.Getpid())
	extra := name + "x"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("groupadd", "--system", extra)
	t.Cleanup(func() { exec.Command("groupdel", extra).Run() })
	run("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--groups", extra, name)
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroup(extra)
	if err != nil {
		t.Fatal(err)
	}
	extraGID, _ = strconv.Atoi(g.Gid)
	return u, extraGID
}

// openDir returns a new directory under /tmp that every user may pass
// through, for checkpoint dirs a rank's user must reach.
func openDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gpuctl-ckpt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// procStatus returns the real, effective, saved and filesystem ids of the
// Uid and Gid lines of /proc/PID/status, and its Groups line.
func procStatus(t *testing.T, pid int) (uids, gids, groups string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Uid":
			uids = strings.Join(strings.Fields(v), " ")
		case "Gid":
			gids = strings.Join(strings.Fields(v), " ")
		case "Groups":
			groups = strings.Join(strings.Fields(v), " ")
		}
	}
	return
}

// TestRanksRunAsNamedUser launches a rank as a throwaway user, by name and
// by uid: the kernel says the rank runs with that user's ids and groups,
// it can write the checkpoint dir nodemon made for it, and its environment
// names the user.
func TestRanksRunAsNamedUser(t *testing.T) {
	requireRoot(t)
	u, extra := throwawayUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, by := range []string{u.Username, u.Uid} {
		t.Run("by "+map[bool]string{true: "uid", false: "name"}[by == u.Uid], func(t *testing.T) {
			e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.AllowRootRanks = false })
			ck := filepath.Join(openDir(t), "ckpt", "job")
			l := &api.LaunchRanks{Job: "as-user", Attempt: 1, RunAsUser: by, CheckpointDir: ck, WorldSize: 1,
				Command: []string{"/bin/sh", "-c", `echo "user=$USER home=$HOME pwd=$(pwd)"; echo ok > "$GPUCTL_CHECKPOINT_DIR/probe"; exec sleep 300`},
				Ranks:   []*api.RankSpec{{Rank: 0}}}
			if err := e.x.Launch(l); err != nil {
				t.Fatalf("launch as %s: %v", by, err)
			}
			pid := rankPID(t, e.x, "as-user", 0)
			killOnCleanup(t, pid)
			probe := filepath.Join(ck, "probe")
			eventually(t, "the rank writing its checkpoint dir", 10*time.Second, func() bool {
				_, err := os.Stat(probe)
				return err == nil
			})
			uids, gids, groups := procStatus(t, pid)
			wantIDs := func(id int) string { s := strconv.Itoa(id); return s + " " + s + " " + s + " " + s }
			if uids != wantIDs(uid) || gids != wantIDs(gid) {
				t.Fatalf("/proc/%d/status: Uid %q Gid %q, want all %d and %d", pid, uids, gids, uid, gid)
			}
			if groups != strconv.Itoa(extra) {
				t.Errorf("/proc/%d/status: Groups %q, want only the user's extra group %d (none of root's)", pid, groups, extra)
			}
			for _, p := range []string{probe, ck, filepath.Dir(ck)} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
					t.Errorf("%s belongs to uid %d, want the rank's user %d", p, st.Uid, uid)
				}
			}
			eventually(t, "the rank's first line in its log", 10*time.Second, func() bool {
				b, _ := os.ReadFile(logPath(e.dir, "as-user", 0))
				return strings.Contains(string(b), "user="+u.Username+" home=/nonexistent pwd=/\n")
			})
		})
	}
}

// TestRootRanksRefused: nodemon started without --allow-root-ranks refuses
// every launch whose ranks would run as root, and starts nothing; with it,
// a job that names no user runs as nodemon's own user, root.
func TestRootRanksRefused(t *testing.T) {
	requireRoot(t)
	u, _ := throwawayUser(t)
	closed := filepath.Join(t.TempDir(), "ck") // under a 0700 dir of root's
	taken := openDir(t)                        // exists, root's, 0755
	job := func(user, group, ck string) *api.LaunchRanks {
		l := sleepJob("j", 1, 0)
		l.RunAsUser, l.RunAsGroup, l.CheckpointDir = user, group, ck
		return l
	}
	tests := []struct {
		name string
		l    *api.LaunchRanks
		want string
	}{
		{"no user named", job("", "", ""), "would run as root (the job names no user, and nodemon runs as root"},
		{"user root", job("root", "", ""), "user root (uid 0, gid 0) is root"},
		{"uid 0", job("0", "", ""), "user root (uid 0, gid 0) is root"},
		{"group root", job(u.Username, "root", ""), "in group root"},
		{"group without user", job("", "wheel", ""), "names a group but no user"},
		{"unknown user", job("gpuctl-no-such-user", "", ""), "no such user on this host"},
		{"unknown group", job(u.Username, "gpuctl-no-such-group", ""), "no such group"},
		{"checkpoint dir behind a closed dir", job(u.Username, "", filepath.Join(closed, "job")), "cannot pass through"},
		{"checkpoint dir of another user", job(u.Username, "", taken), "cannot write " + taken},
		{"relative checkpoint dir", job(u.Username, "", "ckpt"), "not an absolute path"},
	}
	// Root ranks are this node's policy (another node may allow them): the
	// job runs elsewhere. The rest is the job's fault on any node.
	nodePolicy := map[string]bool{"no user named": true, "user root": true, "uid 0": true, "group root": true}
	e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.AllowRootRanks = false })
	os.MkdirAll(closed, 0o700)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.x.Launch(tc.l)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("launch: %v, want a refusal containing %q", err, tc.want)
			}
			var nr *NodeRefusal
			var je *JobError
			if errors.As(err, &nr) != nodePolicy[tc.name] || errors.As(err, &je) == nodePolicy[tc.name] {
				t.Errorf("node's refusal %v, job's %v; want the node's only for a root refusal", errors.As(err, &nr), errors.As(err, &je))
			}
			t.Logf("refusal as reported: %v", err)
			if got := e.x.GPUProcesses(); len(got) != 0 {
				t.Fatalf("a refused launch started ranks: %v", got)
			}
		})
	}
	if fi, _ := os.Stat(taken); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatal("a refused launch chowned a directory that existed")
	}

	allowed := newTestExecutor(t, "", func(o *ExecutorOptions) { o.AllowRootRanks = true })
	if err := allowed.x.Launch(job("", "", "")); err != nil {
		t.Fatalf("launch with --allow-root-ranks: %v", err)
	}
	pid := rankPID(t, allowed.x, "j", 0)
	killOnCleanup(t, pid)
	if uids, _, _ := procStatus(t, pid); uids != "0 0 0 0" {
		t.Fatalf("rank Uid %q, want root's", uids)
	}
}
