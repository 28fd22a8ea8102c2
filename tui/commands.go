package tui

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/view/events"
	"github.com/gpuctl/gpuctl/tui/view/gpu"
	"github.com/gpuctl/gpuctl/tui/view/job"
	"github.com/gpuctl/gpuctl/tui/view/jobs"
	"github.com/gpuctl/gpuctl/tui/view/node"
	"github.com/gpuctl/gpuctl/tui/view/nodes"
	"github.com/gpuctl/gpuctl/tui/view/observe"
	"github.com/gpuctl/gpuctl/tui/view/overview"
	"github.com/gpuctl/gpuctl/tui/view/plan"
	"github.com/gpuctl/gpuctl/tui/view/stalls"
)

// commandNames are the `:` commands, for help and completion.
var commandNames = []string{"overview", "nodes", "node", "gpu", "jobs", "job", "stalls", "events", "observe", "flows", "plan",
	"submit", "rebalance", "help", "quit"}

// aliases map short forms to commands, k9s style.
var aliases = map[string]string{"ov": "overview", "no": "nodes", "jo": "jobs", "st": "stalls", "ev": "events",
	"ob": "observe", "q": "quit", "q!": "quit", "n": "node", "j": "job"}

// run carries out a `:` command.
func (m *Model) run(line string) tea.Cmd {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	name := f[0]
	if a, ok := aliases[name]; ok {
		name = a
	}
	switch name {
	case "quit":
		return tea.Quit
	case "help":
		m.showHelp = true
		return nil
	case "submit":
		if !m.ctx.Can(app.ActSubmit) {
			return m.deny("submit")
		}
		return actions.Submit(m.ctx)
	case "rebalance":
		if !m.ctx.Can(app.ActRebalance) {
			return m.deny("rebalance")
		}
		return actions.Rebalance(m.ctx)
	}
	v, err := m.open(strings.Join(append([]string{name}, f[1:]...), " "))
	if err != nil {
		m.flash, m.flashErr = err.Error(), true
		return nil
	}
	// A top-level list replaces the stack above the overview, as k9s does.
	if name != "node" && name != "gpu" && name != "job" && name != "flows" {
		for len(m.stack) > 1 {
			m.pop()
		}
		if name == "overview" {
			return nil
		}
	}
	return m.push(v)
}

func (m *Model) deny(what string) tea.Cmd {
	m.flash, m.flashErr = fmt.Sprintf("%s: your role (%s) may not do this", what, m.ctx.Role), true
	if m.ctx.ReadOnly {
		m.flash = what + ": the console is read-only (--readonly)"
	}
	return nil
}

// open builds the view a command names.
func (m *Model) open(line string) (app.View, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	name, args := f[0], f[1:]
	if a, ok := aliases[name]; ok {
		name = a
	}
	switch name {
	case "overview":
		return overview.New(m.ctx), nil
	case "nodes":
		return nodes.New(m.ctx), nil
	case "node":
		if len(args) != 1 {
			return nil, fmt.Errorf(":node NAME — tab completes the names")
		}
		return node.New(m.ctx, args[0]), nil
	case "gpu":
		if len(args) != 2 {
			return nil, fmt.Errorf(":gpu NODE INDEX")
		}
		i, err := strconv.Atoi(args[1])
		if err != nil || i < 0 {
			return nil, fmt.Errorf(":gpu %s %s: the index is a GPU number, e.g. 0", args[0], args[1])
		}
		return gpu.New(m.ctx, args[0], i), nil
	case "jobs":
		return jobs.New(m.ctx), nil
	case "job":
		if len(args) != 1 && !(len(args) == 3 && args[1] == "rank") {
			return nil, fmt.Errorf(":job ID [rank R]")
		}
		rank := -1
		if len(args) == 3 {
			r, err := strconv.Atoi(args[2])
			if err != nil {
				return nil, fmt.Errorf(":job %s rank %s: a rank is a number", args[0], args[2])
			}
			rank = r
		}
		return job.New(m.ctx, args[0], rank), nil
	case "stalls":
		return stalls.New(m.ctx), nil
	case "events":
		v := events.New(m.ctx)
		if len(args) > 0 {
			v.SetFilter(strings.Join(args, " "))
		}
		return v, nil
	case "observe":
		v := observe.New(m.ctx)
		if len(args) > 0 {
			v.SetFilter(strings.Join(args, " "))
		}
		return v, nil
	case "flows":
		if len(args) != 1 {
			return nil, fmt.Errorf(":flows NODE — tab completes the names")
		}
		return observe.Flows(m.ctx, args[0]), nil
	case "plan":
		return plan.New(m.ctx, args), nil
	}
	return nil, fmt.Errorf("unknown command %q: try %s", name, strings.Join(commandNames, ", "))
}

// complete offers the commands (and node names or job ids after node,
// gpu, job) that start with prefix.
func (m *Model) complete(prefix string) []string {
	f := strings.Fields(prefix)
	trailing := strings.HasSuffix(prefix, " ")
	if len(f) == 0 || (len(f) == 1 && !trailing) {
		p := ""
		if len(f) == 1 {
			p = f[0]
		}
		var out []string
		for _, c := range commandNames {
			if strings.HasPrefix(c, p) {
				out = append(out, c)
			}
		}
		return out
	}
	arg := ""
	if !trailing {
		arg = f[len(f)-1]
	}
	var pool []string
	switch f[0] {
	case "node", "n", "gpu", "flows":
		if len(f) > 2 || (len(f) == 2 && trailing) {
			return nil
		}
		for _, n := range m.ctx.Snap.Nodes {
			pool = append(pool, app.NodeName(n))
		}
	case "job", "j":
		if len(f) > 2 || (len(f) == 2 && trailing) {
			return nil
		}
		for _, j := range m.ctx.Snap.Jobs {
			pool = append(pool, j.GetId())
			if j.GetName() != "" {
				pool = append(pool, j.GetName())
			}
		}
		slices.Sort(pool)
		pool = slices.Compact(pool)
	default:
		return nil
	}
	var out []string
	for _, p := range pool {
		if strings.HasPrefix(p, arg) {
			out = append(out, f[0]+" "+p)
		}
	}
	if len(out) > 50 {
		out = out[:50]
	}
	return out
}
