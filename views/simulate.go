package views

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/gpuctl/gpuctl/scheduler/simulate"
)

// WriteDocument writes v as an indented JSON document, each absent value
// present and null (WithNulls).
func WriteDocument(w io.Writer, v any) error {
	doc, err := WithNulls(v)
	if err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	if err := writeJSON(w, doc); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// Span renders seconds of a training run as the largest sensible unit
// (days, hours, minutes, seconds).
func Span(sec float64) string {
	switch {
	case sec >= 2*86400:
		return fmt.Sprintf("%.1f days", sec/86400)
	case sec >= 2*3600:
		return fmt.Sprintf("%.1f h", sec/3600)
	case sec >= 120:
		return fmt.Sprintf("%.0f min", sec/60)
	}
	return fmt.Sprintf("%.1f s", sec)
}

// SimTrace writes `gpuctl simulate --trace`'s table: the cluster the
// trace at tracePath was replayed on, then one row per policy.
func SimTrace(w io.Writer, tracePath string, rows []simulate.TraceRow) error {
	if len(rows) == 0 {
		return nil
	}
	r0 := rows[0]
	fmt.Fprintf(w, "trace %s: %d jobs on %d nodes × %d GPUs (%d GPUs), checkpoint every %s\n\n",
		tracePath, r0.Jobs, r0.Nodes, r0.GPUs/max(r0.Nodes, 1), r0.GPUs, time.Duration(r0.CheckpointSeconds)*time.Second)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POLICY\tMEAN JCT\tP50 JCT\tP95 JCT\tP99 JCT\tMEAN QUEUE\tMAKESPAN\tUTIL\tRESTARTS\tPREEMPT\tLOST GPU-H\tWALL\t")
	hours := func(s float64) string { return fmt.Sprintf("%.1fh", s/3600) }
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\t%d\t%.0f\t%.2fs\t\n",
			r.Policy, hours(r.MeanJCT), hours(r.P50JCT), hours(r.P95JCT), hours(r.P99JCT), hours(r.MeanQueue),
			hours(float64(r.Makespan)), 100*r.Utilization, r.Restarts, r.Preemptions, r.LostGPUHours, r.WallSeconds)
	}
	return tw.Flush()
}

// SimRun writes `gpuctl simulate --model`'s report of a run under
// failures: the plan, the cluster, predicted against simulated, and what
// the replay saw; took is how long the replay ran.
func SimRun(w io.Writer, doc simulate.RunDocument, took time.Duration) error {
	best, cl, res := doc.Plan, doc.Cluster, doc.Simulated
	fmt.Fprintf(w, "%s on %d × %s: %s, step %.2fs, MFU %.1f%%\n", doc.Model.Name, doc.GPUs, doc.GPU, best.Plan, best.StepSeconds, best.MFU*100)
	fmt.Fprintf(w, "%d steps (%.3g tokens): %s of failure-free training\n", cl.Steps, cl.TrainTokens, Span(cl.FailureFreeSeconds))
	fmt.Fprintf(w, "cluster: %d job nodes + %d spares; an interruption every %s (%.0f%% one GPU, the rest a node), repairs take %s, seed %d\n",
		cl.JobNodes, cl.SpareNodes, Span(cl.MTBFSeconds), cl.GPUFaultShare*100, Span(cl.RepairSeconds), cl.Seed)
	fmt.Fprintf(w, "checkpoint %.0fs every %s; detection %.0fs, restart %.0fs\n\n", cl.CheckpointSeconds, Span(cl.CheckpointInterval), cl.DetectSeconds, cl.RestartSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tEFFECTIVE TIME\tGOODPUT\tINTERRUPTIONS\t")
	fmt.Fprintf(tw, "predicted\t%s\t%.2f%%\t%.0f\t\n", Span(doc.Predicted.EffectiveSeconds), doc.Predicted.Goodput*100, doc.Predicted.Interruptions)
	fmt.Fprintf(tw, "simulated\t%s\t%.2f%%\t%d\t\n", Span(res.WallSeconds), res.Goodput*100, res.Interruptions)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nsimulated − predicted: %+.2f%%; %d GPU and %d node failures (%d during recovery), %d nodes swapped in, %s lost work, %s recovering (%s waiting for nodes), %d checkpoints; replay took %.2fs\n",
		doc.DifferencePercent, res.GPUFailures, res.NodeFailures, res.DuringRecovery, res.Replacements, Span(res.LostWorkSeconds),
		Span(res.RecoverySeconds), Span(res.SpareWaitSeconds), res.Checkpoints, took.Seconds())
	return nil
}
