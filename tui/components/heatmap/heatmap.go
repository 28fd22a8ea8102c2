// Package heatmap draws every GPU of a cluster in one screen: nodes side
// by side in lines, each node a column of its GPUs, two GPUs per cell with
// half blocks (one per cell without colour), grouped by switch or rack
// label. When the GPUs do not fit it shows one cell per node (their mean),
// and beyond that it scrolls.
package heatmap

import (
	"cmp"
	"slices"
	"strings"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Metric is what the colour of a cell says.
type Metric int

// The metrics the map can show.
const (
	Util Metric = iota
	Memory
	Power
	Temp
	Throttle
	Health
	numMetrics
)

// Metrics lists every metric in the order `m` cycles through them.
var Metrics = []Metric{Util, Memory, Power, Temp, Throttle, Health}

func (m Metric) String() string {
	return [...]string{"util", "memory", "power", "temperature", "throttle", "health (XID/ECC)"}[m]
}

// Next returns the metric after m.
func (m Metric) Next() Metric { return (m + 1) % numMetrics }

// Level places one GPU on the heat scale for metric m, or returns one of
// the special cells.
func Level(m Metric, n *api.NodeStatus, g *api.GPUStatus) int {
	if n.GetState() == api.NodeState_NODE_STATE_DOWN {
		return styles.HeatStale
	}
	if app.GPUFaulty(g) {
		return styles.HeatFaulty
	}
	l := g.GetLast()
	switch m {
	case Util:
		return styles.Level(float64(l.GetUtilGpuPercent()) / 100)
	case Memory:
		t := l.GetMemTotalBytes()
		if t == 0 {
			t = g.GetInfo().GetMemTotalBytes()
		}
		if t == 0 {
			return 0
		}
		return styles.Level(float64(l.GetMemUsedBytes()) / float64(t))
	case Power:
		lim := g.GetInfo().GetPowerLimitMw()
		if lim == 0 {
			lim = 700_000
		}
		return styles.Level(float64(l.GetPowerMw()) / float64(lim))
	case Temp:
		// 30 °C is idle-cool, 90 °C is where GPUs throttle.
		return styles.Level((float64(l.GetTempC()) - 30) / 60)
	case Throttle:
		n := len(l.GetThrottleNames())
		if n == 0 && l.GetThrottleReasons() != 0 {
			n = 1
		}
		return min(n*3, styles.HeatLevels-1)
	case Health:
		bad := l.GetEcc().GetVolatileCorrected() + uint64(l.GetRetiredPagesSbe()+l.GetRemappedRowsCorrectable())
		if l.GetRemapPending() {
			bad += 5
		}
		return min(int(bad), styles.HeatLevels-1)
	}
	return 0
}

// Zoom is the map's cell size: every GPU, or one cell per node.
type Zoom int

// Zoom settings; Auto picks GPUs when they fit.
const (
	Auto Zoom = iota
	GPUs
	Nodes
)

func (z Zoom) String() string { return [...]string{"auto", "gpus", "nodes"}[z] }

// Layout places nodes on the screen; it depends on the node list and the
// size, not on the figures, so it is rebuilt only when those change.
type Layout struct {
	// Lines hold node indexes per column; -1 is a gap between groups.
	Lines [][]int
	// Labels name the group each line starts with ("" to repeat none).
	Labels []string
	Margin int
	// PerNode is set when a cell shows a node, not a GPU.
	PerNode bool
	// SubRows is the GPU slots of a node column (PerNode: 1).
	SubRows int
	Color   bool
	// Rows is the height of the whole map in terminal rows.
	Rows int
	// where maps a node index to its line and column.
	where map[int][2]int
	// GroupBy is the label the layout grouped by ("" for none).
	GroupBy string
}

// rowsPerLine is how many terminal rows one line of nodes takes, and
// linesPerRow how many lines share one row (node cells in colour pack two).
func (l *Layout) rowsPerLine() int {
	if l.Color {
		return max((l.SubRows+1)/2, 1)
	}
	return l.SubRows
}

// NewLayout lays out nodes (sorted by name) in width × height. It groups
// by rack, else switch, else not at all, whichever fits.
func NewLayout(nodes []*api.NodeStatus, width, height int, zoom Zoom, color bool) *Layout {
	gpus := 1
	for _, n := range nodes {
		gpus = max(gpus, len(n.GetGpus()))
	}
	if color && gpus%2 == 1 {
		gpus++
	}
	try := func(perNode bool, group string) *Layout {
		l := &Layout{PerNode: perNode, Color: color, SubRows: gpus, GroupBy: group}
		if perNode {
			l.SubRows = 1
		}
		l.place(nodes, width, group)
		return l
	}
	var best *Layout
	for _, perNode := range []bool{false, true} {
		if perNode && zoom == GPUs || !perNode && zoom == Nodes {
			continue
		}
		for _, g := range []string{"rack", "switch", ""} {
			l := try(perNode, g)
			if best == nil {
				best = l
			}
			if l.Rows <= height {
				return l
			}
		}
		if zoom != Auto {
			// The zoom asked for scrolls; keep its most compact layout.
			best = try(perNode, "")
			return best
		}
	}
	return try(zoom != GPUs, "")
}

func groupOf(n *api.NodeStatus, by string) string {
	if by == "" {
		return ""
	}
	lb := n.GetRegistration().GetLabels()
	if by == "rack" {
		return lb["switch"] + "/" + lb["rack"]
	}
	return lb["switch"]
}

func (l *Layout) place(nodes []*api.NodeStatus, width int, by string) {
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	if by != "" {
		slices.SortStableFunc(order, func(a, b int) int {
			return cmp.Compare(groupOf(nodes[a], by), groupOf(nodes[b], by))
		})
	}
	if by != "" && width >= 100 {
		l.Margin = 9
	}
	cols := max(width-l.Margin, 1)
	l.where = make(map[int][2]int, len(nodes))
	var line []int
	label := ""
	prev := "\x00"
	flush := func() {
		l.Lines = append(l.Lines, line)
		l.Labels = append(l.Labels, label)
		line, label = nil, ""
	}
	for _, i := range order {
		g := groupOf(nodes[i], by)
		if g != prev {
			if len(line) > 0 && by != "" {
				if len(line)+1 >= cols {
					flush()
				} else {
					line = append(line, -1)
				}
			}
			if label == "" {
				label = groupLabel(nodes[i], by)
			}
			prev = g
		}
		if len(line) >= cols {
			flush()
			label = groupLabel(nodes[i], by)
		}
		if label == "" && len(line) == 0 {
			label = groupLabel(nodes[i], by)
		}
		l.where[i] = [2]int{len(l.Lines), len(line)}
		line = append(line, i)
	}
	if len(line) > 0 {
		flush()
	}
	rows := len(l.Lines) * l.rowsPerLine()
	if l.PerNode && l.Color {
		rows = (len(l.Lines) + 1) / 2
	}
	l.Rows = rows
}

func groupLabel(n *api.NodeStatus, by string) string {
	lb := n.GetRegistration().GetLabels()
	switch by {
	case "rack":
		return lb["rack"]
	case "switch":
		return lb["switch"]
	}
	return ""
}

// Where returns the line and column of node i.
func (l *Layout) Where(i int) (line, col int, ok bool) {
	p, ok := l.where[i]
	return p[0], p[1], ok
}

// At returns the node index at line and column, or -1.
func (l *Layout) At(line, col int) int {
	if line < 0 || line >= len(l.Lines) || col < 0 {
		return -1
	}
	if col >= len(l.Lines[line]) {
		col = len(l.Lines[line]) - 1
	}
	for c := col; c >= 0; c-- {
		if i := l.Lines[line][c]; i >= 0 {
			return i
		}
	}
	return -1
}

// RowOfLine is the first terminal row of a line.
func (l *Layout) RowOfLine(line int) int {
	if l.PerNode && l.Color {
		return line / 2
	}
	return line * l.rowsPerLine()
}

// LineAt returns the line shown at terminal row r and screen column x, for
// a mouse click (top half of a packed cell: the even line).
func (l *Layout) LineAt(r int) int {
	if l.PerNode && l.Color {
		return r * 2
	}
	return r / max(l.rowsPerLine(), 1)
}

// Levels are every GPU's place on the heat scale for one metric, and each
// node's (its GPUs' mean), for the nodes of one snapshot. Working them out
// reads every GPU's sample; consoles that draw the same snapshot share one
// Levels (see app.History.Derive), so it is read once, not once per console.
type Levels struct {
	gpu  [][]uint8
	node []uint8
}

// NewLevels places the GPUs of nodes on the scale of metric m.
func NewLevels(m Metric, nodes []*api.NodeStatus) *Levels {
	lv := &Levels{gpu: make([][]uint8, len(nodes)), node: make([]uint8, len(nodes))}
	n := 0
	for _, nd := range nodes {
		n += len(nd.GetGpus())
	}
	all := make([]uint8, n)
	for i, nd := range nodes {
		gs := nd.GetGpus()
		lv.gpu[i], all = all[:len(gs):len(gs)], all[len(gs):]
		sum, faulty, stale := 0, false, false
		for k, g := range gs {
			v := Level(m, nd, g)
			lv.gpu[i][k] = uint8(v)
			switch v {
			case styles.HeatStale:
				stale = true
			case styles.HeatFaulty:
				faulty = true
			default:
				sum += v
			}
		}
		switch {
		case len(gs) == 0:
			lv.node[i] = styles.HeatEmpty
		case stale:
			lv.node[i] = styles.HeatStale
		case faulty:
			lv.node[i] = styles.HeatFaulty
		default:
			lv.node[i] = uint8(sum / len(gs))
		}
	}
	return lv
}

// levelsOf names the levels of one metric among what consoles derive
// from a snapshot.
type levelsOf Metric

// SharedLevels are the levels of metric m for nodes, the nodes of the
// snapshot h goes with, worked out once for every console reading h.
func SharedLevels(h *app.History, m Metric, nodes []*api.NodeStatus) *Levels {
	return h.Derive(levelsOf(m), func() any { return NewLevels(m, nodes) }).(*Levels)
}

// Render draws rows [top, top+height) of the map at levels lv (of the
// nodes the layout was made for); cursor is the selected node index (-1
// for none).
func (l *Layout) Render(st *styles.Styles, lv *Levels, top, height, cursor int) string {
	level := func(line, col, sub int) int {
		if line >= len(l.Lines) || col >= len(l.Lines[line]) {
			return styles.HeatEmpty
		}
		i := l.Lines[line][col]
		if i < 0 || i >= len(lv.node) {
			return styles.HeatEmpty
		}
		if l.PerNode {
			return int(lv.node[i])
		}
		if sub >= len(lv.gpu[i]) {
			return styles.HeatEmpty
		}
		return int(lv.gpu[i][sub])
	}
	// Each terminal row shows two virtual sub-rows in colour, one without.
	vsub := func(r int) (line, sub int) {
		if l.PerNode {
			return r, 0
		}
		return r / l.SubRows, r % l.SubRows
	}
	var b strings.Builder
	b.Grow(height * 4096)
	for r := top; r < min(top+height, l.Rows); r++ {
		if r > top {
			b.WriteByte('\n')
		}
		var v0, v1 int
		if st.Color {
			v0, v1 = 2*r, 2*r+1
			if !l.PerNode {
				// A node column's GPUs: row r holds slots 2k and 2k+1 of line r/rows.
				rpl := l.rowsPerLine()
				line := r / rpl
				k := r % rpl
				v0, v1 = line*l.SubRows+2*k, line*l.SubRows+2*k+1
			}
		} else {
			v0 = r
		}
		line0, sub0 := vsub(v0)
		line1, sub1 := vsub(v1)
		if l.Margin > 0 {
			lbl := ""
			if line0 < len(l.Labels) && (sub0 == 0 || l.PerNode) {
				lbl = l.Labels[line0]
			}
			b.WriteString(st.Dim.Render(app.Pad(lbl, l.Margin-1)))
			b.WriteByte(' ')
		}
		width := 0
		if line0 < len(l.Lines) {
			width = len(l.Lines[line0])
		}
		if st.Color && line1 < len(l.Lines) {
			width = max(width, len(l.Lines[line1]))
		}
		last := -1
		for c := range width {
			cur := cursor >= 0 && ((line0 < len(l.Lines) && c < len(l.Lines[line0]) && l.Lines[line0][c] == cursor) ||
				(st.Color && line1 < len(l.Lines) && c < len(l.Lines[line1]) && l.Lines[line1][c] == cursor))
			t := level(line0, c, sub0)
			if !st.Color {
				if cur {
					b.WriteString("\x1b[7m" + st.HeatMono[t] + styles.Reset)
				} else {
					b.WriteString(st.HeatMono[t])
				}
				continue
			}
			bt := styles.HeatEmpty
			if !l.PerNode || line1 < len(l.Lines) {
				bt = level(line1, c, sub1)
			}
			if cur {
				b.WriteString("\x1b[30;107m" + st.HeatMono[t])
				last = -1
				continue
			}
			if p := t*64 + bt; p != last {
				b.WriteString(st.Heat[t][bt])
				last = p
			} else {
				b.WriteString("▀")
			}
		}
		if st.Color && width > 0 {
			b.WriteString(styles.Reset)
		}
	}
	return b.String()
}
