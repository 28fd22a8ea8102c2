package procfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFileOf: a library a container maps is found in its overlay's upper
// layer first, then its lower layers in order; a process whose root is no
// overlay is reached through /proc/PID/root.
func TestFileOf(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lowerLib := write("l 2/opt/libnccl.so.2")
	write("l1/opt/other.so")
	upperLib := write("up/opt/patched.so")
	write("l 2/opt/patched.so")
	proc := filepath.Join(dir, "proc")
	mountinfo := "2270 2255 0:223 / / rw,relatime master:1 - overlay overlay rw,lowerdir=" + dir + "/l1:" + dir + "/l\\0402,upperdir=" + dir + "/up,workdir=" + dir + "/work\n" +
		"2271 2270 0:224 / /proc rw - proc proc rw\n"
	for pid, info := range map[string]string{"7": mountinfo, "8": "25 1 8:1 / / rw - ext4 /dev/sda1 rw\n"} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "mountinfo"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		pid        int
		path, want string
	}{
		{7, "/opt/libnccl.so.2", lowerLib},
		{7, "/opt/patched.so", upperLib},
		{7, "/opt/missing.so", filepath.Join(proc, "7", "root", "/opt/missing.so")},
		{8, "/usr/lib/libnccl.so.2", filepath.Join(proc, "8", "root", "/usr/lib/libnccl.so.2")},
		{9, "/x.so", filepath.Join(proc, "9", "root", "/x.so")},
	} {
		if got := FileOf(proc, tc.pid, tc.path); got != tc.want {
			t.Errorf("FileOf(%d, %s) = %s, want %s", tc.pid, tc.path, got, tc.want)
		}
	}
}
