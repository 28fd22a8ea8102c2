package kube

import (
	"reflect"
	"strings"
	"testing"
)

func TestDecideGang(t *testing.T) {
	placement := []string{"a", "a", "b", "b"}
	all := func(string) bool { return true }
	pod := func(name string, rank int, node string) GangPod { return GangPod{Name: name, Rank: rank, Node: node} }
	for _, tc := range []struct {
		name   string
		pods   []GangPod
		usable func(string) bool
		bind   []Binding
		wait   string
		undo   string
	}{
		{name: "none yet", wait: "0 of 4 pods exist"},
		{name: "three of four: bind none", pods: []GangPod{pod("p0", 0, ""), pod("p1", 1, ""), pod("p3", 3, "")}, wait: "3 of 4 pods exist"},
		{name: "all exist: bind each to its rank's node",
			pods: []GangPod{pod("p0", 0, ""), pod("p1", 1, ""), pod("p2", 2, ""), pod("p3", 3, "")},
			bind: []Binding{{"p0", "a"}, {"p1", "a"}, {"p2", "b"}, {"p3", "b"}}},
		{name: "a retry binds what is left",
			pods: []GangPod{pod("p0", 0, "a"), pod("p1", 1, ""), pod("p2", 2, "b"), pod("p3", 3, "")},
			bind: []Binding{{"p1", "a"}, {"p3", "b"}}},
		{name: "all bound", pods: []GangPod{pod("p0", 0, "a"), pod("p1", 1, "a"), pod("p2", 2, "b"), pod("p3", 3, "b")}},
		{name: "bound elsewhere", pods: []GangPod{pod("p0", 0, "b")}, undo: "pod p0 (rank 0) is on b, placed on a"},
		{name: "a placed node gone", pods: []GangPod{pod("p0", 0, "")}, usable: func(n string) bool { return n != "b" },
			undo: "placed nodes no longer usable: [b]"},
		{name: "rank out of range", pods: []GangPod{pod("p9", 9, "")}, undo: "pod p9 has rank 9, the attempt has 4"},
		{name: "two pods of a rank", pods: []GangPod{pod("p1", 1, ""), pod("q1", 1, "")}, undo: "pods p1 and q1 both run rank 1"},
		{name: "a pod going", pods: []GangPod{{Name: "p2", Rank: 2, Deleting: true}}, undo: "pod p2 (rank 2) is being deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			usable := tc.usable
			if usable == nil {
				usable = all
			}
			d := DecideGang(placement, tc.pods, usable)
			if !reflect.DeepEqual(d.Bind, tc.bind) || d.Wait != tc.wait || !strings.Contains(d.Undo, tc.undo) || (tc.undo == "") != (d.Undo == "") {
				t.Errorf("got %+v, want bind %v wait %q undo %q", d, tc.bind, tc.wait, tc.undo)
			}
			if d.Undo != "" && len(d.Bind) > 0 {
				t.Errorf("an undo binds nothing, got %v", d.Bind)
			}
			if gone := strings.HasPrefix(tc.undo, "placed nodes no longer usable"); gone != (len(d.Unusable) > 0) {
				t.Errorf("unusable nodes %v for undo %q", d.Unusable, d.Undo)
			}
		})
	}
}

func TestStillRunning(t *testing.T) {
	pods := []OldPod{
		{Name: "a1-0", Attempt: 1, Node: "n1", NodeReady: true},
		{Name: "a1-1", Attempt: 1, Node: "n2"},                               // its Node is lost
		{Name: "a1-2", Attempt: 1, Node: "n3", NodeReady: true, Ended: true}, // done
		{Name: "a2-0", Attempt: 2},                                           // never bound
	}
	got := StillRunning(pods)
	if len(got) != 1 || got[0].Name != "a1-0" {
		t.Fatalf("still running %+v, want only a1-0", got)
	}
}
