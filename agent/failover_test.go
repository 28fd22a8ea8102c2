package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/hatest"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/transport"
)

// These tests run nodemon's session loop against real servers on
// loopback: controlplane.New as the leader, hatest's fake standby (a real
// listener with the cluster CA that only names the leader), and a second
// real server of the same CA to fail over to.

// startLeader runs a real control plane on 127.0.0.1:0 in dir; pki, when
// set, is the pki directory of a server whose CA it shares.
func startLeader(t *testing.T, dir, pki string, lease time.Duration) *controlplane.Server {
	t.Helper()
	if pki != "" {
		hatest.SharePKI(t, pki, filepath.Join(dir, "pki"))
	}
	return servertest.Start(t, controlplane.Config{DataDir: dir, Lease: lease})
}

// record is one log line with its time.
type record struct {
	at  time.Time
	msg string
	kv  string
}

// recorder is an slog.Handler keeping every record, so a test can tell
// when nodemon did what.
type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var kv strings.Builder
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&kv, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.recs = append(r.recs, record{rec.Time, rec.Message, kv.String()})
	r.mu.Unlock()
	return nil
}

// find returns the records with message msg.
func (r *recorder) find(msg string) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []record
	for _, rec := range r.recs {
		if rec.msg == msg {
			out = append(out, rec)
		}
	}
	return out
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		fmt.Fprintf(&b, "%s %s%s\n", rec.at.Format("15:04:05.000"), rec.msg, rec.kv)
	}
	return b.String()
}

// runNode runs nodemon (simulated GPUs, eBPF off) named name with
// --server servers until stop is called or the test ends.
func runNode(t *testing.T, name, servers, token, dataDir string) (rec *recorder, stop func()) {
	t.Helper()
	rec = &recorder{}
	log := slog.New(rec)
	p, err := OpenProbes(ProbeOptions{Node: name, Sim: "dgx-h100", EBPF: EBPFOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Server: servers, Token: token, Name: name, DataDir: dataDir, CgroupRoot: "off", Log: log}, p)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("nodemon: %v", err)
			}
			p.Close()
			if t.Failed() {
				t.Logf("nodemon's log:\n%s", rec)
			}
		})
	}
	t.Cleanup(stop)
	return rec, stop
}

// connectedAt reports whether s has node name ready over a live session.
func connectedAt(s *controlplane.Server, name string) bool {
	for _, n := range s.Nodes() {
		if n.GetRegistration().GetName() == name && n.GetConnected() && n.GetState() == api.NodeState_NODE_STATE_READY {
			return true
		}
	}
	return false
}

func token(t *testing.T, s *controlplane.Server) string {
	t.Helper()
	tok, _, err := s.Authority().CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestNodemonFindsTheLeaderThroughAStandby: given [standby, leader],
// nodemon's join is sent on to the leader, and so is its session once it
// has an identity, each without a pause: a redirect is not a failure.
func TestNodemonFindsTheLeaderThroughAStandby(t *testing.T) {
	dir := t.TempDir()
	leader := startLeader(t, filepath.Join(dir, "leader"), "", 0)
	standby := hatest.StartStandby(t, filepath.Join(dir, "leader", "pki"), leader.Addr().String())
	servers := standby.Addr() + "," + leader.Addr().String()
	data := filepath.Join(dir, "node")

	// First start: the join goes to the standby first, which names the
	// leader.
	start := time.Now()
	rec, stop := runNode(t, "gpu-a", servers, token(t, leader), data)
	eventually(t, "gpu-a registered at the leader", 15*time.Second, func() bool { return connectedAt(leader, "gpu-a") })
	t.Logf("joined through the standby and registered at the leader in %s", time.Since(start).Round(time.Millisecond))
	if got := rec.find("server is a standby; joining at the leader"); len(got) != 1 {
		t.Fatalf("join redirects logged: %d, want 1\n%s", len(got), rec)
	}
	stop()
	eventually(t, "gpu-a's first session gone", 10*time.Second, func() bool { return !connectedAt(leader, "gpu-a") })

	// Started again with its identity, nodemon tries the standby first
	// again: the welcome names the leader.
	start = time.Now()
	rec, _ = runNode(t, "gpu-a", servers, "", data)
	eventually(t, "gpu-a registered at the leader again", 15*time.Second, func() bool { return connectedAt(leader, "gpu-a") })
	took := time.Since(start)
	if n := len(standby.Hellos()); n != 1 {
		t.Fatalf("the standby heard %d hellos, want 1", n)
	}
	if got := rec.find("server is a standby; dialing the leader"); len(got) != 1 {
		t.Fatalf("session redirects logged: %d, want 1\n%s", len(got), rec)
	}
	if got := rec.find("disconnected from server; retrying"); len(got) != 0 {
		t.Fatalf("nodemon paused after the redirect:\n%s", rec)
	}
	t.Logf("registered at the leader through the standby's welcome in %s", took.Round(time.Millisecond))
}

// TestNodemonSkipsADeadAddress: given [an address that swallows every
// packet, leader], nodemon gets to the leader with no pause and without waiting
// out the dead address's dial.
func TestNodemonSkipsADeadAddress(t *testing.T) {
	dir := t.TempDir()
	leader := startLeader(t, filepath.Join(dir, "leader"), "", 0)
	// A socket that reads nothing: a dial there waits out its timeout, as
	// at a stopped server or a dead host (a closed port would fail fast).
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	dead := hole.LocalAddr().String()
	data := filepath.Join(dir, "node")
	if _, err := transport.Join(context.Background(), leader.Addr().String(), token(t, leader), "gpu-b", filepath.Join(data, "identity")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rec, _ := runNode(t, "gpu-b", dead+","+leader.Addr().String(), "", data)
	eventually(t, "gpu-b registered at the leader", 15*time.Second, func() bool { return connectedAt(leader, "gpu-b") })
	took := time.Since(start)
	if got := rec.find("disconnected from server; retrying"); len(got) != 0 {
		t.Fatalf("nodemon paused before trying the second address:\n%s", rec)
	}
	// The second address is dialled DialStagger after the first, not
	// after the first's dial timeout.
	if took > transport.NodeDialTimeout/2 {
		t.Fatalf("registered after %s: the dead address held the dial (its timeout is %s)\n%s", took, transport.NodeDialTimeout, rec)
	}
	t.Logf("registered at the leader past a dead first address in %s (a dial gives up after %s)", took.Round(time.Millisecond), transport.NodeDialTimeout)
}

// deadAddr is a loopback UDP address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	c.Close()
	return addr
}

// TestNodemonLeavesASilentLeader: the leader is cut off without a word
// (every packet dropped, as when it is killed with SIGKILL or its host
// dies); nodemon takes it for dead once SilenceLimit passes with nothing
// on the control stream, and registers at the next server. A healthy
// leader that has nothing to say but the lease renewals is not left.
func TestNodemonLeavesASilentLeader(t *testing.T) {
	dir := t.TempDir()
	first := startLeader(t, filepath.Join(dir, "first"), "", 0)
	second := startLeader(t, filepath.Join(dir, "second"), filepath.Join(dir, "first", "pki"), 0)
	link := hatest.StartLink(t, first.Addr().String())
	data := filepath.Join(dir, "node")
	if _, err := transport.Join(context.Background(), first.Addr().String(), token(t, first), "gpu-c", filepath.Join(data, "identity")); err != nil {
		t.Fatal(err)
	}
	rec, _ := runNode(t, "gpu-c", link.Addr()+","+second.Addr().String(), "", data)
	eventually(t, "gpu-c registered at the first server", 15*time.Second, func() bool { return connectedAt(first, "gpu-c") })

	// Healthy and idle for longer than the limit: the renewals keep the
	// session. The watchdog first looks once the limit has passed since
	// the session began; wait for that look rather than for a guess at
	// the time it takes.
	limit := SilenceLimit(time.Second)
	eventually(t, "the watchdog looked at the silence and kept the session", limit+5*time.Second, func() bool {
		return len(rec.find(sessionKept)) > 0 || len(rec.find("lost server; trying the next")) > 0
	})
	if got := rec.find("lost server; trying the next"); len(got) != 0 || !connectedAt(first, "gpu-c") {
		t.Fatalf("nodemon left a healthy server:\n%s", rec)
	}

	cut := time.Now()
	link.Cut()
	eventually(t, "gpu-c registered at the second server", limit+10*time.Second, func() bool { return connectedAt(second, "gpu-c") })
	failover := time.Since(cut)
	lost := rec.find("lost server; trying the next")
	if len(lost) != 1 || !strings.Contains(lost[0].kv, "taking it for dead") {
		t.Fatalf("want one session ended by the watchdog, got %v\n%s", lost, rec)
	}
	detect := lost[0].at.Sub(cut)
	// The last renewal came at most a heartbeat before the cut, so the
	// watchdog fires between limit-1s and limit after it.
	if detect > limit+500*time.Millisecond || detect < limit-time.Second-200*time.Millisecond {
		t.Fatalf("watchdog fired %s after the cut, want within (%s - 1 heartbeat, %s]", detect, limit, limit)
	}
	if got := rec.find("disconnected from server; retrying"); len(got) != 0 {
		t.Fatalf("nodemon paused before the second server:\n%s", rec)
	}
	t.Logf("silence limit %s: dead leader noticed %s after the cut, registered at the second server %s after it",
		limit, detect.Round(time.Millisecond), failover.Round(time.Millisecond))
}

// TestNodemonKeepsALeaselessServer: a server without a lease sends nothing
// regularly, so the watchdog stays off and an idle session lasts.
func TestNodemonKeepsALeaselessServer(t *testing.T) {
	dir := t.TempDir()
	s := startLeader(t, filepath.Join(dir, "server"), "", -1)
	data := filepath.Join(dir, "node")
	rec, _ := runNode(t, "gpu-d", s.Addr().String(), token(t, s), data)
	eventually(t, "gpu-d registered", 15*time.Second, func() bool { return connectedAt(s, "gpu-d") })
	time.Sleep(SilenceLimit(time.Second) + time.Second)
	if got := slices.Concat(rec.find("lost server; trying the next"), rec.find("disconnected from server; retrying")); len(got) != 0 || !connectedAt(s, "gpu-d") {
		t.Fatalf("an idle session without a lease ended:\n%s", rec)
	}
}

func TestSilenceLimit(t *testing.T) {
	tests := []struct {
		heartbeat, want time.Duration
	}{
		{time.Second, 3 * time.Second}, // the default heartbeat
		{100 * time.Millisecond, 3 * time.Second},
		{2 * time.Second, 6 * time.Second},
		{10 * time.Second, 30 * time.Second},
	}
	for _, tc := range tests {
		if got := SilenceLimit(tc.heartbeat); got != tc.want {
			t.Errorf("SilenceLimit(%s) = %s, want %s", tc.heartbeat, got, tc.want)
		}
	}
}

// TestHearingPausesDuringCommands: time spent carrying out a command
// (nodemon reads nothing meanwhile) is not the server's silence.
func TestHearingPausesDuringCommands(t *testing.T) {
	t0 := time.Now()
	h := newHearing(t0)
	if got := h.silence(t0.Add(2 * time.Second)); got != 2*time.Second {
		t.Fatalf("silence after 2s = %s", got)
	}
	h.busy(true)
	if got := h.silence(t0.Add(time.Hour)); got != 0 {
		t.Fatalf("silence during a command = %s, want 0", got)
	}
	h.busy(false)
	if got := h.silence(time.Now()); got > time.Second {
		t.Fatalf("silence right after a command = %s", got)
	}
	h.heard(t0.Add(10 * time.Second))
	if got := h.silence(t0.Add(11 * time.Second)); got != time.Second {
		t.Fatalf("silence 1s after a message = %s", got)
	}
}
