package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestRankLogsBelongToTheJobUser runs a rank as a throwaway user that
// writes past the rotation size: the job's log directory and every log
// file, the rotated ones too, are that user's and closed to others.
func TestRankLogsBelongToTheJobUser(t *testing.T) {
	requireRoot(t)
	u, _ := throwawayUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.AllowRootRanks, o.LogMaxBytes, o.LogKeep = false, 4096, 2 })
	line := strings.Repeat("x", 99)
	l := &api.LaunchRanks{Job: "private", Attempt: 1, RunAsUser: u.Username, WorldSize: 1,
		Command: []string{"/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do echo " + line + "; i=$((i+1)); done"},
		Ranks:   []*api.RankSpec{{Rank: 0}}}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	e.events.waitFor(t, "exit", isExit("private", 0))
	log := logPath(e.dir, "private", 0)
	check := func(path string, mode os.FileMode) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != mode || int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s: mode %v uid %d gid %d, want %v owned by %s (uid %d, gid %d)", path, fi.Mode().Perm(), st.Uid, st.Gid, mode, u.Username, uid, gid)
		}
	}
	check(filepath.Dir(log), 0o750)
	for _, p := range []string{log, log + ".1", log + ".2"} {
		check(p, 0o640)
	}
}

// TestRankLogHeaderEscapesTheCommand: gpuctl's own start line in a rank
// log carries the command escaped, so even a raw reading of the log shows
// no escape sequence under gpuctl's name.
func TestRankLogHeaderEscapesTheCommand(t *testing.T) {
	e := newTestExecutor(t, "")
	l := &api.LaunchRanks{Job: "hdr", Attempt: 1, WorldSize: 1,
		Command: []string{"/bin/sh", "-c", "exit 0", "\x1b]0;pwned\x07\x1b[2J\u202e"},
		Ranks:   []*api.RankSpec{{Rank: 0}}}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	e.events.waitFor(t, "exit", isExit("hdr", 0))
	b, err := os.ReadFile(logPath(e.dir, "hdr", 0))
	if err != nil {
		t.Fatal(err)
	}
	var header string
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, ") started: pid ") {
			header = ln
		}
	}
	if want := `exit 0 \x1b]0;pwned\x07\x1b[2J\u202e`; !strings.HasSuffix(header, want) {
		t.Fatalf("start line %q, want it to end in %q", header, want)
	}
}
