package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestErrorsSayEachPrefixOnce runs the real nodemon into errors that pass
// through several layers: each layer's words appear once.
func TestErrorsSayEachPrefixOnce(t *testing.T) {
	bin := testbin.Nodemon(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no identity and no token", nil, "nodemon: no identity in "},
		{"malformed token", []string{"--token", "gpj1.junk"}, "nodemon: join 127.0.0.1:9 as n1: malformed join token"},
		{"device plugin directory under a file", []string{"--device-plugin-dir", "/dev/null/device-plugins"},
			"nodemon: --device-plugin-dir: mkdir /dev/null: not a directory"},
		{"10 KB name", []string{"--name", strings.Repeat("n", 10<<10) + "x"}, `nodemon: --name: name "` + strings.Repeat("n", 64) + `"… (10241 bytes) must be 1 to 64 characters`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--server", "127.0.0.1:9", "--name", "n1", "--data-dir", filepath.Join(dir, "data"),
				"--sim", "dgx-h100", "--ebpf", "off", "--log-file", filepath.Join(dir, "nodemon.log")}, tc.args...)
			cmd := exec.Command(bin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("nodemon exited 0; stderr:\n%s", stderr.String())
				}
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("nodemon still runs after 60 s; stderr:\n%s", stderr.String())
			}
			msg := strings.TrimSpace(stderr.String())
			if !strings.HasPrefix(msg, tc.want) {
				t.Errorf("stderr %q, want it to start with %q", msg, tc.want)
			}
			if len(msg) > 512 {
				t.Errorf("stderr is %d bytes: a refused value is quoted whole", len(msg))
			}
			for _, word := range []string{"nodemon:", "join 127.0.0.1:9"} {
				if strings.Count(msg, word) > 1 {
					t.Errorf("%q says %q more than once", msg, word)
				}
			}
		})
	}
}
