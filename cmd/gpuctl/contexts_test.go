package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/transport"
)

// TestContextsAcrossTwoClusters: two real servers' admin configs become
// two contexts of one client config; commands reach the current one, or
// the one --context names, each with its own credentials; use-context
// switches; an unknown context is refused with the ones there are.
func TestContextsAcrossTwoClusters(t *testing.T) {
	t.Setenv(transport.EnvContext, "") // --context sets it for the process
	srvA, adminA := startServer(t, t.TempDir())
	srvB, adminB := startServer(t, t.TempDir())
	for _, s := range []struct {
		srv interface {
			CreateJoinToken(time.Duration, int, string) (string, error)
		}
		desc string
	}{{srvA, "tokens-of-cluster-a"}, {srvB, "tokens-of-cluster-b"}} {
		if _, err := s.srv.CreateJoinToken(time.Hour, 1, s.desc); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	mustGpuctl(t, "config", "add-context", "lab", "--from", adminA, "--config", cfg)
	mustGpuctl(t, "config", "add-context", "prod", "--from", adminB, "--config", cfg)
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the config holds keys: mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if out := mustGpuctl(t, "config", "get-contexts", "--config", cfg); !strings.Contains(out, "*        lab") || !strings.Contains(out, "prod") {
		t.Errorf("get-contexts:\n%s", out)
	}
	if out := mustGpuctl(t, "token", "list", "--config", cfg); !strings.Contains(out, "tokens-of-cluster-a") {
		t.Errorf("the current context (lab) is not cluster a:\n%s", out)
	}
	if out := mustGpuctl(t, "token", "list", "--config", cfg, "--context", "prod"); !strings.Contains(out, "tokens-of-cluster-b") {
		t.Errorf("--context prod is not cluster b:\n%s", out)
	}
	os.Setenv(transport.EnvContext, "")
	mustGpuctl(t, "config", "use-context", "prod", "--config", cfg)
	if out := mustGpuctl(t, "token", "list", "--config", cfg); !strings.Contains(out, "tokens-of-cluster-b") {
		t.Errorf("after use-context prod, commands reach:\n%s", out)
	}
	if _, _, err := gpuctl(t, "token", "list", "--config", cfg, "--context", "staging"); err == nil ||
		!strings.Contains(err.Error(), `has no context "staging": it has lab, prod`) {
		t.Errorf("an unknown context: %v", err)
	}
	os.Setenv(transport.EnvContext, "")
	if _, _, err := gpuctl(t, "config", "use-context", "staging", "--config", cfg); err == nil || !strings.Contains(err.Error(), "it has lab, prod") {
		t.Errorf("use-context of an unknown context: %v", err)
	}
	// A config without contexts is one cluster, and becomes context
	// "default" when another is added.
	single := filepath.Join(filepath.Dir(adminA), "single.yaml") // beside the files it names
	data, err := os.ReadFile(adminA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(single, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustGpuctl(t, "config", "get-contexts", "--config", single); !strings.Contains(out, "has no contexts") {
		t.Errorf("get-contexts of a single cluster:\n%s", out)
	}
	mustGpuctl(t, "config", "add-context", "prod", "--from", adminB, "--config", single)
	if out := mustGpuctl(t, "token", "list", "--config", single); !strings.Contains(out, "tokens-of-cluster-a") {
		t.Errorf("the former single cluster is no longer current:\n%s", out)
	}
	if out := mustGpuctl(t, "config", "get-contexts", "--config", single); !strings.Contains(out, "*        default") {
		t.Errorf("get-contexts after adding to a single cluster:\n%s", out)
	}
}
