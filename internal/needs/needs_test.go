package needs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestSkipFailsWhenRequired runs a skipping test in a child process with
// and without its variable: skipped without, failed loudly with.
func TestSkipFailsWhenRequired(t *testing.T) {
	if os.Getenv("NEEDS_CHILD") == "1" {
		EBPF.Skip(t, "no NCCL calls traced")
		return
	}
	run := func(value string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSkipFailsWhenRequired$", "-test.v")
		cmd.Env = append(os.Environ(), "NEEDS_CHILD=1", string(EBPF)+"="+value)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, value := range []string{"", "0"} {
		out, err := run(value)
		if err != nil || !strings.Contains(out, "--- SKIP") || !strings.Contains(out, "set GPUCTL_REQUIRE_EBPF=1 to make this a failure") {
			t.Errorf("%s=%q: want a skip naming the variable, got %v\n%s", EBPF, value, err, out)
		}
	}
	out, err := run("1")
	if err == nil || !strings.Contains(out, "--- FAIL") || !strings.Contains(out, "FORBIDDEN SKIP: GPUCTL_REQUIRE_EBPF=1") || !strings.Contains(out, "no NCCL calls traced") {
		t.Errorf("%s=1: want a failure naming the variable and the reason, got %v\n%s", EBPF, err, out)
	}
}

// TestEveryRequirementGoesThroughNeeds: no Go file but this package's
// reads a GPUCTL_REQUIRE_* variable or skips for a missing feature (eBPF,
// root, NVML, ...) by itself, so no test can decide on its own that a
// required feature may be skipped.
func TestEveryRequirementGoesThroughNeeds(t *testing.T) {
	root := testbin.Root(t)
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path == self || name == ".git" || name == "testdata" || name == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range bytes.Split(src, []byte("\n")) {
			if bytes.Contains(line, []byte(`Getenv("GPUCTL_REQUIRE_`)) || skipsForAFeature(string(line)) {
				rel, _ := filepath.Rel(root, path)
				bad = append(bad, rel+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(string(line)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("read a GPUCTL_REQUIRE_* variable or skip for a missing feature directly; use needs.<Feature>.Required or .Skip:\n%s", strings.Join(bad, "\n"))
	}
}

// featureWords are what a skip's reason says when it skips for a feature
// the machine lacks.
var featureWords = []string{"ebpf", "traced", "root", "nvml", "uprobe"}

// directSkip is a skip called on a test's own t or b.
var directSkip = regexp.MustCompile(`(^|[^\w.])[tb]\.Skip`)

// skipsForAFeature reports whether line skips a test for a missing
// feature without going through this package.
func skipsForAFeature(line string) bool {
	if !directSkip.MatchString(line) {
		return false
	}
	lower := strings.ToLower(line)
	for _, w := range featureWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}
