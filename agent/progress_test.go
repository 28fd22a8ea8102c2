package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// TestProcessAliveTellsReusedPIDs: processAlive matches the start time.
func TestProcessAliveTellsReusedPIDs(t *testing.T) {
	s, err := procfs.ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.StartTicks == 0 || !strings.Contains("RS", s.State) {
		t.Fatalf("own stat = %+v", s)
	}
	if !processAlive("/proc", os.Getpid(), s.StartTicks) || processAlive("/proc", os.Getpid(), s.StartTicks+1) {
		t.Fatal("processAlive does not tell this process from a reused pid")
	}
	if _, err := procfs.ReadStat("/proc", 1<<30); err == nil {
		t.Fatal("stat of a pid that cannot exist succeeded")
	}
}

func TestLogParser(t *testing.T) {
	tests := []struct {
		name     string
		chunks   []string
		step     int64
		lastCkpt int64
		seconds  map[int64]float64
	}{
		{"nothing", nil, -1, -1, map[int64]float64{}},
		{"steps", []string{"start rank=0 world=1\nstep 1 loss=0.5 step_ms=3\nstep 2 loss=0.4 step_ms=3\n"}, 2, -1, map[int64]float64{}},
		{"line split across reads", []string{"step 4", "1 loss=0.1 step_ms=1", "0\n"}, 41, -1, map[int64]float64{}},
		{"partial line not taken yet", []string{"step 7 loss=1\nstep 8 lo"}, 7, -1, map[int64]float64{}},
		{"checkpoint", []string{"step 10 loss=1\ncheckpoint step=10 bytes=1048640 seconds=0.012\n"}, 10, 10, map[int64]float64{10: 0.012}},
		{"checkpoint split", []string{"checkpoint step=2", "0 bytes=1 seconds=1.5\r\n"}, -1, 20, map[int64]float64{20: 1.5}},
		{"checkpoint without seconds", []string{"checkpoint step=3 bytes=1\n"}, -1, 3, map[int64]float64{3: 0}},
		{"garbage ignored", []string{"step\nstep x\nstep -3\ncheckpoint step=x\ncheckpoint\nstepper 9\nresume step=5 source=latest\n"}, -1, -1, map[int64]float64{}},
		{"stderr noise between", []string{"step 5 loss=1\nringtrain rank 0 (j): warning\nstep 6 loss=1\n"}, 6, -1, map[int64]float64{}},
		{"overlong line skipped", []string{"step 1 x\n", strings.Repeat("y", maxLogLine+10), "step 99\nstep 2 x\n"}, 2, -1, map[int64]float64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newLogParser()
			now := time.Unix(100, 0)
			for _, c := range tc.chunks {
				p.feed([]byte(c), now)
			}
			if p.step != tc.step || p.lastCkpt != tc.lastCkpt {
				t.Fatalf("step %d, last checkpoint %d; want %d, %d", p.step, p.lastCkpt, tc.step, tc.lastCkpt)
			}
			if tc.step >= 0 && !p.stepAt.Equal(now) {
				t.Fatalf("step seen at %v, want %v", p.stepAt, now)
			}
			if fmt.Sprint(p.ckptSeconds) != fmt.Sprint(tc.seconds) {
				t.Fatalf("checkpoint seconds %v, want %v", p.ckptSeconds, tc.seconds)
			}
		})
	}
}

func TestLogParserKeepsFewCheckpoints(t *testing.T) {
	p := newLogParser()
	for i := range 200 {
		p.feed(fmt.Appendf(nil, "checkpoint step=%d bytes=1 seconds=1\n", i), time.Now())
	}
	if len(p.ckptSeconds) > 64 {
		t.Fatalf("%d checkpoint steps kept, want at most 64", len(p.ckptSeconds))
	}
	if _, ok := p.ckptSeconds[199]; !ok {
		t.Fatal("newest checkpoint dropped")
	}
}

func FuzzLogParser(f *testing.F) {
	f.Add([]byte("step 1 loss=1 step_ms=2\ncheckpoint step=1 bytes=2 seconds=0.5\n"), 3)
	f.Add([]byte("checkpoint step=9 seconds=NaN\nstep 99999999999999999999\n"), 1)
	f.Add([]byte("resume step=4 source=latest\nstop step=4 reason=signal\n"), 7)
	f.Fuzz(func(t *testing.T, b []byte, split int) {
		// However the output is cut into reads, the parse is the same.
		whole := newLogParser()
		whole.feed(b, time.Unix(1, 0))
		cut := newLogParser()
		if split < 1 {
			split = 1
		}
		for i := 0; i < len(b); i += split {
			cut.feed(b[i:min(len(b), i+split)], time.Unix(1, 0))
		}
		if whole.step != cut.step || whole.lastCkpt != cut.lastCkpt || len(whole.ckptSeconds) != len(cut.ckptSeconds) {
			t.Fatalf("whole: step %d ckpt %d; in %d-byte reads: step %d ckpt %d", whole.step, whole.lastCkpt, split, cut.step, cut.lastCkpt)
		}
		for s, v := range whole.ckptSeconds {
			if v < 0 || v != v {
				t.Fatalf("checkpoint %d seconds %v", s, v)
			}
		}
		if len(whole.partial) > maxLogLine {
			t.Fatalf("partial line of %d bytes kept", len(whole.partial))
		}
	})
}

func TestLogTailFollowsRotationAndTruncation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank-0.log")
	appendTo := func(s string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	appendTo("step 100 from an earlier attempt\n")
	tail := openLogTail(path)
	t.Cleanup(tail.close)
	p := newLogParser()
	poll := func(want int64) {
		t.Helper()
		if err := tail.poll(p, time.Now()); err != nil {
			t.Fatal(err)
		}
		if p.step != want {
			t.Fatalf("step %d, want %d", p.step, want)
		}
	}
	poll(-1) // what was there before is not this rank's
	appendTo("step 1 x\nstep 2")
	poll(1)
	appendTo(" x\n")
	poll(2)
	// Rotated: the rest of the old file, then the new one from its start.
	appendTo("step 3 x\n")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	poll(3)
	appendTo("step 4 x\n")
	poll(4)
	// Truncated in place (copytruncate).
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendTo("step 5\n")
	poll(5)
	// Gone between rotation's rename and the new file: nothing, no error.
	os.Remove(path)
	poll(5)
	appendTo("step 6\n")
	poll(6)
}

func TestRotatingWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rank-0.log")
	w, err := openRotating(path, 100, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	chunk := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 40) }
	for i := range 10 {
		w.Write(chunk(i))
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	// 40-byte writes into 100-byte files: two per file; ten writes leave
	// the newest two in the log and 3 rotated files, the oldest dropped.
	want := map[string]string{
		"rank-0.log":   string(chunk(8)) + string(chunk(9)),
		"rank-0.log.1": string(chunk(6)) + string(chunk(7)),
		"rank-0.log.2": string(chunk(4)) + string(chunk(5)),
		"rank-0.log.3": string(chunk(2)) + string(chunk(3)),
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != len(want) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("files %v, want %d", names, len(want))
	}
	for name, content := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != content {
			t.Fatalf("%s = %q (err %v), want %q", name, b, err, content)
		}
	}
	// Lines stay whole across files; a line longer than the limit is cut.
	w.Write([]byte("line one\nline two\n" + strings.Repeat("z", 250)))
	for name, content := range map[string]string{
		"rank-0.log.3": string(chunk(8)) + string(chunk(9)) + "line one\nline two\n",
		"rank-0.log.2": strings.Repeat("z", 100),
		"rank-0.log.1": strings.Repeat("z", 100),
		"rank-0.log":   strings.Repeat("z", 50),
	} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != content {
			t.Fatalf("%s = %q, want %q", name, b, content)
		}
	}
	if _, err := openRotating(path, 0, 3, nil); err == nil {
		t.Fatal("a zero rotation size was accepted")
	}
}

func TestShimRotatesTheRankLog(t *testing.T) {
	e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.LogMaxBytes, o.LogKeep = 4096, 2 })
	l := &api.LaunchRanks{Job: "chatty", Attempt: 1, WorldSize: 1, Ranks: []*api.RankSpec{{Rank: 0}},
		Command: []string{"/bin/sh", "-c", `i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo "step $i loss=0.1 pad=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; done`}}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	if ev := e.events.waitFor(t, "exit", isExit("chatty", 0)); ev.ExitCode != 0 {
		t.Fatalf("exit = %v", ev)
	}
	path := logPath(e.dir, "chatty", 0)
	var all []byte
	for _, suffix := range []string{".2", ".1", ""} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 4096 {
			t.Fatalf("%s is %d bytes, over the 4096 limit", path+suffix, len(b))
		}
		all = append(all, b...)
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("a third rotated file exists with keep=2 (err %v)", err)
	}
	// The newest files hold the end of the output, unbroken.
	if !bytes.Contains(all, []byte("step 399 loss=0.1")) || !bytes.Contains(all, []byte("\nstep 400 loss=0.1 pad=")) {
		t.Fatalf("rotated logs lack the last steps:\n%s", all[max(0, len(all)-300):])
	}
}

func TestReadLogs(t *testing.T) {
	e := newTestExecutor(t, "")
	content := []byte("0123456789abcdefghij")
	if err := os.MkdirAll(filepath.Join(e.dir, "logs", "j"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logPath(e.dir, "j", 1), content, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		req      *api.ReadLogs
		want     string
		wantNext int64
		wantErr  string
	}{
		{"from start", &api.ReadLogs{Job: "j", Rank: 1, Offset: 0, MaxBytes: 5}, "01234", 5, ""},
		{"follow on", &api.ReadLogs{Job: "j", Rank: 1, Offset: 5, MaxBytes: 5}, "56789", 10, ""},
		{"to the end", &api.ReadLogs{Job: "j", Rank: 1, Offset: 15, MaxBytes: 100}, "fghij", 20, ""},
		{"max 0 reads up to the cap", &api.ReadLogs{Job: "j", Rank: 1}, string(content), 20, ""},
		{"tail", &api.ReadLogs{Job: "j", Rank: 1, Offset: -4, MaxBytes: 100}, "ghij", 20, ""},
		{"tail limited", &api.ReadLogs{Job: "j", Rank: 1, Offset: -10, MaxBytes: 3}, "abc", 13, ""},
		{"tail longer than the file", &api.ReadLogs{Job: "j", Rank: 1, Offset: -100, MaxBytes: 100}, string(content), 20, ""},
		{"at the end", &api.ReadLogs{Job: "j", Rank: 1, Offset: 20, MaxBytes: 10}, "", 20, ""},
		{"past the end", &api.ReadLogs{Job: "j", Rank: 1, Offset: 500, MaxBytes: 10}, "", 20, ""},
		{"unknown rank", &api.ReadLogs{Job: "j", Rank: 7}, "", 0, `job "j" has no rank 7 on node node-a`},
		{"unknown job", &api.ReadLogs{Job: "nope", Rank: 0}, "", 0, `job "nope" has no rank 0`},
		{"job escaping the log dir", &api.ReadLogs{Job: "../../etc", Rank: 0}, "", 0, "job name"},
		{"no job", &api.ReadLogs{Rank: 0}, "", 0, "job name is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, next, err := e.x.ReadLogs(tc.req)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != tc.want || next != tc.wantNext {
				t.Fatalf("got %q next %d, want %q next %d", data, next, tc.want, tc.wantNext)
			}
		})
	}
}

func TestReadLogsCapsAtOneMiB(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxReadLogsBytes+5000)
	data, next, err := readRange(bytes.NewReader(big), int64(len(big)), 0, 1<<31)
	if err != nil || len(data) != MaxReadLogsBytes || next != MaxReadLogsBytes {
		t.Fatalf("read %d bytes next %d (err %v), want the 1 MiB cap", len(data), next, err)
	}
}

func TestLogTailCatchUpAfterAdoption(t *testing.T) {
	tests := []struct {
		name     string
		log      string
		step     int64
		lastCkpt int64
	}{
		{"from the rank's start line", "step 900 old attempt\ngpuctl: rank 0 of job j (attempt 2) started: pid 42: ringtrain\nstep 5 x\ncheckpoint step=5 bytes=1 seconds=0.5\nstep 6 x\n", 6, 5},
		{"an earlier pid's start line is not it", "gpuctl: rank 0 of job j (attempt 1) started: pid 41: x\nstep 900 old\ngpuctl: rank 0 of job j (attempt 2) started: pid 42: x\n", -1, -1},
		{"no start line in a short log", "step 7 x\n", 7, -1},
		{"partial last line waits", "gpuctl: rank 0 of job j (attempt 2) started: pid 42: x\nstep 8 x\nstep 9", 8, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0.log")
			os.WriteFile(path, []byte(tc.log), 0o644)
			tail := openLogTail(path)
			t.Cleanup(tail.close)
			p := newLogParser()
			if err := tail.catchUp(p, 42, time.Now()); err != nil {
				t.Fatal(err)
			}
			if p.step != tc.step || p.lastCkpt != tc.lastCkpt {
				t.Fatalf("step %d, checkpoint %d; want %d, %d", p.step, p.lastCkpt, tc.step, tc.lastCkpt)
			}
			os.WriteFile(path, append([]byte(tc.log), " x\nstep 10 x\n"...), 0o644)
			tail.poll(p, time.Now())
			if p.step != 10 {
				t.Fatalf("after catching up, the next poll reads step %d, want 10", p.step)
			}
		})
	}
}
