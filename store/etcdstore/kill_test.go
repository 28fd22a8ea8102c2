package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
)

// writeWithin retries a write until it lands or the deadline passes, and
// returns how long it took.
func writeWithin(t *testing.T, d time.Duration, fn func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := fn()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("no write landed within %s: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRidesOutKillOfTheRaftLeader(t *testing.T) {
	c := etcdtest.Start(t, 3)
	s := openFenced(t, c.Client(t), Options{Timeout: 2 * time.Second})
	must(t, s.PutJob(&api.Job{Id: "j-0"}))

	for round := 1; round <= 2; round++ {
		dead := c.Leader()
		// Write all along while the member dies: the longest gap between
		// two landed writes is the outage a pass commit sees.
		killed := make(chan time.Duration)
		go func() {
			start := time.Now()
			c.Kill(dead)
			killed <- time.Since(start)
		}()
		var gap, killTook time.Duration
		last := time.Now()
		for n := 0; ; n++ {
			err := s.PutJob(&api.Job{Id: fmt.Sprint("j-", round), Attempt: uint32(n)})
			if err == nil {
				gap, last = max(gap, time.Since(last)), time.Now()
			} else if time.Since(last) > 10*time.Second {
				t.Fatalf("no write landed for 10s after killing m%d: %v", dead, err)
			}
			if killTook != 0 && err == nil {
				break // a write landed after the member was gone
			}
			select {
			case killTook = <-killed:
			case <-time.After(10 * time.Millisecond):
			}
		}
		t.Logf("round %d: killed raft leader m%d (Kill took %s); longest gap between landed writes %s", round, dead, killTook.Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap > 5*time.Second {
			t.Errorf("writes stopped for %s when the raft leader died, want a few seconds at most", gap)
		}

		members, err := s.Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		healthy, leaders := 0, 0
		for _, m := range members {
			if m.GetHealthy() {
				healthy++
			}
			if m.GetLeader() {
				leaders++
			}
			if m.GetName() == fmt.Sprint("m", dead) && (m.GetHealthy() || m.GetError() == "") {
				t.Errorf("killed member reported %v", m)
			}
		}
		if len(members) != 3 || healthy != 2 || leaders != 1 {
			t.Errorf("health with m%d killed: %v", dead, members)
		}

		c.Restart(dead)
		writeWithin(t, 10*time.Second, func() error { return s.AppendEvent(&api.Event{Message: "after restart"}) })
	}
	jobs, err := s.Jobs()
	if err != nil || len(jobs) != 3 {
		t.Fatalf("jobs after two kills: %v, %v", jobs, err)
	}
	members, err := s.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if !m.GetHealthy() {
			t.Errorf("member not healthy after restart: %v", m)
		}
	}
}
