package nodes

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestSuspect(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := SuspectPolicy{For: time.Minute, Window: 10 * time.Minute, CordonAt: 3}
	cases := []struct {
		name      string
		record    []time.Time
		lost, now time.Time
		policy    SuspectPolicy
		wantLost  []time.Time
		wantUntil time.Time
		cordon    bool
		isNew     bool
		reason    string
	}{
		{name: "first loss: suspect for a minute from when it is judged", lost: at(0), now: at(5 * time.Second), policy: p,
			wantLost: []time.Time{at(0)}, wantUntil: at(65 * time.Second), isNew: true,
			reason: "lost at 10:00:00, 1 of 3 losses within 10m0s that cordon it"},
		{name: "second loss within the window: suspect again", record: []time.Time{at(0)}, lost: at(4 * time.Minute), now: at(4 * time.Minute), policy: p,
			wantLost: []time.Time{at(0), at(4 * time.Minute)}, wantUntil: at(5 * time.Minute), isNew: true,
			reason: "lost at 10:04:00, 2 of 3"},
		{name: "third loss within the window cordons for good, saying when", record: []time.Time{at(0), at(4 * time.Minute)},
			lost: at(9 * time.Minute), now: at(9 * time.Minute), policy: p,
			wantLost: []time.Time{at(0), at(4 * time.Minute), at(9 * time.Minute)}, cordon: true, isNew: true,
			reason: "lost 3 times within 10m0s (at 10:00:00, 10:04:00, 10:09:00): cordoned until an operator uncordons it"},
		{name: "losses older than the window expire", record: []time.Time{at(0), at(4 * time.Minute)},
			lost: at(12 * time.Minute), now: at(12 * time.Minute), policy: p,
			wantLost: []time.Time{at(4 * time.Minute), at(12 * time.Minute)}, wantUntil: at(13 * time.Minute), isNew: true,
			reason: "lost at 10:12:00, 2 of 3"},
		{name: "a loss exactly one window old has expired", record: []time.Time{at(0), at(1 * time.Minute)},
			lost: at(10 * time.Minute), now: at(10 * time.Minute), policy: p,
			wantLost: []time.Time{at(1 * time.Minute), at(10 * time.Minute)}, wantUntil: at(11 * time.Minute), isNew: true},
		{name: "the same loss seen by a second job counts once", record: []time.Time{at(0)}, lost: at(0), now: at(2 * time.Second), policy: p,
			wantLost: []time.Time{at(0)}, wantUntil: at(62 * time.Second), isNew: false},
		{name: "the same loss as the one that cordoned stays cordoned", record: []time.Time{at(0), at(time.Minute), at(2 * time.Minute)},
			lost: at(2 * time.Minute), now: at(2 * time.Minute), policy: p,
			wantLost: []time.Time{at(0), at(time.Minute), at(2 * time.Minute)}, cordon: true, isNew: false},
		{name: "zero policy takes the defaults", lost: at(0), now: at(0),
			wantLost: []time.Time{at(0)}, wantUntil: at(DefaultSuspectPolicy.For), isNew: true,
			reason: "1 of 3 losses within 10m0s"},
		{name: "a policy of one cordons at the first loss", lost: at(0), now: at(0), policy: SuspectPolicy{CordonAt: 1},
			wantLost: []time.Time{at(0)}, cordon: true, isNew: true, reason: "lost 1 times within 10m0s (at 10:00:00)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Suspect(c.record, c.lost, c.now, c.policy)
			if !slices.EqualFunc(v.Lost, c.wantLost, time.Time.Equal) {
				t.Errorf("lost %v, want %v", v.Lost, c.wantLost)
			}
			if !v.Until.Equal(c.wantUntil) || v.Cordon != c.cordon || v.New != c.isNew {
				t.Errorf("until %v cordon %v new %v, want %v %v %v", v.Until, v.Cordon, v.New, c.wantUntil, c.cordon, c.isNew)
			}
			if !strings.Contains(v.Reason, c.reason) {
				t.Errorf("reason %q, want it to contain %q", v.Reason, c.reason)
			}
		})
	}
	// The record passed in is not modified.
	rec := []time.Time{at(0)}
	Suspect(rec, at(time.Minute), at(time.Minute), p)
	if len(rec) != 1 {
		t.Errorf("record modified: %v", rec)
	}
}

// TestLostNodeIsSuspectThenCordoned walks a node through the losses a
// recovery reports (ActionSuspect): each makes it suspect for a while, a
// second job reporting the same loss counts once, a passed validation
// lifts the suspicion but keeps the loss on record, the third loss within
// the window cordons it for good saying when, the record survives a
// server restart, and an operator's uncordon clears it all.
func TestLostNodeIsSuspectThenCordoned(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	c := &clock{t: t0}
	st := newStore(t)
	r := newRegistry(t, st, c, nil)
	registerIdle(t, r, reg("a", 1, 1000))
	lose := func(at time.Duration) {
		t.Helper()
		c.set(t0.Add(at))
		if down := r.CheckHeartbeats(); !slices.Equal(down, []string{"a"}) {
			t.Fatalf("at %s: down %v, want a", at, down)
		}
		c.set(t0.Add(at + 2*time.Second))
		registerIdle(t, r, reg("a", 1, 1000))
		c.set(t0.Add(at + 3*time.Second))
		for _, job := range []string{"j1", "j2"} {
			if _, err := r.SetCordon("a", ActionSuspect, "recovering job "+job+": node a went down"); err != nil {
				t.Fatal(err)
			}
		}
	}
	lose(10 * time.Second)
	n := statusOf(t, r, "a")
	if n.GetCordoned() || !Suspected(n.GetSuspectUntilUnixNano(), c.now()) || n.GetSuspectUntilUnixNano() != c.now().Add(time.Minute).UnixNano() ||
		len(n.GetLostUnixNano()) != 1 || !strings.Contains(n.GetSuspectReason(), "recovering job j1: node a went down; lost at 10:00:10, 1 of 3") {
		t.Fatalf("after the first loss: cordoned %v suspect until %d lost %v %q", n.GetCordoned(), n.GetSuspectUntilUnixNano(), n.GetLostUnixNano(), n.GetSuspectReason())
	}
	if stored, _ := st.Node("a"); stored.GetSuspectUntilUnixNano() != n.GetSuspectUntilUnixNano() || len(stored.GetLostUnixNano()) != 1 {
		t.Errorf("suspicion not stored: %v", stored)
	}
	if got := eventsOf(t, st, api.EventKind_EVENT_KIND_CORDON); len(got) != 1 || !strings.Contains(got[0], "suspect until 10:01:13") {
		t.Errorf("cordon events %q, want one saying until when a is suspect", got)
	}
	if _, err := r.SetCordon("a", ActionVouch, "passed validation j3-validate-2"); err != nil {
		t.Fatal(err)
	}
	if n := statusOf(t, r, "a"); Suspected(n.GetSuspectUntilUnixNano(), c.now()) || len(n.GetLostUnixNano()) != 1 {
		t.Errorf("after validation passed: suspect until %d lost %v", n.GetSuspectUntilUnixNano(), n.GetLostUnixNano())
	}
	lose(4 * time.Minute)
	if n := statusOf(t, r, "a"); n.GetCordoned() || !Suspected(n.GetSuspectUntilUnixNano(), c.now()) || len(n.GetLostUnixNano()) != 2 {
		t.Errorf("after the second loss: cordoned %v suspect %v lost %v", n.GetCordoned(), n.GetSuspectUntilUnixNano(), n.GetLostUnixNano())
	}
	lose(9 * time.Minute)
	n = statusOf(t, r, "a")
	want := "recovering job j1: node a went down; lost 3 times within 10m0s (at 10:00:10, 10:04:00, 10:09:00): cordoned until an operator uncordons it"
	if !n.GetCordoned() || n.GetCordonReason() != want || Suspected(n.GetSuspectUntilUnixNano(), c.now()) {
		t.Errorf("after the third loss: cordoned %v %q suspect %d, want cordoned %q", n.GetCordoned(), n.GetCordonReason(), n.GetSuspectUntilUnixNano(), want)
	}
	again := newRegistry(t, st, c, nil)
	if n := statusOf(t, again, "a"); !n.GetCordoned() || n.GetCordonReason() != want || len(n.GetLostUnixNano()) != 3 {
		t.Errorf("after a server restart: cordoned %v %q lost %v", n.GetCordoned(), n.GetCordonReason(), n.GetLostUnixNano())
	}
	if _, err := again.SetCordon("a", ActionUncordon, ""); err != nil {
		t.Fatal(err)
	}
	if n := statusOf(t, again, "a"); n.GetCordoned() || n.GetSuspectUntilUnixNano() != 0 || len(n.GetLostUnixNano()) != 0 {
		t.Errorf("after uncordon: cordoned %v suspect %d lost %v", n.GetCordoned(), n.GetSuspectUntilUnixNano(), n.GetLostUnixNano())
	}
}
