package controlplane

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/transport"
)

// startServer runs a real control plane on 127.0.0.1:0.
func startServer(t *testing.T) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, dir
}

// fakeNode joins with a token and opens a control stream.
func fakeNode(t *testing.T, s *Server, name string) (*transport.Conn, *transport.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, _, err := s.Authority().CreateToken(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, err := transport.Join(ctx, s.Addr().String(), tok, name, filepath.Join(t.TempDir(), "id"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := transport.DialNode(ctx, s.Addr().String(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(10 * time.Second))
	return conn, st
}

func TestHandshakeRefusals(t *testing.T) {
	s, _ := startServer(t)
	tests := []struct {
		name    string
		version *api.Version
		regName string
		want    string
	}{
		{"unknown major version", &api.Version{Major: api.ProtocolMajor + 1}, "", "protocol v2"},
		{"registration under another name", api.CurrentVersion(), "someone-else", "certificate names"},
		// A v1.1 nodemon that lists no features may not fence one attempt
		// alone: it is refused at hello, told to upgrade.
		{"v1.1 without features", &api.Version{Major: 1, Minor: 1}, "", "protocol v1.1 without fence"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := []string{"n-a", "n-b", "n-c"}[i]
			_, st := fakeNode(t, s, node)
			if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: tc.version}}}); err != nil {
				t.Fatal(err)
			}
			var m api.ServerMessage
			if err := st.Recv(&m); err != nil {
				// The refusal may close the connection before the welcome
				// is read; the close carries the same reason.
				var refused *transport.RefusedError
				if errors.As(err, &refused) && strings.Contains(refused.Reason, tc.want) {
					return
				}
				t.Fatalf("after hello: %v", err)
			}
			if e := m.GetWelcome().GetError(); e != "" {
				if !strings.Contains(e, tc.want) {
					t.Fatalf("welcome error %q, want it to mention %q", e, tc.want)
				}
				return
			}
			st.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: &api.NodeRegistration{Name: tc.regName}}})
			err := st.Recv(&m)
			var refused *transport.RefusedError
			var closed *transport.PeerClosedError
			switch {
			case errors.As(err, &refused) && strings.Contains(refused.Reason, tc.want):
			case errors.As(err, &closed) && strings.Contains(closed.Reason, tc.want):
			default:
				t.Fatalf("after a bad registration: %v (%T), want a refusal mentioning %q", err, err, tc.want)
			}
		})
	}
}

func TestClientRolesAndViews(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	// A node registers and sends one telemetry batch and one event.
	conn, st := fakeNode(t, s, "gpu-1")
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion()}}})
	var m api.ServerMessage
	if err := st.Recv(&m); err != nil || m.GetWelcome().GetError() != "" {
		t.Fatalf("welcome: %v %v", err, m.GetWelcome().GetError())
	}
	reg := &api.NodeRegistration{Name: "gpu-1", HeartbeatIntervalMs: 60000, Gpus: []*api.GPUInfo{{Index: 0, Uuid: "GPU-1", Model: "H100"}}}
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg}})
	ev, err := conn.OpenStream(ctx, transport.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	ev.Send(&api.AgentMessage{Body: &api.AgentMessage_Event{Event: &api.Event{Seq: 1, Kind: api.EventKind_EVENT_KIND_XID, Xid: 79,
		XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE, GpuIndex: 0, Message: "fell off the bus"}}})
	ev.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := ev.Recv(&m); err != nil || m.GetEventAck().GetSeq() != 1 {
		t.Fatalf("event ack: %v, %v", err, &m)
	}

	admin, err := client.Dial(ctx, AdminConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	nodes, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].GetState() != api.NodeState_NODE_STATE_READY || nodes[0].GetGpus()[0].GetHealthy() {
		t.Fatalf("nodes = %v; want gpu-1 ready with GPU 0 unhealthy after XID 79", nodes)
	}
	evs, err := admin.Events(ctx, &api.ListEventsRequest{Node: "gpu-1"})
	if err != nil {
		t.Fatal(err)
	}
	var xids int
	for _, e := range evs {
		if e.GetXid() == 79 {
			xids++
		}
	}
	if xids != 1 {
		t.Fatalf("%d XID 79 events in %v", xids, evs)
	}
	if _, _, err := admin.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour}); err != nil {
		t.Fatalf("admin token: %v", err)
	}
	// create_token (field 6), as a client older than v1.1 sends it, is
	// refused saying what to do.
	old := &api.ClientRequest{}
	old.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.BytesType), 0))
	err = admin.Transport().Call(ctx, old, func(r *api.ClientResponse) error {
		if r.GetError() != "" {
			return errors.New(r.GetError())
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "older than protocol v1.1") || !strings.Contains(err.Error(), "gpuctl token create") {
		t.Errorf("create_token of a client before v1.1: %v, want the refusal naming the version and what to do", err)
	}
	if err := admin.InjectFault(ctx, "nope", &api.InjectFault{Kind: api.FaultKind_FAULT_KIND_XID79}); err == nil || !strings.Contains(err.Error(), "unknown node") {
		t.Fatalf("fault on unknown node: %v", err)
	}

	// A viewer may look but not make tokens.
	id, err := s.Authority().IssueClient("watcher", transport.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	viewerCfg := filepath.Join(t.TempDir(), "viewer.yaml")
	if err := transport.WriteClientConfig(viewerCfg, s.Addr().String(), id); err != nil {
		t.Fatal(err)
	}
	viewer, err := client.Dial(ctx, viewerCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer viewer.Close()
	if _, err := viewer.Nodes(ctx); err != nil {
		t.Fatalf("viewer list nodes: %v", err)
	}
	if _, _, err := viewer.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour}); err == nil || !strings.Contains(err.Error(), "permission denied: create_join_token needs the admin role, watcher has viewer") {
		t.Fatalf("viewer token: %v, want permission denied", err)
	}
	if _, err := viewer.Cordon(ctx, "gpu-1", "cordon", "mine"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("viewer cordon: %v, want permission denied", err)
	}
	if n, _ := viewer.Nodes(ctx); len(n) != 1 || n[0].GetCordoned() {
		t.Fatalf("a refused cordon changed the node: %v", n)
	}
	// Both the change and the refusal are audited, with who and the result.
	audits, err := admin.Events(ctx, &api.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var audited []string
	for _, e := range audits {
		if e.GetKind() == api.EventKind_EVENT_KIND_AUDIT {
			a := e.GetAttrs()
			audited = append(audited, a["who"]+" "+a["request"]+" "+strings.SplitN(a["result"], ":", 2)[0])
		}
	}
	for _, want := range []string{"admin create_join_token ok", "watcher create_join_token permission denied", "watcher cordon permission denied"} {
		if !slices.Contains(audited, want) {
			t.Errorf("no audit event %q among %q", want, audited)
		}
	}
	// Stalls of a job the server does not know is an error, not nothing.
	if _, err := viewer.ListStalls(ctx, "no-such-job"); err == nil || !strings.Contains(err.Error(), `unknown job "no-such-job"`) {
		t.Errorf("stalls of an unknown job: %v", err)
	}
	if _, err := s.Stalls("no-such-job"); err == nil {
		t.Error("Stalls of an unknown job: no error")
	}

	// The node's connection closing disconnects it at once; it is down
	// only if it stays away as long as a silent node (its heartbeat is a
	// minute here: controlplane/nodes tests that part on a clock).
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		nodes, _ := admin.Nodes(ctx)
		if len(nodes) == 1 && !nodes[0].GetConnected() {
			if n := nodes[0]; n.GetState() != api.NodeState_NODE_STATE_READY {
				t.Fatalf("node %s at once after its connection closed (%q)", n.GetState().Short(), n.GetDownReason())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node still connected after its connection closed: %v", nodes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestObserveStreamsAndEnds(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	conn, st := fakeNode(t, s, "gpu-2")
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion()}}})
	var m api.ServerMessage
	st.Recv(&m)
	st.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: &api.NodeRegistration{Name: "gpu-2", HeartbeatIntervalMs: 60000}}})
	tel, err := conn.OpenStream(ctx, transport.StreamTelemetry)
	if err != nil {
		t.Fatal(err)
	}
	var calls []*api.CollectiveRecord
	for i := 1; i <= 50; i++ {
		calls = append(calls, &api.CollectiveRecord{Seq: uint64(i), Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Job: "j", Rank: int32(i % 2),
			Bytes: uint64(i * 100), DurationNs: int64(i) * 1e6, StartUnixNano: time.Now().UnixNano()})
	}
	tel.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: &api.Telemetry{Collectives: calls, LostCollectives: 7}}})

	cl, err := client.Dial(ctx, AdminConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*api.ObserveItem
	var lost uint64
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 10 && time.Now().Before(deadline) {
		got = got[:0]
		err := cl.Observe(ctx, &api.ObserveRequest{Filter: &api.ObserveFilter{HasRank: true, Rank: 1, SlowerThanNs: 20e6}, Last: 10},
			func(b *api.ObserveBatch) error {
				got = append(got, b.GetItems()...)
				lost = b.GetLostAtNodes()
				return nil
			})
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) != 10 || lost != 7 {
		t.Fatalf("observe --rank 1 --slower-than 20ms --last 10: %d items, lost %d; want 10, 7", len(got), lost)
	}
	for _, it := range got {
		c := it.GetCollective()
		if c.GetRank() != 1 || c.GetDurationNs() < 20e6 {
			t.Fatalf("filter let through %v", c)
		}
	}
	if got[9].GetCollective().GetSeq() != 49 {
		t.Fatalf("last item seq %d, want the newest (49)", got[9].GetCollective().GetSeq())
	}
}

func TestCarbonPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.carbon")
	bad := filepath.Join(dir, "bad.carbon")
	for path, text := range map[string]string{good: "site=eu" + strings.Repeat(" 100", 24) + "\n", bad: "# curves\nsite=eu 1 2 3\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		cfg     Config
		name    string
		wantErr string
	}{
		{Config{}, "fifo", ""},
		{Config{CarbonIntensity: good}, "fifo", ""},
		{Config{CarbonIntensity: good, CarbonAware: true}, "fifo+carbon", ""},
		{Config{CarbonAware: true}, "", "--carbon-aware needs --carbon-intensity FILE"},
		{Config{CarbonIntensity: bad, CarbonAware: true}, "", "bad.carbon:2: site=eu has 3 values; give 24"},
		{Config{CarbonIntensity: filepath.Join(dir, "none")}, "", "--carbon-intensity: open"},
	} {
		p, in, err := carbonPolicy(tc.cfg, scheduler.FIFO{})
		if err == nil && (in != nil) != (tc.cfg.CarbonIntensity != "") {
			t.Errorf("%+v: curves %v", tc.cfg, in)
		}
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: error %v; want %q", tc.cfg, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || p.Name() != tc.name):
			t.Errorf("%+v: %v, %v; want policy %s", tc.cfg, p, err, tc.name)
		}
	}
}

func TestHeteroPolicy(t *testing.T) {
	for _, tc := range []struct {
		hetero, name, wantErr string
	}{
		{"", "fifo", ""},
		{"max-throughput", "fifo+max-throughput", ""},
		{"max-min-fair", "fifo+max-min-fair", ""},
		{"fastest", "", `--hetero: unknown heterogeneity objective "fastest"; use max-throughput or max-min-fair`},
	} {
		p, err := heteroPolicy(Config{Hetero: tc.hetero}, scheduler.FIFO{})
		switch {
		case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
			t.Errorf("%q: error %v; want %q", tc.hetero, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || p.Name() != tc.name):
			t.Errorf("%q: %v, %v; want policy %s", tc.hetero, p, err, tc.name)
		}
	}
}
