package nodes

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestDeniedPeersReachWitnesses: a node that named the deny-list feature
// hears the revoked node certificates after its first heartbeat, once per
// change of the list and not again; a node without the feature never
// hears them.
func TestDeniedPeersReachWitnesses(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	r := newRegistry(t, newStore(t), c, &recSink{})
	r.cfg.Lease = 5 * time.Second
	l := newLoopback(t, r)
	r.SetDeniedPeers([]string{"bb", "aa", "aa"})

	connect := func(name string, features []string) *nodeConn {
		t.Helper()
		nc := l.hello(name, &api.Hello{Version: api.CurrentVersion(), Features: features})
		if nc.refusal != "" {
			t.Fatalf("refused: %s", nc.refusal)
		}
		if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg(name, 2, 1000)}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, name+" ready", func() bool { return r.Connected(name) })
		return nc
	}
	// beats sends heartbeats up to seq and returns every list heard
	// until the renewal answering the last: by then the server has done
	// what followed every heartbeat before it.
	heard := map[*nodeConn][][]string{}
	next := map[*nodeConn]uint64{}
	beats := func(nc *nodeConn, n int) [][]string {
		t.Helper()
		for range n {
			next[nc]++
			seq := next[nc]
			if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{Seq: seq}}}); err != nil {
				t.Fatal(err)
			}
			for {
				var m api.ServerMessage
				nc.control.SetReadDeadline(time.Now().Add(10 * time.Second))
				if err := nc.control.Recv(&m); err != nil {
					t.Fatal(err)
				}
				if d := m.GetDeniedPeers(); d != nil {
					heard[nc] = append(heard[nc], d.GetSerials())
				}
				if m.GetLease().GetHeartbeatSeq() == seq {
					break
				}
			}
		}
		return heard[nc]
	}
	same := func(got [][]string, want ...[]string) bool {
		return slices.EqualFunc(got, want, func(a, b []string) bool { return slices.Equal(a, b) })
	}

	witness := connect("a", api.NodeFeatures())
	if got := beats(witness, 3); !same(got, []string{"aa", "bb"}) {
		t.Fatalf("after 3 heartbeats the witness heard %q, want the list once", got)
	}
	r.SetDeniedPeers([]string{"aa", "bb"})
	if got := beats(witness, 2); !same(got, []string{"aa", "bb"}) {
		t.Fatalf("an unchanged list was sent again: %q", got)
	}
	r.SetDeniedPeers([]string{"cc"})
	if got := beats(witness, 2); !same(got, []string{"aa", "bb"}, []string{"cc"}) {
		t.Fatalf("after a change the witness heard %q, want the new list once more", got)
	}

	old := connect("b", []string{api.FeatureLease, api.FeatureFence, api.FeatureRunAs, api.FeatureNodeRank, api.FeaturePeerLease})
	if got := beats(old, 3); len(got) != 0 {
		t.Fatalf("a node without the deny-list feature heard %q", got)
	}
}
