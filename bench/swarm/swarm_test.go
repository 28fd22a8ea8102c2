package swarm

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/internal/jsoncontract"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestSwarmReportIsSane runs a small swarm against a real gpuctl serve and
// checks that the report adds up: every node registered and heard from,
// samples flowing at nodes × GPUs a second and visible to the watching
// client at that rate, latencies measured and positive, the server's
// figures read, and the server stopped afterwards.
func TestSwarmReportIsSane(t *testing.T) {
	const nodes, gpus = 20, 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{Nodes: nodes, GPUs: gpus, Quiet: time.Second, Warmup: 2 * time.Second, Duration: 4 * time.Second,
		Gpuctl: testbin.Gpuctl(t), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	want := float64(nodes * gpus)
	near := func(got float64) bool { return got > 0.8*want && got < 1.2*want }
	checks := []struct {
		name string
		ok   bool
	}{
		{"every node registered", rep.Registered == nodes},
		{"no node failed or went down", rep.NodeErrors == 0 && rep.NodesDown == 0},
		{"samples sent ≈ nodes × GPUs a second", near(rep.SamplesSentPerSec)},
		{"samples visible ≈ nodes × GPUs a second", near(rep.SamplesVisiblePerSec)},
		// About one new sample per node per second reached the watch.
		{"visibility measured for most batches", rep.Visibility.Count >= int(0.8*nodes*rep.WindowSeconds)},
		{"visibility positive and under a second", rep.Visibility.P50Seconds > 0 && rep.Visibility.P99Seconds >= rep.Visibility.P50Seconds && rep.Visibility.P99Seconds < 1},
		{"command round trips measured", rep.CommandQuiet.Count > 0 && rep.CommandLoaded.Count > 0 && rep.CommandLoaded.P50Seconds > 0},
		{"API round trips measured", rep.APILoaded.Count > 0 && rep.APILoaded.P50Seconds > 0},
		{"server CPU and memory read", rep.ServerCPUCores > 0 && rep.ServerRSSBytes > rep.ServerRSSIdleBytes && rep.ServerRSSIdleBytes > 0},
		{"window about as asked", rep.WindowSeconds > 3.5 && rep.WindowSeconds < 6},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: report %+v", c.name, rep)
		}
	}
	doc, err := json.Marshal(Document(rep))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	contract, err := jsoncontract.Parse(readme)
	if err != nil {
		t.Fatal(err)
	}
	if missing, err := contract.Undocumented("bench swarm", doc); err != nil || len(missing) > 0 {
		t.Errorf("-o json fields not in the README's JSON output section: %v %v", missing, err)
	}
	if err := syscall.Kill(rep.ServerPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("server pid %d still there after the run: %v", rep.ServerPID, err)
	}
}

// TestSwarmFailoverOnEtcd runs a small swarm against a server on an etcd
// member the swarm runs, kills it, and checks that its replacement leads
// and every node registered with it and stayed up.
func TestSwarmFailoverOnEtcd(t *testing.T) {
	const nodes = 10
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{Nodes: nodes, Quiet: time.Second, Warmup: time.Second, Duration: 2 * time.Second,
		Gpuctl: testbin.Gpuctl(t), Dir: t.TempDir(), Store: StoreEtcd, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	f := rep.Failover
	if rep.Store != StoreEtcd || f == nil || f.Registered != nodes || f.NodesDownAfter != 0 || f.RestartSeconds <= 0 || f.ReconnectSeconds <= 0 {
		t.Errorf("failover on etcd: store %q, %+v", rep.Store, f)
	}
	if rep.NodeErrors != 0 || rep.Shed == nil {
		t.Errorf("%d node errors (first: %v), shed %v", rep.NodeErrors, rep.FirstNodeError, rep.Shed)
	}
}

func TestSummarize(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		name string
		in   []time.Duration
		want Latency
	}{
		{"none", nil, Latency{}},
		{"one", ms(7), Latency{Count: 1, P50Seconds: 0.007, P99Seconds: 0.007, MaxSeconds: 0.007}},
		{"unsorted", ms(5, 1, 3, 2, 4), Latency{Count: 5, P50Seconds: 0.003, P99Seconds: 0.005, MaxSeconds: 0.005}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := summarize(c.in); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	if got := summarize(hundred); got.P50Seconds != 0.051 || got.P99Seconds != 0.1 {
		t.Errorf("1..100 ms: %+v, want p50 51 and p99 100 (nearest rank above)", got)
	}
}
