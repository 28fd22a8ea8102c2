package failslow

import "testing"

// TestSourceFeedsEachCollectiveOnce: a process's calls feed the analysis
// until its first completion, its completions after; no collective is fed
// twice, whether completions arrive after their calls (a GPU's enqueue
// returns first) or before them (the reference library, completing inside
// the call).
func TestSourceFeedsEachCollectiveOnce(t *testing.T) {
	type rec struct {
		seq        int
		completion bool
	}
	for _, tc := range []struct {
		name string
		recs []rec
		fed  []rec
	}{
		{"no plugin: every call", []rec{{1, false}, {2, false}, {3, false}},
			[]rec{{1, false}, {2, false}, {3, false}}},
		{"completions after their calls", []rec{{1, false}, {2, false}, {1, true}, {3, false}, {2, true}, {3, true}},
			[]rec{{1, false}, {2, false}, {3, true}}},
		{"completions before their calls", []rec{{1, true}, {1, false}, {2, true}, {2, false}},
			[]rec{{1, true}, {2, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Source
			p := Proc{Node: "n", PID: 7}
			var fed []rec
			seen := map[int]bool{}
			for _, r := range tc.recs {
				if s.Use(p, 1, uint64(r.seq), r.completion) {
					if seen[r.seq] {
						t.Fatalf("seq %d fed twice", r.seq)
					}
					seen[r.seq] = true
					fed = append(fed, r)
				}
			}
			if len(fed) != len(tc.fed) {
				t.Fatalf("fed %v, want %v", fed, tc.fed)
			}
			for i := range fed {
				if fed[i] != tc.fed[i] {
					t.Fatalf("fed %v, want %v", fed, tc.fed)
				}
			}
			// Another process, or communicator, is judged on its own records.
			if !s.Use(Proc{Node: "n", PID: 8}, 1, 9, false) || !s.Use(p, 2, 9, false) {
				t.Error("another process's or communicator's call was left out")
			}
			s.Keep(func(q Proc) bool { return q != p })
			if s.Len() != 1 {
				t.Errorf("%d communicators remembered after p exited, want 1", s.Len())
			}
		})
	}
}
