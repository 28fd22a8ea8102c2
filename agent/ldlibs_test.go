package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestNeededNCCLResolvesRunpath(t *testing.T) {
	root, _ := filepath.Abs("..")
	ringtrain := filepath.Join(root, "workload", "build", "ringtrain")
	if _, err := os.Stat(ringtrain); err != nil {
		if out, err := exec.Command("make", "-C", filepath.Join(root, "workload")).CombinedOutput(); err != nil {
			t.Fatalf("build workload: %v\n%s", err, out)
		}
	}
	got, err := neededNCCL(ringtrain, "")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "workload", "build", "libnccl.so.2")
	if len(got) != 1 || got[0] != want {
		t.Fatalf("neededNCCL(ringtrain) = %v, want [%s] (found through RUNPATH $ORIGIN)", got, want)
	}
	if got, err := neededNCCL("/bin/sh", ""); err != nil || len(got) != 0 {
		t.Fatalf("neededNCCL(/bin/sh) = %v, %v; want none", got, err)
	}
	script := filepath.Join(t.TempDir(), "run.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	if got, err := neededNCCL(script, ""); err != nil || len(got) != 0 {
		t.Fatalf("neededNCCL(script) = %v, %v; want none", got, err)
	}
}
