package main

import (
	"encoding/json"
	"github.com/charmbracelet/colorprofile"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/styles"
	"github.com/gpuctl/gpuctl/tui/view/plan"
)

// TestPlannerCallersAgree: one job file, three askers — gpuctl serve (a
// dry-run submit over QUIC), `gpuctl plan -f` and the console's plan view
// and submit form — get one plan.
func TestPlannerCallersAgree(t *testing.T) {
	dir := t.TempDir()
	_, cfg := startServer(t, filepath.Join(dir, "server"))
	for _, tc := range []struct {
		model, gpu string
		nodes      int
		stack      string
	}{
		{"gpt3-175b", "h100", 128, ""},
		{"llama2-70b", "h100", 8, ""},
		{"gpt-1t", "h100", 384, ""},
		{"llama2-70b", "a100-80gb", 16, ""},
		// 126 layers on 16 stages of 8 chunks, the first and last chunks
		// the embedding and output layers alone: uneven and interleaved.
		{"llama3-405b", "h100", 2048, ""},
		// A named training stack travels from the job file (and the
		// console's stack field) into every asker's plan.
		{"gpt3-175b", "h100", 128, "megatron-2021"},
		{"gpt3-175b", "h100", 128, "megatron-core-2024"},
	} {
		name := tc.model + "-" + tc.gpu
		if tc.stack != "" {
			name += "-" + tc.stack
		}
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, name+".yaml")
			model := "{preset: " + tc.model + "}"
			if tc.stack != "" {
				model = "{preset: " + tc.model + ", stack: " + tc.stack + "}"
			}
			job := "name: agree\nnodes: " + strconv.Itoa(tc.nodes) + "\ngpus_per_node: 8\ngpu_model: " + tc.gpu +
				"\ncommand: [python, train.py]\nmodel: " + model + "\n"
			if err := os.WriteFile(file, []byte(job), 0o644); err != nil {
				t.Fatal(err)
			}
			gpus := 8 * tc.nodes

			out, errOut, err := gpuctl(t, "submit", "--config", cfg, "-f", file, "--dry-run", "-o", "json")
			if err != nil {
				t.Fatalf("submit --dry-run: %v\n%s", err, errOut)
			}
			var dry struct {
				Jobs []struct {
					Plan struct {
						TP, CP, PP, DP int
						MicroBatch     int `json:"micro_batch"`
						VirtualStages  int `json:"virtual_stages"`
						Source         string
					}
				}
			}
			if err := json.Unmarshal([]byte(out), &dry); err != nil || len(dry.Jobs) != 1 {
				t.Fatalf("dry run is not one job's JSON: %v\n%s", err, out)
			}
			p := dry.Jobs[0].Plan
			if p.Source != "planner" {
				t.Fatalf("server plan source %q, want planner:\n%s", p.Source, out)
			}
			server := short(costmodel.Plan{TP: p.TP, CP: p.CP, PP: p.PP, DP: p.DP, MicroBatch: p.MicroBatch, VirtualStages: p.VirtualStages})

			doc := planDocOf(t, "-f", file)
			if len(doc.Plans) == 0 {
				t.Fatalf("gpuctl plan -f: no plan")
			}
			cli := short(doc.Plans[0].Plan)

			ctx := app.NewContext(styles.New(colorprofile.Ascii, true), transport.RoleViewer, nil)
			view := plan.New(ctx, []string{tc.model, strconv.Itoa(gpus), tc.gpu, tc.stack})
			if len(view.Best()) == 0 {
				t.Fatalf("console plan view: no plan")
			}
			console := short(view.Best()[0].Plan)

			opts := actions.PlanOptions(tc.model, tc.gpu, tc.stack, gpus)
			if len(opts) < 2 {
				t.Fatalf("submit form offers no plan")
			}
			form := opts[1].Value
			want := strconv.Itoa(server.TP) + "," + strconv.Itoa(server.PP) + "," + strconv.Itoa(server.DP)

			if cli != server || console != server || form != want {
				t.Errorf("serve %s, gpuctl plan -f %s, console view %s, submit form's first %s", server, cli, console, form)
			}
		})
	}
}

// short keeps the fields a job's plan carries (cp 1 as none).
func short(p costmodel.Plan) costmodel.Plan {
	cp := p.CP
	if cp <= 1 {
		cp = 0
	}
	return costmodel.Plan{TP: p.TP, CP: cp, PP: p.PP, DP: p.DP, MicroBatch: p.MicroBatch, VirtualStages: p.VirtualStages}
}
