package controlplane

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// serveV2 runs a real control plane on 127.0.0.1:0 and returns it with an
// admin client dialled over QUIC.
func serveV2(t *testing.T) (*Server, *client.Client) {
	t.Helper()
	dir := t.TempDir()
	// Operators' jobs run as nobody, the default account.
	s, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0", RunAs: jobspec.RunAsPolicy{DefaultUser: "nobody"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	cl, err := client.Dial(ctx, AdminConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Close()
		cancel()
		<-done
	})
	return s, cl
}

func heldJob(name string) *api.SubmitJobRequest {
	return &api.SubmitJobRequest{Hold: true, Source: name + ".yaml",
		SpecYaml: fmt.Sprintf("name: %s\nnodes: 1\ngpus_per_node: 1\ncommand: [/bin/true]\n", name)}
}

// TestWatchResumesAfterDroppedConnection follows jobs over QUIC, has the
// server drop the client's connection, changes jobs while it is gone, and
// checks that the watch reconnects and resumes from the revision it had
// applied: the changes made meanwhile arrive as changes, not as a new
// snapshot, and nothing is missed.
func TestWatchResumesAfterDroppedConnection(t *testing.T) {
	s, cl := serveV2(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"a", "b"} {
		if _, err := cl.SubmitJob(ctx, heldJob(n)); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu        sync.Mutex
		cache     = client.NewCache()
		batches   []*api.WatchBatch
		drops     int
		dropped   = make(chan struct{}, 4)
		watchDone = make(chan error, 1)
	)
	go func() {
		watchDone <- cl.Watch(ctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_JOBS}},
			client.WatchOptions{Backoff: &transport.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
				OnDisconnect: func(error, time.Duration) {
					mu.Lock()
					drops++
					mu.Unlock()
					dropped <- struct{}{}
				}},
			func(b *api.WatchBatch) error {
				mu.Lock()
				defer mu.Unlock()
				cache.Apply(b)
				batches = append(batches, b)
				return nil
			})
	}()
	jobsSeen := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(cache.Snapshot().Jobs)
	}
	waitUntil(t, 10*time.Second, "the snapshot's two jobs", func() bool { return jobsSeen() == 2 })
	mu.Lock()
	before := len(batches)
	mu.Unlock()

	if n := s.DisconnectClients("admin", "test drops the connection"); n == 0 {
		t.Fatal("no client connection to drop")
	}
	select {
	case <-dropped:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not notice its connection drop")
	}
	// While it is gone: a new job, and a cancel of an old one.
	if _, err := cl.SubmitJob(ctx, heldJob("c")); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CancelJob(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// The submit and the cancel come as changes of their own: wait for
	// both, not only for the third job.
	waitUntil(t, 10*time.Second, "the job submitted and the cancel made while disconnected", func() bool {
		mu.Lock()
		defer mu.Unlock()
		snap := cache.Snapshot()
		a := snap.Job("a")
		return len(snap.Jobs) == 3 && a != nil && a.GetState() == api.JobState_JOB_STATE_CANCELLED
	})
	mu.Lock()
	defer mu.Unlock()
	for _, b := range batches[before:] {
		if b.GetSnapshot() {
			t.Fatalf("the watch resynced (%q) instead of resuming", b.GetResyncReason())
		}
	}
	snap := cache.Snapshot()
	if j := snap.Job("a"); j == nil || j.GetState() != api.JobState_JOB_STATE_CANCELLED {
		t.Errorf("job a after resume: %v, want cancelled", j)
	}
	if snap.Revision != s.Hub().Revision() && snap.Revision > s.Hub().Revision() {
		t.Errorf("client revision %d past the server's %d", snap.Revision, s.Hub().Revision())
	}
	if drops < 1 {
		t.Errorf("drops = %d", drops)
	}
}

func waitUntil(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUnknownNamesAreErrors checks that every request naming an unknown
// job or node is refused with what to do, never answered with an empty
// list.
func TestUnknownNamesAreErrors(t *testing.T) {
	s, _ := serveV2(t)
	cl := client.New(s.Local(Caller{Name: "ops", Role: transport.RoleAdmin, Via: "test"}))
	ctx := context.Background()
	checks := []struct {
		name string
		call func() error
		want string
	}{
		{"jobs", func() error { _, err := cl.Jobs(ctx, "nosuch"); return err }, `unknown job "nosuch"`},
		{"events by node", func() error {
			_, err := cl.Events(ctx, &api.ListEventsRequest{Node: "nosuch"})
			return err
		}, `unknown node "nosuch"`},
		{"collectives by job", func() error { _, err := cl.Collectives(ctx, "nosuch", ""); return err }, `unknown job "nosuch"`},
		{"collectives by node", func() error { _, err := cl.Collectives(ctx, "", "nosuch"); return err }, `unknown node "nosuch"`},
		{"stalls", func() error { _, err := cl.ListStalls(ctx, "nosuch"); return err }, `unknown job "nosuch"`},
		{"gpu history", func() error { _, err := cl.GPUHistory(ctx, "nosuch", 0); return err }, `unknown node "nosuch"`},
		{"cordon", func() error { _, err := cl.Cordon(ctx, "nosuch", "cordon", "x"); return err }, `unknown node "nosuch"`},
		{"logs", func() error {
			return cl.Logs(ctx, &api.LogsRequest{Job: "nosuch"}, func(*api.LogsChunk) error { return nil })
		}, `unknown job "nosuch"`},
		{"cancel", func() error { _, err := cl.CancelJob(ctx, "nosuch"); return err }, `unknown job "nosuch"`},
		{"restart", func() error { _, err := cl.RestartJob(ctx, "nosuch", "", nil); return err }, `unknown job "nosuch"`},
		{"checkpoint", func() error { _, err := cl.CheckpointJob(ctx, "nosuch"); return err }, `unknown job "nosuch"`},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "`gpuctl ") {
				t.Fatalf("err %v, want %q with what to do", err, c.want)
			}
		})
	}
}

// TestMutatingRequestsAreAudited checks that a change, refused or done,
// leaves an audit event naming who asked, what, and the result, and that a
// look leaves none.
func TestMutatingRequestsAreAudited(t *testing.T) {
	s, _ := serveV2(t)
	ctx := context.Background()
	viewer := client.New(s.Local(Caller{Name: "key:bob", Role: transport.RoleViewer, Via: "ssh"}))
	op := client.New(s.Local(Caller{Name: "alice", Role: transport.RoleOperator, Via: "cert"}))
	if _, err := viewer.Cordon(ctx, "n1", "cordon", "look"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("viewer cordon: %v", err)
	}
	if _, err := viewer.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := op.SubmitJob(ctx, heldJob("audited"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.CancelJob(ctx, j.GetJob().GetId()); err != nil {
		t.Fatal(err)
	}
	evs, err := s.store.Events(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.GetKind() != api.EventKind_EVENT_KIND_AUDIT {
			continue
		}
		a := e.GetAttrs()
		res := a["result"]
		if res != "ok" {
			res = "refused"
		}
		got = append(got, fmt.Sprintf("%s/%s/%s/%s", a["who"], a["via"], a["request"], res))
		if !strings.Contains(e.GetMessage(), a["who"]) {
			t.Errorf("audit message %q does not name %s", e.GetMessage(), a["who"])
		}
	}
	want := []string{"key:bob/ssh/cordon/refused", "alice/cert/submit_job/ok", "alice/cert/cancel_job/ok"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit events %v, want %v", got, want)
	}
}

// TestReasonsAreCleaned checks that a cordon reason carrying terminal
// control sequences is stored and listed as plain, bounded text.
func TestReasonsAreCleaned(t *testing.T) {
	s, cl := serveV2(t)
	ctx := context.Background()
	_, st := fakeNode(t, s, "n1")
	registerFake(t, st, "n1")
	waitUntil(t, 5*time.Second, "n1 registered", func() bool { return s.nodes.Known("n1") })
	r, err := cl.Cordon(ctx, "n1", "cordon", "bad\x1b[2J DIMM\x07\n"+strings.Repeat("x", 2000))
	if err != nil {
		t.Fatal(err)
	}
	got := r.GetNode().GetCordonReason()
	if strings.ContainsAny(got, "\x1b\x07\n") || len(got) > 1100 || !strings.HasPrefix(got, "bad[2J DIMM") {
		t.Fatalf("cordon reason stored as %q", got)
	}
}

// registerFake says hello and registers name on a fake node's control
// stream, with a long heartbeat so the detector leaves it alone.
func registerFake(t *testing.T, st *transport.Stream, name string) {
	t.Helper()
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion()}}})
	var m api.ServerMessage
	if err := st.Recv(&m); err != nil || m.GetWelcome().GetError() != "" {
		t.Fatalf("welcome: %v %v", err, m.GetWelcome().GetError())
	}
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: &api.NodeRegistration{Name: name, HeartbeatIntervalMs: 60000}}})
}

// losingTransport delivers the first submit but loses its answer, as a
// connection dropped just after the server stored the job would.
type losingTransport struct {
	next client.Transport
	lost bool
}

func (l *losingTransport) Close() error { return nil }

func (l *losingTransport) Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	if req.GetSubmitJob() != nil && !l.lost {
		l.lost = true
		if err := l.next.Call(ctx, req, func(*api.ClientResponse) error { return nil }); err != nil {
			return err
		}
		return fmt.Errorf("connection lost before the answer")
	}
	return l.next.Call(ctx, req, fn)
}

// TestSubmitRetryCreatesNoDuplicate: a submit whose answer was lost is
// sent again with the same idempotency key and gets the job the first try
// created; one job exists.
func TestSubmitRetryCreatesNoDuplicate(t *testing.T) {
	s, _ := serveV2(t)
	ctx := context.Background()
	lt := &losingTransport{next: s.Local(Caller{Name: "ops", Role: transport.RoleAdmin, Via: "test"})}
	cl := client.New(lt)
	r, err := cl.SubmitJob(ctx, heldJob("once"))
	if err != nil {
		t.Fatal(err)
	}
	if !lt.lost {
		t.Fatal("the first answer was not lost: the test tests nothing")
	}
	jobs, err := cl.Jobs(ctx, "once")
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].GetId() != r.GetJob().GetId() || jobs[0].GetIdempotencyKey() == "" {
		t.Fatalf("after a retried submit: %d jobs named once (%v), want the one the retry answered with", len(jobs), jobs)
	}
}

// TestManyRequestsOnOneConnection: a client (the console, a --watch loop)
// makes far more requests over one connection than the server's stream
// limit (1024); each request's stream is done once answered.
func TestManyRequestsOnOneConnection(t *testing.T) {
	_, cl := serveV2(t)
	for i := 0; i < 1500; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := cl.Nodes(ctx)
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
}
