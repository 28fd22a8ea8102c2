package fencing

import (
	"slices"
	"testing"
	"time"
)

func TestQuorumMeetsEveryAckSet(t *testing.T) {
	for n := 1; n <= 9; n++ {
		q, a := Quorum(n), AcksToFence(n)
		if q+a <= n {
			t.Errorf("n=%d: a quorum of %d and %d acks can miss each other", n, q, a)
		}
		if q > n || a < 1 || a > n {
			t.Errorf("n=%d: quorum %d, acks %d out of range", n, q, a)
		}
	}
	want := map[int][2]int{1: {1, 1}, 2: {2, 1}, 3: {2, 2}, 4: {3, 2}, 5: {3, 3}}
	for n, w := range want {
		if Quorum(n) != w[0] || AcksToFence(n) != w[1] {
			t.Errorf("n=%d: quorum %d acks %d, want %v", n, Quorum(n), AcksToFence(n), w)
		}
	}
}

func TestPoolAndWitnesses(t *testing.T) {
	all := func(string) bool { return true }
	noPeer := func(n string) bool { return n != "b" && n != "y" }
	tests := []struct {
		name    string
		nodes   []string
		others  []string
		can     func(string) bool
		pool    []string
		witness map[string][]string
	}{
		{"one node, two others", []string{"a"}, []string{"z", "x", "y"}, all,
			[]string{"a", "x", "y"}, map[string][]string{"a": {"x", "y"}, "x": {"y", "a"}}},
		{"one node alone", []string{"a"}, nil, all, []string{"a"}, map[string][]string{"a": nil}},
		{"nodes without a peer listener are left out", []string{"a", "b"}, []string{"y", "x"}, noPeer,
			[]string{"a", "x"}, map[string][]string{"a": {"x"}, "b": nil}},
		{"a large job: the next four", []string{"a", "b", "c", "d", "e", "f"}, []string{"x", "y"}, all,
			[]string{"a", "b", "c", "d", "e", "f", "x", "y"},
			map[string][]string{"a": {"b", "c", "d", "e"}, "y": {"a", "b", "c", "d"}, "f": {"x", "y", "a", "b"}}},
		{"the attempt's nodes are not extras", []string{"a"}, []string{"a", "b"}, all,
			[]string{"a", "b"}, map[string][]string{"a": {"b"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pool := Pool(tc.nodes, tc.others, tc.can)
			if !slices.Equal(pool, tc.pool) {
				t.Fatalf("Pool = %v, want %v", pool, tc.pool)
			}
			for node, want := range tc.witness {
				if got := Of(pool, node); !slices.Equal(got, want) {
					t.Errorf("Of(%s) = %v, want %v", node, got, want)
				}
			}
		})
	}
}

func TestUntil(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lease, margin := 20*time.Second, time.Second
	w3 := []string{"b", "c", "x"}
	tests := []struct {
		name      string
		witnesses []string
		acks      []Ack
		until     time.Time
		ok        bool
	}{
		{"no witnesses: the server's lease alone", nil, nil, t0.Add(21 * time.Second), true},
		{"too few acks", w3, []Ack{{"b", t0.Add(3 * time.Second), time.Second}}, time.Time{}, false},
		{"the same witness twice counts once", w3, []Ack{{"b", t0.Add(3 * time.Second), time.Second}, {"b", t0.Add(4 * time.Second), 0}}, time.Time{}, false},
		{"acks from strangers count nothing", w3, []Ack{{"b", t0, 0}, {"q", t0, 0}}, time.Time{}, false},
		{"a dead node: its witnesses last vouched before its last contact",
			w3, []Ack{{"b", t0.Add(3 * time.Second), 5 * time.Second}, {"c", t0.Add(3 * time.Second), 4 * time.Second}},
			t0.Add(21 * time.Second), true},
		{"a node cut from the server only: vouched until the acks",
			w3, []Ack{{"b", t0.Add(3 * time.Second), 200 * time.Millisecond}, {"x", t0.Add(4 * time.Second), 0}},
			t0.Add(25 * time.Second), true},
		{"two witnesses: one ack is enough", []string{"b", "x"}, []Ack{{"x", t0.Add(2 * time.Second), 0}},
			t0.Add(23 * time.Second), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			until, ok := Until(tc.witnesses, tc.acks, t0, lease, margin)
			if ok != tc.ok || !until.Equal(tc.until) {
				t.Errorf("Until = %v, %v; want %v, %v", until, ok, tc.until, tc.ok)
			}
		})
	}
}
