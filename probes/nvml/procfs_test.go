package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// statLine builds a /proc/<pid>/stat line with the given times and RSS.
func statLine(pid int, comm string, state byte, utime, stime, start uint64, rss int64) string {
	f := make([]string, 52)
	for i := range f {
		f[i] = "0"
	}
	f[0] = fmt.Sprint(pid)
	f[1] = "(" + comm + ")"
	f[2] = string(state)
	f[13], f[14] = fmt.Sprint(utime), fmt.Sprint(stime)
	f[21] = fmt.Sprint(start)
	f[23] = fmt.Sprint(rss)
	return strings.Join(f, " ") + "\n"
}

func TestParseIO(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procIO
		wantErr bool
	}{
		{"full", "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 30\nwrite_bytes: 40\ncancelled_write_bytes: 0\n", procIO{10, 20, 30, 40}, false},
		{"no trailing newline", "rchar: 1\nwchar: 2", procIO{rchar: 1, wchar: 2}, false},
		{"blank lines", "\nrchar: 5\n\n", procIO{rchar: 5}, false},
		{"bad number", "rchar: x\n", procIO{}, true},
		{"no colon", "rchar 5\n", procIO{}, true},
		{"empty", "", procIO{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseIO([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseIO: err %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("parseIO = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadProcSelf(t *testing.T) {
	st, _, _, err := readProc("/proc", uint32(os.Getpid()), make([]byte, 16))
	if err != nil {
		t.Fatalf("read own /proc entry: %v", err)
	}
	if st.State == "" || st.StartTicks == 0 || st.RSSPages == 0 {
		t.Errorf("own stat looks empty: %+v", st)
	}
	if _, _, _, err := readProc(t.TempDir(), 1, nil); err == nil {
		t.Error("reading a missing process succeeded")
	}
	dir := filepath.Join(t.TempDir(), "9")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(statLine(9, "z", 'Z', 0, 0, 1, 0)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := readProc(filepath.Dir(dir), 9, nil); err != errZombie {
		t.Errorf("zombie: err %v, want errZombie", err)
	}
}

func FuzzParseIO(f *testing.F) {
	f.Add([]byte("rchar: 10\nwchar: 20\nread_bytes: 30\nwrite_bytes: 40\n"))
	f.Add([]byte("rchar:\n"))
	f.Add([]byte(":::"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseIO(b)
	})
}
