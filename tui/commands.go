package tui

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/view/contexts"
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

// argKind is what a command's first argument names, for completion.
type argKind int

const (
	argNone argKind = iota
	argNode
	argJob
	argContext
)

// command is one `:` command. Names, aliases, completion, help and what
// runs all come from the one registry below.
type command struct {
	name    string
	aliases []string
	// gate is the action the role must be allowed; "" is anyone.
	gate app.Action
	arg  argKind
	// pushed views stack on the current one; the others replace the
	// stack above the overview, as k9s does.
	pushed bool
	// act runs a command that opens no view; open builds a view.
	act  func(m *Model, args []string) tea.Cmd
	open func(m *Model, args []string) (app.View, error)
}

// commands are the console's `:` commands, in the order help lists them.
var commands = []command{
	{name: "overview", aliases: []string{"ov"}, open: func(m *Model, _ []string) (app.View, error) { return overview.New(m.ctx), nil }},
	{name: "nodes", aliases: []string{"no"}, open: func(m *Model, _ []string) (app.View, error) { return nodes.New(m.ctx), nil }},
	{name: "node", aliases: []string{"n"}, arg: argNode, pushed: true, open: func(m *Model, args []string) (app.View, error) {
		if len(args) != 1 {
			return nil, fmt.Errorf(":node NAME — tab completes the names")
		}
		return node.New(m.ctx, args[0]), nil
	}},
	{name: "gpu", arg: argNode, pushed: true, open: func(m *Model, args []string) (app.View, error) {
		if len(args) != 2 {
			return nil, fmt.Errorf(":gpu NODE INDEX")
		}
		i, err := strconv.Atoi(args[1])
		if err != nil || i < 0 {
			return nil, fmt.Errorf(":gpu %s %s: the index is a GPU number, e.g. 0", args[0], args[1])
		}
		return gpu.New(m.ctx, args[0], i), nil
	}},
	{name: "jobs", aliases: []string{"jo"}, open: func(m *Model, _ []string) (app.View, error) { return jobs.New(m.ctx), nil }},
	{name: "job", aliases: []string{"j"}, arg: argJob, pushed: true, open: func(m *Model, args []string) (app.View, error) {
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
	}},
	{name: "stalls", aliases: []string{"st"}, open: func(m *Model, _ []string) (app.View, error) { return stalls.New(m.ctx), nil }},
	{name: "events", aliases: []string{"ev"}, open: func(m *Model, args []string) (app.View, error) {
		v := events.New(m.ctx)
		if len(args) > 0 {
			v.SetFilter(strings.Join(args, " "))
		}
		return v, nil
	}},
	{name: "observe", aliases: []string{"ob"}, open: func(m *Model, args []string) (app.View, error) {
		v := observe.New(m.ctx)
		if len(args) > 0 {
			v.SetFilter(strings.Join(args, " "))
		}
		return v, nil
	}},
	{name: "flows", arg: argNode, pushed: true, open: func(m *Model, args []string) (app.View, error) {
		if len(args) != 1 {
			return nil, fmt.Errorf(":flows NODE — tab completes the names")
		}
		return observe.Flows(m.ctx, args[0]), nil
	}},
	{name: "plan", open: func(m *Model, args []string) (app.View, error) { return plan.New(m.ctx, args), nil }},
	{name: "submit", gate: app.ActSubmit, act: func(m *Model, _ []string) tea.Cmd { return actions.Submit(m.ctx) }},
	{name: "rebalance", gate: app.ActRebalance, act: func(m *Model, _ []string) tea.Cmd { return actions.Rebalance(m.ctx) }},
	{name: "ctx", aliases: []string{"context"}, arg: argContext, act: func(m *Model, args []string) tea.Cmd {
		switch len(args) {
		case 0:
			return m.push(contexts.New(m.ctx))
		case 1:
			return m.switchContext(args[0])
		}
		m.flash, m.flashErr = ":ctx [NAME] — without a name it lists the client config's contexts", true
		return nil
	}},
	{name: "help", act: func(m *Model, _ []string) tea.Cmd { m.showHelp = true; return nil }},
	{name: "quit", aliases: []string{"q", "q!"}, act: func(*Model, []string) tea.Cmd { return tea.Quit }},
}

// lookupCommand finds a command by its name or an alias.
func lookupCommand(name string) (*command, bool) {
	for i := range commands {
		if c := &commands[i]; c.name == name || slices.Contains(c.aliases, name) {
			return c, true
		}
	}
	return nil, false
}

// commandNames are every command's name, for errors.
func commandNames() []string {
	out := make([]string, len(commands))
	for i, c := range commands {
		out[i] = c.name
	}
	return out
}

// allowedCommands are the names this console's role may run, for help and
// completion.
func (m *Model) allowedCommands() []string {
	var out []string
	for _, c := range commands {
		if c.gate == "" || m.ctx.Can(c.gate) {
			out = append(out, c.name)
		}
	}
	return out
}

// run carries out a `:` command.
func (m *Model) run(line string) tea.Cmd {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	c, ok := lookupCommand(f[0])
	if ok && c.gate != "" && !m.ctx.Can(c.gate) {
		return m.deny(c.name)
	}
	if ok && c.act != nil {
		return c.act(m, f[1:])
	}
	v, err := m.open(line)
	if err != nil {
		m.flash, m.flashErr = err.Error(), true
		return nil
	}
	if !c.pushed {
		for len(m.stack) > 1 {
			m.pop()
		}
		if c.name == "overview" {
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
	c, ok := lookupCommand(f[0])
	if !ok || c.open == nil {
		return nil, fmt.Errorf("unknown command %q: try %s", f[0], strings.Join(commandNames(), ", "))
	}
	return c.open(m, f[1:])
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
		for _, c := range m.allowedCommands() {
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
	c, ok := lookupCommand(f[0])
	if !ok {
		return nil
	}
	var pool []string
	switch c.arg {
	case argNode:
		if len(f) > 2 || (len(f) == 2 && trailing) {
			return nil
		}
		for _, n := range m.ctx.Snap.Nodes {
			pool = append(pool, app.NodeName(n))
		}
	case argJob:
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
	case argContext:
		if len(f) > 2 || (len(f) == 2 && trailing) {
			return nil
		}
		for _, c := range m.ctx.Contexts {
			pool = append(pool, c.Name)
		}
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
