package deploy

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// panelSpec is one dashboard panel drawn from Prometheus's answers: its
// title, PromQL (as in grafana/gpuctl.json, variables filled in), how
// each series is named, and the y axis.
type panelSpec struct {
	title, expr, yLabel string
	legend              func(map[string]string) string
}

// drawPanels draws three of the dashboard's panels over [start, end] from
// the real Prometheus p, one above the other, into a PNG at path.
func drawPanels(p *prometheus, path, job string, start, end time.Time) error {
	specs := []panelSpec{
		{title: "GPU utilization — DCGM_FI_DEV_GPU_UTIL{Hostname=\"node-00\"}", expr: `DCGM_FI_DEV_GPU_UTIL{Hostname="node-00"}`, yLabel: "%",
			legend: func(m map[string]string) string {
				if m["hpc_job"] != "" {
					return "gpu " + m["gpu"] + " (" + m["hpc_job"] + " rank " + m["rank"] + ")"
				}
				return "gpu " + m["gpu"]
			}},
		{title: "Training steps per second — gpuctl_job_steps_per_second", expr: fmt.Sprintf(`gpuctl_job_steps_per_second{hpc_job=%q}`, job), yLabel: "steps/s",
			legend: func(m map[string]string) string { return m["hpc_job"] }},
		{title: "XID errors — DCGM_FI_DEV_XID_ERRORS (count per code)", expr: `sum by (Hostname, gpu, err_code) (DCGM_FI_DEV_XID_ERRORS)`, yLabel: "count",
			legend: func(m map[string]string) string { return m["Hostname"] + " gpu " + m["gpu"] + " XID " + m["err_code"] }},
	}
	step := max(end.Sub(start)/200, time.Second)
	plots := make([][]*plot.Plot, len(specs))
	for i, s := range specs {
		series, err := p.query(s.expr, start, end, step)
		if err != nil {
			return err
		}
		pl := plot.New()
		pl.Title.Text = s.title
		pl.Y.Label.Text = s.yLabel
		pl.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05"}
		// One time axis for every panel, as a dashboard's.
		pl.X.Min, pl.X.Max = float64(start.Unix()), float64(end.Unix())
		pl.Legend.Top = true
		pl.Add(plotter.NewGrid())
		sort.Slice(series, func(a, b int) bool { return s.legend(series[a].Metric) < s.legend(series[b].Metric) })
		for k, ser := range series {
			xys := make(plotter.XYs, 0, len(ser.Values))
			for _, v := range ser.Values {
				ts, _ := v[0].(float64)
				str, _ := v[1].(string)
				f, err := strconv.ParseFloat(str, 64)
				if err != nil {
					continue
				}
				xys = append(xys, plotter.XY{X: ts, Y: f})
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			line.Color = plotutil.Color(k)
			line.Width = vg.Points(1.5)
			pl.Add(line)
			pl.Legend.Add(s.legend(ser.Metric), line)
		}
		plots[i] = []*plot.Plot{pl}
	}
	img := vgimg.New(vg.Points(900), vg.Points(270*float64(len(specs))))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(specs), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
