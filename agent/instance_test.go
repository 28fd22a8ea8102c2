package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstanceIDIsKept: the id is made once and read back unchanged by
// every later start on the same data dir; another data dir gets another
// id; a damaged file is refused with what to do.
func TestInstanceIDIsKept(t *testing.T) {
	dir := t.TempDir()
	first, err := instanceID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !validInstanceID(first) {
		t.Fatalf("instance id %q", first)
	}
	again, err := instanceID(dir)
	if err != nil || again != first {
		t.Fatalf("second start: %q %v, want %q", again, err, first)
	}
	other, err := instanceID(t.TempDir())
	if err != nil || other == first {
		t.Fatalf("another data dir: %q %v", other, err)
	}
	if err := os.WriteFile(filepath.Join(dir, instanceFile), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := instanceID(dir); err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Fatalf("damaged file: %v", err)
	}
}
