package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestLeaseClockCountsFromTheAnsweredHeartbeat(t *testing.T) {
	c := newLeaseClock()
	t0 := time.Unix(1000, 0)
	for seq := uint64(1); seq <= leaseClockKeep+10; seq++ {
		c.sentAt(seq, t0.Add(time.Duration(seq)*time.Second))
	}
	tests := []struct {
		name   string
		seq    uint64
		lease  time.Duration
		want   time.Time
		wantOK bool
	}{
		// From when the node sent it: never later than the server reckons
		// (it heard the heartbeat after it was sent).
		{"latest heartbeat", leaseClockKeep + 10, 5 * time.Second, t0.Add((leaseClockKeep + 15) * time.Second), true},
		{"an older one still kept", 20, 5 * time.Second, t0.Add(25 * time.Second), true},
		{"forgotten: too old", 1, 5 * time.Second, time.Time{}, false},
		{"never sent (an earlier session's)", 9999, 5 * time.Second, time.Time{}, false},
		{"no lease", 20, 0, time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := c.deadline(tc.seq, tc.lease)
			if ok != tc.wantOK || !got.Equal(tc.want) {
				t.Errorf("deadline(%d, %s) = %v, %v; want %v, %v", tc.seq, tc.lease, got, ok, tc.want, tc.wantOK)
			}
		})
	}
	c.reset()
	if _, ok := c.deadline(leaseClockKeep+10, time.Second); ok {
		t.Error("a new session answers heartbeats of the old one")
	}
}

func TestLeaseWatchExpiry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lease-1")
	now := time.Unix(2000, 0)
	w := &leaseWatch{path: path}
	if w.expired(now); w.readErr == nil {
		t.Fatal("a missing lease file read without error")
	}
	steps := []struct {
		name  string
		write string // "" leaves the file as it is
		at    time.Time
		want  bool
	}{
		{"before the deadline", "2005000000000", now, false},
		{"just past it", "", now.Add(5*time.Second + time.Nanosecond), true},
		{"renewed", "2010000000000", now.Add(6 * time.Second), false},
		// Only nodemon extends a lease; a file that turns unreadable keeps
		// the last deadline, it does not lift it.
		{"garbage keeps the old deadline", "soon", now.Add(9 * time.Second), false},
		{"and it still runs out", "", now.Add(11 * time.Second), true},
		{"an earlier deadline does not shorten it", "2001000000000", now.Add(9 * time.Second), false},
	}
	for _, s := range steps {
		if s.write != "" {
			if err := os.WriteFile(path, []byte(s.write), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := w.expired(s.at); got != s.want {
			t.Errorf("%s: expired = %v, want %v (deadline %v)", s.name, got, s.want, w.deadline)
		}
	}
}

// TestShimStopsRankWhenLeaseRunsOut runs real ranks under the shim with a
// lease nobody renews: each is stopped (SIGTERM, then SIGKILL for the one
// that ignores it) once the lease passes, the exit says why, and a rank
// whose lease is renewed runs on.
func TestShimStopsRankWhenLeaseRunsOut(t *testing.T) {
	e := newTestExecutor(t, "")
	e.x.BeginLease(time.Second, time.Now())
	start := time.Now()
	polite := sleepJob("polite", 1, 0)
	stubborn := &api.LaunchRanks{Job: "stubborn", Attempt: 1, Command: []string{"/bin/sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"},
		Ranks: []*api.RankSpec{{Rank: 0}}}
	for _, l := range []*api.LaunchRanks{polite, stubborn} {
		if err := e.x.Launch(l); err != nil {
			t.Fatal(err)
		}
		killOnCleanup(t, rankPID(t, e.x, l.GetJob(), 0))
	}
	for _, job := range []string{"polite", "stubborn"} {
		ev := e.events.waitFor(t, job+" stopped by its lease", isExit(job, 0))
		took := time.Since(start)
		if ev.GetSignal() != LeaseSignal || !strings.Contains(ev.GetAttrs()["fenced"], "lease expired") {
			t.Errorf("%s: exit %v, want signal %s with the reason", job, ev, LeaseSignal)
		}
		if took < time.Second || took > time.Second+leaseGrace+2*time.Second {
			t.Errorf("%s stopped %s after launch with a 1 s lease", job, took.Round(time.Millisecond))
		}
		if alive(ev.GetPid()) {
			t.Errorf("%s: rank pid %d alive after its exit was reported", job, ev.GetPid())
		}
		t.Logf("%s stopped %.2fs after launch (lease 1 s): %s", job, took.Seconds(), ev.GetMessage())
	}
	out, _ := os.ReadFile(logPath(e.dir, "stubborn", 0))
	if !strings.Contains(string(out), "stopped by its shim: lease expired") {
		t.Errorf("stubborn rank's log lacks the shim's reason:\n%s", out)
	}

	// Renewed every 200 ms, a rank outlives several leases.
	if err := e.x.Launch(sleepJob("renewed", 1, 0)); err != nil {
		t.Fatal(err)
	}
	pid := rankPID(t, e.x, "renewed", 0)
	killOnCleanup(t, pid)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		e.x.RenewLeases(time.Now().Add(time.Second))
	}
	if !alive(uint32(pid)) {
		t.Fatal("a rank whose lease was renewed was stopped")
	}
}

// TestFenceKillsOnlyTheSupersededAttempt fences attempt 1 of a job while
// another job runs: attempt 1's ranks are killed and listed, the other job
// is untouched, and a fenced rank's lease is never renewed.
func TestFenceKillsOnlyTheSupersededAttempt(t *testing.T) {
	e := newTestExecutor(t, "")
	e.x.BeginLease(time.Minute, time.Now())
	for _, l := range []*api.LaunchRanks{sleepJob("old", 1, 0, 1), sleepJob("other", 3, 0)} {
		if err := e.x.Launch(l); err != nil {
			t.Fatal(err)
		}
	}
	other := rankPID(t, e.x, "other", 0)
	killOnCleanup(t, other)
	if _, err := e.x.Fence(&api.SignalRanks{Job: "old", Attempt: 2, Signal: "SIGKILL", Fence: true}); err != nil {
		t.Fatal(err)
	}
	if n := len(e.events.match(isExit("old", 0))); n != 0 {
		t.Fatal("a fence of attempt 2 killed attempt 1")
	}
	killed, err := e.x.Fence(&api.SignalRanks{Job: "old", Attempt: 1, Signal: "SIGKILL", Fence: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 2 {
		t.Fatalf("fence killed %v, want ranks 0 and 1", killed)
	}
	for _, rk := range killed {
		if alive(rk.GetPid()) {
			t.Errorf("rank %d (pid %d) alive after the fence answered", rk.GetRank(), rk.GetPid())
		}
	}
	if !alive(uint32(other)) {
		t.Error("the fence killed another job's rank")
	}
	// Once no rank of attempt 1 runs, its lease file goes; a running
	// attempt's stays.
	for _, r := range []int32{0, 1} {
		e.events.waitFor(t, "old rank exit", isExit("old", r))
	}
	gone := e.x.leasePath("old", 1)
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(gone); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("lease file %s still there after attempt 1 ended", gone)
		}
	}
	if _, err := os.Stat(e.x.leasePath("other", 3)); err != nil {
		t.Errorf("the running attempt's lease file: %v", err)
	}
}

func alive(pid uint32) bool {
	if pid == 0 {
		return false
	}
	if err := syscall.Kill(int(pid), 0); err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "stat"))
	// A zombie is dead, only not yet reaped.
	return err == nil && !strings.Contains(string(b), ") Z ")
}

// TestLeftoverLeaseFilesAreCleaned: a restarted nodemon removes the lease
// files of attempts that have no rank left here (one whose rank was
// killed while nodemon was down, one an older nodemon left behind), and
// keeps those of the ranks it adopts.
func TestLeftoverLeaseFilesAreCleaned(t *testing.T) {
	dir := t.TempDir()
	first := newTestExecutor(t, dir)
	first.x.BeginLease(time.Minute, time.Now())
	for _, l := range []*api.LaunchRanks{sleepJob("kept", 2, 0), sleepJob("gone", 1, 1)} {
		if err := first.x.Launch(l); err != nil {
			t.Fatal(err)
		}
	}
	kept, gone := rankRec(t, first.x, "kept", 0), rankRec(t, first.x, "gone", 1)
	killOnCleanup(t, kept.PID)
	killOnCleanup(t, gone.PID)
	run := filepath.Join(dir, "run")
	older := filepath.Join(run, "older", "lease-7")
	if err := os.MkdirAll(filepath.Dir(older), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeLease(older, time.Now()); err != nil {
		t.Fatal(err)
	}
	crash(first)
	syscall.Kill(-gone.PID, syscall.SIGKILL)
	eventually(t, "the killed rank's shim gone", 10*time.Second, func() bool {
		return !processAlive("/proc", gone.ShimPID, gone.ShimStartTicks)
	})
	for _, f := range []string{"kept/lease-2", "gone/lease-1"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Fatalf("before the restart: %v", err)
		}
	}

	newTestExecutor(t, dir)
	if _, err := os.Stat(filepath.Join(run, "kept", "lease-2")); err != nil {
		t.Errorf("the adopted rank's lease file: %v", err)
	}
	for _, f := range []string{"gone/lease-1", "older/lease-7"} {
		if _, err := os.Stat(filepath.Join(run, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the restart: %v, want it removed", f, err)
		}
	}
}
