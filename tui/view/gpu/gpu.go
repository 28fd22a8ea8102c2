// Package gpu is one GPU's detail: its counters now and charts of the
// samples the server retains (GPUHistory), refreshed every few seconds.
package gpu

import (
	"fmt"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/spark"
)

// Refresh is how often the history is fetched again.
const Refresh = 3 * time.Second

// KeyMap is the GPU view's keys.
type KeyMap struct{ Reload, Flows key.Binding }

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding { return []key.Binding{k.Reload, k.Flows} }

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding { return [][]key.Binding{{k.Reload, k.Flows}} }

// Model is the GPU view.
type Model struct {
	ctx     *app.Context
	node    string
	index   int
	keys    KeyMap
	gen     uint64
	samples []*api.GPUSample
	err     error
}

// historyMsg answers a GPUHistory request of generation gen.
type historyMsg struct {
	gen     uint64
	samples []*api.GPUSample
	err     error
}

type tickMsg struct{ gen uint64 }

// New returns the view of GPU index of node.
func New(ctx *app.Context, node string, index int) *Model {
	return &Model{ctx: ctx, node: node, index: index, keys: KeyMap{Reload: app.Bind("r", "reload", "r"),
		Flows: app.Bind("w", "the node's flows", "w")}}
}

// Name implements app.View.
func (m *Model) Name() string { return "gpu" }

// Title implements app.View.
func (m *Model) Title() string { return fmt.Sprintf("GPU %d", m.index) }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Init implements app.View: the first fetch.
func (m *Model) Init() tea.Cmd { return m.fetch() }

func (m *Model) fetch() tea.Cmd {
	m.gen = m.ctx.NextGen()
	gen, cl, node, idx := m.gen, m.ctx.Client, m.node, m.index
	return m.ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		s, err := cl.GPUHistory(c, node, idx)
		return historyMsg{gen: gen, samples: s, err: err}
	})
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case historyMsg:
		if msg.gen != m.gen {
			return m, nil
		}
		m.samples, m.err = msg.samples, msg.err
		gen := m.gen
		return m, m.ctx.Tick(Refresh, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	case tickMsg:
		if msg.gen == m.gen {
			return m, m.fetch()
		}
	case tea.KeyPressMsg:
		switch {
		case key.Matches(msg, m.keys.Reload):
			return m, m.fetch()
		case key.Matches(msg, m.keys.Flows):
			node := m.node
			return m, func() tea.Msg { return app.JumpMsg{Command: "flows " + node} }
		}
	}
	return m, nil
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	var b strings.Builder
	n := m.ctx.Snap.Node(m.node)
	var g *api.GPUStatus
	if n != nil && m.index < len(n.GetGpus()) {
		g = n.GetGpus()[m.index]
	}
	if g == nil {
		return st.Crit.Render(fmt.Sprintf("%s has no GPU %d", m.node, m.index))
	}
	l := g.GetLast()
	fmt.Fprintf(&b, "%s GPU %d · %s · %s · %s\n", st.Bold.Render(m.node), m.index, g.GetInfo().GetModel(), g.GetInfo().GetUuid(),
		g.GetInfo().GetPciBusId())
	health := st.OK.Render("healthy")
	if !g.GetHealthy() {
		health = st.Crit.Render("unhealthy: " + g.GetUnhealthyReason())
	}
	e := l.GetEcc()
	fmt.Fprintf(&b, "%s · util %d%% · mem %s of %s · %d W · %d°C\n", health,
		l.GetUtilGpuPercent(), app.Bytes(l.GetMemUsedBytes()), app.Bytes(l.GetMemTotalBytes()), l.GetPowerMw()/1000, l.GetTempC())
	// Clocks and throttle reasons on a line of their own: they are what a
	// slow rank's evidence points at, so 80 columns must not cut them.
	throttle := orDash(strings.Join(l.GetThrottleNames(), ","))
	if len(l.GetThrottleNames()) > 0 {
		throttle = st.Warn.Render(throttle)
	}
	fmt.Fprintf(&b, "SM %d MHz · mem %d MHz · throttle %s\n", l.GetSmClockMhz(), l.GetMemClockMhz(), throttle)
	fmt.Fprintf(&b, "ECC volatile %d corrected / %d uncorrected · retired pages %d/%d · remapped rows %d/%d · NVLink %s · PCIe %s\n",
		e.GetVolatileCorrected(), e.GetVolatileUncorrected(), l.GetRetiredPagesSbe(), l.GetRetiredPagesDbe(),
		l.GetRemappedRowsCorrectable(), l.GetRemappedRowsUncorrectable(),
		app.Rate(l.GetNvlinkTxBytesPerSec()+l.GetNvlinkRxBytesPerSec()), app.Rate(l.GetPcieTxBytesPerSec()+l.GetPcieRxBytesPerSec()))
	switch {
	case m.err != nil:
		b.WriteString(st.FlashErr.Render("history: "+m.err.Error()) + "\n")
		return b.String()
	case m.samples == nil:
		b.WriteString(st.Dim.Render("loading history…") + "\n")
		return b.String()
	}
	s := m.samples
	span := ""
	if len(s) > 1 {
		span = app.Duration(time.Duration(s[len(s)-1].GetTimeUnixNano() - s[0].GetTimeUnixNano()))
	}
	fmt.Fprintf(&b, "%s\n", st.Dim.Render(fmt.Sprintf("%d samples over %s, newest right", len(s), span)))
	series := []struct {
		name string
		top  float64
		f    func(*api.GPUSample) float64
		unit string
	}{
		{"util %", 100, func(x *api.GPUSample) float64 { return float64(x.GetUtilGpuPercent()) }, "%"},
		{"memory %", 100, func(x *api.GPUSample) float64 {
			if x.GetMemTotalBytes() == 0 {
				return 0
			}
			return float64(x.GetMemUsedBytes()) / float64(x.GetMemTotalBytes()) * 100
		}, "%"},
		{"power W", float64(g.GetInfo().GetPowerLimitMw()) / 1000, func(x *api.GPUSample) float64 { return float64(x.GetPowerMw()) / 1000 }, "W"},
		{"temp °C", 100, func(x *api.GPUSample) float64 { return float64(x.GetTempC()) }, "°C"},
		{"NVLink B/s", 0, func(x *api.GPUSample) float64 {
			return float64(x.GetNvlinkTxBytesPerSec() + x.GetNvlinkRxBytesPerSec())
		}, ""},
	}
	room := m.ctx.Height - strings.Count(b.String(), "\n")
	h := max(room/len(series)-1, 1)
	w := max(m.ctx.Width-14, 10)
	for _, se := range series {
		vals := make([]float64, len(s))
		for i, x := range s {
			vals[i] = se.f(x)
		}
		last := 0.0
		if len(vals) > 0 {
			last = vals[len(vals)-1]
		}
		rows := spark.Chart(vals, w, h, se.top)
		for i, r := range rows {
			label := ""
			if i == 0 {
				label = se.name
			} else if i == 1 {
				label = fmt.Sprintf("%.0f%s", last, se.unit)
			}
			b.WriteString(st.Dim.Render(fmt.Sprintf("%-13s", app.Trunc(label, 13))) + " " + st.Spark.Render(r) + "\n")
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
