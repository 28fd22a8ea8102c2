package planner

import "github.com/gpuctl/gpuctl/scheduler/costmodel"

// Document is `gpuctl plan -o json`'s document; docs/costmodel.md, "JSON
// output", documents every field.
type Document struct {
	Model    costmodel.Model    `json:"model"`
	GPU      costmodel.Hardware `json:"gpu"`
	GPUs     int                `json:"gpus"`
	Training costmodel.Training `json:"training"`
	Tunables costmodel.Tunables `json:"tunables"`
	// MTBFSource says where the failure rate comes from.
	MTBFSource  string                 `json:"mtbf_source,omitempty"`
	Calibration *costmodel.Calibration `json:"calibration,omitempty"`
	Plans       []costmodel.Evaluation `json:"plans"`
	// Rejections counts why plans lost, by reason.
	Rejections    []ReasonCount `json:"rejections"`
	ClosestLosers []Loser       `json:"closest_losers"`
}

// Loser is one plan that lost, with the figures that decided it.
type Loser struct {
	costmodel.Plan
	Reason         costmodel.Reason `json:"reason"`
	Detail         string           `json:"detail"`
	StepSeconds    float64          `json:"predicted_step_seconds,omitempty"`
	MemPerGPUBytes int64            `json:"predicted_mem_per_gpu_bytes,omitempty"`
}

// NewDocument is the document of a search of r showing the top plans (0:
// all), with what calibration moved and where the failure rate came from.
func NewDocument(r Request, cal *costmodel.Calibration, mtbfSource string, ranked []costmodel.Evaluation, rejected []costmodel.Rejection, top int) Document {
	shown := ranked
	if top > 0 && len(shown) > top {
		shown = shown[:top]
	}
	lost := Lost(ranked, rejected, len(shown))
	doc := Document{Model: r.Model, GPU: r.Hardware, GPUs: r.GPUs, Training: r.Training, Tunables: r.Tunables, Calibration: cal,
		Plans: shown, Rejections: Reasons(lost), ClosestLosers: []Loser{}}
	if r.Tunables.MTBF > 0 {
		doc.MTBFSource = mtbfSource
	}
	if doc.Plans == nil {
		doc.Plans = []costmodel.Evaluation{}
	}
	for _, l := range Closest(lost, 5) {
		d := Loser{Plan: l.Plan, Reason: l.Reason, Detail: l.Detail, MemPerGPUBytes: l.MemPerGPUBytes}
		if l.Evaluation != nil {
			d.StepSeconds = l.Evaluation.StepSeconds
			d.MemPerGPUBytes = l.Evaluation.MemPerGPUBytes
		}
		doc.ClosestLosers = append(doc.ClosestLosers, d)
	}
	return doc
}
