package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/jsoncontract"
	"github.com/gpuctl/gpuctl/workload"
)

// TestMain lets the test binary stand in for nodemon as the rank shim, as
// the in-process agents re-execute it for every rank.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == agent.ShimCommand {
		os.Exit(agent.RunShim(os.Args[2:], os.Stderr))
	}
	os.Exit(m.Run())
}

var (
	workloadOnce sync.Once
	workloadArt  workload.Artifacts
	workloadErr  error
)

// cluster is a control plane and nodes simulating DGX H100s, all in this
// process over real QUIC on loopback, and the admin config to reach it.
type cluster struct {
	srv    *controlplane.Server
	config string
	ring   string
}

func startCluster(t *testing.T, nodes int) *cluster {
	t.Helper()
	return startClusterOf(t, controlplane.Config{}, slices.Repeat([]string{"dgx-h100"}, nodes)...)
}

// startClusterOf starts a control plane with cfg (its data dir and listen
// address set here) and one node per simulated host profile in sims.
func startClusterOf(t *testing.T, cfg controlplane.Config, sims ...string) *cluster {
	t.Helper()
	nodes := len(sims)
	workloadOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		workloadArt, workloadErr = workload.Build(ctx, workload.SourceDir())
	})
	if workloadErr != nil {
		t.Fatalf("reference workload: %v", workloadErr)
	}
	dir := t.TempDir()
	cfg.DataDir, cfg.Listen = filepath.Join(dir, "server"), "127.0.0.1:0"
	srv, err := controlplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := srv.Listen(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { srv.Serve(ctx); close(served) }()
	t.Cleanup(func() { cancel(); <-served })
	token, err := srv.CreateJoinToken(time.Hour, nodes, "test cluster")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		name := "node-0" + string(rune('0'+i))
		probes, err := agent.OpenProbes(agent.ProbeOptions{Node: name, Sim: sims[i], EBPF: agent.EBPFOff}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{Server: srv.Addr().String(), Token: token, Name: name, DataDir: filepath.Join(dir, name),
			Labels: map[string]string{"rack": "r0"}, CgroupRoot: "off", AllowRootRanks: true}, probes)
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(actx); close(done) }()
		t.Cleanup(func() { acancel(); <-done })
	}
	c := &cluster{srv: srv, config: controlplane.AdminConfigPath(filepath.Join(dir, "server")), ring: workloadArt.RingTrain}
	eventually(t, "nodes ready with samples", 30*time.Second, func() bool {
		ready := 0
		for _, n := range srv.Nodes() {
			if n.GetState() == api.NodeState_NODE_STATE_READY && len(n.GetGpus()) > 0 && n.GetGpus()[0].GetLast() != nil {
				ready++
			}
		}
		return ready == nodes
	})
	return c
}

func eventually(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gpuctl runs the command line in this process against the cluster and
// returns what it printed.
func (c *cluster) gpuctl(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCmd()
	var out, errw bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errw)
	root.SetArgs(withFlags(args, "--config", c.config))
	err = root.Execute()
	return out.String(), errw.String(), err
}

// withFlags adds flags to a command line, before its "--" when it has
// one (what follows is the job's command).
func withFlags(args []string, flags ...string) []string {
	full := append([]string{}, args...)
	if i := slices.Index(full, "--"); i >= 0 {
		return slices.Insert(full, i, flags...)
	}
	return append(full, flags...)
}

// TestJSONOutputsAgainstREADME runs every subcommand that prints JSON
// against a real cluster and checks each field it prints against the
// README's JSON output section.
func TestJSONOutputsAgainstREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	contract, err := jsoncontract.Parse(readme)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 2)
	t.Setenv("COLUMNS", "80")

	mustJSON := func(t *testing.T, list string, args ...string) map[string]any {
		t.Helper()
		out, errOut, err := c.gpuctl(t, withFlags(args, "-o", "json")...)
		if err != nil {
			t.Fatalf("gpuctl %s: %v\n%s", strings.Join(args, " "), err, errOut)
		}
		check(t, contract, args[0], out)
		var doc map[string]any
		json.Unmarshal([]byte(out), &doc)
		if _, ok := doc[list].([]any); !ok {
			t.Fatalf("gpuctl %s -o json has no list %q:\n%s", strings.Join(args, " "), list, out)
		}
		return doc
	}

	ckpt := filepath.Join(t.TempDir(), "ckpt")
	out, errOut, err := c.gpuctl(t, "submit", "--name", "ring", "--nodes", "2", "--gpus-per-node", "1", "--checkpoint-dir", ckpt,
		"--", c.ring, "--steps", "0", "--compute-ms", "20", "--bytes", "64K", "--ckpt-interval", "20")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, errOut)
	}
	ring := strings.TrimSpace(out)
	eventually(t, "ring trains", 30*time.Second, func() bool {
		for _, j := range c.srv.Jobs() {
			if j.GetId() == ring && j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStep() > 0 {
				return true
			}
		}
		return false
	})

	for _, tc := range []struct {
		list string
		args []string
	}{
		{"nodes", []string{"nodes"}},
		{"nodes", []string{"nodes", "node-01"}},
		{"gpus", []string{"gpus", "node-00"}},
		{"events", []string{"events", "--since", "1d"}},
		{"events", []string{"events", "--job", "ring"}},
		{"collectives", []string{"collectives"}},
		{"jobs", []string{"jobs"}},
		{"jobs", []string{"jobs", "ring", "--state", "running"}},
		{"stalls", []string{"stalls"}},
		{"versions", []string{"version"}},
		{"servers", []string{"status"}},
		{"moves", []string{"rebalance"}},
		{"jobs", []string{"submit", "--dry-run", "--name", "dry", "--gpus", "1", "--", c.ring}},
		{"jobs", []string{"checkpoint", ring}},
		{"identities", []string{"user", "list", "--with-nodes"}},
		{"tokens", []string{"token", "list"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { mustJSON(t, tc.list, tc.args...) })
	}
	if v := mustJSON(t, "versions", "version")["versions"].([]any); len(v) != 2 || v[1].(map[string]any)["address"] == nil {
		t.Errorf("version: %v", v)
	}

	// Held jobs: one released to the scheduler, one placed by hand.
	held := func(name string) string {
		j := mustJSON(t, "jobs", "submit", "--hold", "--name", name, "--gpus", "1", "--", "/bin/sleep", "60")["jobs"].([]any)[0].(map[string]any)
		if j["hold"] != true || j["state"] != "pending" {
			t.Fatalf("held job %v", j)
		}
		return j["id"].(string)
	}
	released := held("released")
	if j := mustJSON(t, "jobs", "release", released)["jobs"].([]any)[0].(map[string]any); j["hold"] != false {
		t.Errorf("released job still held: %v", j)
	}
	mustJSON(t, "jobs", "cancel", released)
	id := held("placed")
	mustJSON(t, "jobs", "assign", id, "--nodes", "node-00")
	mustJSON(t, "jobs", "restart", id)
	mustJSON(t, "jobs", "cancel", id)

	for _, action := range []string{"cordon", "uncordon", "drain", "uncordon"} {
		args := []string{action, "node-01"}
		if action != "uncordon" {
			args = append(args, "--reason", "test "+action)
		}
		doc := mustJSON(t, "nodes", args...)
		if _, ok := doc["drained_jobs"].([]any); !ok {
			t.Errorf("%s: no drained_jobs list", action)
		}
	}

	// observe is a stream: one object per line.
	out, errOut, err = c.gpuctl(t, "observe", "--last", "5", "-o", "json")
	if err != nil {
		t.Fatalf("observe: %v\n%s", err, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		check(t, contract, "observe", line)
	}

	// Every command the README documents was run.
	ran := map[string]bool{"nodes": true, "gpus": true, "events": true, "collectives": true, "jobs": true, "stalls": true, "version": true, "status": true,
		"rebalance": true, "submit": true, "checkpoint": true, "assign": true, "restart": true, "cancel": true, "release": true,
		"cordon": true, "uncordon": true, "drain": true, "observe": true, "user": true, "token": true,
		// Checked against their types and output by TestJSONDocumentsAreDocumented.
		"plan": true, "simulate": true,
		// Checked against a real swarm's report by bench/swarm's TestSwarmReportIsSane.
		"bench swarm": true}
	for _, cmd := range contract.Commands() {
		if !ran[cmd] {
			t.Errorf("README documents gpuctl %s -o json, which this test does not run", cmd)
		}
	}
}

func check(t *testing.T, c *jsoncontract.Contract, cmd, out string) {
	t.Helper()
	missing, err := c.Undocumented(cmd, []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("gpuctl %s -o json prints fields the README does not document: %s", cmd, strings.Join(missing, ", "))
	}
}

// TestCLIAgainstCluster checks the table habits against a real cluster:
// names that match nothing are errors that list what exists, empty
// listings are said on stderr, describe pages come out whole.
func TestCLIAgainstCluster(t *testing.T) {
	c := startCluster(t, 2)
	t.Setenv("COLUMNS", "80")
	tests := []struct {
		name                 string
		args                 []string
		stdout, stderr, fail string
	}{
		{name: "nodes", args: []string{"nodes"}, stdout: "node-00  ready"},
		{name: "no headers, sorted", args: []string{"nodes", "--no-headers", "--sort-by", "name"}, stdout: "node-00  ready"},
		{name: "unknown node", args: []string{"nodes", "node-00", "node-09"}, fail: `no node named "node-09": known nodes are node-[00-01]`},
		{name: "unknown job", args: []string{"jobs", "nosuch"}, fail: `no job with id or name "nosuch"; there are none`},
		{name: "no jobs", args: []string{"jobs"}, stderr: "no jobs\n"},
		{name: "no stalls", args: []string{"stalls"}, stderr: "no stalls\n"},
		{name: "bad state", args: []string{"jobs", "--state", "sleeping"}, fail: `--state "sleeping": use pending, running`},
		{name: "bad since", args: []string{"events", "--since", "yesterday"}, fail: "want a duration (30s, 10m, 1d, 2d12h) or an RFC 3339 time"},
		{name: "bad sort", args: []string{"nodes", "--sort-by", "colour"}, fail: `--sort-by "colour": no such column; use one of name, state`},
		{name: "describe node", args: []string{"describe", "node", "node-01"}, stdout: "Takes new work:        yes"},
		{name: "describe gpu", args: []string{"describe", "gpu", "node-00/3"}, stdout: "Index:                 3"},
		{name: "describe missing gpu", args: []string{"describe", "gpu", "node-00/9"}, fail: "node-00 has no GPU 9: its GPUs are 0,1,2,3,4,5,6,7"},
		{name: "version", args: []string{"version"}, stdout: "client 0.1.0, protocol v1.3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := c.gpuctl(t, tc.args...)
			if tc.fail != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fail) {
					t.Fatalf("err %v, want it to say %q", err, tc.fail)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			if !strings.Contains(out, tc.stdout) || tc.stderr != "" && errOut != tc.stderr {
				t.Errorf("stdout:\n%s\nstderr:\n%s\nwant stdout to hold %q, stderr %q", out, errOut, tc.stdout, tc.stderr)
			}
			if tc.stderr != "" && out != "" {
				t.Errorf("stdout %q, want nothing: an empty listing prints no rows", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if len([]rune(line)) > 80 && tc.args[0] != "describe" {
					t.Errorf("line wider than $COLUMNS=80: %s", line)
				}
			}
		})
	}
}
