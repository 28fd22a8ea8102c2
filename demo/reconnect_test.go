package demo

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/store"
)

// TestNodeRidesOutServerRestart stops the server under a connected node,
// injects a GPU fault while it is gone, and starts a new server on the same
// address and data dir: the node reconnects by itself, the XID arrives
// exactly once, and the telemetry it could not buffer is counted.
func TestNodeRidesOutServerRestart(t *testing.T) {
	dataDir := t.TempDir()
	srv, stop := runServer(t, dataDir, "127.0.0.1:0")
	addr := srv.Addr().String()
	token, _, err := srv.Authority().CreateToken(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	probes := runAgent(t, agent.Config{Server: addr, Token: token, Name: "r1", DataDir: t.TempDir(),
		Interval: 50 * time.Millisecond, Heartbeat: 100 * time.Millisecond, TelemetryBuffer: 3})

	waitNode := func(s *controlplane.Server, what string, ok func(*api.NodeStatus) bool) {
		t.Helper()
		poll(t, 15*time.Second, what, func() error {
			for _, n := range s.Nodes() {
				if n.GetRegistration().GetName() == "r1" && ok(n) {
					return nil
				}
			}
			return fmt.Errorf("not yet: %v", s.Nodes())
		})
	}
	waitNode(srv, "r1 ready", func(n *api.NodeStatus) bool { return n.GetState() == api.NodeState_NODE_STATE_READY })
	stop()

	if err := probes.Inject(&api.InjectFault{GpuIndex: 2, Kind: api.FaultKind_FAULT_KIND_XID79}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // 20 samples against a buffer of 3

	srv2, stop2 := runServer(t, dataDir, addr)
	t.Cleanup(stop2)
	waitNode(srv2, "r1 back with GPU 2 unhealthy and drops counted", func(n *api.NodeStatus) bool {
		return n.GetState() == api.NodeState_NODE_STATE_READY && !n.GetGpus()[2].GetHealthy() && n.GetDroppedBatches() > 0
	})
	stop2()
	st, err := store.OpenBolt(filepath.Join(dataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.Events(store.EventFilter{Node: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	xids := 0
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_XID && e.GetXid() == 79 {
			xids++
			if e.GetXidClass() == api.XIDClass_XID_CLASS_UNSPECIFIED || e.GetGpuIndex() != 2 {
				t.Errorf("XID event %v lacks its class or GPU", e)
			}
		}
	}
	if xids != 1 {
		t.Fatalf("%d XID 79 events persisted, want exactly 1: %v", xids, evs)
	}
}
