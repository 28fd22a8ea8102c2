package views

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// describer writes `gpuctl describe` pages: "Key:  value" facts, then
// sections of indented tables, as kubectl describe does.
type describer struct {
	w   io.Writer
	o   Options
	now time.Time
	err error
}

func (d *describer) printf(format string, args ...any) {
	if d.err == nil {
		_, d.err = fmt.Fprintf(d.w, format, args...)
	}
}

// fact writes one "Key: value" line, the value escaped; "" shows as -.
func (d *describer) fact(key, value string) {
	d.printf("%-22s %s\n", key+":", api.EscapeText(dash(value)))
}

// section writes a titled table indented under it, or "<none>".
func (d *describer) section(title string, t tableData) {
	d.printf("%s:\n", title)
	if len(t.rows) == 0 {
		d.printf("  <none>\n")
		return
	}
	var b strings.Builder
	o := Options{Format: Table, Width: max(d.o.width()-2, 0), Now: d.now}
	if d.o.Format == Wide {
		o.Format = Wide
	}
	if err := o.writeTable(&b, t); err != nil {
		d.err = err
		return
	}
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		d.printf("  %s\n", line)
	}
}

func (d *describer) when(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.Format(time.RFC3339) + " (" + age(d.now, *t) + " ago)"
}

func newDescriber(w io.Writer, o Options) *describer {
	return &describer{w: w, o: o, now: o.now()}
}

// eventsTable lists events newest last, at most n.
func eventsTable(evs []*api.Event, n int) tableData {
	if len(evs) > n {
		evs = evs[len(evs)-n:]
	}
	t := tableData{cols: []column{{name: "TIME"}, {name: "KIND"}, {name: "SEVERITY"}, {name: "MESSAGE", flex: true}}}
	for _, e := range evs {
		v := EventFromAPI(e)
		t.add(txt(timeOrZero(v.Time).Format(time.RFC3339)), txt(v.Kind), txt(v.Severity), txt(v.Message))
	}
	return t
}

// recentEvents is how many events a describe page shows.
const recentEvents = 20

// DescribeNode writes every fact of a node, its GPUs, the jobs placed on
// it and its recent events.
func DescribeNode(w io.Writer, o Options, n *api.NodeStatus, jobs []*api.Job, events []*api.Event) error {
	d := newDescriber(w, o)
	v := NodeFromAPI(n)
	d.fact("Name", v.Name)
	d.fact("State", NodeStateText(n))
	d.fact("State since", d.when(v.StateSince))
	if v.State == "down" {
		d.fact("Down reason", deref(v.DownReason))
	}
	schedulable := "yes"
	switch {
	case v.Draining:
		schedulable = "no: draining (its jobs move elsewhere)"
	case v.Cordoned:
		schedulable = "no: cordoned"
	case v.Suspect(d.now) != "":
		schedulable = "not from the queue: " + v.Suspect(d.now) + "; a recovery may take it once its validation passes there"
	}
	d.fact("Takes new work", schedulable)
	if v.Cordoned {
		d.fact("Cordon reason", deref(v.CordonReason))
	}
	if v.Suspect(d.now) != "" {
		d.fact("Suspect because", deref(v.SuspectReason))
	}
	if len(v.LostTimes) > 0 {
		at := make([]string, len(v.LostTimes))
		for i, t := range v.LostTimes {
			at[i] = t.Format(time.RFC3339)
		}
		d.fact("Lost by recoveries", fmt.Sprintf("%d× within the window: %s", len(v.LostTimes), strings.Join(at, ", ")))
	}
	if v.Stale {
		d.fact("Figures", "stale: the last ones the node sent before it went down")
	}
	d.fact("Connected", strconv.FormatBool(v.Connected))
	d.fact("Last seen", d.when(v.LastSeen))
	d.fact("Address", deref(v.Address))
	d.fact("Hostname", deref(v.Hostname))
	d.fact("Labels", labels(v.Labels))
	d.fact("Simulated", deref(v.SimProfile))
	d.fact("nodemon", deref(v.AgentVersion))
	d.fact("Driver", deref(v.DriverVersion))
	d.fact("CUDA", deref(v.CUDAVersion))
	if v.HeartbeatSecs != nil {
		d.fact("Heartbeat", (time.Duration(*v.HeartbeatSecs * 1e9)).String())
	}
	d.fact("Lost at the node", fmt.Sprintf("%d NCCL records, %d flow updates, %d telemetry batches", v.LostCollectives, v.LostNetEvents, v.DroppedBatches))

	gpus := tableData{cols: []column{{name: "GPU"}, {name: "MODEL"}, {name: "UTIL"}, {name: "MEM"}, {name: "TEMP"}, {name: "POWER"}, {name: "HEALTH", flex: true}}}
	for _, g := range v.GPUs {
		health := "ok"
		switch {
		case g.Lost:
			health = "lost"
		case !g.Healthy:
			health = "unhealthy: " + dash(deref(g.UnhealthyReason))
		}
		if g.UtilPercent == nil {
			gpus.add(count(g.Index), txt(shortModel(g.Model)), txt("-"), txt("-/"+gib(g.MemTotalBytes)), txt("-"), txt("-"), txt(health))
			continue
		}
		gpus.add(count(g.Index), txt(shortModel(g.Model)), txt(staleText(g.Stale, fmt.Sprintf("%d%%", *g.UtilPercent))),
			txt(staleText(g.Stale, gib(*g.MemUsedBytes)+"/"+gib(g.MemTotalBytes))), txt(staleText(g.Stale, fmt.Sprintf("%dC", *g.TempCelsius))),
			txt(staleText(g.Stale, fmt.Sprintf("%.0fW", *g.PowerWatts))), txt(health))
	}
	d.section("GPUs", gpus)

	placed := tableData{cols: []column{{name: "JOB"}, {name: "NAME"}, {name: "STATE"}, {name: "GPUS"}, {name: "RANKS"}, {name: "PIDS"}}}
	for _, j := range jobs {
		jv := JobFromAPI(j)
		for _, jn := range jv.Placement {
			if jn.Node != v.Name {
				continue
			}
			placed.add(txt(jv.ID), txt(jv.Name), txt(stateText(jv)), txt(uintList(jn.GPUs)), txt(rankList(jn.Ranks)), txt(pidList([]JobNodeJSON{jn})))
		}
	}
	d.section("Jobs", placed)
	d.section(fmt.Sprintf("Events (last %d)", recentEvents), eventsTable(events, recentEvents))
	return d.err
}

// DescribeJob writes every fact of a job, its placement, its attempts (as
// sacct lists a job's steps), its stalls and its recent events.
func DescribeJob(w io.Writer, o Options, j *api.Job, stalls []*api.Stall, events []*api.Event) error {
	d := newDescriber(w, o)
	v := JobFromAPI(j)
	d.fact("ID", v.ID)
	d.fact("Name", v.Name)
	d.fact("Tenant", deref(v.Tenant))
	d.fact("Priority", strconv.Itoa(int(v.Priority)))
	d.fact("State", stateText(v))
	if v.State == "pending" {
		d.fact("Waiting because", deref(v.PendingReason))
	}
	d.fact("Reason", deref(v.Reason))
	d.fact("Held", strconv.FormatBool(v.Hold))
	d.fact("Plan", planText(v.Plan)+" ("+planSourceText(v.Plan.Source)+")")
	if len(v.TypePlans) > 0 {
		d.fact("GPU type", TypeText(j))
		d.fact("Plans by type", typePlansText(v.TypePlans))
	}
	gpus := strconv.Itoa(v.GPUs)
	if v.FullGPUs != v.GPUs {
		gpus += fmt.Sprintf(" of %d (shrunk)", v.FullGPUs)
	}
	d.fact("GPUs", gpus)
	if v.Plan.StepSeconds != nil {
		d.fact("Predicted", fmt.Sprintf("%.3f s/step, MFU %.1f%%, %s per GPU", *v.Plan.StepSeconds, 100*deref0(v.Plan.MFU),
			Bytes(uint64(max(deref64(v.Plan.MemPerGPUBytes), 0)))))
	}
	if v.Plan.MeasuredStepSeconds != nil {
		m := fmt.Sprintf("%.3f s/step", *v.Plan.MeasuredStepSeconds)
		if v.Plan.CalibratedComputeScale != nil {
			m += fmt.Sprintf(", calibrated compute_scale %.3f comm_scale %.3f (moved %s)", *v.Plan.CalibratedComputeScale,
				deref0(v.Plan.CalibratedCommScale), deref(v.Plan.CalibratedTerm))
		}
		d.fact("Measured", m)
	}
	if v.Plan.CalibrationNote != nil {
		d.fact("Calibration", *v.Plan.CalibrationNote)
	}
	d.fact("Submitted", d.when(v.SubmitTime))
	d.fact("First started", d.when(v.FirstStartTime))
	d.fact("Started", d.when(v.StartTime))
	d.fact("Ended", d.when(v.EndTime))
	d.fact("Attempt", strconv.Itoa(int(v.Attempt)))
	d.fact("Restarts", fmt.Sprintf("%d (preempted %d times)", v.Restarts, v.Preemptions))
	d.fact("Master", deref(v.Master))
	d.fact("Checkpoint dir", deref(v.CheckpointDir))
	d.fact("Step", optText(v.Step))
	d.fact("Last checkpoint step", optText(v.LastCkptStep))
	d.fact("Resume step", strconv.FormatInt(v.ResumeStep, 10))
	ckpt := strconv.Itoa(int(v.Checkpoints))
	if v.CheckpointSecs != nil {
		ckpt += fmt.Sprintf(", %.1f s each on average", *v.CheckpointSecs)
	}
	d.fact("Checkpoints", ckpt)
	d.fact("Advised interval", seconds(v.AdvisedInterval)+" (Young–Daly, from checkpoint time and the cluster's failure rate)")
	d.fact("Goodput", percent(v.Goodput))
	d.fact("Lost steps", strconv.FormatInt(v.LostSteps, 10))
	d.fact("Downtime", (time.Duration(v.DowntimeSeconds) * time.Second).String())
	d.fact("Useful time", (time.Duration(v.UsefulSeconds) * time.Second).String())
	d.fact("Energy", kWh(v.EnergyJoules))
	d.fact("Emissions", kgCO2e(v.CO2eKg))
	d.fact("GPU-hours", fmt.Sprintf("%.2f before this attempt", v.GPUSeconds/3600))
	if v.EstimateSeconds != nil {
		d.fact("Expected runtime", fmt.Sprintf("%s (%s)", time.Duration(*v.EstimateSeconds)*time.Second, deref(v.EstimateBasis)))
	}
	d.fact("Avoids", strings.Join(v.Exclude, ","))
	d.fact("Stalled", strconv.FormatBool(v.Stalled))

	place := tableData{cols: []column{{name: "NODE"}, {name: "GPUS"}, {name: "RANK"}, {name: "GPU"}, {name: "PID"}, {name: "STATUS"}}}
	for _, jn := range v.Placement {
		for _, r := range jn.Ranks {
			status := "running"
			switch {
			case r.Exited && r.Signal != nil:
				status = "killed by " + *r.Signal
			case r.Exited:
				status = fmt.Sprintf("exited %d", *r.ExitCode)
			case r.PID == nil:
				status = "starting"
			}
			pid := "-"
			if r.PID != nil {
				pid = strconv.Itoa(int(*r.PID))
			}
			place.add(txt(jn.Node), txt(uintList(jn.GPUs)), count(r.Rank), count(r.GPU), txt(pid), txt(status))
		}
		if len(jn.Ranks) == 0 {
			place.add(txt(jn.Node), txt(uintList(jn.GPUs)), txt("-"), txt("-"), txt("-"), txt("not launched"))
		}
	}
	d.section("Placement", place)
	if len(v.MoveTarget) > 0 {
		d.fact("Moving to", nodeList(v.MoveTarget))
	}

	att := tableData{cols: []column{{name: "ATTEMPT"}, {name: "START"}, {name: "END"}, {name: "NODES"}, {name: "GPUS"}, {name: "STEPS"},
		{name: "LOST"}, {name: "GPU-HOURS"}, {name: "ENERGY"}, {name: "END REASON", flex: true}}}
	for _, a := range v.Attempts {
		end, reason := "running", dash(deref(a.EndReason))
		if a.EndTime != nil {
			end = a.EndTime.Format(time.RFC3339)
		}
		att.add(count(a.Attempt), txt(timeOrZero(a.StartTime).Format(time.RFC3339)), txt(end), txt(HostList(a.Nodes)), count(a.GPUs),
			txt(fmt.Sprintf("%d→%d", a.ResumeStep, a.LastStep)), count(a.LostSteps), txt(fmt.Sprintf("%.2f", a.GPUSeconds/3600)),
			txt(kWh(a.EnergyJoules)), txt(reason))
	}
	d.section("Attempts", att)

	st := tableData{cols: []column{{name: "COMM"}, {name: "LAGGING"}, {name: "FOR"}, {name: "DIAGNOSIS", flex: true}}}
	for _, s := range stalls {
		sv := StallFromAPI(s, d.now)
		lag := make([]string, len(sv.LaggingRanks))
		for i, r := range sv.LaggingRanks {
			lag[i] = fmt.Sprintf("%d@%s/%d", r.Rank, r.Node, r.PID)
		}
		st.add(txt(sv.Comm), txt(dash(strings.Join(lag, ","))), txt(age(d.now, timeOrZero(sv.Since))), txt(sv.Diagnosis))
	}
	d.section("Stalls", st)
	d.section(fmt.Sprintf("Events (last %d)", recentEvents), eventsTable(events, recentEvents))
	return d.err
}

// DescribeGPU writes every fact of one GPU, the ranks on it, a summary of
// its retained samples and its recent events.
func DescribeGPU(w io.Writer, o Options, n *api.NodeStatus, g *api.GPUStatus, history []*api.GPUSample, jobs []*api.Job, events []*api.Event) error {
	d := newDescriber(w, o)
	v := GPUFromAPI(n.GetRegistration().GetName(), n.GetStale(), g)
	d.fact("Node", v.Node)
	d.fact("Index", strconv.Itoa(int(v.Index)))
	d.fact("UUID", v.UUID)
	d.fact("Model", v.Model)
	d.fact("PCI bus id", deref(v.PCIBusID))
	health := "healthy"
	switch {
	case v.Lost:
		health = "lost (off the bus)"
	case !v.Healthy:
		health = "unhealthy: " + dash(deref(v.UnhealthyReason))
	}
	d.fact("Health", health)
	if v.Stale {
		d.fact("Figures", "stale: the last ones the node sent before it went down")
	}
	d.fact("Sampled", d.when(v.SampleTime))
	if v.UtilPercent != nil {
		d.fact("Utilization", fmt.Sprintf("%d%% (memory %d%%)", *v.UtilPercent, *v.MemUtilPercent))
		d.fact("Memory", Bytes(*v.MemUsedBytes)+" of "+Bytes(v.MemTotalBytes))
		d.fact("Temperature", fmt.Sprintf("%d C", *v.TempCelsius))
		power := fmt.Sprintf("%.1f W", *v.PowerWatts)
		if v.PowerLimitWatts != nil {
			power += fmt.Sprintf(" of %.0f W", *v.PowerLimitWatts)
		}
		d.fact("Power", power)
		d.fact("Energy", kWh(*v.EnergyJoules)+" since the driver loaded")
		d.fact("Clocks", fmt.Sprintf("SM %d MHz, memory %d MHz", *v.SMClockMHz, *v.MemClockMHz))
		d.fact("Throttle", strings.Join(v.Throttle, ","))
		d.fact("ECC (volatile)", fmt.Sprintf("%d corrected, %d uncorrected", *v.ECCCorrected, *v.ECCUncorrected))
		d.fact("Retired pages", strconv.Itoa(int(*v.RetiredPages)))
		remap := fmt.Sprintf("%d correctable, %d uncorrectable", *v.RemappedCorr, *v.RemappedUncorr)
		if v.RemapPending {
			remap += ", pending (reset the GPU)"
		}
		if v.RemapFailure {
			remap += ", FAILED"
		}
		d.fact("Remapped rows", remap)
		d.fact("NVLink", Bytes(*v.NVLinkTx)+"/s tx, "+Bytes(*v.NVLinkRx)+"/s rx")
		d.fact("PCIe", Bytes(*v.PCIeTx)+"/s tx, "+Bytes(*v.PCIeRx)+"/s rx")
	}
	// Which job's rank runs here, from the placements.
	ranks := map[uint32]string{}
	for _, j := range jobs {
		for _, jn := range j.GetPlacement() {
			if jn.GetNode() != v.Node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if r.GetGpu() == v.Index && r.GetPid() != 0 {
					ranks[r.GetPid()] = fmt.Sprintf("%s rank %d", j.GetId(), r.GetRank())
				}
			}
		}
	}
	procs := tableData{cols: []column{{name: "PID"}, {name: "NAME"}, {name: "MEM"}, {name: "RANK"}}}
	for _, p := range v.Processes {
		procs.add(count(p.PID), txt(dash(deref(p.Name))), num(Bytes(p.MemUsedBytes), float64(p.MemUsedBytes)), txt(dash(ranks[p.PID])))
	}
	d.section("Processes", procs)
	if len(history) > 0 {
		hist := tableData{cols: []column{{name: "COUNTER"}, {name: "MIN"}, {name: "MEAN"}, {name: "MAX"}}}
		series := []struct {
			name string
			val  func(*api.GPUSample) float64
			unit string
		}{
			{"utilization", func(s *api.GPUSample) float64 { return float64(s.GetUtilGpuPercent()) }, "%"},
			{"temperature", func(s *api.GPUSample) float64 { return float64(s.GetTempC()) }, " C"},
			{"power", func(s *api.GPUSample) float64 { return float64(s.GetPowerMw()) / 1000 }, " W"},
		}
		for _, sr := range series {
			lo, hi, sum := sr.val(history[0]), sr.val(history[0]), 0.0
			for _, s := range history {
				x := sr.val(s)
				lo, hi, sum = min(lo, x), max(hi, x), sum+x
			}
			f := func(x float64) cell { return txt(strconv.FormatFloat(x, 'f', 0, 64) + sr.unit) }
			hist.add(txt(sr.name), f(lo), f(sum/float64(len(history))), f(hi))
		}
		first, last := timeOf(history[0].GetTimeUnixNano()), timeOf(history[len(history)-1].GetTimeUnixNano())
		d.section(fmt.Sprintf("History (%d samples over %s)", len(history), Duration(last.Sub(first))), hist)
	}
	var mine []*api.Event
	for _, e := range events {
		if e.GetNode() == v.Node && isGPUEvent(e.GetKind()) && e.GetGpuIndex() == int32(v.Index) || e.GetGpuUuid() != "" && e.GetGpuUuid() == v.UUID {
			mine = append(mine, e)
		}
	}
	d.section(fmt.Sprintf("Events (last %d)", recentEvents), eventsTable(mine, recentEvents))
	return d.err
}

func optText(v *int64) string {
	if v == nil {
		return "unknown"
	}
	return strconv.FormatInt(*v, 10)
}

func deref64(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

func kgCO2e(kg *float64) string {
	if kg == nil {
		return "no carbon-intensity source"
	}
	return strconv.FormatFloat(*kg, 'f', 3, 64) + " kgCO2e"
}

func kWh(joules float64) string {
	return strconv.FormatFloat(joules/3.6e6, 'f', 3, 64) + " kWh"
}

func uintList(v []uint32) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(int(x))
	}
	return dash(strings.Join(s, ","))
}

func rankList(rs []JobRankJSON) string {
	s := make([]int, len(rs))
	for i, r := range rs {
		s[i] = int(r.Rank)
	}
	sort.Ints(s)
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = strconv.Itoa(x)
	}
	return dash(strings.Join(out, ","))
}

// TypeText is the GPU model a job allowing several got, and why (the
// reason starts with the model).
func TypeText(j *api.Job) string {
	switch {
	case j.GetGpuType() == "":
		return "not chosen yet (chosen when it starts)"
	case j.GetGpuTypeReason() == "":
		return j.GetGpuType()
	}
	return j.GetGpuTypeReason()
}

// typePlansText lists a job's plan on each model it allows.
func typePlansText(ts []TypePlanJSON) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.GPUModel + " " + planText(t.Plan)
		if t.Plan.StepSeconds != nil {
			parts[i] += fmt.Sprintf(" %.3f s/step", *t.Plan.StepSeconds)
		}
	}
	return strings.Join(parts, "; ")
}

// ParseGPUName reads NODE/INDEX or NODE:INDEX; ok is false for anything
// else (a UUID).
func ParseGPUName(s string) (node string, index int, ok bool) {
	i := strings.LastIndexAny(s, "/:")
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 0 {
		return "", 0, false
	}
	return s[:i], n, true
}
