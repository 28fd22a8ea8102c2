package costmodel

import "testing"

// searchMaxVirtualStages is the interleaving the planner tries by default
// (scheduler/planner.MaxVirtualStages; the planner imports this package).
const searchMaxVirtualStages = 8

// TestSearchReachesPublishedLayouts: for every published run in the
// validation table, the search's own best plan on the same GPUs, model,
// training and tunables is predicted at least as fast as the published
// layout. A search that cannot reach interleaving with uneven first and
// last stages, or context parallelism, loses to the hand-written row.
func TestSearchReachesPublishedLayouts(t *testing.T) {
	for _, r := range loadValidation(t) {
		t.Run(r.ID, func(t *testing.T) {
			c, err := r.config()
			if err != nil {
				t.Fatal(err)
			}
			pub, err := c.Evaluate(r.Plan)
			if err != nil {
				t.Fatal(err)
			}
			if !pub.Fits {
				t.Skipf("the published layout %s does not fit in the model's memory (%s); the memory model decides this row", r.Plan, FormatBytes(pub.MemPerGPUBytes))
			}
			mbs := []int{1, 2, 4, 8}
			if r.Plan.MicroBatch > 8 {
				mbs = append(mbs, r.Plan.MicroBatch)
			}
			ranked, rejected := Search(c.Model, c.Hardware, r.GPUs, Options{
				Training: c.Training, Tunables: c.Tunables, MicroBatchSizes: mbs,
				MaxVirtualStages: searchMaxVirtualStages, AllowUnevenPipeline: true,
			})
			if len(ranked) == 0 {
				t.Fatalf("no plan fits; first rejection: %+v", rejected[0])
			}
			best := ranked[0]
			if best.StepSeconds > pub.StepSeconds*(1+1e-9) {
				t.Errorf("best searched plan %s predicts %.3f s per step, the published layout %s %.3f s (%.1f%% slower)",
					best.Plan, best.StepSeconds, pub.Plan, pub.StepSeconds, (best.StepSeconds/pub.StepSeconds-1)*100)
			}
			t.Logf("published %s %.3f s; searched %s %.3f s", pub.Plan, pub.StepSeconds, best.Plan, best.StepSeconds)
		})
	}
}
