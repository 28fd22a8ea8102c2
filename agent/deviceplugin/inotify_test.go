package deviceplugin

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// inotifyRecord is one event as the kernel writes it: the header, then
// the name NUL-padded to pad bytes.
func inotifyRecord(name string, pad int) []byte {
	b := make([]byte, unix.SizeofInotifyEvent, unix.SizeofInotifyEvent+pad)
	binary.NativeEndian.PutUint32(b[0:], 1)              // wd
	binary.NativeEndian.PutUint32(b[4:], unix.IN_CREATE) // mask
	binary.NativeEndian.PutUint32(b[12:], uint32(pad))   // len
	return append(b, append([]byte(name), make([]byte, pad-len(name))...)...)
}

func TestInotifyNames(t *testing.T) {
	two := append(inotifyRecord("kubelet.sock", 16), inotifyRecord("gpuctl-gpu.sock", 32)...)
	for _, tc := range []struct {
		name string
		buf  []byte
		want []string
	}{
		{"two events", two, []string{"kubelet.sock", "gpuctl-gpu.sock"}},
		{"a name filling its padding", inotifyRecord("abcdefgh", 8), []string{"abcdefgh"}},
		{"no name (the directory itself)", inotifyRecord("", 0), []string{""}},
		{"a record cut short ends the list", two[:len(two)-1], []string{"kubelet.sock"}},
		{"a header cut short", two[:10], nil},
		{"empty", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inotifyNames(tc.buf); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("names %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzInotifyNames: any bytes decode without a panic into names without
// NULs, and records built from names decode back to them.
func FuzzInotifyNames(f *testing.F) {
	f.Add(inotifyRecord("kubelet.sock", 16), "kubelet.sock")
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, "")
	f.Fuzz(func(t *testing.T, buf []byte, name string) {
		for _, n := range inotifyNames(buf) {
			if bytes.IndexByte([]byte(n), 0) >= 0 {
				t.Fatalf("name %q holds a NUL", n)
			}
		}
		name = string(bytes.ReplaceAll([]byte(name), []byte{0}, nil))
		rec := inotifyRecord(name, (len(name)+16)/16*16)
		if got := inotifyNames(append(rec, rec...)); !reflect.DeepEqual(got, []string{name, name}) {
			t.Fatalf("records of %q decode to %q", name, got)
		}
	})
}
