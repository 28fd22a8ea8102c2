package simulate

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTraceDocument(t *testing.T) {
	tests := []struct {
		name string
		rows []TraceRow
		want string
	}{
		{"no replay", nil, `"policies":[]`},
		{"lost GPU time in seconds", []TraceRow{{Result: Result{Policy: "fifo", Jobs: 3, Nodes: 2, GPUs: 16, LostGPUHours: 1.5}, WallSeconds: 0.25}},
			`"jobs":3,"nodes":2,"gpus":16,"checkpoint_interval_seconds":0,"policies":[{"policy":"fifo"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := NewTraceDocument("t.json", tc.rows)
			b, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tc.want) {
				t.Errorf("document %s lacks %s", b, tc.want)
			}
			if len(tc.rows) > 0 && doc.Policies[0].LostGPUSeconds != 5400 {
				t.Errorf("lost_gpu_seconds %v, want 5400", doc.Policies[0].LostGPUSeconds)
			}
		})
	}
}
