package transport

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name      string
		attempt   int
		base, max time.Duration
		jitter, r float64
		want      time.Duration
	}{
		{"first", 0, 100 * ms, 10 * time.Second, 0, 0, 100 * ms},
		{"doubles", 3, 100 * ms, 10 * time.Second, 0, 0, 800 * ms},
		{"capped", 10, 100 * ms, 10 * time.Second, 0, 0, 10 * time.Second},
		{"huge attempt stays capped", 1000, 100 * ms, 10 * time.Second, 0, 0, 10 * time.Second},
		{"full jitter draw", 2, 100 * ms, 10 * time.Second, 0.5, 1, 200 * ms},
		{"half jitter draw", 2, 100 * ms, 10 * time.Second, 0.5, 0.5, 300 * ms},
		{"jitter above one clamps", 0, 100 * ms, time.Second, 3, 0.5, 50 * ms},
		{"r out of range clamps", 0, 100 * ms, time.Second, 0.5, -4, 100 * ms},
		{"zero base", 5, 0, time.Second, 0.5, 0.5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := BackoffDelay(tc.attempt, tc.base, tc.max, tc.jitter, tc.r); got != tc.want {
				t.Fatalf("BackoffDelay = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBackoffSequenceAndReset(t *testing.T) {
	draws := []float64{0, 0.5, 1, 0}
	i := 0
	b := &Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2, ResetAfter: time.Minute,
		Rand: func() float64 { r := draws[i%len(draws)]; i++; return r }}
	want := []time.Duration{100 * time.Millisecond, 180 * time.Millisecond, 320 * time.Millisecond, 800 * time.Millisecond, time.Second}
	for n, w := range want {
		if got := b.Next(); got != w {
			t.Fatalf("pause %d = %s, want %s", n, got, w)
		}
	}
	// A flapping connection keeps the long pauses.
	b.Ended(10 * time.Second)
	if b.Attempt() != len(want) {
		t.Fatalf("short connection reset the backoff")
	}
	// A connection that stayed up starts over: Base less 0.2*0.5 jitter.
	b.Ended(2 * time.Minute)
	if got := b.Next(); got != 90*time.Millisecond {
		t.Fatalf("after reset pause = %s, want 90ms", got)
	}
	if b.Attempt() != 1 {
		t.Fatalf("attempt after reset and one pause = %d", b.Attempt())
	}
}

func TestBackoffWaitHonorsContext(t *testing.T) {
	b := &Backoff{Base: time.Hour, Max: time.Hour, Jitter: -1}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait on a canceled context = %v", err)
	}
	fast := &Backoff{Base: time.Nanosecond, Max: time.Nanosecond}
	if err := fast.Wait(context.Background()); err != nil {
		t.Fatalf("Wait = %v", err)
	}
}
