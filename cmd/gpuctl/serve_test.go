package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/store"
)

// syncBuffer collects a command's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve runs `gpuctl serve ARGS` until the returned stop is called, and
// waits until it listens.
func serve(t *testing.T, args ...string) (stop func() error) {
	t.Helper()
	stop, _ = serveOutput(t, args...)
	return stop
}

// serveOutput is serve that also hands back what the server prints.
func serveOutput(t *testing.T, args ...string) (stop func() error, out *syncBuffer) {
	t.Helper()
	out = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	root.SetArgs(append([]string{"serve", "--log-level", "error"}, args...))
	root.SetOut(out)
	root.SetErr(out)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "listening on") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("gpuctl serve %s exited: %v\n%s", strings.Join(args, " "), err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("gpuctl serve did not listen within 20s:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop, out
}

func jobNames(t *testing.T, config string) []string {
	t.Helper()
	var doc struct{ Jobs []struct{ Name string } }
	if err := json.Unmarshal([]byte(mustGpuctl(t, "jobs", "-o", "json", "--config", config)), &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range doc.Jobs {
		names = append(names, j.Name)
	}
	return names
}

// TestServeRestoreBringsBackJobs submits jobs to a real gpuctl serve, stops
// it (which takes a last backup), loses its state file, is refused with the
// backup named, and starts again with --restore: the jobs are back.
func TestServeRestoreBringsBackJobs(t *testing.T) {
	dir := t.TempDir()
	// One address for both runs: admin.yaml names it.
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	listen := u.LocalAddr().String()
	u.Close()
	stop := serve(t, "--data-dir", dir, "--listen", listen)
	admin := controlplane.AdminConfigPath(dir)
	for _, name := range []string{"ring-a", "ring-b"} {
		mustGpuctl(t, "submit", "--hold", "--name", name, "--gpus", "1", "--config", admin, "--", "/bin/true")
	}
	if got := jobNames(t, admin); len(got) != 2 {
		t.Fatalf("jobs before the backup: %v", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	last, _, err := store.LastBackup(filepath.Join(dir, "backups"))
	if err != nil || last == "" {
		t.Fatalf("no backup after a clean shutdown: %v", err)
	}

	state := controlplane.StatePath(dir)
	if err := os.Truncate(state, 0); err != nil {
		t.Fatal(err)
	}
	_, _, err = gpuctl(t, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), state+" is damaged: it is empty") || !strings.Contains(err.Error(), "--restore "+last) {
		t.Fatalf("serve on an empty state file: %v", err)
	}
	t.Logf("refusal: %v", err)

	// A damaged backup is refused and changes nothing.
	bad := filepath.Join(t.TempDir(), "bad.db")
	b, _ := os.ReadFile(last)
	os.WriteFile(bad, b[:len(b)/3], 0o600)
	if _, _, err := gpuctl(t, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--restore", bad); err == nil || !strings.Contains(err.Error(), "the backup is damaged") {
		t.Fatalf("serve --restore of a damaged backup: %v", err)
	}

	serve(t, "--data-dir", dir, "--listen", listen, "--restore", last)
	if got := strings.Join(jobNames(t, admin), ","); got != "ring-a,ring-b" {
		t.Fatalf("jobs after --restore: %s, want ring-a,ring-b", got)
	}
	aside, _ := filepath.Glob(state + ".before-restore-*")
	if len(aside) != 1 {
		t.Fatalf("the replaced state file was not kept: %v", aside)
	}
}

// TestServeWarnsOfAnAdvertiseMissingTheListenAddress: gpuctl serve bound
// to one address, advertising only another, says so at start and still
// serves (NAT may make it right); advertising its own address, it says
// nothing.
func TestServeWarnsOfAnAdvertiseMissingTheListenAddress(t *testing.T) {
	for _, tc := range []struct {
		advertise string
		warn      bool
	}{
		{"127.0.0.2:7443", true},
		{"127.0.0.1:7443", false},
	} {
		_, out := serveOutput(t, "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--advertise", tc.advertise)
		warned := strings.Contains(out.String(), "warning: --listen 127.0.0.1:0 binds one address, but --advertise "+tc.advertise+" does not name it")
		if warned != tc.warn {
			t.Errorf("--advertise %s: warned %v, want %v; gpuctl serve printed:\n%s", tc.advertise, warned, tc.warn, out.String())
		}
	}
}

// TestAdvertisedOwnAddressFirst: with etcd the first advertised address
// is where the other servers send nodes and clients when this one leads;
// this server's --listen address listed later is refused, saying so.
func TestAdvertisedOwnAddressFirst(t *testing.T) {
	got, err := advertised(controlplane.Config{Listen: "10.0.0.1:7443", AdvertiseAddr: "10.0.0.1:7443,10.0.0.2:7443"})
	if err != nil || got != "10.0.0.1:7443" {
		t.Fatalf("own address first: %q, %v", got, err)
	}
	_, err = advertised(controlplane.Config{Listen: "10.0.0.1:7443", AdvertiseAddr: "10.0.0.2:7443, 10.0.0.1:7443"})
	if err == nil || !strings.Contains(err.Error(), "as address 2 of 2") || !strings.Contains(err.Error(), "comes first") {
		t.Fatalf("own address second: %v, want it refused with the reason", err)
	}
}
