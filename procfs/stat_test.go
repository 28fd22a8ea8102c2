package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// statLine builds a /proc/PID/stat line with the fields gpuctl reads; the
// others are 0.
func statLine(pid int, comm, state string, utime, stime, start uint64, rss int64) string {
	f := make([]string, 52)
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[2] = fmt.Sprint(pid), "("+comm+")", state
	f[3], f[4] = "1", fmt.Sprint(pid)
	f[13], f[14] = fmt.Sprint(utime), fmt.Sprint(stime)
	f[21] = fmt.Sprint(start)
	f[23] = fmt.Sprint(rss)
	return strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	// Field layout of proc(5): pid (comm) state ppid pgrp session tty tpgid
	// flags minflt cminflt majflt cmajflt utime stime cutime cstime prio
	// nice threads itreal starttime vsize rss …
	short := "4242 (abc) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 424242 1000 10 18446744073709551615"
	tests := []struct {
		name    string
		in      string
		want    Stat
		wantErr string
	}{
		{"running", statLine(4242, "ringtrain", "R", 250, 50, 9000, 300),
			Stat{PID: 4242, State: "R", PPID: 1, PGRP: 4242, UTime: 250, STime: 50, StartTicks: 9000, RSSPages: 300}, ""},
		{"name with spaces and parens", statLine(7, "a) (b c", "S", 1, 2, 3, 4),
			Stat{PID: 7, State: "S", PPID: 1, PGRP: 7, UTime: 1, STime: 2, StartTicks: 3, RSSPages: 4}, ""},
		{"zombie", statLine(7, "sh", "Z", 0, 0, 5, 0), Stat{PID: 7, State: "Z", PPID: 1, PGRP: 7, StartTicks: 5}, ""},
		{"negative rss", statLine(7, "x", "R", 1, 1, 5, -1), Stat{PID: 7, State: "R", PPID: 1, PGRP: 7, UTime: 1, STime: 1, StartTicks: 5}, ""},
		{"just enough fields", short, Stat{PID: 4242, State: "S", PPID: 1, PGRP: 4242, UTime: 5, STime: 6, StartTicks: 424242, RSSPages: 10}, ""},
		{"real kernel line", "1 (systemd) S 0 1 1 0 -1 4194560 50012 2938451 112 1417 122 269 6213 2384 20 0 1 0 27 22577152 3184 18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			Stat{PID: 1, State: "S", PGRP: 1, UTime: 122, STime: 269, StartTicks: 27, RSSPages: 3184}, ""},
		{"empty", "", Stat{}, "no (comm)"},
		{"no paren", "1 systemd S 0", Stat{}, "no (comm)"},
		{"no closing paren", "12 (abc S 1", Stat{}, "no (comm)"},
		{"bad pid", "x (abc) S 1 1 1", Stat{}, "bad pid"},
		{"truncated", "12 (abc) S 1 1 1 0", Stat{}, "fields after the name"},
		{"bad utime", strings.Replace(statLine(3, "c", "R", 1, 2, 3, 4), " 1 2 0 0 0", " x 2 0 0 0", 1), Stat{}, "field 14"},
		{"bad rss", strings.Replace(statLine(3, "c", "R", 1, 2, 3, 4), " 0 4 0", " 0 q 0", 1), Stat{}, "rss"},
		{"two-letter state", statLine(3, "c", "RS", 1, 2, 3, 4), Stat{}, "not one letter"},
		{"NUL state", statLine(3, "c", "\x00", 1, 2, 3, 4), Stat{}, "not one letter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if s := (Stat{UTime: 250, STime: 50}); s.CPUSeconds() != 3 {
		t.Fatalf("CPUSeconds = %v, want 3", s.CPUSeconds())
	}
	for state, exited := range map[string]bool{"R": false, "S": false, "T": false, "Z": true, "X": true} {
		if (Stat{State: state}).Exited() != exited {
			t.Errorf("Exited(%s) != %v", state, exited)
		}
	}
}

func TestReadStatOfThisProcess(t *testing.T) {
	s, err := ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.StartTicks == 0 || s.RSSPages == 0 || !strings.Contains("RS", s.State) {
		t.Fatalf("own stat = %+v", s)
	}
	if _, err := ReadStat("/proc", 1<<30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("stat of a pid that cannot exist: %v, want ErrNoProcess", err)
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte(statLine(42, "rank", "R", 150, 50, 9000, 300)))
	f.Add([]byte(statLine(7, "a) (b c", "S", 1, 2, 3, 4)))
	f.Add([]byte("77 (a ) b) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 1\n"))
	f.Add([]byte("1 (x"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStat(b)
		if err != nil {
			return
		}
		if s.PID <= 0 || len(s.State) != 1 || s.State[0] < 'A' || !bytes.Contains(b, []byte(")")) {
			t.Fatalf("accepted %q as %+v", b, s)
		}
	})
}
