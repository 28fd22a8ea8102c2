package actions

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/huh/v2"
	"github.com/google/uuid"
	"go.yaml.in/yaml/v3"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/dialog"
)

// SubmitValues is what the submit form collects.
type SubmitValues struct {
	File        string
	Name        string
	Command     string
	Nodes       string
	GPUsPerNode string
	Checkpoint  string
	Model       string
	GPU         string
	// Stack is the model's training stack ("": the default).
	Stack string
	// Plan is "tp,pp,dp" from the planner's list, or "" for the server's choice.
	Plan string
}

// Spec turns the form into a job file (YAML) and checks it as the server
// will, so a mistake is named before anything is sent.
func (v SubmitValues) Spec() (source string, yamlText []byte, err error) {
	if f := strings.TrimSpace(v.File); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", nil, fmt.Errorf("job file: %w", err)
		}
		if _, err := jobspec.Parse(f, data); err != nil {
			return "", nil, err
		}
		return f, data, nil
	}
	s := jobspec.Spec{Name: strings.TrimSpace(v.Name), Command: strings.Fields(v.Command),
		Checkpoint: jobspec.CheckpointSpec{Dir: strings.TrimSpace(v.Checkpoint)}}
	var err2 error
	if s.Nodes, err2 = atoiField("nodes", v.Nodes); err2 != nil {
		return "", nil, err2
	}
	if s.GPUsPerNode, err2 = atoiField("gpus per node", v.GPUsPerNode); err2 != nil {
		return "", nil, err2
	}
	if v.Model != "" {
		s.Model = &jobspec.ModelSpec{Preset: v.Model, Stack: v.Stack}
		s.GPUModel = ""
	}
	if v.Plan != "" {
		var tp, pp, dp int
		if _, err := fmt.Sscanf(v.Plan, "%d,%d,%d", &tp, &pp, &dp); err != nil {
			return "", nil, fmt.Errorf("plan %q: want tp,pp,dp", v.Plan)
		}
		s.Plan = &jobspec.PlanSpec{TP: tp, PP: pp, DP: dp}
	}
	data, err := yaml.Marshal(&s)
	if err != nil {
		return "", nil, fmt.Errorf("job file: %w", err)
	}
	if _, err := jobspec.Parse("submit form", data); err != nil {
		return "", nil, err
	}
	return "submit form", data, nil
}

func atoiField(name, s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a count", name, s)
	}
	return n, nil
}

// PlanOptions lists the planner's best plans for a model trained on stack
// on gpus GPUs of profile gpu, as the form offers them.
func PlanOptions(model, gpu, stack string, gpus int) []huh.Option[string] {
	opts := []huh.Option[string]{huh.NewOption("let gpuctl serve choose", "")}
	if model == "" || gpus <= 0 {
		return opts
	}
	req, err := planner.ForPreset(model, gpu, stack, gpus)
	if err != nil {
		return opts
	}
	ranked, _ := planner.Search(req)
	for i, e := range ranked {
		if i == 5 {
			break
		}
		label := fmt.Sprintf("tp%d·pp%d·dp%d  step %.2fs  MFU %.1f%%  %s/GPU", e.TP, e.PP, e.DP, e.StepSeconds, e.MFU*100,
			costmodel.FormatBytes(e.MemPerGPUBytes))
		opts = append(opts, huh.NewOption(label, fmt.Sprintf("%d,%d,%d", e.TP, e.PP, e.DP)))
	}
	return opts
}

// submitForm is the submit overlay: a huh form, then a dry run shown as a
// confirmation.
type submitForm struct {
	ctx    *app.Context
	form   *huh.Form
	v      *SubmitValues
	opened time.Time
	done   bool
}

// Submit opens the submit form.
func Submit(ctx *app.Context) tea.Cmd {
	v := &SubmitValues{GPUsPerNode: "8", Nodes: "1", GPU: "h100"}
	models := []huh.Option[string]{huh.NewOption("none (no cost model)", "")}
	for _, n := range costmodel.ModelNames() {
		models = append(models, huh.NewOption(n, n))
	}
	stacks := []huh.Option[string]{huh.NewOption("default ("+costmodel.DefaultStack+")", "")}
	for _, n := range costmodel.StackNames() {
		stacks = append(stacks, huh.NewOption(n, n))
	}
	gpus := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(v.Nodes))
		g, _ := strconv.Atoi(strings.TrimSpace(v.GPUsPerNode))
		return n * g
	}
	km := huh.NewDefaultKeyMap()
	km.Quit = key.NewBinding(key.WithKeys("esc", "ctrl+c"), key.WithHelp("esc", "cancel"))
	form := huh.NewForm(
		huh.NewGroup(
			huh.NewInput().Title("Job file").Description("a job YAML on this machine; leave empty to fill in the form").Value(&v.File),
		),
		huh.NewGroup(
			huh.NewInput().Title("Name").Value(&v.Name).Validate(func(s string) error {
				if strings.TrimSpace(s) == "" {
					return fmt.Errorf("a job needs a name")
				}
				return nil
			}),
			huh.NewInput().Title("Command").Description("what every rank runs").Value(&v.Command),
			huh.NewInput().Title("Nodes").Value(&v.Nodes),
			huh.NewInput().Title("GPUs per node").Value(&v.GPUsPerNode),
			huh.NewInput().Title("Checkpoint dir").Description("makes the job movable and preemptible").Value(&v.Checkpoint),
			huh.NewSelect[string]().Title("Model").Options(models...).Value(&v.Model).Height(6),
		).WithHideFunc(func() bool { return strings.TrimSpace(v.File) != "" }),
		huh.NewGroup(
			huh.NewSelect[string]().Title("Training stack").Description("what it overlaps: docs/costmodel.md").Options(stacks...).Value(&v.Stack).Height(7),
		).WithHideFunc(func() bool { return strings.TrimSpace(v.File) != "" || v.Model == "" }),
		huh.NewGroup(
			huh.NewSelect[string]().Title("Plan (the planner's best)").
				OptionsFunc(func() []huh.Option[string] { return PlanOptions(v.Model, v.GPU, v.Stack, gpus()) }, v).
				Value(&v.Plan),
		).WithHideFunc(func() bool { return strings.TrimSpace(v.File) != "" || v.Model == "" }),
	).WithKeyMap(km).WithShowHelp(true).WithWidth(70)
	f := &submitForm{ctx: ctx, form: form, v: v, opened: ctx.Now()}
	return tea.Batch(func() tea.Msg { return app.OverlayMsg{Overlay: f} }, form.Init())
}

func (f *submitForm) Done() bool { return f.done }

func (f *submitForm) Update(msg tea.Msg) (app.Overlay, tea.Cmd) {
	if _, ok := msg.(tea.KeyPressMsg); ok && f.ctx.Now().Sub(f.opened) < dialog.Grace {
		return f, nil
	}
	m, cmd := f.form.Update(msg)
	f.form = m.(*huh.Form)
	switch f.form.State {
	case huh.StateAborted:
		f.done = true
		return f, nil
	case huh.StateCompleted:
		f.done = true
		return f, f.dryRun()
	}
	return f, cmd
}

// dryRun checks the spec locally, asks the server where the job would run,
// and shows that as the confirmation.
func (f *submitForm) dryRun() tea.Cmd {
	src, data, err := f.v.Spec()
	if err != nil {
		return app.Flash("submit: "+err.Error(), true)
	}
	ctx, cl := f.ctx, f.ctx.Client
	return ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		r, err := cl.SubmitJob(c, &api.SubmitJobRequest{SpecYaml: string(data), Source: src, DryRun: true})
		if err != nil {
			return app.ActionResult("submit (dry run)", err)
		}
		j := r.GetJob()
		body := fmt.Sprintf("%s: plan %s (%s), %d GPUs\nwould run on: %s\n", j.GetName(), app.Plan(j), j.GetPlan().GetSource(),
			j.GetFullGpus(), placementText(j.GetPlacement()))
		if j.GetPendingReason() != "" {
			body += "would wait: " + j.GetPendingReason() + "\n"
		}
		body += fmt.Sprintf("jobs ahead in the queue: %d", r.GetQueuedAhead())
		if s := j.GetPlan().GetStepSeconds(); s > 0 {
			body += fmt.Sprintf("\npredicted step %s, MFU %.1f%%", app.Secs(s), j.GetPlan().GetMfu()*100)
		}
		keyID := uuid.NewString()
		d := dialog.New(ctx.Styles, ctx.Now, "submit "+j.GetName()+"?", body, false, nil, func([]dialog.Field) tea.Cmd {
			return ctx.Task(func() tea.Msg {
				c, cancel := app.Request()
				defer cancel()
				r, err := cl.SubmitJob(c, &api.SubmitJobRequest{SpecYaml: string(data), Source: src, IdempotencyKey: keyID})
				if err != nil {
					return app.ActionResult("submit", err)
				}
				return app.FlashMsg{Text: "submitted " + r.GetJob().GetId() + " " + r.GetJob().GetName()}
			})
		})
		return app.OverlayMsg{Overlay: d}
	})
}

func (f *submitForm) Render(width, height int) string {
	return f.ctx.Styles.Dialog.Render(f.ctx.Styles.DialogTitle.Render("submit a job") + "\n\n" + f.form.View())
}
