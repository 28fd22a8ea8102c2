package etcdstore

import (
	"cmp"
	"strings"
	"testing"
)

// FuzzEventKeyOrder checks that the event log's byte order is the order
// Events promises: time (negative as 0), then leadership, then arrival;
// and that eventsSince starts exactly at the first key of its time.
func FuzzEventKeyOrder(f *testing.F) {
	f.Add(int64(1), int64(2), uint64(3), int64(1), int64(2), uint64(4), int64(1))
	f.Add(int64(-5), int64(9), uint64(1), int64(0), int64(1), uint64(1), int64(0))
	f.Add(int64(1<<62), int64(1), uint64(1<<63), int64(1<<62), int64(2), uint64(0), int64(1<<62+1))
	k := keys{"/gpuctl/"}
	f.Fuzz(func(t *testing.T, t1, r1 int64, n1 uint64, t2, r2 int64, n2 uint64, since int64) {
		a, b := k.event(t1, r1, n1), k.event(t2, r2, n2)
		want := cmp.Or(cmp.Compare(max(t1, 0), max(t2, 0)), cmp.Compare(max(r1, 0), max(r2, 0)), cmp.Compare(n1, n2))
		if got := strings.Compare(a, b); got != want {
			t.Fatalf("key order %d, want %d: %q vs %q", got, want, a, b)
		}
		if !strings.HasPrefix(a, k.events()) || len(a) != len(k.events())+48 {
			t.Fatalf("key %q outside the events folder or not 48 digits", a)
		}
		if inRange := a >= k.eventsSince(since); inRange != (max(t1, 0) >= max(since, 0)) {
			t.Fatalf("event at %d in range since %d = %v", t1, since, inRange)
		}
	})
}
