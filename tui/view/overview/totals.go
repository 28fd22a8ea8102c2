package overview

import (
	"time"

	"fmt"
	"strings"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// totals are the cluster's figures above the map.
type totals struct {
	gpus, busy, free, faulty, unavailable int
	powerW                                float64
	nodes                                 map[string]int
	jobs                                  map[api.JobState]int
	goodput                               float64
	notReady                              string
}

func computeTotals(s *client.Snapshot, now time.Time) totals {
	t := totals{nodes: map[string]int{}, jobs: map[api.JobState]int{}}
	held := map[string]map[uint32]bool{}
	var gpW, gpN float64
	for _, j := range s.Jobs {
		t.jobs[j.GetState()]++
		if j.GetState() == api.JobState_JOB_STATE_RUNNING || j.GetState() == api.JobState_JOB_STATE_RECOVERING {
			for _, pn := range j.GetPlacement() {
				if held[pn.GetNode()] == nil {
					held[pn.GetNode()] = map[uint32]bool{}
				}
				for _, g := range pn.GetGpus() {
					held[pn.GetNode()][g] = true
				}
			}
			if gp := j.GetGoodput(); gp > 0 {
				w := float64(max(app.JobGPUs(j), 1))
				gpW += gp * w
				gpN += w
			}
		}
	}
	if gpN > 0 {
		t.goodput = gpW / gpN
	}
	var notReady []string
	for _, n := range s.Nodes {
		badge := app.NodeBadge(n, now)
		t.nodes[badge]++
		name := app.NodeName(n)
		down := n.GetState() == api.NodeState_NODE_STATE_DOWN
		cordoned := app.Cordoned(n)
		for _, g := range n.GetGpus() {
			t.gpus++
			if !down {
				t.powerW += float64(g.GetLast().GetPowerMw()) / 1000
			}
			switch {
			case app.GPUFaulty(g):
				t.faulty++
			case down || cordoned:
				t.unavailable++
			case held[name][g.GetInfo().GetIndex()] || len(g.GetLast().GetProcesses()) > 0:
				t.busy++
			default:
				t.free++
			}
		}
		if badge != "ready" && len(notReady) < 40 {
			why := n.GetCordonReason()
			if down {
				why = n.GetDownReason()
			}
			if badge == "faulty" {
				for _, g := range n.GetGpus() {
					if app.GPUFaulty(g) {
						why = fmt.Sprintf("GPU %d %s", g.GetInfo().GetIndex(), g.GetUnhealthyReason())
						break
					}
				}
			}
			item := badge + " " + name
			if why != "" {
				item += " (" + why + ")"
			}
			notReady = append(notReady, item)
		}
	}
	if len(notReady) == 0 {
		t.notReady = "every node is ready"
	} else {
		t.notReady = "not ready: " + strings.Join(notReady, " · ")
	}
	return t
}

func (t totals) gpuLine() string {
	pw := fmt.Sprintf("%.1f kW", t.powerW/1000)
	if t.powerW >= 1e6 {
		pw = fmt.Sprintf("%.2f MW", t.powerW/1e6)
	}
	gp := "-"
	if t.goodput > 0 {
		gp = fmt.Sprintf("%.1f%%", t.goodput*100)
	}
	return fmt.Sprintf("GPUs %d: %d busy · %d free · %d faulty · %d unavailable │ power %s │ jobs %d running · %d pending · %d recovering · %d failed │ goodput %s",
		t.gpus, t.busy, t.free, t.faulty, t.unavailable, pw,
		t.jobs[api.JobState_JOB_STATE_RUNNING], t.jobs[api.JobState_JOB_STATE_PENDING], t.jobs[api.JobState_JOB_STATE_RECOVERING],
		t.jobs[api.JobState_JOB_STATE_FAILED], gp)
}

// Badges are the node states in the order the overview counts them, with
// the glyph each shows as.
var Badges = []struct{ Name, Glyph string }{
	{"ready", "●"}, {"suspect", "◔"}, {"cordoned", "◐"}, {"draining", "◑"}, {"down", "✕"}, {"faulty", "⚠"},
}

func (t totals) nodeLine(st *styles.Styles, width int) string {
	total := 0
	for _, c := range t.nodes {
		total += c
	}
	parts := []string{fmt.Sprintf("nodes %d:", total)}
	for _, b := range Badges {
		s := fmt.Sprintf("%s %d %s", b.Glyph, t.nodes[b.Name], b.Name)
		switch {
		case t.nodes[b.Name] == 0:
			s = st.Dim.Render(s)
		case b.Name == "ready":
			s = st.OK.Render(s)
		case b.Name == "down" || b.Name == "faulty":
			s = st.Crit.Render(s)
		default:
			s = st.Warn.Render(s)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "  ")
}
