package tui

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/dialog"
	"github.com/gpuctl/gpuctl/tui/fixture"
	"github.com/gpuctl/gpuctl/tui/view/job"
	"github.com/gpuctl/gpuctl/tui/view/nodes"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// harness is a console on a fixed cluster with a fixed clock, whose
// commands run synchronously.
type harness struct {
	t   *testing.T
	m   *Model
	cl  *fixture.Client
	now time.Time
}

func newHarness(t *testing.T, role transport.Role, w, h int) *harness {
	t.Helper()
	hs := &harness{t: t, cl: &fixture.Client{LogLines: []string{"step 1233 loss 2.31", "step 1234 loss 2.30"}}, now: fixture.Now}
	ascii, dark := colorprofile.Ascii, true
	hs.m = New(Options{Client: hs.cl, Role: role, User: "alice", Profile: &ascii, Dark: &dark, Now: func() time.Time { return hs.now }})
	hs.m.ctx.Tick = func(time.Duration, func(time.Time) tea.Msg) tea.Cmd { return nil }
	hs.send(tea.WindowSizeMsg{Width: w, Height: h})
	hs.send(app.SnapshotMsg{Snap: fixture.Cluster(40, 8)})
	return hs
}

// send delivers msg and everything the commands it starts answer.
func (hs *harness) send(msg tea.Msg) {
	hs.t.Helper()
	_, cmd := hs.m.Update(msg)
	hs.run(cmd, 0)
}

func (hs *harness) run(cmd tea.Cmd, depth int) {
	if cmd == nil || depth > 50 {
		return
	}
	msg := cmd()
	switch msg := msg.(type) {
	case nil:
		return
	case tea.BatchMsg:
		for _, c := range msg {
			hs.run(c, depth+1)
		}
		return
	case tea.QuitMsg:
		return
	}
	if reflect.TypeOf(msg).String() == "tea.sequenceMsg" {
		return
	}
	_, next := hs.m.Update(msg)
	hs.run(next, depth+1)
}

// keys types each key: "enter", "esc", "tab", "ctrl+k", or runs of text.
func (hs *harness) keys(ks ...string) {
	hs.t.Helper()
	for _, k := range ks {
		hs.send(keyMsg(k))
	}
}

func (hs *harness) text(s string) {
	for _, r := range s {
		hs.send(keyMsg(string(r)))
	}
}

func keyMsg(k string) tea.KeyPressMsg {
	switch k {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "right":
		return tea.KeyPressMsg{Code: tea.KeyRight}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	}
	if c, ok := strings.CutPrefix(k, "ctrl+"); ok {
		return tea.KeyPressMsg{Code: rune(c[0]), Mod: tea.ModCtrl}
	}
	r := []rune(k)[0]
	if r >= 'A' && r <= 'Z' {
		return tea.KeyPressMsg{Code: r + 32, ShiftedCode: r, Mod: tea.ModShift, Text: k}
	}
	return tea.KeyPressMsg{Code: r, Text: k}
}

// command types a : command.
func (hs *harness) command(c string) {
	hs.keys(":")
	hs.text(c)
	hs.keys("enter")
}

// confirm waits out the dialog's grace, moves to Confirm and presses it.
func (hs *harness) confirm() {
	hs.t.Helper()
	if hs.m.Overlay() == nil {
		hs.t.Fatalf("no dialog open; screen:\n%s", hs.screen())
	}
	hs.now = hs.now.Add(dialog.Grace)
	hs.keys("tab", "enter")
}

func (hs *harness) screen() string { return ansi.Strip(hs.m.Render()) }

// slow delivers the fixture's fail-slow findings and lateness, as the
// console's poll would.
func (hs *harness) slow() {
	hs.t.Helper()
	hs.send(app.SnapshotMsg{Snap: fixture.SlowCluster(40, 8)})
	hs.send(app.SlowMsg{Resp: fixture.Slow()})
}

// typed makes the running job one allowing h100 and a100-80gb, started
// on the h100s.
func (hs *harness) typed() {
	hs.t.Helper()
	snap := fixture.Cluster(40, 8)
	for i, j := range snap.Jobs {
		if j.GetId() != "j-0a1b2c" {
			continue
		}
		j = proto.Clone(j).(*api.Job)
		j.TypePlans = []*api.JobTypePlan{
			{GpuModel: "h100", Plan: proto.Clone(j.GetPlan()).(*api.JobPlan)},
			{GpuModel: "a100-80gb", Plan: &api.JobPlan{Tp: 4, Pp: 4, Dp: 2, Source: "planner", StepSeconds: 2 * j.GetPlan().GetStepSeconds()}},
		}
		j.GpuType, j.GpuTypeReason = "h100", "h100: 2.00× its a100-80gb throughput; max-throughput"
		snap.Jobs[i] = j
	}
	hs.send(app.SnapshotMsg{Snap: snap})
}

func (hs *harness) calls(method string) []fixture.Call {
	var out []fixture.Call
	for _, c := range hs.cl.Calls() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test -run %s -update rewrites it):\n--- got\n%s\n--- want\n%s", path, t.Name(), got, want)
	}
}

// TestViewsGolden renders every view from the fixed cluster at 80×24 and
// 160×48 with colour off.
func TestViewsGolden(t *testing.T) {
	views := []struct {
		name string
		do   func(hs *harness)
	}{
		{"overview", func(*harness) {}},
		{"overview-memory", func(hs *harness) { hs.keys("m") }},
		{"nodes", func(hs *harness) { hs.command("nodes") }},
		{"nodes-wide", func(hs *harness) { hs.command("nodes"); hs.keys("ctrl+w") }},
		{"node", func(hs *harness) { hs.command("node node-0001") }},
		{"gpu", func(hs *harness) { hs.command("gpu node-0000 2") }},
		{"jobs", func(hs *harness) { hs.command("jobs") }},
		{"job-ranks", func(hs *harness) { hs.command("job j-0a1b2c") }},
		{"job-xray", func(hs *harness) { hs.command("job j-0a1b2c"); hs.keys("2") }},
		{"job-grid", func(hs *harness) { hs.command("job j-0a1b2c"); hs.keys("3") }},
		{"job-logs", func(hs *harness) { hs.command("job j-0a1b2c"); hs.keys("4") }},
		{"job-typed", func(hs *harness) { hs.typed(); hs.command("job j-0a1b2c") }},
		{"stalls", func(hs *harness) { hs.command("stalls") }},
		{"events", func(hs *harness) { hs.command("events") }},
		{"events-xid", func(hs *harness) { hs.command("events kind:xid") }},
		{"observe", func(hs *harness) { hs.command("observe") }},
		{"plan", func(hs *harness) { hs.command("plan llama2-70b 64 h100") }},
		{"help-jobs", func(hs *harness) { hs.command("jobs"); hs.keys("?") }},
		{"confirm-cordon", func(hs *harness) { hs.command("nodes"); hs.keys("c") }},
		{"confirm-restart", func(hs *harness) { hs.command("job j-0a1b2c"); hs.keys("R") }},
		{"slow-overview", func(hs *harness) { hs.slow() }},
		{"slow-stalls", func(hs *harness) { hs.slow(); hs.command("stalls"); hs.keys("j") }},
		{"slow-stalls-link", func(hs *harness) { hs.slow(); hs.command("stalls"); hs.keys("j", "j") }},
		{"slow-job-ranks", func(hs *harness) { hs.slow(); hs.command("job j-0a1b2c") }},
		{"slow-job-grid", func(hs *harness) { hs.slow(); hs.command("job j-0a1b2c"); hs.keys("3") }},
		{"slow-gpu", func(hs *harness) { hs.slow(); hs.keys("@") }},
		{"slow-flows", func(hs *harness) { hs.slow(); hs.keys("@", "w") }},
		{"contexts", func(hs *harness) { hs.withContexts(); hs.command("ctx") }},
	}
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		for _, v := range views {
			name := fmt.Sprintf("%s-%dx%d", v.name, size[0], size[1])
			t.Run(name, func(t *testing.T) {
				hs := newHarness(t, transport.RoleOperator, size[0], size[1])
				v.do(hs)
				got := hs.screen()
				if n := strings.Count(got, "\n") + 1; n != size[1] {
					t.Errorf("screen has %d lines, want %d", n, size[1])
				}
				golden(t, name, got)
			})
		}
	}
}

func TestNavigation(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	if got := hs.m.Top().Name(); got != "overview" {
		t.Fatalf("first view %s, want overview", got)
	}
	hs.keys("enter")
	if got := hs.m.Top().Title(); got != "node-0000" {
		t.Fatalf("enter on the overview opened %q, want node-0000", got)
	}
	hs.keys("enter")
	if got := hs.m.Top().Name(); got != "gpu" {
		t.Fatalf("enter on a node opened %q, want the GPU view", got)
	}
	if c := hs.calls("GPUHistory"); len(c) != 1 || c[0].Args[0] != "node-0000" || c[0].Args[1] != 0 {
		t.Errorf("GPU view asked %v, want GPUHistory(node-0000, 0)", c)
	}
	hs.keys("esc", "esc")
	if got := hs.m.Top().Name(); got != "overview" {
		t.Fatalf("esc esc back at %s, want overview", got)
	}
	hs.command("jobs")
	hs.keys("enter")
	if j, ok := hs.m.Top().(*job.Model); !ok || j.Job().GetId() != "j-0a1b2c" {
		t.Fatalf(":jobs then enter opened %T", hs.m.Top())
	}
	// ! jumps to the lagging rank of the live stall.
	hs.keys("0", "!")
	j, ok := hs.m.Top().(*job.Model)
	if !ok {
		t.Fatalf("! opened %T, want the job", hs.m.Top())
	}
	if !strings.Contains(hs.screen(), "L 5") {
		t.Errorf("the job view does not mark rank 5 lagging:\n%s", hs.screen())
	}
	_ = j
	// Unknown commands say what exists.
	hs.command("nosuch")
	if f, isErr := hs.m.Flash(); !isErr || !strings.Contains(f, "unknown command") {
		t.Errorf("flash after :nosuch = %q", f)
	}
}

func TestCommandCompletionAndHistory(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	hs.keys(":")
	hs.text("no")
	hs.keys("tab")
	if v := hs.m.prompt.Value; v != "node" {
		t.Errorf("tab after 'no' gives %q, want the common prefix node", v)
	}
	hs.text(" node-000")
	hs.keys("tab")
	if v := hs.m.prompt.Value; v != "node node-000" && !strings.HasPrefix(v, "node node-000") {
		t.Errorf("tab on a node name gives %q", v)
	}
	hs.keys("backspace", "backspace", "backspace", "backspace")
	hs.text("0012")
	hs.keys("enter")
	if got := hs.m.Top().Title(); got != "node-0012" {
		t.Fatalf(":node node-0012 opened %q", got)
	}
	hs.keys(":", "up")
	if v := hs.m.prompt.Value; v != "node node-0012" {
		t.Errorf("history up gives %q", v)
	}
	hs.keys("esc")
}

func TestFilter(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	hs.command("nodes")
	hs.keys("/")
	hs.text("cordoned")
	v := hs.m.Top().(*nodes.Model)
	rows := v.Rows()
	if len(rows) == 0 {
		t.Fatal("filter cordoned left no rows")
	}
	for _, r := range rows {
		n := hs.m.ctx.Snap.Node(r)
		if app.NodeBadge(n, time.Now()) != "cordoned" {
			t.Errorf("filter cordoned kept %s (%s)", r, app.NodeBadge(n, time.Now()))
		}
	}
	hs.keys("enter", "esc")
	if len(v.Rows()) != 40 {
		t.Errorf("esc keeps %d rows, want the filter cleared (40)", len(v.Rows()))
	}
}

func TestActions(t *testing.T) {
	cases := []struct {
		name   string
		do     func(hs *harness)
		method string
		args   []any
	}{
		{"cordon from nodes", func(hs *harness) {
			hs.command("nodes")
			hs.keys("c")
			hs.now = hs.now.Add(dialog.Grace)
			hs.text("bad fan")
			hs.keys("tab", "enter")
		}, "Cordon", []any{"node-0000", "cordon", "bad fan"}},
		{"uncordon marked nodes", func(hs *harness) {
			hs.command("nodes")
			hs.keys("space", "space", "u")
			hs.confirm()
		}, "Cordon", []any{"node-0001", "uncordon", ""}},
		{"drain from the node view", func(hs *harness) {
			hs.command("node node-0003")
			hs.keys("d")
			hs.confirm()
		}, "Cordon", []any{"node-0003", "drain", ""}},
		{"cordon from the overview", func(hs *harness) {
			hs.keys("right", "c")
			hs.confirm()
		}, "Cordon", []any{"node-0001", "cordon", ""}},
		{"checkpoint", func(hs *harness) {
			hs.command("jobs")
			hs.keys("C")
			hs.confirm()
		}, "CheckpointJob", []any{"j-0a1b2c"}},
		{"restart excludes the lagging node", func(hs *harness) {
			hs.command("job j-0a1b2c")
			hs.keys("R")
			hs.confirm()
		}, "RestartJob", []any{"j-0a1b2c", "latest", []string{"node-0001"}}},
		{"cancel", func(hs *harness) {
			hs.command("jobs")
			hs.keys("down", "ctrl+k")
			hs.confirm()
		}, "CancelJob", []any{"j-3d4e5f"}},
		{"assign to marked nodes", func(hs *harness) {
			hs.command("nodes")
			hs.keys("down", "down", "space", "space")
			hs.command("jobs")
			hs.keys("down", "a")
			hs.confirm()
		}, "AssignJob", []any{"j-3d4e5f", []string{"node-0002", "node-0003"}}},
		{"rebalance applies the plan shown", func(hs *harness) {
			hs.command("jobs")
			hs.keys("B")
			hs.confirm()
		}, "Rebalance", []any{true}},
		{"fault injection", func(hs *harness) {
			hs.command("node node-0002")
			hs.keys("down", "F")
			hs.confirm()
		}, "InjectFault", []any{"node-0002", api.FaultKind_FAULT_KIND_XID79, int32(1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t, transport.RoleAdmin, 160, 48)
			tc.do(hs)
			got := hs.calls(tc.method)
			if len(got) == 0 {
				t.Fatalf("no %s call; calls %v; screen:\n%s", tc.method, hs.cl.Calls(), hs.screen())
			}
			last := got[len(got)-1]
			if !reflect.DeepEqual(last.Args, tc.args) {
				t.Errorf("%s%v, want %v", tc.method, last.Args, tc.args)
			}
			if f, isErr := hs.m.Flash(); isErr || f == "" {
				t.Errorf("flash %q (error %v) after the action", f, isErr)
			}
		})
	}
}

func TestDialogFocusAndGrace(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	hs.command("jobs")
	hs.keys("C")
	d, ok := hs.m.Overlay().(*dialog.Confirm)
	if !ok {
		t.Fatalf("C opened %T", hs.m.Overlay())
	}
	if d.Focus() != "cancel" {
		t.Errorf("focus starts on %s, want cancel", d.Focus())
	}
	// Keys in flight when it opened are ignored.
	hs.keys("tab", "enter")
	if hs.m.Overlay() == nil || len(hs.calls("CheckpointJob")) != 0 {
		t.Fatal("keys within the grace answered the dialog")
	}
	hs.now = hs.now.Add(dialog.Grace)
	hs.keys("enter")
	if hs.m.Overlay() != nil || len(hs.calls("CheckpointJob")) != 0 {
		t.Fatalf("enter on Cancel: overlay %v, calls %v", hs.m.Overlay(), hs.cl.Calls())
	}
}

func TestRolesHideActions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		role     transport.Role
		readonly bool
		cordon   bool
		fault    bool
	}{
		{"viewer", transport.RoleViewer, false, false, false},
		{"operator", transport.RoleOperator, false, true, false},
		{"admin", transport.RoleAdmin, false, true, true},
		{"admin read-only", transport.RoleAdmin, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t, tc.role, 160, 48)
			hs.m.ctx.ReadOnly = tc.readonly
			hs.command("node node-0002")
			hs.keys("?")
			help := hs.screen()
			if got := strings.Contains(help, "cordon"); got != tc.cordon {
				t.Errorf("help shows cordon: %v, want %v\n%s", got, tc.cordon, help)
			}
			if got := strings.Contains(help, "inject fault"); got != tc.fault {
				t.Errorf("help shows fault injection: %v, want %v", got, tc.fault)
			}
			hs.keys("esc", "c", "F", "d")
			if o := hs.m.Overlay(); (o != nil) != tc.cordon {
				t.Errorf("action keys opened %T, want a dialog: %v", o, tc.cordon)
			}
			hs.keys("esc")
			hs.command("submit")
			if f, isErr := hs.m.Flash(); tc.cordon == isErr {
				t.Errorf(":submit flash %q error %v", f, isErr)
			}
		})
	}
}

func TestConnectionBanner(t *testing.T) {
	hs := newHarness(t, transport.RoleViewer, 120, 30)
	hs.send(app.ConnMsg{Err: errTest("connection refused"), RetryIn: 2 * time.Second})
	if s := hs.screen(); !strings.Contains(s, "connection lost: connection refused") {
		t.Errorf("no banner:\n%s", s)
	}
	hs.send(app.SnapshotMsg{Snap: fixture.Cluster(40, 8)})
	if s := hs.screen(); strings.Contains(s, "connection lost") {
		t.Errorf("banner stays after a snapshot:\n%s", s)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

func TestMouse(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	hs.command("nodes")
	// Row 3 of the table is the body's line 1 (count line) + header + row 1.
	y := hs.m.chrome() - 1 + 3
	hs.send(tea.MouseClickMsg{X: 2, Y: y, Button: tea.MouseLeft})
	if got := hs.m.Top().(*nodes.Model).Cursor(); got != "node-0001" {
		t.Errorf("click selects %s, want node-0001", got)
	}
	hs.send(tea.MouseClickMsg{X: 2, Y: y, Button: tea.MouseLeft})
	if got := hs.m.Top().Title(); got != "node-0001" {
		t.Errorf("second click opens %q", got)
	}
}

// TestQuitKeys: q and ctrl+c quit from a view (htop, nvitop and k9s
// habits), while a q typed into the filter or the command line is text.
func TestQuitKeys(t *testing.T) {
	quits := func(hs *harness, k string) bool {
		_, cmd := hs.m.Update(keyMsg(k))
		if cmd == nil {
			return false
		}
		_, ok := cmd().(tea.QuitMsg)
		return ok
	}
	for _, k := range []string{"q", "ctrl+c"} {
		if hs := newHarness(t, transport.RoleOperator, 160, 48); !quits(hs, k) {
			t.Errorf("%s on the overview did not quit", k)
		}
	}
	hs := newHarness(t, transport.RoleOperator, 160, 48)
	hs.command("nodes")
	hs.keys("/")
	if quits(hs, "q") {
		t.Error("q typed into the filter quit the console")
	}
	hs.keys("esc", ":")
	if quits(hs, "q") {
		t.Error("q typed into the command line quit the console")
	}
}

// TestReadOnlyBanner: the server's word that the control plane is
// read-only (its store away) shows as a banner with the reason until its
// word that it is writable again.
func TestReadOnlyBanner(t *testing.T) {
	hs := newHarness(t, transport.RoleViewer, 160, 30)
	snap := fixture.Cluster(40, 8)
	since := hs.m.ctx.Now().Add(-12 * time.Second)
	reason := "the store (etcd at http://127.0.0.1:2379) is unreachable since " + since.UTC().Format(time.RFC3339) + ": the control plane is read-only"
	snap.Events = append(slices.Clone(snap.Events), &api.Event{TimeUnixNano: since.UnixNano(), Kind: api.EventKind_EVENT_KIND_READ_ONLY,
		Message: reason, Attrs: map[string]string{"read_only": "true"}})
	hs.send(app.SnapshotMsg{Snap: snap})
	s := hs.screen()
	if !strings.Contains(s, "READ-ONLY for 12s: the store (etcd at http://127.0.0.1:2379) is unreachable") {
		t.Errorf("no read-only banner:\n%s", s)
	}
	golden(t, "TestReadOnlyBanner", s)
	snap.Events = append(slices.Clone(snap.Events), &api.Event{TimeUnixNano: hs.m.ctx.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_READ_ONLY,
		Message: "the control plane is writable again", Attrs: map[string]string{"read_only": "false"}})
	hs.send(app.SnapshotMsg{Snap: snap})
	if s := hs.screen(); strings.Contains(s, "READ-ONLY") {
		t.Errorf("the banner stays once the control plane is writable again:\n%s", s)
	}
}

// TestSlowFindings: the console asks for the fail-slow findings when it
// starts, shows the first in a banner, and @ opens the slow rank's GPU
// (its clocks and throttle reasons), w from there its node's flows; in
// the Stalls view enter on a finding does the same and esc returns.
func TestSlowFindings(t *testing.T) {
	hs := newHarness(t, transport.RoleOperator, 120, 40)
	if s := hs.screen(); strings.Contains(s, "SLOW") {
		t.Fatalf("a slow banner before any finding:\n%s", s)
	}
	hs.run(hs.m.Init(), 0)
	if c := hs.calls("ListFindings"); len(c) != 1 || c[0].Args[0] != "" {
		t.Fatalf("the console asked %v, want ListFindings of every job once", c)
	}
	if s := hs.screen(); !strings.Contains(s, "SLOW RANK r3@node-0000 of j-0a1b2c for 1m35s: 38ms late — @ opens it (+1 more, :stalls) · enters") {
		t.Fatalf("no banner for the slow rank:\n%s", s)
	}
	hs.keys("@")
	if v := hs.m.Top(); v.Name() != "gpu" || v.Title() != "GPU 3" || !strings.Contains(hs.screen(), "node-0000 GPU 3") {
		t.Fatalf("@ opened %s %q, want node-0000 GPU 3:\n%s", v.Name(), v.Title(), hs.screen())
	}
	hs.keys("w")
	if v := hs.m.Top(); v.Name() != "observe" || !strings.Contains(hs.screen(), `GPU 3 › flows of node-0000`) ||
		!strings.Contains(hs.screen(), `flows · ended (enter restarts) · filter ""`) {
		t.Fatalf("w on the GPU opened %s:\n%s", v.Name(), hs.screen())
	}
	if c := hs.calls("Observe"); len(c) == 0 || c[len(c)-1].Args[0] != "node-0000" {
		t.Errorf("flows asked %v, want node-0000's", c)
	}
	hs.keys("esc")
	if v := hs.m.Top(); v.Name() != "gpu" {
		t.Errorf("esc from the flows went to %s, want back to the GPU", v.Name())
	}

	hs.command("stalls")
	hs.keys("j", "enter")
	if v := hs.m.Top(); v.Name() != "gpu" || v.Title() != "GPU 3" {
		t.Errorf("enter on the slow rank opened %s %q, want GPU 3", v.Name(), v.Title())
	}
	hs.command("stalls")
	hs.keys("j", "j", "enter")
	if v := hs.m.Top(); v.Title() != "flows of node-0001" {
		t.Errorf("enter on the slow link opened %s:\n%s", v.Name(), hs.screen())
	}

	// The findings clear: the banner goes, and @ says so.
	hs.send(app.SlowMsg{Resp: &api.ListStallsResponse{}})
	hs.keys("0")
	if s := hs.screen(); strings.Contains(s, "SLOW") {
		t.Errorf("the banner stays once no finding stands:\n%s", s)
	}
	hs.keys("@")
	if f, _ := hs.m.Flash(); f != "no slow rank or link stands" {
		t.Errorf("@ with no finding: flash %q", f)
	}
}
