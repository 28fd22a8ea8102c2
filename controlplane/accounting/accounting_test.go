package accounting

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

// TestClusterGPUMTBF: the cluster's failures move the estimate off the
// prior: restarts and jobs that failed after running count, over the
// GPU-seconds jobs attained and are running now.
func TestClusterGPUMTBF(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	prior := float64(scheduler.PriorGPUMTBFSeconds)
	running := &api.Job{State: api.JobState_JOB_STATE_RUNNING, Attempt: 1, StartUnixNano: now.Add(-100 * time.Second).UnixNano(),
		Placement: []*api.JobNode{{Node: "n0", Ranks: []*api.JobRank{{Rank: 0}, {Rank: 1}}}}}
	cases := []struct {
		name string
		jobs []*api.Job
		want float64
	}{
		{"no history", nil, prior},
		{"a pending job", []*api.Job{{State: api.JobState_JOB_STATE_PENDING}}, prior},
		{"3 restarts over 1e6 GPU-s", []*api.Job{{State: api.JobState_JOB_STATE_PENDING, Restarts: 3, AttainedGpuSeconds: 1e6}}, (prior + 1e6) / 4},
		{"a job that failed after running", []*api.Job{{State: api.JobState_JOB_STATE_FAILED, Attempt: 1, AttainedGpuSeconds: 50}}, (prior + 50) / 2},
		{"a job refused before it ran", []*api.Job{{State: api.JobState_JOB_STATE_FAILED}}, prior},
		{"running time counts", []*api.Job{running}, prior + 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := GPUMTBF(c.jobs, now); math.Abs(got-c.want) > 1e-6 {
				t.Errorf("GPUMTBF = %g, want %g", got, c.want)
			}
		})
	}
}

// TestEmissions: a kWh on a node whose curve says 400 gCO2e/kWh over the
// interval is 400 g; a node without a curve leaves emissions unknown, and
// they stay unknown once any energy was.
func TestEmissions(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0) // 08:00 UTC
	in, err := carbon.Parse(strings.NewReader("site=eu"+strings.Repeat(" 400", 8)+strings.Repeat(" 100", 16)), "test")
	if err != nil {
		t.Fatal(err)
	}
	node := func(name, site string, mj uint64) *api.NodeStatus {
		return &api.NodeStatus{Registration: &api.NodeRegistration{Name: name, Labels: map[string]string{"site": site}},
			Gpus: []*api.GPUStatus{{Info: &api.GPUInfo{Index: 0}, Last: &api.GPUSample{EnergyMj: mj}}}}
	}
	job := func(nodes ...string) *api.Job {
		j := &api.Job{State: api.JobState_JOB_STATE_RUNNING, Attempt: 1}
		for _, n := range nodes {
			j.Placement = append(j.Placement, &api.JobNode{Node: n, Gpus: []uint32{0}, Ranks: []*api.JobRank{{}}})
		}
		return j
	}
	const kWhMJ = 3_600_000_000 // one kWh in millijoules
	pass := func(p *Progress, j *api.Job, at time.Time, mj uint64, sites ...string) {
		nodes := map[string]*api.NodeStatus{}
		for i, s := range sites {
			n := "n" + strconv.Itoa(i)
			nodes[n] = node(n, s, mj)
		}
		p.Update(j, Inputs{Nodes: nodes, Intensity: in}, at)
	}

	// 07:30–08:30: half at 400, half at 100.
	j, p := job("n0"), NewProgress()
	pass(p, j, t0.Add(-30*time.Minute), 1000, "eu")
	pass(p, j, t0.Add(30*time.Minute), 1000+kWhMJ, "eu")
	if j.GetEnergyJoules() != 3.6e6 || j.Co2EGrams == nil || math.Abs(j.GetCo2EGrams()-250) > 1e-6 {
		t.Fatalf("energy %g J, emissions %v g; want 1 kWh at a mean 250 g/kWh", j.GetEnergyJoules(), j.Co2EGrams)
	}

	// A node of no listed site: energy, no emissions.
	j, p = job("n0"), NewProgress()
	pass(p, j, t0, 1000, "us")
	pass(p, j, t0.Add(time.Hour), 1000+kWhMJ, "us")
	if j.GetEnergyJoules() != 3.6e6 || j.Co2EGrams != nil {
		t.Fatalf("no curve: energy %g J, emissions %v", j.GetEnergyJoules(), j.Co2EGrams)
	}
	// Once unknown, a later pass on a curve does not make them known.
	pass(p, j, t0.Add(2*time.Hour), 1000+2*kWhMJ, "eu")
	if j.Co2EGrams != nil {
		t.Fatalf("emissions %g after energy without a curve", j.GetCo2EGrams())
	}
	// One node with a curve and one without: unknown.
	j, p = job("n0", "n1"), NewProgress()
	pass(p, j, t0, 1000, "eu", "us")
	pass(p, j, t0.Add(time.Hour), 1000+kWhMJ, "eu", "us")
	if j.GetEnergyJoules() != 7.2e6 || j.Co2EGrams != nil {
		t.Fatalf("half without a curve: energy %g J, emissions %v", j.GetEnergyJoules(), j.Co2EGrams)
	}
}
