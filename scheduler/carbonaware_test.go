package scheduler

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

const hourSec = 3600

// twoSites is two switches of one rack of two 8-GPU nodes: switch 0 is
// site=dirty (400 gCO2e/kWh, 100 from 12:00 to 15:00 UTC), switch 1 is
// site=clean (200 all day).
func twoSites(t *testing.T) (*clusterBuilder, *carbon.Intensities) {
	b := newCluster(t, 2, 1, 2, 8)
	for i := range b.s.Nodes {
		site := "dirty"
		if b.s.Nodes[i].Switch() == "sw1" {
			site = "clean"
		}
		b.s.Nodes[i].Labels["site"] = site
	}
	dirty := "site=dirty" + strings.Repeat(" 400", 12) + " 100 100 100" + strings.Repeat(" 400", 9)
	clean := "site=clean" + strings.Repeat(" 200", 24)
	in, err := carbon.Parse(strings.NewReader(dirty+"\n"+clean+"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	return b, in
}

func summary(ds []Decision) string {
	var out []string
	for _, d := range ds {
		switch d := d.(type) {
		case Start:
			out = append(out, fmt.Sprintf("start %s on %s", d.Job, strings.Join(d.Placement.Nodes(), ",")))
		case Hold:
			out = append(out, fmt.Sprintf("hold %s until %d", d.Job, d.At/hourSec))
		case Reserve:
			out = append(out, "reserve "+d.Job)
		default:
			out = append(out, fmt.Sprintf("%T %s", d, d.JobID()))
		}
	}
	return strings.Join(out, "; ")
}

func TestCarbonAware(t *testing.T) {
	now := int64(9 * hourSec)
	job := func(id string, gpus int, until int64) JobRequest {
		return JobRequest{ID: id, GPUs: gpus, Estimate: hourSec, Until: until, Submit: now}
	}
	for _, tc := range []struct {
		name    string
		pending []JobRequest
		labels  bool
		want    string
	}{
		{"waits for the dip", []JobRequest{job("a", 16, 24*hourSec)}, true,
			"hold a until 12"},
		{"not deferrable runs now", []JobRequest{job("a", 16, 0)}, true,
			"start a on s0r0n00,s0r0n01"},
		{"deadline too close runs now on the cleaner site", []JobRequest{job("a", 8, now+90*60)}, true,
			"start a on s1r0n00"},
		{"no curve runs now", []JobRequest{job("a", 16, 24*hourSec)}, false,
			"start a on s0r0n00,s0r0n01"},
		{"a held job blocks no one", []JobRequest{job("a", 16, 24*hourSec), job("b", 32, 0)}, true,
			"hold a until 12; start b on s0r0n00,s0r0n01,s1r0n00,s1r0n01"},
		{"no estimate runs now", []JobRequest{{ID: "a", GPUs: 8, Until: 24 * hourSec}}, true,
			"start a on s0r0n00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, in := twoSites(t)
			if !tc.labels {
				for i := range b.s.Nodes {
					delete(b.s.Nodes[i].Labels, "site")
				}
			}
			s := b.now(now).pending(tc.pending...).snap()
			if got := summary(Schedule(s, WithCarbon(FIFO{}, in))); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			for _, r := range s.Pending {
				if len(r.Prefer) != 0 {
					t.Fatalf("the snapshot's request %s was changed: %+v", r.ID, r.Prefer)
				}
			}
		})
	}
}

// Without the option a deferrable job is an ordinary one.
func TestDeferrableWithoutCarbonRunsNow(t *testing.T) {
	b, _ := twoSites(t)
	s := b.now(9 * hourSec).pending(JobRequest{ID: "a", GPUs: 16, Estimate: hourSec, Until: 24 * hourSec}).snap()
	if got := summary(Schedule(s, FIFO{})); got != "start a on s0r0n00,s0r0n01" {
		t.Fatal(got)
	}
}

func TestCarbonAwareDelegates(t *testing.T) {
	_, in := twoSites(t)
	p := WithCarbon(DefaultLAS(), in)
	if p.Name() != "las+carbon" || !p.Preempts() || p.Backfills() || p.Grace() != 300 {
		t.Fatalf("%s: preempts %v backfills %v grace %d", p.Name(), p.Preempts(), p.Backfills(), p.Grace())
	}
	if q := WithCarbon(EASY{Base: FIFO{}}, in); !q.Backfills() || q.Preempts() {
		t.Fatalf("%s does not keep backfill", q.Name())
	}
}
