package views

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

var update = flag.Bool("update", false, "rewrite golden files")

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func sampleNodes() []*api.NodeStatus {
	gpu := func(i uint32, util uint32, healthy bool) *api.GPUStatus {
		g := &api.GPUStatus{
			Info:    &api.GPUInfo{Index: i, Uuid: "GPU-0000-" + string(rune('a'+i)), Model: "NVIDIA H100 80GB HBM3", MemTotalBytes: 80 << 30},
			Healthy: healthy,
			Last: &api.GPUSample{Index: i, TimeUnixNano: now.Add(-time.Second).UnixNano(), UtilGpuPercent: util, MemUsedBytes: 10 << 30,
				MemTotalBytes: 80 << 30, PowerMw: 300000 + util*3000, TempC: 40 + util/4, SmClockMhz: 1980, EnergyMj: 123456789,
				ThrottleNames: []string{}, Ecc: &api.ECCCounts{VolatileCorrected: 2},
				Processes: []*api.GPUProcess{{Pid: 4242, Name: "ringtrain", UsedMemBytes: 8 << 30}}},
		}
		if !healthy {
			g.UnhealthyReason = "XID 79 (reboot the node)"
		}
		return g
	}
	return []*api.NodeStatus{
		{Registration: &api.NodeRegistration{Name: "node-00", Labels: map[string]string{"rack": "r1"}, SimProfile: "dgx-h100"},
			State: api.NodeState_NODE_STATE_READY, Connected: true, LastSeenUnixNano: now.Add(-500 * time.Millisecond).UnixNano(),
			RemoteAddr: "127.0.0.1:40000", Gpus: []*api.GPUStatus{gpu(0, 97, true), gpu(1, 0, true)}},
		{Registration: &api.NodeRegistration{Name: "node-01"}, State: api.NodeState_NODE_STATE_DOWN,
			LastSeenUnixNano: now.Add(-2 * time.Minute).UnixNano(), Gpus: []*api.GPUStatus{gpu(0, 0, false)}, LostCollectives: 3},
	}
}

func golden(t *testing.T, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", t.Name()+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./views -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestNodesFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Nodes(&b, f, sampleNodes(), now); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func TestNodesJSONContract(t *testing.T) {
	var b bytes.Buffer
	if err := Nodes(&b, JSON, sampleNodes(), now); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	n := doc["nodes"][0]
	for _, k := range []string{"name", "state", "last_seen", "gpus"} {
		if _, ok := n[k]; !ok {
			t.Errorf("node lacks %q", k)
		}
	}
	g := n["gpus"].([]any)[0].(map[string]any)
	for _, k := range []string{"index", "uuid", "model", "util_percent", "mem_used_bytes", "mem_total_bytes", "temp_c", "power_w"} {
		if _, ok := g[k]; !ok {
			t.Errorf("gpu lacks %q", k)
		}
	}
	if n["state"] != "ready" || doc["nodes"][1]["state"] != "down" {
		t.Errorf("states = %v, %v", n["state"], doc["nodes"][1]["state"])
	}
}

func TestGPUsFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := GPUs(&b, f, sampleNodes()); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func sampleEvents() []*api.Event {
	return []*api.Event{
		{Seq: 1, Node: "node-00", TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_XID, Severity: api.Severity_SEVERITY_CRITICAL,
			GpuIndex: 3, Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE, Message: "GPU has fallen off the bus"},
		{Seq: 2, Node: "node-01", TimeUnixNano: now.Add(time.Second).UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT,
			Severity: api.Severity_SEVERITY_WARNING, Job: "demo", Rank: 0, Pid: 77, ExitCode: -1, Signal: "SIGKILL", Message: "rank 0 killed"},
	}
}

func TestEventsFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Events(&b, f, sampleEvents()); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func TestCollectivesFormats(t *testing.T) {
	cs := []*api.CollectiveStat{{Node: "node-00", Pid: 4242, Job: "demo", Rank: 1, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 0x5555aaaa,
		Seq: 120, Bytes: 120 << 22, Calls: 120, InCallSeconds: 1.5, LastUnixNano: now.Add(-time.Second).UnixNano()}}
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Collectives(&b, f, cs, now); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func TestObserveWriterReportsLoss(t *testing.T) {
	item := &api.ObserveItem{Node: "node-00", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{
		StartUnixNano: now.UnixNano(), DurationNs: 1500000, Pid: 9, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 0x10, Seq: 5,
		Bytes: 4096, Job: "demo", Rank: 1, Peer: -1}}}
	for _, f := range []ObserveFormat{Compact, JSONLines} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			o := NewObserveWriter(&b, f)
			// Losses at nodes before the observer started are not reported.
			if err := o.Batch(&api.ObserveBatch{Items: []*api.ObserveItem{item}, LostAtNodes: 10}); err != nil {
				t.Fatal(err)
			}
			if err := o.Batch(&api.ObserveBatch{LostByServer: 4, LostAtNodes: 12}); err != nil {
				t.Fatal(err)
			}
			byServer, atNodes := o.Lost()
			if byServer != 4 || atNodes != 2 {
				t.Fatalf("Lost() = %d, %d; want 4, 2", byServer, atNodes)
			}
			out := b.String()
			if f == JSONLines {
				if !bytes.Contains(b.Bytes(), []byte(`"type":"lost"`)) || !bytes.Contains(b.Bytes(), []byte(`"lost_by_server":4`)) {
					t.Fatalf("no loss line in %s", out)
				}
			} else if !bytes.Contains(b.Bytes(), []byte("4 records dropped")) || !bytes.Contains(b.Bytes(), []byte("2 lost at nodes")) {
				t.Fatalf("no loss line in %s", out)
			}
		})
	}
}
