package nodes

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestProtocolSkew speaks the node protocol over real QUIC as nodemons of
// older releases do: a hello of v1.1 without features (fencing came after
// v1.1 without a version change, so such a node may fence by stopping
// every rank of the job) is refused with a welcome that names the version,
// what it lacks and what to do; a v1.1 node that lists the features, a
// v1.2 node (every one fences) and this release's are let in, told the
// features the server uses, and fenced as before.
func TestProtocolSkew(t *testing.T) {
	v := func(minor uint32) *api.Version { return &api.Version{Major: 1, Minor: minor} }
	tests := []struct {
		name  string
		lease time.Duration
		hello *api.Hello
		// refused, when set, are the words the refusal must hold.
		refused []string
		// uses are the features the welcome says the server uses.
		uses []string
	}{
		{name: "v1.1 without features", lease: 5 * time.Second, hello: &api.Hello{Version: v(1)},
			refused: []string{"protocol v1.1 without", "fence (without it fencing an old attempt would stop every rank", "lease", "run-as", "upgrade nodemon"}},
		{name: "v1.1 without fence", lease: 5 * time.Second, hello: &api.Hello{Version: v(1), Features: []string{"lease", "run-as", "node-rank"}},
			refused: []string{"protocol v1.1 without fence (", "upgrade nodemon"}},
		{name: "v1.1 without a lease, server with leases", lease: 5 * time.Second, hello: &api.Hello{Version: v(1), Features: []string{"fence", "run-as", "node-rank"}},
			refused: []string{"without lease (without it its ranks would run on when it is cut off"}},
		{name: "v1.1 listing its features", lease: 5 * time.Second, hello: &api.Hello{Version: v(1), Features: []string{"fence", "lease", "node-rank", "run-as"}},
			uses: []string{"fence", "lease", "node-rank", "run-as"}},
		{name: "v1.1 without a lease, server without leases", hello: &api.Hello{Version: v(1), Features: []string{"fence", "run-as", "node-rank"}},
			uses: []string{"fence", "node-rank", "run-as"}},
		{name: "v1.2 without a list", lease: 5 * time.Second, hello: &api.Hello{Version: v(2)},
			uses: []string{"fence", "lease", "node-rank", "run-as"}},
		{name: "this release", lease: 5 * time.Second, hello: &api.Hello{Version: api.CurrentVersion(), Features: api.NodeFeatures()},
			uses: []string{"deny-list", "fence", "lease", "node-rank", "peer-lease", "run-as", "telemetry-pace"}},
		{name: "this release, server without leases", hello: &api.Hello{Version: api.CurrentVersion(), Features: api.NodeFeatures()},
			uses: []string{"fence", "node-rank", "run-as", "telemetry-pace"}},
		{name: "a later release with a feature this server lacks", lease: 5 * time.Second,
			hello: &api.Hello{Version: v(9), Features: append(api.NodeFeatures(), "lease-v3")},
			uses:  []string{"deny-list", "fence", "lease", "node-rank", "peer-lease", "run-as", "telemetry-pace"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			r := newRegistry(t, newStore(t), c, &recSink{})
			r.cfg.Lease = tc.lease
			r.cfg.Superseded = func(_ string, running []*api.RankStatus) []*api.RankStatus {
				return slices.DeleteFunc(slices.Clone(running), func(rk *api.RankStatus) bool { return rk.GetAttempt() >= 2 })
			}
			l := newLoopback(t, r)
			nc := l.hello("a", tc.hello)
			w := nc.welcome
			if tc.refused != nil {
				for _, want := range tc.refused {
					if !strings.Contains(nc.refusal, want) {
						t.Errorf("refusal %q does not say %q", nc.refusal, want)
					}
				}
				if want := r.neededFeatures(); w != nil && !slices.Equal(w.GetFeatures(), want) {
					t.Errorf("refusal lists features %v, want those the server needs %v", w.GetFeatures(), want)
				}
				select {
				case <-nc.conn.Context().Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the refused node's connection is still open")
				}
				if _, err := r.Node("a"); err == nil {
					t.Error("a refused node is known to the registry")
				}
				return
			}
			if nc.refusal != "" {
				t.Fatalf("refused: %s", nc.refusal)
			}
			if got := slices.Sorted(slices.Values(w.GetFeatures())); !slices.Equal(got, tc.uses) {
				t.Errorf("welcome says the server uses %v, want %v", got, tc.uses)
			}
			if got, want := w.GetLeaseMs(), uint32(tc.lease/time.Millisecond); got != want {
				t.Errorf("welcome lease %d ms, want %d", got, want)
			}
			// Fenced as before: the superseded attempt alone, then ready.
			rg := reg("a", 2, 1000)
			rg.Running = []*api.RankStatus{{Job: "j", Attempt: 1, Rank: 0, Pid: 10}, {Job: "j", Attempt: 2, Rank: 1, Pid: 20}}
			if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: rg}}); err != nil {
				t.Fatal(err)
			}
			var m api.ServerMessage
			nc.control.SetReadDeadline(time.Now().Add(10 * time.Second))
			if err := nc.control.Recv(&m); err != nil {
				t.Fatal(err)
			}
			if s := m.GetCommand().GetSignal(); s.GetJob() != "j" || s.GetAttempt() != 1 || !s.GetFence() {
				t.Fatalf("first message after registering: %v, want a fence of j attempt 1", &m)
			}
			if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: &api.CommandAck{
				Id: m.GetCommand().GetId(), Killed: []*api.RankStatus{{Job: "j", Attempt: 1, Rank: 0, Pid: 10}}}}}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a ready", func() bool { return r.Connected("a") })
		})
	}
}

// TestCommandANodeCannotHonourIsNotSent: the session's one check refuses,
// before anything is sent, a command whose meaning needs a feature the
// node's hello did not have, saying which and what to do.
func TestCommandANodeCannotHonourIsNotSent(t *testing.T) {
	tests := []struct {
		name     string
		features []string
		cmd      *api.Command
		lacks    string
	}{
		{"fence", []string{"run-as", "node-rank"}, &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: "j", Attempt: 1, Signal: "SIGKILL", Fence: true}}}, "fence"},
		{"signal of one attempt", []string{"run-as", "node-rank"}, &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: "j", Attempt: 2, Signal: "SIGTERM"}}}, "fence"},
		{"launch as a user", []string{"fence", "node-rank"}, &api.Command{Body: &api.Command_Launch{Launch: &api.LaunchRanks{Job: "j", RunAsUser: "alice", NumNodes: 1}}}, "run-as"},
		{"launch of several nodes", []string{"fence", "run-as"}, &api.Command{Body: &api.Command_Launch{Launch: &api.LaunchRanks{Job: "j", NodeRank: 1, NumNodes: 2}}}, "node-rank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// No control stream: a send would panic, so a refusal here
			// was made before anything left.
			ns := &session{name: "a", features: tc.features, pending: map[uint64]chan *api.CommandAck{}}
			_, err := ns.commandAck(t.Context(), tc.cmd)
			if err == nil || !strings.Contains(err.Error(), "lacks "+tc.lacks) || !strings.Contains(err.Error(), "upgrade nodemon") {
				t.Fatalf("command to a node without %s: %v, want a refusal naming it", tc.lacks, err)
			}
		})
	}
	// What every node can honour still goes.
	if need := api.CommandNeeds(&api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: "j", Signal: "SIGUSR1"}}}); len(need) != 0 {
		t.Errorf("a plain signal needs %v", need)
	}
}
