// Package actions builds the console's changes: each opens a confirmation
// that shows its blast radius first (the jobs and ranks it touches, or the
// placement before and after) and, once confirmed, makes the request
// through app.Client. Which actions a session sees is app.Context.Can's
// business; the server checks the role again on every request.
package actions

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/dialog"
)

func open(ctx *app.Context, title, body string, danger bool, fields []dialog.Field, run func([]dialog.Field) tea.Cmd) tea.Cmd {
	d := dialog.New(ctx.Styles, ctx.Now, title, body, danger, fields, func(f []dialog.Field) tea.Cmd { return ctx.Task(run(f)) })
	return func() tea.Msg { return app.OverlayMsg{Overlay: d} }
}

// ranksOn lists, per job, the ranks of its current placement on nodes.
func ranksOn(ctx *app.Context, nodes []string) []string {
	var out []string
	for _, j := range ctx.Snap.Jobs {
		var parts []string
		for _, pn := range j.GetPlacement() {
			if !slices.Contains(nodes, pn.GetNode()) {
				continue
			}
			rs := make([]string, 0, len(pn.GetRanks()))
			for _, r := range pn.GetRanks() {
				rs = append(rs, strconv.Itoa(int(r.GetRank())))
			}
			parts = append(parts, fmt.Sprintf("ranks %s on %s", strings.Join(rs, ","), pn.GetNode()))
		}
		if len(parts) > 0 {
			ck := "no checkpoint dir: stays"
			if j.GetCheckpointDir() != "" {
				ck = "checkpoints to " + j.GetCheckpointDir()
			}
			out = append(out, fmt.Sprintf("  %s %s (%s, %s): %s", j.GetId(), j.GetName(), app.JobState(j), ck, strings.Join(parts, "; ")))
		}
	}
	return out
}

// Cordon asks to cordon, uncordon or drain nodes.
func Cordon(ctx *app.Context, nodes []string, action string) tea.Cmd {
	if len(nodes) == 0 {
		return app.Flash(action+": no node selected", true)
	}
	var b strings.Builder
	switch action {
	case "cordon":
		b.WriteString("No new work will be placed on " + strings.Join(nodes, ", ") + ". Running ranks keep running.\n")
	case "uncordon":
		b.WriteString(strings.Join(nodes, ", ") + " will take new work again.\n")
	case "drain":
		b.WriteString("Cordons " + strings.Join(nodes, ", ") + ", then moves each job there that names a checkpoint dir\n" +
			"elsewhere (checkpoint, stop, relaunch), one at a time. Jobs without one stay.\n")
	}
	if rs := ranksOn(ctx, nodes); len(rs) > 0 {
		b.WriteString("\nJobs with ranks there:\n" + strings.Join(rs, "\n"))
	} else {
		b.WriteString("\nNo job has ranks there.")
	}
	var fields []dialog.Field
	if action != "uncordon" {
		fields = []dialog.Field{{Label: "reason"}}
	}
	title := fmt.Sprintf("%s %d node(s)?", action, len(nodes))
	cl := ctx.Client
	return open(ctx, title, b.String(), action == "drain", fields, func(f []dialog.Field) tea.Cmd {
		reason := ""
		if len(f) > 0 {
			reason = strings.TrimSpace(f[0].Value)
		}
		return func() tea.Msg {
			var done []string
			for _, n := range nodes {
				c, cancel := app.Request()
				r, err := cl.Cordon(c, n, action, reason)
				cancel()
				if err != nil {
					return app.ActionResult(action+" "+n, err)
				}
				msg := action + " " + n
				for _, dj := range r.GetJobs() {
					if dj.GetMoving() {
						msg += fmt.Sprintf("; %s moves to %s", dj.GetJob(), strings.Join(dj.GetTo(), ","))
					} else {
						msg += fmt.Sprintf("; %s stays: %s", dj.GetJob(), dj.GetReason())
					}
				}
				done = append(done, msg)
			}
			return app.ActionResult(strings.Join(done, " · "), nil)
		}
	})
}

func jobRanks(j *api.Job) (ranks int, nodes []string) {
	for _, pn := range j.GetPlacement() {
		ranks += len(pn.GetRanks())
		nodes = append(nodes, pn.GetNode())
	}
	return ranks, nodes
}

func jobLine(j *api.Job) string {
	ranks, nodes := jobRanks(j)
	return fmt.Sprintf("%s %s: %s, plan %s, %d ranks on %s, step %d, last checkpoint step %d",
		j.GetId(), j.GetName(), app.JobState(j), app.Plan(j), ranks, orNone(strings.Join(nodes, ",")), j.GetStep(), j.GetLastCheckpointStep())
}

func orNone(s string) string {
	if s == "" {
		return "no node"
	}
	return s
}

// Checkpoint asks every rank of a job to checkpoint now.
func Checkpoint(ctx *app.Context, j *api.Job) tea.Cmd {
	body := jobLine(j) + "\n\nEvery rank gets SIGUSR1 and writes a checkpoint; training pauses for as long as that takes" +
		fmt.Sprintf(" (measured mean %s).", app.Secs(j.GetCheckpointSeconds()))
	cl, id := ctx.Client, j.GetId()
	return open(ctx, "checkpoint "+j.GetName()+"?", body, false, nil, func([]dialog.Field) tea.Cmd {
		return func() tea.Msg {
			c, cancel := app.Request()
			defer cancel()
			_, err := cl.CheckpointJob(c, id)
			return app.ActionResult("checkpoint requested for "+id, err)
		}
	})
}

// Restart stops a job and relaunches it from a checkpoint, avoiding the
// nodes in exclude (editable in the dialog).
func Restart(ctx *app.Context, j *api.Job, exclude []string) tea.Cmd {
	lost := j.GetStep() - j.GetLastCheckpointStep()
	body := jobLine(j) + fmt.Sprintf("\n\nEvery rank is stopped (SIGTERM, SIGKILL after 5 s) and the job relaunched from its "+
		"checkpoint; about %d steps since the last checkpoint are redone. Excluded nodes are cordoned out of its placement.", max(lost, 0))
	fields := []dialog.Field{{Label: "exclude nodes", Value: strings.Join(exclude, ",")}, {Label: "from checkpoint", Value: "latest"}}
	cl, id := ctx.Client, j.GetId()
	return open(ctx, "restart "+j.GetName()+"?", body, true, fields, func(f []dialog.Field) tea.Cmd {
		ex := splitList(f[0].Value)
		from := strings.TrimSpace(f[1].Value)
		return func() tea.Msg {
			c, cancel := app.Request()
			defer cancel()
			_, err := cl.RestartJob(c, id, from, ex)
			return app.ActionResult("restart of "+id+" started", err)
		}
	})
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		out = append(out, p)
	}
	return out
}

// Cancel cancels a job.
func Cancel(ctx *app.Context, j *api.Job) tea.Cmd {
	lost := j.GetStep() - j.GetLastCheckpointStep()
	body := jobLine(j) + fmt.Sprintf("\n\nEvery rank gets SIGTERM, SIGKILL after 30 s; the job ends cancelled. "+
		"%d steps since the last checkpoint are lost.", max(lost, 0))
	cl, id := ctx.Client, j.GetId()
	return open(ctx, "cancel "+j.GetName()+"?", body, true, nil, func([]dialog.Field) tea.Cmd {
		return func() tea.Msg {
			c, cancel := app.Request()
			defer cancel()
			_, err := cl.CancelJob(c, id)
			return app.ActionResult("cancelled "+id, err)
		}
	})
}

// Assign starts a pending job on exactly the given nodes.
func Assign(ctx *app.Context, j *api.Job, nodes []string) tea.Cmd {
	if len(nodes) == 0 {
		return app.Flash("assign: mark nodes first (space in :nodes), then assign from :jobs", true)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s needs %d GPUs (plan %s).\n\nbefore: %s\nafter:  %s\n\nFree GPUs on the nodes:\n",
		j.GetId(), j.GetName(), j.GetFullGpus(), app.Plan(j), placementText(j.GetPlacement()), strings.Join(nodes, ", "))
	for _, n := range nodes {
		ns := ctx.Snap.Node(n)
		if ns == nil {
			fmt.Fprintf(&b, "  %s: unknown node\n", n)
			continue
		}
		fmt.Fprintf(&b, "  %s: %s, %d of %d GPUs free\n", n, app.NodeBadge(ns, ctx.Now()), freeGPUs(ctx, ns), len(ns.GetGpus()))
	}
	cl, id := ctx.Client, j.GetId()
	return open(ctx, "assign "+j.GetName()+"?", b.String(), false, nil, func([]dialog.Field) tea.Cmd {
		return func() tea.Msg {
			c, cancel := app.Request()
			defer cancel()
			_, err := cl.AssignJob(c, id, nodes)
			return app.ActionResult("assigned "+id+" to "+strings.Join(nodes, ","), err)
		}
	})
}

func placementText(p []*api.JobNode) string {
	if len(p) == 0 {
		return "not placed"
	}
	parts := make([]string, len(p))
	for i, pn := range p {
		gs := make([]string, len(pn.GetGpus()))
		for k, g := range pn.GetGpus() {
			gs[k] = strconv.Itoa(int(g))
		}
		parts[i] = pn.GetNode() + "[" + strings.Join(gs, ",") + "]"
	}
	return strings.Join(parts, " ")
}

// freeGPUs counts the GPUs of n that no job's placement holds.
func freeGPUs(ctx *app.Context, n *api.NodeStatus) int {
	used := map[uint32]bool{}
	for _, j := range ctx.Snap.Jobs {
		for _, pn := range j.GetPlacement() {
			if pn.GetNode() == app.NodeName(n) {
				for _, g := range pn.GetGpus() {
					used[g] = true
				}
			}
		}
	}
	return len(n.GetGpus()) - len(used)
}

// rebalancePlanMsg carries the server's proposed moves.
type rebalancePlanMsg struct {
	resp *api.RebalanceResponse
	err  error
}

// Rebalance asks the server for its move plan, shows it, and applies it
// once confirmed.
func Rebalance(ctx *app.Context) tea.Cmd {
	cl := ctx.Client
	return ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		r, err := cl.Rebalance(c, false, 0)
		if err != nil {
			return app.ActionResult("rebalance plan", err)
		}
		if len(r.GetMoves()) == 0 {
			return app.FlashMsg{Text: "rebalance: nothing to move; the packing is as tight as it gets"}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "packing before %s\npacking after  %s\n\n", packing(r.GetBefore()), packing(r.GetAfter()))
		for _, mv := range r.GetMoves() {
			fmt.Fprintf(&b, "%s: %s\n    → %s\n", mv.GetJob(), placementText(mv.GetFrom()), placementText(mv.GetTo()))
		}
		b.WriteString("\nEach job is checkpointed, stopped and relaunched on its new nodes, one at a time.")
		d := dialog.New(ctx.Styles, ctx.Now, fmt.Sprintf("rebalance: move %d job(s)?", len(r.GetMoves())), b.String(), true, nil,
			func([]dialog.Field) tea.Cmd {
				return ctx.Task(func() tea.Msg {
					c, cancel := app.Request()
					defer cancel()
					_, err := cl.Rebalance(c, true, 0)
					return app.ActionResult(fmt.Sprintf("rebalance started: %d move(s)", len(r.GetMoves())), err)
				})
			})
		return app.OverlayMsg{Overlay: d}
	})
}

func packing(p *api.Packing) string {
	return fmt.Sprintf("cost %.2f (%d fragmented nodes, %d extra switches, %d extra racks)",
		p.GetCost(), p.GetFragmentedNodes(), p.GetExtraSwitches(), p.GetExtraRacks())
}

// faultKinds names the injectable faults.
var faultKinds = map[string]api.FaultKind{
	"xid79": api.FaultKind_FAULT_KIND_XID79, "xid48": api.FaultKind_FAULT_KIND_XID48,
	"ecc": api.FaultKind_FAULT_KIND_ECC_UNCORRECTABLE, "thermal": api.FaultKind_FAULT_KIND_THERMAL,
	"lost": api.FaultKind_FAULT_KIND_GPU_LOST, "clear": api.FaultKind_FAULT_KIND_CLEAR,
}

// Fault injects a fault into a GPU of a simulated node.
func Fault(ctx *app.Context, n *api.NodeStatus, gpu int) tea.Cmd {
	if !app.Simulated(n) {
		return app.Flash("fault injection needs a simulated node (nodemon --sim); "+app.NodeName(n)+" has real GPUs", true)
	}
	name := app.NodeName(n)
	body := fmt.Sprintf("%s is simulated (%s). The fault shows in NVML as on real hardware; jobs there see it:\n",
		name, n.GetRegistration().GetSimProfile())
	if rs := ranksOn(ctx, []string{name}); len(rs) > 0 {
		body += strings.Join(rs, "\n")
	} else {
		body += "  no job has ranks there."
	}
	body += "\n\nkinds: xid79 (fell off the bus), xid48 (DBE), ecc, thermal, lost, clear"
	fields := []dialog.Field{{Label: "fault", Value: "xid79"}, {Label: "gpu", Value: strconv.Itoa(gpu)}}
	cl := ctx.Client
	return open(ctx, "inject a fault into "+name+"?", body, true, fields, func(f []dialog.Field) tea.Cmd {
		kind, ok := faultKinds[strings.TrimSpace(f[0].Value)]
		g, err := strconv.Atoi(strings.TrimSpace(f[1].Value))
		return func() tea.Msg {
			if !ok {
				return app.FlashMsg{Text: fmt.Sprintf("fault %q: use xid79, xid48, ecc, thermal, lost or clear", f[0].Value), Err: true}
			}
			if err != nil || g < 0 || g >= len(n.GetGpus()) {
				return app.FlashMsg{Text: fmt.Sprintf("gpu %q: %s has GPUs 0 to %d", f[1].Value, name, len(n.GetGpus())-1), Err: true}
			}
			c, cancel := app.Request()
			defer cancel()
			err := cl.InjectFault(c, name, &api.InjectFault{GpuIndex: int32(g), Kind: kind})
			return app.ActionResult(fmt.Sprintf("injected %s into %s GPU %d", f[0].Value, name, g), err)
		}
	})
}
