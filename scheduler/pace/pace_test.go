package pace

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	busy := Signals{Late: 600 * time.Millisecond}
	shed := Signals{Shed: 12}
	full := Signals{QueueFill: 0.6}
	calm := Signals{Late: 10 * time.Millisecond}
	between := Signals{Late: 200 * time.Millisecond}
	type step struct {
		at     time.Duration
		in     Signals
		factor uint32
		change bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"calm stays at its own pace", []step{{0, calm, 1, false}, {time.Minute, calm, 1, false}}},
		{"behind twice doubles, then waits for the nodes to follow", []step{
			{0, busy, 1, false}, {time.Second, busy, 2, true}, {2 * time.Second, busy, 2, false}, {6 * time.Second, busy, 4, true},
			{7 * time.Second, shed, 4, false}, {11 * time.Second, full, 8, true}}},
		{"one moment behind (a burst of registrations) is not overload", []step{
			{0, shed, 1, false}, {time.Second, calm, 1, false}, {2 * time.Second, shed, 1, false}, {3 * time.Second, between, 1, false},
			{4 * time.Second, busy, 1, false}}},
		{"far behind doubles at every update", []step{
			{0, Signals{Late: 2 * time.Second}, 2, true}, {time.Second, Signals{QueueFill: 1}, 4, true},
			{2 * time.Second, Signals{Late: 3 * time.Second}, 8, true}, {3 * time.Second, busy, 8, false}}},
		{"never past the bound", []step{
			{0, busy, 1, false}, {time.Second, busy, 2, true}, {6 * time.Second, busy, 4, true}, {11 * time.Second, busy, 8, true},
			{16 * time.Second, busy, 16, true}, {21 * time.Second, busy, 16, false}}},
		{"halves after 30 s of room, not before", []step{
			{0, busy, 1, false}, {time.Second, busy, 2, true}, {6 * time.Second, busy, 4, true}, {7 * time.Second, calm, 4, false},
			{36 * time.Second, calm, 4, false}, {37 * time.Second, calm, 2, true}, {40 * time.Second, calm, 2, false},
			{67 * time.Second, calm, 1, true}, {120 * time.Second, calm, 1, false}}},
		{"a moment between calm and behind starts the calm over", []step{
			{0, busy, 1, false}, {time.Second, busy, 2, true}, {2 * time.Second, calm, 2, false}, {20 * time.Second, between, 2, false},
			{31 * time.Second, calm, 2, false}, {60 * time.Second, calm, 2, false}, {61 * time.Second, calm, 1, true}}},
		{"behind again while calming keeps the factor", []step{
			{0, busy, 1, false}, {time.Second, busy, 2, true}, {2 * time.Second, calm, 2, false}, {25 * time.Second, shed, 2, false},
			{26 * time.Second, shed, 4, true}, {40 * time.Second, calm, 4, false}, {70 * time.Second, calm, 2, true}}},
	}
	t0 := time.Unix(1000, 0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := New(Rule{})
			for _, s := range c.steps {
				f, changed, why := p.Update(t0.Add(s.at), s.in)
				if f != s.factor || changed != s.change {
					t.Fatalf("at %s with %+v: factor %d changed %v (%s), want %d %v", s.at, s.in, f, changed, why, s.factor, s.change)
				}
				if changed && why == "" {
					t.Errorf("at %s: a change without a reason", s.at)
				}
			}
		})
	}
}
