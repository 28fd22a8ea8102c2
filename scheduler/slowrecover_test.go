package scheduler

import (
	"testing"
	"time"
)

func TestDecideSlow(t *testing.T) {
	rule := SlowRule{Hold: time.Minute, Max: 2, Window: time.Hour}
	now := int64(10 * time.Hour)
	ago := func(d time.Duration) int64 { return now - int64(d) }
	auto := func(c SlowCase) SlowCase {
		c.Auto, c.Now = true, now
		if c.Class == "" {
			c.Class = "compute-slow"
		}
		return c
	}
	tests := []struct {
		name string
		c    SlowCase
		want SlowVerdict
		node string
	}{
		{"alert policy", SlowCase{Class: "compute-slow", Node: "n1", Since: ago(time.Hour), Now: now}, SlowAlert, ""},
		{"job-wide names no node", auto(SlowCase{Class: "job-slow", Since: ago(time.Hour)}), SlowAlert, ""},
		{"communicator with no node", auto(SlowCase{Class: "communication-slow", Since: ago(time.Hour)}), SlowAlert, ""},
		{"acknowledged", auto(SlowCase{Node: "n1", Quiet: true, Since: ago(time.Hour)}), SlowQuiet, ""},
		{"held too short", auto(SlowCase{Node: "n1", Since: ago(59 * time.Second)}), SlowHold, ""},
		{"held exactly", auto(SlowCase{Node: "n1", Since: ago(time.Minute)}), SlowExclude, "n1"},
		{"communication names a node", auto(SlowCase{Class: "communication-slow", Node: "n2", Since: ago(2 * time.Minute)}), SlowExclude, "n2"},
		{"one earlier exclusion", auto(SlowCase{Node: "n1", Since: ago(time.Hour), Past: []int64{ago(10 * time.Minute)}}), SlowExclude, "n1"},
		{"bound reached", auto(SlowCase{Node: "n1", Since: ago(time.Hour), Past: []int64{ago(50 * time.Minute), ago(10 * time.Minute)}}), SlowBound, ""},
		{"older ones out of the window", auto(SlowCase{Node: "n1", Since: ago(time.Hour), Past: []int64{ago(2 * time.Hour), ago(61 * time.Minute), ago(time.Minute)}}), SlowExclude, "n1"},
		{"the window's edge is out", auto(SlowCase{Node: "n1", Since: ago(time.Hour), Past: []int64{ago(time.Hour), ago(time.Minute)}}), SlowExclude, "n1"},
		{"quiet wins over the bound", auto(SlowCase{Node: "n1", Quiet: true, Since: ago(time.Hour), Past: []int64{ago(2 * time.Minute), ago(time.Minute)}}), SlowQuiet, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := DecideSlow(rule, tt.c)
			if d.Verdict != tt.want || d.Node != tt.node || d.Reason == "" {
				t.Errorf("DecideSlow = %s %q (%s), want %s %q", d.Verdict, d.Node, d.Reason, tt.want, tt.node)
			}
		})
	}
}
