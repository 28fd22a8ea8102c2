package nvml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHangFile(t *testing.T) {
	dir := t.TempDir()
	sim, err := NewSim("dgx-h100", SimOptions{KernelDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hang-3")
	for _, where := range []string{"inside", "outside"} {
		if err := sim.Hang(3, where); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != where+"\n" {
			t.Fatalf("hang %s: file %q, %v", where, b, err)
		}
	}
	if err := sim.Hang(3, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("cleared hang left %s: %v", path, err)
	}
	if err := sim.Hang(3, ""); err != nil {
		t.Errorf("clearing twice: %v", err)
	}
	for _, c := range []struct {
		gpu   int
		where string
		err   string
	}{
		{3, "sideways", `where is "sideways"; use inside or outside`},
		{8, "inside", "GPU 8 does not exist"},
	} {
		if err := sim.Hang(c.gpu, c.where); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Hang(%d, %q) = %v, want %q", c.gpu, c.where, err, c.err)
		}
	}
	bare, err := NewSim("dgx-h100", SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bare.Hang(0, "inside"); err == nil || !strings.Contains(err.Error(), "no kernel dir") {
		t.Errorf("hang without a kernel dir: %v", err)
	}
	if err := bare.Hang(0, ""); err != nil {
		t.Errorf("clear without a kernel dir: %v", err)
	}
}
