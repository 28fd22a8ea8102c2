package rdma

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeTree creates files (path relative to root → contents) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, body := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRead(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"mlx5_1/ports/1/counters/port_xmit_data":        "1000\n",
		"mlx5_0/ports/1/counters/port_xmit_data":        "123456789012\n",
		"mlx5_0/ports/1/counters/port_rcv_data":         "42\n",
		"mlx5_0/ports/1/counters/symbol_error":          "0\n",
		"mlx5_0/ports/1/counters/unsupported":           "N/A\n",
		"mlx5_0/ports/1/hw_counters/out_of_buffer":      "7\n",
		"mlx5_0/ports/1/hw_counters/port_rcv_data":      "9\n",
		"mlx5_0/ports/2/counters/port_rcv_errors":       "0x10\n",
		"mlx5_0/ports/notaport/counters/port_xmit_data": "1\n",
		"mlx5_0/node_guid":                              "abcd\n",
		"stray-file":                                    "x",
	})
	now := time.Unix(1700000000, 5)
	got, err := Read(root, now)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		dev      string
		port     uint32
		counters map[string]uint64
	}
	wants := []want{
		{"mlx5_0", 1, map[string]uint64{"port_xmit_data": 123456789012, "port_rcv_data": 42, "symbol_error": 0, "out_of_buffer": 7, "hw_port_rcv_data": 9}},
		{"mlx5_0", 2, map[string]uint64{"port_rcv_errors": 16}},
		{"mlx5_1", 1, map[string]uint64{"port_xmit_data": 1000}},
	}
	if len(got) != len(wants) {
		t.Fatalf("got %d samples, want %d: %v", len(got), len(wants), got)
	}
	for i, w := range wants {
		g := got[i]
		if g.Device != w.dev || g.Port != w.port || g.TimeUnixNano != now.UnixNano() {
			t.Errorf("sample %d = %s/%d@%d, want %s/%d@%d", i, g.Device, g.Port, g.TimeUnixNano, w.dev, w.port, now.UnixNano())
		}
		if len(g.Counters) != len(w.counters) {
			t.Errorf("%s/%d counters = %v, want %v", w.dev, w.port, g.Counters, w.counters)
		}
		for k, v := range w.counters {
			if g.Counters[k] != v {
				t.Errorf("%s/%d %s = %d, want %d", w.dev, w.port, k, g.Counters[k], v)
			}
		}
	}
}

func TestReadNoRDMA(t *testing.T) {
	got, err := Read(filepath.Join(t.TempDir(), "infiniband"), time.Now())
	if err != nil || len(got) != 0 {
		t.Fatalf("Read of a missing tree = %v, %v; want no samples and no error", got, err)
	}
}

func TestReadUnreadableRoot(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(f, time.Now()); err == nil {
		t.Fatal("Read of a root that is a file succeeded; want an error")
	}
}

func TestParseCounter(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want uint64
		err  bool
	}{
		{"decimal", "42\n", 42, false},
		{"max uint64", "18446744073709551615", 1<<64 - 1, false},
		{"hex", "0xff\n", 255, false},
		{"padded", "  7 \n", 7, false},
		{"empty", "\n", 0, true},
		{"negative", "-1", 0, true},
		{"text", "N/A", 0, true},
		{"overflow", "18446744073709551616", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCounter([]byte(tc.in))
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ParseCounter(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func FuzzParseCounter(f *testing.F) {
	for _, s := range []string{"0", "42\n", "0x1f", "", "abc", "99999999999999999999"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseCounter(b)
		if err != nil && v != 0 {
			t.Fatalf("ParseCounter(%q) = %d with error %v; want 0 on error", b, v, err)
		}
	})
}
