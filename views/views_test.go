package views

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

var update = flag.Bool("update", false, "rewrite golden files")

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func gpuStatus(i uint32, util uint32, healthy bool) *api.GPUStatus {
	g := &api.GPUStatus{
		Info: &api.GPUInfo{Index: i, Uuid: "GPU-0000-" + string(rune('a'+i)), Model: "NVIDIA H100 80GB HBM3", MemTotalBytes: 80 << 30,
			PciBusId: "00000000:1" + string(rune('0'+i)) + ":00.0", PowerLimitMw: 700000},
		Healthy: healthy,
		Last: &api.GPUSample{Index: i, TimeUnixNano: now.Add(-time.Second).UnixNano(), UtilGpuPercent: util, UtilMemPercent: util / 2,
			MemUsedBytes: 10 << 30, MemTotalBytes: 80 << 30, PowerMw: 300000 + util*3000, TempC: 40 + util/4, SmClockMhz: 1980,
			MemClockMhz: 2619, EnergyMj: 123456789, ThrottleNames: []string{}, Ecc: &api.ECCCounts{VolatileCorrected: 2},
			NvlinkTxBytesPerSec: 5 << 30, NvlinkRxBytesPerSec: 5 << 30, PcieTxBytesPerSec: 1 << 20, PcieRxBytesPerSec: 2 << 20,
			Processes: []*api.GPUProcess{{Pid: 4242, Name: "ringtrain", UsedMemBytes: 8 << 30}}},
	}
	if !healthy {
		g.UnhealthyReason = "XID 79 (reboot the node)"
		g.Last.ThrottleNames = []string{"hw_thermal_slowdown"}
		g.Last.RemapPending = true
	}
	return g
}

// sampleNodes covers every state a node shows: ready; cordoned with a
// long reason holding a terminal escape; down and draining with stale
// figures; a v1.0 server's cordoned state; and a node never sampled.
func sampleNodes() []*api.NodeStatus {
	reg := func(name string) *api.NodeRegistration {
		return &api.NodeRegistration{Name: name, Hostname: "host-" + name, Labels: map[string]string{"rack": "r1", "switch": "leaf-0"},
			SimProfile: "dgx-h100", AgentVersion: "0.1.0", DriverVersion: "550.54.15", CudaVersion: "12.4", HeartbeatIntervalMs: 1000}
	}
	seen := now.Add(-500 * time.Millisecond).UnixNano()
	return []*api.NodeStatus{
		{Registration: reg("node-00"), State: api.NodeState_NODE_STATE_READY, Connected: true, LastSeenUnixNano: seen,
			StateSinceUnixNano: now.Add(-3 * time.Hour).UnixNano(), RemoteAddr: "127.0.0.1:40000",
			Gpus: []*api.GPUStatus{gpuStatus(0, 97, true), gpuStatus(1, 0, true)}},
		{Registration: reg("node-01"), State: api.NodeState_NODE_STATE_READY, Connected: true, LastSeenUnixNano: seen, Cordoned: true,
			CordonReason:       "DIMM errors on socket 1, waiting for the vendor \x1b[2J to replace the board; see ticket INC-40213 for details",
			StateSinceUnixNano: now.Add(-time.Hour).UnixNano(), Gpus: []*api.GPUStatus{gpuStatus(0, 12, true)}},
		{Registration: reg("node-02"), State: api.NodeState_NODE_STATE_DOWN, Cordoned: true, Draining: true, Stale: true,
			DownReason: "no heartbeat for 2.1s", CordonReason: "maintenance", LastSeenUnixNano: now.Add(-2 * time.Minute).UnixNano(),
			StateSinceUnixNano: now.Add(-2 * time.Minute).UnixNano(), Gpus: []*api.GPUStatus{gpuStatus(0, 55, false)}, LostCollectives: 3},
		{Registration: reg("node-03"), State: api.NodeState_NODE_STATE_CORDONED, Connected: true, LastSeenUnixNano: seen,
			Gpus: []*api.GPUStatus{{Info: &api.GPUInfo{Index: 0, Uuid: "GPU-new", Model: "NVIDIA H100 80GB HBM3", MemTotalBytes: 80 << 30}, Healthy: true}}},
	}
}

func sampleEvents() []*api.Event {
	return []*api.Event{
		{Seq: 1, Node: "node-00", TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_XID, Severity: api.Severity_SEVERITY_CRITICAL,
			GpuIndex: 3, GpuUuid: "GPU-0000-d", Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE, Count: 1,
			Message: "Xid 79: GPU has fallen off the bus (reboot the node)"},
		{Seq: 2, Node: "node-01", TimeUnixNano: now.Add(time.Second).UnixNano(), Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT,
			Severity: api.Severity_SEVERITY_WARNING, Job: "j-1a2b3c", Rank: 0, Pid: 77, ExitCode: -1, Signal: "SIGKILL",
			Message: "rank 0 of j-1a2b3c (pid 77) killed by SIGKILL after the node's out-of-memory killer chose it; its last step was 4410"},
		{Seq: 3, Node: "node-01", TimeUnixNano: now.Add(2 * time.Second).UnixNano(), Kind: api.EventKind_EVENT_KIND_CHECKPOINT,
			Severity: api.Severity_SEVERITY_INFO, Job: "j-1a2b3c", Step: 4400, Bytes: 3 << 30, Seconds: 12.5, Message: "checkpoint step 4400"},
		{TimeUnixNano: now.Add(3 * time.Second).UnixNano(), Kind: api.EventKind_EVENT_KIND_RECOVERY, Severity: api.Severity_SEVERITY_INFO,
			Job: "j-1a2b3c", DurationSeconds: 4.2, Attrs: map[string]string{"step": "validate"}, Message: "validated node-03 in 4.2s"},
		{TimeUnixNano: now.Add(4 * time.Second).UnixNano(), Kind: api.EventKind_EVENT_KIND_AUDIT, Severity: api.Severity_SEVERITY_INFO,
			Attrs: map[string]string{"who": "admin", "request": "cordon", "result": "ok"}, Message: "admin cordoned node-01"},
	}
}

func sampleCollectives() []*api.CollectiveStat {
	return []*api.CollectiveStat{{Node: "node-00", Pid: 4242, Job: "j-1a2b3c", Rank: 1, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 0x5555aaaa,
		Seq: 120, Bytes: 120 << 22, Calls: 120, InCallSeconds: 1.5, LastUnixNano: now.Add(-time.Second).UnixNano(),
		Completions: 119, GpuSeconds: 2.38, CompletedSeq: 119},
		{Node: "node-01", Pid: 5150, Rank: 2, Op: api.NCCLOp_NCCL_OP_BROADCAST, Comm: 0x7f00, Seq: 1, Bytes: 4096, Calls: 1,
			InCallSeconds: 0.0001, LastUnixNano: now.Add(-time.Minute).UnixNano()}}
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

// layouts are the ways every view is golden-tested: tables at 80 and
// 160 columns, wide, and JSON.
var layouts = []struct {
	name string
	o    Options
}{
	{"table80", Options{Format: Table, Width: 80, Now: now}},
	{"table160", Options{Format: Table, Width: 160, Now: now}},
	{"wide", Options{Format: Wide, Width: 80, Now: now}},
	{"json", Options{Format: JSON, Now: now}},
}

// views are every list view with its fixture.
var views = []struct {
	name   string
	render func(w *bytes.Buffer, o Options) error
}{
	{"nodes", func(w *bytes.Buffer, o Options) error { return Nodes(w, o, sampleNodes()) }},
	{"gpus", func(w *bytes.Buffer, o Options) error { return GPUs(w, o, sampleNodes()) }},
	{"events", func(w *bytes.Buffer, o Options) error { return Events(w, o, sampleEvents()) }},
	{"collectives", func(w *bytes.Buffer, o Options) error { return Collectives(w, o, sampleCollectives()) }},
	{"jobs", func(w *bytes.Buffer, o Options) error { return Jobs(w, o, sampleJobs()) }},
	{"stalls", func(w *bytes.Buffer, o Options) error { return Stalls(w, o, sampleStalls()) }},
	// gpuctl status: its list is the servers.
	{"servers", func(w *bytes.Buffer, o Options) error { return Status(w, o, sampleStatus()) }},
	// A variant of a view is named view-variant.
	{"servers-read-only", func(w *bytes.Buffer, o Options) error { return Status(w, o, readOnlyStatus()) }},
}

// readOnlyStatus is sampleStatus while etcd is away: the leader answers
// from what it last read and refuses changes.
func readOnlyStatus() *api.StatusResponse {
	st := sampleStatus()
	since := now.Add(-12 * time.Second)
	st.StoreHealthy, st.StoreError = false, "etcd unreachable: context deadline exceeded"
	st.ReadOnly, st.ReadOnlySinceUnixNano = true, since.UnixNano()
	st.ReadOnlyReason = "the store (etcd at https://10.0.0.1:2379) is unreachable since " + since.UTC().Format(time.RFC3339) +
		": the control plane is read-only; retry when it returns (context deadline exceeded)"
	return st
}

// sampleStatus is a control plane of two servers on a three-member etcd
// with one member down, after one failover.
func sampleStatus() *api.StatusResponse {
	at := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	leader := &api.ServerStatus{Name: "head-2", Addr: "10.0.0.2:7443", Role: "leader", SinceUnixNano: at(90 * time.Second)}
	return &api.StatusResponse{Self: leader, Leader: leader, Store: "etcd", StoreHealthy: true,
		Servers: []*api.ServerStatus{leader, {Name: "head-1", Addr: "10.0.0.1:7443", Role: "standby", SinceUnixNano: at(30 * time.Second)}},
		StoreMembers: []*api.StoreMember{
			{Name: "etcd-1", Endpoint: "https://10.0.0.1:2379", Healthy: true},
			{Name: "etcd-2", Endpoint: "https://10.0.0.2:2379", Leader: true, Healthy: true},
			{Name: "etcd-3", Endpoint: "https://10.0.0.3:2379", Error: "context deadline exceeded"}},
		Leadership: []*api.Event{
			{TimeUnixNano: at(90 * time.Second), Message: "server head-2 leads the control plane at 10.0.0.2:7443", Attrs: map[string]string{"server": "head-2"}},
			{TimeUnixNano: at(48 * time.Hour), Message: "server head-1 leads the control plane at 10.0.0.1:7443", Attrs: map[string]string{"server": "head-1"}}},
		TelemetryShed: &api.TelemetryShed{Batches: 120, GpuSamples: 4960, Collectives: 960, Pace: 4}}
}

func TestGolden(t *testing.T) {
	for _, v := range views {
		for _, l := range layouts {
			t.Run(v.name+"/"+l.name, func(t *testing.T) {
				var b bytes.Buffer
				if err := v.render(&b, l.o); err != nil {
					t.Fatal(err)
				}
				golden(t, b.Bytes())
				if l.o.Format == JSON {
					return
				}
				for i, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
					if strings.ContainsRune(line, 0x1b) {
						t.Errorf("line %d holds a raw escape character: %q", i+1, line)
					}
				}
			})
		}
	}
}

// TestTablesFit checks that at 80 and 160 columns every table fits, but
// for columns that are not free text (a table whose fixed columns alone
// are wider is left as it is, as kubectl does).
func TestTablesFit(t *testing.T) {
	for _, v := range views {
		for _, width := range []int{80, 160} {
			var b bytes.Buffer
			if err := v.render(&b, Options{Format: Table, Width: width, Now: now}); err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
				if n := width0(line); n > width {
					t.Errorf("%s at %d columns: line of %d: %s", v.name, width, n, line)
				}
			}
		}
	}
}

func width0(s string) int { return len([]rune(s)) }

// TestCollectivesFitTerminal: the demo job's aggregates (long job id and
// communicator handles, busy counters) are 107 columns with every column;
// at 80 the table leaves out its least useful columns, at 200 and with
// -o wide it keeps them all.
func TestCollectivesFitTerminal(t *testing.T) {
	var cs []*api.CollectiveStat
	for rank := range int32(4) {
		node := fmt.Sprintf("node-%02d", rank/2)
		for i, op := range []api.NCCLOp{api.NCCLOp_NCCL_OP_ALL_REDUCE, api.NCCLOp_NCCL_OP_COMM_INIT_RANK} {
			cs = append(cs, &api.CollectiveStat{Node: node, Pid: 1_234_567 + uint32(rank), Job: "demo-ringtrain-7f3a9c", Rank: rank, Op: op,
				Comm: 0x55d0c0ffee00 + uint64(i)<<8, Seq: 123_456, Bytes: 123_456 << 22, Calls: 123_456, InCallSeconds: 4321.5,
				LastUnixNano: now.Add(-time.Second).UnixNano(), Completions: 123_455, GpuSeconds: 8642.9, CompletedSeq: 123_455})
		}
	}
	for _, l := range []struct {
		name string
		o    Options
		cols int
	}{
		{"table80", Options{Format: Table, Width: 80, Now: now}, 80},
		{"table200", Options{Format: Table, Width: 200, Now: now}, 200},
		{"wide", Options{Format: Wide, Width: 80, Now: now}, 0},
	} {
		t.Run(l.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Collectives(&b, l.o, cs); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			for _, line := range lines {
				if n := width0(line); l.cols > 0 && n > l.cols {
					t.Errorf("line of %d columns at %d: %s", n, l.cols, line)
				}
			}
			for _, col := range []string{"NODE", "JOB", "RANK", "COMM", "OP", "SEQ", "LAST"} {
				if !strings.Contains(lines[0], col) {
					t.Errorf("header %q lacks %s", lines[0], col)
				}
			}
			if l.cols != 80 && !strings.Contains(lines[0], "PID") {
				t.Errorf("header %q left out PID with room for it", lines[0])
			}
		})
	}
}

func TestJSONDocuments(t *testing.T) {
	for _, v := range views {
		t.Run(v.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := v.render(&b, Options{Format: JSON, Now: now}); err != nil {
				t.Fatal(err)
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			key, _, _ := strings.Cut(v.name, "-")
			var list []map[string]any
			if err := json.Unmarshal(doc[key], &list); err != nil || len(list) == 0 {
				t.Fatalf("document has no list %q: %s", key, b.Bytes())
			}
			// Every object of a list has the same fields: absent values are
			// null, never left out.
			for i := range list {
				if len(list[i]) != len(list[0]) {
					t.Errorf("%s[%d] has %d fields, %s[0] %d", v.name, i, len(list[i]), v.name, len(list[0]))
				}
			}
		})
	}
}

func TestEmptyListings(t *testing.T) {
	for _, v := range []struct {
		name   string
		render func(w *bytes.Buffer, o Options) error
		want   string
	}{
		{"nodes", func(w *bytes.Buffer, o Options) error { return Nodes(w, o, nil) }, "no nodes"},
		{"gpus", func(w *bytes.Buffer, o Options) error { return GPUs(w, o, nil) }, "no GPUs"},
		{"events", func(w *bytes.Buffer, o Options) error { return Events(w, o, nil) }, "no events"},
		{"collectives", func(w *bytes.Buffer, o Options) error { return Collectives(w, o, nil) }, "no collectives"},
		{"jobs", func(w *bytes.Buffer, o Options) error { return Jobs(w, o, nil) }, "no jobs"},
		{"stalls", func(w *bytes.Buffer, o Options) error { return Stalls(w, o, nil) }, "no stalls"},
	} {
		t.Run(v.name, func(t *testing.T) {
			var out, errw bytes.Buffer
			if err := v.render(&out, Options{Format: Table, Stderr: &errw}); err != nil {
				t.Fatal(err)
			}
			if out.Len() != 0 || !strings.HasPrefix(errw.String(), v.want) {
				t.Errorf("stdout %q, stderr %q; want nothing on stdout and %q on stderr", out.String(), errw.String(), v.want)
			}
			out.Reset()
			if err := v.render(&out, Options{Format: JSON}); err != nil {
				t.Fatal(err)
			}
			if want := "{\n  \"" + v.name + "\": []\n}\n"; out.String() != want {
				t.Errorf("JSON %q, want %q", out.String(), want)
			}
		})
	}
}

func TestSortAndHeaders(t *testing.T) {
	tests := []struct {
		name, sortBy string
		noHeaders    bool
		want         []string // first column of each line
		err          string
	}{
		{name: "server order", want: []string{"ID", "j-1a2b3c", "j-4d5e6f", "j-777777", "j-888888", "j-999999"}},
		{name: "by age, youngest first", sortBy: "age", want: []string{"ID", "j-888888", "j-4d5e6f", "j-1a2b3c", "j-777777", "j-999999"}},
		{name: "by gpus, numerically", sortBy: "GPUS", want: []string{"ID", "j-777777", "j-888888", "j-1a2b3c", "j-999999", "j-4d5e6f"}},
		{name: "by name", sortBy: "name", noHeaders: true, want: []string{"j-777777", "j-4d5e6f", "j-999999", "j-888888", "j-1a2b3c"}},
		{name: "unknown column", sortBy: "colour", err: `--sort-by "colour": no such column; use one of id, name, state, gpus, nodes, age, reason`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			err := Jobs(&b, Options{Format: Table, Now: now, SortBy: tc.sortBy, NoHeaders: tc.noHeaders}, sampleJobs())
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
				got = append(got, strings.Fields(line)[0])
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("rows %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHostList(t *testing.T) {
	tests := []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"node-00"}, "node-00"},
		{[]string{"node-00", "node-01", "node-02", "node-07"}, "node-[00-02,07]"},
		{[]string{"node-03", "node-01"}, "node-[01,03]"},
		{[]string{"gpu9", "gpu10", "gpu11"}, "gpu9,gpu[10-11]"},
		{[]string{"a1", "b1", "a2", "head"}, "a[1-2],b1,head"},
	}
	for _, tc := range tests {
		if got := HostList(tc.in); got != tc.want {
			t.Errorf("HostList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNodeStateText(t *testing.T) {
	tests := []struct {
		n    *api.NodeStatus
		want string
	}{
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_READY}, "ready"},
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_READY, Cordoned: true}, "ready,cordoned"},
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_READY, Cordoned: true, Draining: true}, "ready,draining"},
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_DOWN}, "down"},
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_DOWN, Cordoned: true, Draining: true}, "down,draining"},
		// What a server before protocol v1.1 reports.
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_CORDONED}, "ready,cordoned"},
		{&api.NodeStatus{State: api.NodeState_NODE_STATE_DRAINING}, "ready,draining"},
	}
	for _, tc := range tests {
		if got := NodeStateText(tc.n); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.n, got, tc.want)
		}
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

// TestObserveJSONLines checks the observe stream's lines: enums by name,
// durations in seconds, peer null when the op has none.
func TestObserveJSONLines(t *testing.T) {
	var b bytes.Buffer
	o := NewObserveWriter(&b, JSONLines)
	err := o.Batch(&api.ObserveBatch{Items: []*api.ObserveItem{
		{Node: "node-00", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{StartUnixNano: now.UnixNano(),
			DurationNs: 1500000, Pid: 9, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 0x10, Seq: 5, Count: 1024, Datatype: 9, Bytes: 2048,
			Job: "j-1a2b3c", Rank: 1, Peer: -1, Result: 0}}},
		{Node: "node-00", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{StartUnixNano: now.UnixNano(),
			Op: api.NCCLOp_NCCL_OP_SEND, Datatype: 7, Peer: 3, Result: 6}}},
		{Node: "node-01", Body: &api.ObserveItem_Flow{Flow: &api.NetFlowSample{TimeUnixNano: now.UnixNano(), Pid: 9, LocalAddr: "127.0.0.1:5000",
			RemoteAddr: "127.0.0.1:6000", Protocol: "tcp", TxBytes: 10, RxBytes: 20, Retransmits: 1, Job: "j-1a2b3c", Rank: 1}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, b.Bytes())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var first, second map[string]any
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &second)
	if first["datatype"] != "bfloat16" || first["result"] != "success" || first["duration_seconds"] != 0.0015 || first["peer"] != nil {
		t.Errorf("collective line %s", lines[0])
	}
	if second["datatype"] != "float32" || second["result"] != "remote_error" || second["peer"] != 3.0 {
		t.Errorf("send line %s", lines[1])
	}
}
