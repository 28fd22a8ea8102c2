//go:build linux && amd64

package nccl

import "testing"

func TestNcclMapping(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
		ok               bool
	}{
		{"real nccl", "7f1c2a000000-7f1c2a200000 r-xp 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", true},
		{"workload library", "7f00-7f10 r--p 00000000 00:2a 99                         /work/main/workload/build/libnccl.so.2", "/work/main/workload/build/libnccl.so.2", true},
		{"path with spaces", "7f00-7f10 r--p 00000000 00:2a 99 /opt/my libs/libnccl.so", "/opt/my libs/libnccl.so", true},
		{"deleted file", "7f00-7f10 r--p 00000000 00:2a 99 /tmp/libnccl.so.2 (deleted)", "", false},
		{"other library", "7f00-7f10 r-xp 00000000 fd:01 5 /usr/lib/libc.so.6", "", false},
		{"gpuctl's profiler plugin", "7f00-7f10 r-xp 00000000 fd:01 5 /opt/gpuctl/libnccl-profiler-gpuctl.so", "/opt/gpuctl/libnccl-profiler-gpuctl.so", true},
		{"nccl net plugin is not the API library", "7f00-7f10 r-xp 00000000 fd:01 5 /usr/lib/libnccl-net.so", "", false},
		{"anonymous", "7f00-7f10 rw-p 00000000 00:00 0", "", false},
		{"special", "7ffd-7ffe rw-p 00000000 00:00 0                          [stack]", "", false},
		{"garbage", "libnccl.so", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ncclMapping(tc.line)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ncclMapping = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzNcclMapping(f *testing.F) {
	f.Add("7f00-7f10 r--p 00000000 00:2a 99 /work/libnccl.so.2")
	f.Add("7f00-7f10 rw-p 00000000 00:00 0")
	f.Fuzz(func(t *testing.T, line string) {
		if path, ok := ncclMapping(line); ok && (path == "" || path[0] != '/') {
			t.Fatalf("ncclMapping(%q) = %q, not an absolute path", line, path)
		}
	})
}
