package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestConsoleSwitchesContext: a client config of two real clusters, each
// context with its own credentials (carol exists only on prod); :ctx
// lists both and :ctx NAME reopens the console on the other cluster,
// with that context's identity, and back.
func TestConsoleSwitchesContext(t *testing.T) {
	need(t, "tmux")
	gpuctl := testbin.Gpuctl(t)
	dir := t.TempDir()
	lab, prod := filepath.Join(dir, "lab"), filepath.Join(dir, "prod")
	servertest.Start(t, controlplane.Config{DataDir: lab})
	servertest.Start(t, controlplane.Config{DataDir: prod})
	cfg := filepath.Join(dir, "config.yaml")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(gpuctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("gpuctl %v: %v\n%s", args, err, out)
		}
	}
	carol := filepath.Join(dir, "carol", "carol.yaml")
	run("user", "add", "carol", "--role", "operator", "-o", carol, "--config", controlplane.AdminConfigPath(prod))
	run("config", "add-context", "lab", "--from", controlplane.AdminConfigPath(lab), "--config", cfg)
	run("config", "add-context", "prod", "--from", carol, "--config", cfg)

	m := &tmux{t: t, socket: filepath.Join(dir, "tmux.sock")}
	t.Cleanup(func() { exec.Command("tmux", "-S", m.socket, "kill-server").Run() })
	m.start("console", fmt.Sprintf("env GPUCTL_CONFIG=%s GPUCTL_CONTEXT= TERM=xterm-256color %s --log-file %s", cfg, gpuctl,
		filepath.Join(dir, "console.log")))
	m.waitText("console", "ctx lab · admin (admin)", 20*time.Second)
	m.keys("console", ":ctx", "Enter")
	m.waitText("console", "2 contexts · enter follows one", 10*time.Second)
	m.keys("console", "j", "Enter")
	m.waitText("console", "ctx prod · carol (operator)", 20*time.Second)
	m.keys("console", ":ctx lab", "Enter")
	m.waitText("console", "ctx lab · admin (admin)", 20*time.Second)
	m.keys("console", ":ctx staging", "Enter")
	m.waitText("console", `no context "staging": the client config has lab, prod`, 10*time.Second)
}
