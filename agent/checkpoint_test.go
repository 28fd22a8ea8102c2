package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func isCheckpoint(e *api.Event) bool { return e.Kind == api.EventKind_EVENT_KIND_CHECKPOINT }

func TestCheckpointWatcherOnFakeDir(t *testing.T) {
	e := newTestExecutor(t, "")
	ck := t.TempDir()
	logf := filepath.Join(t.TempDir(), "rank-0.log")
	if err := os.WriteFile(logf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	say := func(line string) {
		f, _ := os.OpenFile(logf, os.O_WRONLY|os.O_APPEND, 0)
		f.WriteString(line + "\n")
		f.Close()
	}
	// save writes step-N/ as two ranks would, then moves the marker.
	save := func(step int64, bytesPerRank int) {
		dir := filepath.Join(ck, fmt.Sprintf("step-%d", step))
		os.MkdirAll(dir, 0o755)
		for r := range 2 {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.bin", r)), make([]byte, bytesPerRank), 0o644)
		}
		os.WriteFile(filepath.Join(ck, "latest"), []byte(strconv.FormatInt(step, 10)), 0o644)
	}
	p0 := &rankProc{rec: rankRecord{Job: "ck", Attempt: 2, LogPath: logf, CheckpointDir: ck, CheckpointReported: -1},
		done: make(chan struct{}), tail: openLogTail(logf), parser: newLogParser()}
	t.Cleanup(p0.tail.close)
	w := newCkptWatch(ck, readMarker(ck))
	now := time.Unix(1000, 0)
	check := func(final bool, want ...int64) []*api.Event {
		t.Helper()
		before := len(e.events.match(isCheckpoint))
		onOwner(t, e.x, func() { e.x.checkCheckpoint("ck", w, p0, now, final) })
		got := e.events.match(isCheckpoint)[before:]
		var steps []int64
		for _, ev := range got {
			steps = append(steps, ev.Step)
		}
		if fmt.Sprint(steps) != fmt.Sprint(want) {
			t.Fatalf("checkpoints reported %v, want %v", steps, want)
		}
		return got
	}

	check(false) // no marker yet
	save(10, 1000)
	say("step 10 loss=1")
	say("checkpoint step=10 bytes=1000 seconds=0.250")
	ev := check(false, 10)[0]
	if ev.Bytes != 2000 || ev.Seconds != 0.25 || ev.Job != "ck" || ev.Rank != 0 || ev.Attrs["attempt"] != "2" ||
		ev.Attrs["dir"] != filepath.Join(ck, "step-10") {
		t.Fatalf("checkpoint event = %v", ev)
	}
	check(false) // reported once

	// The marker moved but rank 0 has not printed its line yet: wait for
	// it a while, then report without the seconds.
	save(20, 10)
	check(false)
	now = now.Add(time.Second)
	check(false)
	now = now.Add(ckptLineGrace)
	if ev := check(false, 20)[0]; ev.Seconds != 0 || ev.Bytes != 20 {
		t.Fatalf("checkpoint event without its line = %v", ev)
	}
	say("checkpoint step=20 bytes=10 seconds=9") // late: not reported again
	check(false)

	// Two checkpoints between polls: both reported, in order.
	save(30, 1)
	say("checkpoint step=30 bytes=1 seconds=0.5")
	save(40, 1)
	say("checkpoint step=40 bytes=1 seconds=0.75")
	got := check(false, 30, 40)
	if got[0].Seconds != 0.5 || got[1].Seconds != 0.75 {
		t.Fatalf("seconds %v and %v, want 0.5 and 0.75", got[0].Seconds, got[1].Seconds)
	}

	// Rank 0 is gone: its log is complete, nothing to wait for.
	save(50, 1)
	check(true, 50)
	if p0.rec.CheckpointReported != 50 {
		t.Fatalf("reported step kept as %d, want 50", p0.rec.CheckpointReported)
	}

	// The marker carries the attempt that committed it: this attempt's
	// own is reported, a newer attempt's (elsewhere) is not this rank's.
	os.MkdirAll(filepath.Join(ck, "step-55"), 0o755)
	os.WriteFile(filepath.Join(ck, "latest"), []byte("55 attempt=2\n"), 0o644)
	check(true, 55)
	os.MkdirAll(filepath.Join(ck, "step-60"), 0o755)
	os.WriteFile(filepath.Join(ck, "latest"), []byte("60 attempt=3\n"), 0o644)
	check(true)

	// A new watch starts from the marker: the checkpoint resumed from is
	// not news.
	w = newCkptWatch(ck, readMarker(ck))
	check(true)
	// A marker that is not a number is not a checkpoint.
	os.WriteFile(filepath.Join(ck, "latest"), []byte("soon"), 0o644)
	check(true)
}

func TestParseMarker(t *testing.T) {
	tests := []struct {
		content string
		want    int64
		attempt uint32
		wantErr bool
	}{
		{"12", 12, 0, false}, {"12\n", 12, 0, false}, {" 7 ", 7, 0, false}, {"", -1, 0, true}, {"-3", -1, 0, true}, {"x", -1, 0, true},
		{"40 attempt=2\n", 40, 2, false}, {"40 attempt=0", -1, 0, true}, {"40 attempt=", -1, 0, true},
		{"40 epoch=2", -1, 0, true}, {"40 attempt=2 x", -1, 0, true}, {"40 attempt=-1", -1, 0, true}, {"+40", -1, 0, true},
	}
	for _, tc := range tests {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "latest"), []byte(tc.content), 0o644)
		got, err := parseMarker(dir)
		if got.step != tc.want || got.attempt != tc.attempt || (err != nil) != tc.wantErr {
			t.Errorf("marker %q: %+v, %v; want step %d attempt %d, error %v", tc.content, got, err, tc.want, tc.attempt, tc.wantErr)
		}
	}
	if got := readMarker(t.TempDir()); got != -1 {
		t.Errorf("no marker: %d, want -1", got)
	}
}

var ckptLine = regexp.MustCompile(`(?m)^checkpoint step=(\d+) bytes=\d+ seconds=([0-9.]+)$`)

// TestRingtrainProgressCheckpointsAndAdoption runs the reference trainer
// as a one-rank job: its steps and checkpoints are followed, a nodemon
// crash and restart adopts it without restarting it, and its clean stop
// is reported once with its real exit status.
var stepLineRE = regexp.MustCompile(`(?m)^step (\d+) `)

func TestRingtrainProgressCheckpointsAndAdoption(t *testing.T) {
	bin := ringtrain(t)
	dir := t.TempDir()
	ck := filepath.Join(t.TempDir(), "ckpt")
	first := newTestExecutor(t, dir)
	l := &api.LaunchRanks{Job: "rt", Attempt: 1, WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: freePort(t),
		Command:       []string{bin, "--compute-ms", "20", "--bytes", "4K", "--state-bytes", "64K", "--ckpt-interval", "10"},
		Env:           map[string]string{"GPUCTL_NCCL_TIMEOUT_S": "30"},
		CheckpointDir: ck, Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{0}}}}
	if err := first.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	pid := rankPID(t, first.x, "rt", 0)
	killOnCleanup(t, pid)
	eventually(t, "steps and CPU time in the rank's status", 20*time.Second, func() bool {
		st := first.x.RankStatuses()
		return len(st) == 1 && st[0].Step >= 3 && st[0].StepUnixNano > 0 && st[0].CpuSeconds > 0 &&
			strings.Contains("RS", st[0].ProcState) && st[0].Pid == uint32(pid)
	})
	first.events.waitFor(t, "checkpoint", func(e *api.Event) bool { return isCheckpoint(e) && e.Step == 10 })
	crash(first)

	second := newTestExecutor(t, dir)
	second.events.waitFor(t, "adoption", func(e *api.Event) bool { return e.Attrs["adopted"] == "true" && e.Pid == uint32(pid) })
	if err := second.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	if got := rankPID(t, second.x, "rt", 0); got != pid {
		t.Fatalf("rank pid %d after relaunch of the adopted attempt, want %d", got, pid)
	}
	second.events.waitFor(t, "checkpoint after adoption", func(e *api.Event) bool { return isCheckpoint(e) && e.Step == 30 })
	eventually(t, "the adopted rank's last checkpoint in its status", 10*time.Second, func() bool {
		st := second.x.RankStatuses()
		return len(st) == 1 && st[0].LastCheckpointStep >= 30
	})
	if err := second.x.Signal(&api.SignalRanks{Job: "rt", Signal: "SIGTERM"}); err != nil {
		t.Fatal(err)
	}
	exit := second.events.waitFor(t, "exit", isExit("rt", 0))
	if exit.ExitCode != 0 || exit.Signal != "" {
		t.Fatalf("exit after SIGTERM = %v, want a clean stop (code 0)", exit)
	}

	// Every checkpoint the rank printed was reported exactly once, by one
	// executor or the other, with the rank's own seconds and the bytes on
	// disk.
	var all []*api.Event
	all = append(all, first.events.match(isCheckpoint)...)
	all = append(all, second.events.match(isCheckpoint)...)
	out, _ := os.ReadFile(logPath(dir, "rt", 0))
	lines := ckptLine.FindAllStringSubmatch(string(out), -1)
	if len(lines) < 3 || len(all) != len(lines) {
		t.Fatalf("%d checkpoint events for %d checkpoint lines:\n%s", len(all), len(lines), out)
	}
	for i, m := range lines {
		step, _ := strconv.ParseInt(m[1], 10, 64)
		secs, _ := strconv.ParseFloat(m[2], 64)
		if all[i].Step != step || all[i].Seconds != secs || all[i].Bytes == 0 {
			t.Errorf("checkpoint %d: event step %d seconds %v bytes %d; log says step %d seconds %v",
				i, all[i].Step, all[i].Seconds, all[i].Bytes, step, secs)
		}
	}
	if n := len(first.events.match(isExit("rt", 0))) + len(second.events.match(isExit("rt", 0))); n != 1 {
		t.Fatalf("%d exit events, want 1", n)
	}
	// The exit carries the last step the rank printed.
	if steps := stepLineRE.FindAllStringSubmatch(string(out), -1); len(steps) == 0 {
		t.Fatalf("no step lines in the rank log:\n%s", out)
	} else if last, _ := strconv.ParseInt(steps[len(steps)-1][1], 10, 64); exit.Step != last {
		t.Errorf("exit event step %d, want the last printed step %d", exit.Step, last)
	}
}

// FuzzParseMarker: whatever a `latest` marker holds, parsing it either
// fails or gives a step and attempt that read back the same once written
// in the canonical form.
func FuzzParseMarker(f *testing.F) {
	for _, s := range []string{"12", "12\n", "40 attempt=2", "40 attempt=0", "-1", "x", "1 attempt=99999999999", "\t7\tattempt=3 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMarkerText(b)
		if err != nil {
			if m.step != -1 {
				t.Fatalf("%q: error %v with step %d", b, err, m.step)
			}
			return
		}
		if m.step < 0 {
			t.Fatalf("%q: step %d accepted", b, m.step)
		}
		canon := strconv.FormatInt(m.step, 10)
		if m.attempt > 0 {
			canon += " attempt=" + strconv.FormatUint(uint64(m.attempt), 10)
		}
		if again, err := parseMarkerText([]byte(canon)); err != nil || again != m {
			t.Fatalf("%q parsed as %+v, but its canonical form %q as %+v (%v)", b, m, canon, again, err)
		}
	})
}
