// Package plan is the planner in the console: the best tensor, pipeline
// and data parallel layouts of a model on a GPU count, computed locally
// by the cost model, and why the other layouts lost.
package plan

import (
	"fmt"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/dialog"
)

// KeyMap is the plan view's keys.
type KeyMap struct{ Edit key.Binding }

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding { return []key.Binding{k.Edit} }

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding { return [][]key.Binding{{k.Edit}} }

// Model is the plan view.
type Model struct {
	ctx              *app.Context
	keys             KeyMap
	model, gpu       string
	stack            string
	gpus             int
	ranked           []costmodel.Evaluation
	rejected         []costmodel.Rejection
	err              error
	hwName, describe string
}

// New plans args: [MODEL [GPUS [GPU [STACK]]]], default gpt3-175b on 1024
// H100s with the default training stack.
func New(ctx *app.Context, args []string) *Model {
	m := &Model{ctx: ctx, keys: KeyMap{Edit: app.Bind("e", "edit model, GPUs, GPU, stack", "e")}, model: "gpt3-175b", gpus: 1024, gpu: "h100"}
	if len(args) > 0 {
		m.model = args[0]
	}
	if len(args) > 1 {
		if n, err := strconv.Atoi(args[1]); err == nil {
			m.gpus = n
		}
	}
	if len(args) > 2 {
		m.gpu = args[2]
	}
	if len(args) > 3 {
		m.stack = args[3]
	}
	m.compute()
	return m
}

func (m *Model) compute() {
	m.ranked, m.rejected, m.err = nil, nil, nil
	req, err := planner.ForPreset(m.model, m.gpu, m.stack, m.gpus)
	if err != nil {
		m.err = err
		return
	}
	m.hwName = req.Hardware.Name
	m.describe = fmt.Sprintf("%s (%.1fB params) on %d × %s, global batch %d", req.Model.Name, req.Model.Params()/1e9, m.gpus, req.Hardware.Name, req.Training.GlobalBatch)
	if m.stack != "" {
		m.describe += ", stack " + m.stack
	}
	m.ranked, m.rejected = planner.Search(req)
}

// Best returns the ranked plans.
func (m *Model) Best() []costmodel.Evaluation { return m.ranked }

// Name implements app.View.
func (m *Model) Name() string { return "plan" }

// Title implements app.View.
func (m *Model) Title() string { return "plan " + m.model }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

type editedMsg struct{ model, gpus, gpu, stack string }

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case editedMsg:
		m.model, m.gpu, m.stack = strings.TrimSpace(msg.model), strings.TrimSpace(msg.gpu), strings.TrimSpace(msg.stack)
		n, err := strconv.Atoi(strings.TrimSpace(msg.gpus))
		if err != nil {
			m.err = fmt.Errorf("GPUs %q is not a number", msg.gpus)
			return m, nil
		}
		m.gpus = n
		m.compute()
	case tea.KeyPressMsg:
		if key.Matches(msg, m.keys.Edit) {
			d := dialog.New(m.ctx.Styles, m.ctx.Now, "plan for", "models: "+strings.Join(costmodel.ModelNames(), ", ")+
				"\nGPUs: "+strings.Join(costmodel.HardwareNames(), ", ")+"\nstacks: "+strings.Join(costmodel.StackNames(), ", ")+" (empty: "+costmodel.DefaultStack+")", false,
				[]dialog.Field{{Label: "model", Value: m.model}, {Label: "GPUs", Value: strconv.Itoa(m.gpus)}, {Label: "GPU", Value: m.gpu}, {Label: "stack", Value: m.stack}},
				func(f []dialog.Field) tea.Cmd {
					return func() tea.Msg { return editedMsg{f[0].Value, f[1].Value, f[2].Value, f[3].Value} }
				})
			return m, func() tea.Msg { return app.OverlayMsg{Overlay: d} }
		}
	}
	return m, nil
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	if m.err != nil {
		return st.FlashErr.Render("plan: "+m.err.Error()) + "\n" + st.Dim.Render("e edits the model, GPU count, GPU and training stack")
	}
	var b strings.Builder
	b.WriteString(st.Bold.Render(app.Trunc(m.describe, m.ctx.Width)) + "\n\n")
	if len(m.ranked) == 0 {
		b.WriteString(st.Crit.Render("no plan fits") + "\n")
	} else {
		b.WriteString(st.TableHeader.Render(" #  TP  PP   DP MBS   V    STEP  TFLOP/S   MFU   MEM/GPU  BUBBLE") + "\n")
		for i, e := range m.ranked[:min(len(m.ranked), 5)] {
			fmt.Fprintf(&b, "%2d %3d %3d %4d %3d %3d %7.2fs %8.0f %5.1f%% %9s %6.1f%%\n", i+1, e.TP, e.PP, e.DP, e.MicroBatch, e.VirtualStages,
				e.StepSeconds, e.TFLOPSPerGPU, e.MFU*100, costmodel.FormatBytes(e.MemPerGPUBytes), e.BubbleSec/e.StepSeconds*100)
		}
		best := m.ranked[0]
		fmt.Fprintf(&b, "\nbest %s: compute %.2fs, bubble %.2fs, tp comm %.2fs, pp comm %.2fs, dp comm %.2fs (%.2fs exposed)\n",
			best.Plan, best.ComputeSec, best.BubbleSec, best.TPCommSec, best.PPCommSec, best.DPCommSec, best.DPExposedSec)
	}
	lost := planner.Lost(m.ranked, m.rejected, 5)
	if len(lost) > 0 {
		fmt.Fprintf(&b, "\nwhy the others lost (%d):\n", len(lost))
		for _, rc := range planner.Reasons(lost) {
			fmt.Fprintf(&b, "  %-28s %d\n", rc.Reason, rc.Count)
		}
		room := m.ctx.Height - strings.Count(b.String(), "\n") - 2
		if cl := planner.Closest(lost, min(room, 5)); len(cl) > 0 {
			b.WriteString("closest losers:\n")
			for _, r := range cl {
				b.WriteString(app.Trunc(fmt.Sprintf("  %-34s %s: %s", r.Plan, r.Reason, r.Detail), m.ctx.Width) + "\n")
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}
