package views

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestSuspectNodeShown: `gpuctl nodes` and `gpuctl describe node` say
// until when a node is suspect and how often it was lost, and nothing
// once the suspicion has expired.
func TestSuspectNodeShown(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := &api.NodeStatus{Registration: &api.NodeRegistration{Name: "node-03"}, State: api.NodeState_NODE_STATE_READY, Connected: true,
		SuspectUntilUnixNano: now.Add(40 * time.Second).UnixNano(), SuspectReason: "recovering job j-1: node node-03 went down",
		LostUnixNano: []int64{now.Add(-5 * time.Minute).UnixNano(), now.Add(-20 * time.Second).UnixNano()}}
	var b strings.Builder
	if err := Nodes(&b, Options{Now: now, Width: 200}, []*api.NodeStatus{n}); err != nil {
		t.Fatal(err)
	}
	if want := "suspect until 12:00:40 (lost 2× within the window)"; !strings.Contains(b.String(), want) {
		t.Errorf("nodes table lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	if err := DescribeNode(&b, Options{Now: now}, n, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"not from the queue: suspect until 12:00:40", "recovering job j-1: node node-03 went down",
		"2× within the window: 2026-03-01T11:55:00Z, 2026-03-01T11:59:40Z"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("describe node lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := Nodes(&b, Options{Now: now.Add(time.Minute)}, []*api.NodeStatus{n}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "suspect") {
		t.Errorf("an expired suspicion is still shown:\n%s", b.String())
	}
}
