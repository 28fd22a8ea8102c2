package views

import (
	"fmt"
	"io"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// EventJSON is one event in `gpuctl events -o json`.
type EventJSON struct {
	Time     *time.Time `json:"time"`
	Node     *string    `json:"node"`
	Seq      *uint64    `json:"seq"`
	Kind     string     `json:"kind"`
	Severity string     `json:"severity"`
	Message  string     `json:"message"`
	GPU      *int32     `json:"gpu"`
	GPUUUID  *string    `json:"gpu_uuid"`
	XID      *uint32    `json:"xid"`
	XIDClass *string    `json:"xid_class"`
	Count    *uint32    `json:"count"`
	PID      *uint32    `json:"pid"`
	Job      *string    `json:"job"`
	Rank     *int32     `json:"rank"`
	ExitCode *int32     `json:"exit_code"`
	Signal   *string    `json:"signal"`
	// Checkpoint events: the step saved and the bytes written; checkpoint
	// and recovery events: how long it took.
	Step            *int64            `json:"step"`
	Bytes           *uint64           `json:"bytes"`
	DurationSeconds *float64          `json:"duration_seconds"`
	Attrs           map[string]string `json:"attrs"`
}

func isGPUEvent(k api.EventKind) bool {
	switch k {
	case api.EventKind_EVENT_KIND_XID, api.EventKind_EVENT_KIND_ECC, api.EventKind_EVENT_KIND_THROTTLE, api.EventKind_EVENT_KIND_GPU_LOST:
		return true
	}
	return false
}

// EventFromAPI converts an event to its JSON view.
func EventFromAPI(e *api.Event) EventJSON {
	out := EventJSON{
		Time: optTime(e.GetTimeUnixNano()), Node: optString(e.GetNode()), Kind: e.GetKind().Short(),
		Severity: e.GetSeverity().Short(), Message: e.GetMessage(), GPUUUID: optString(e.GetGpuUuid()),
		Job: optString(e.GetJob()), Signal: optString(e.GetSignal()), Step: optInt64(e.GetStep()), Attrs: mapOrEmpty(e.GetAttrs()),
	}
	if e.GetSeq() != 0 {
		out.Seq = ptr(e.GetSeq())
	}
	if isGPUEvent(e.GetKind()) {
		out.GPU = ptr(e.GetGpuIndex())
	}
	if e.GetXid() != 0 {
		out.XID, out.XIDClass = ptr(e.GetXid()), ptr(e.GetXidClass().Short())
	}
	if e.GetCount() != 0 {
		out.Count = ptr(e.GetCount())
	}
	if e.GetPid() != 0 {
		out.PID = ptr(e.GetPid())
	}
	// A rank is named by process events; a job-level event (recovery,
	// stall) has none.
	if e.GetJob() != "" && (e.GetPid() != 0 || e.GetKind() == api.EventKind_EVENT_KIND_PROCESS_EXIT) {
		out.Rank = ptr(e.GetRank())
	}
	if e.GetKind() == api.EventKind_EVENT_KIND_PROCESS_EXIT {
		out.ExitCode = ptr(e.GetExitCode())
	}
	if e.GetBytes() != 0 {
		out.Bytes = ptr(e.GetBytes())
	}
	switch {
	case e.GetDurationSeconds() != 0:
		out.DurationSeconds = ptr(e.GetDurationSeconds())
	case e.GetSeconds() != 0:
		out.DurationSeconds = ptr(e.GetSeconds())
	}
	return out
}

// Events writes events, oldest first: the message last, so a long one
// never pushes the other columns off the screen.
func Events(w io.Writer, o Options, events []*api.Event) error {
	if o.Format == JSON {
		doc := struct {
			Events []EventJSON `json:"events"`
		}{Events: []EventJSON{}}
		for _, e := range events {
			doc.Events = append(doc.Events, EventFromAPI(e))
		}
		return writeJSON(w, doc)
	}
	wide := o.Format == Wide
	t := tableData{empty: "no events"}
	t.cols = []column{{name: "TIME"}, {name: "NODE"}, {name: "JOB"}, {name: "KIND"}, {name: "SEVERITY"}, {name: "GPU"}}
	if wide {
		t.cols = append(t.cols, column{name: "XID"}, column{name: "CLASS"}, column{name: "RANK"}, column{name: "PID"})
	}
	t.cols = append(t.cols, column{name: "MESSAGE", flex: true})
	format := "15:04:05Z"
	if wide || spansDays(events) {
		format = "2006-01-02T15:04:05.000Z"
	}
	for _, e := range events {
		v := EventFromAPI(e)
		tm := timeOrZero(v.Time)
		row := []cell{num(tm.Format(format), float64(tm.UnixNano())), txt(dash(deref(v.Node))), txt(dash(deref(v.Job))), txt(v.Kind),
			txt(v.Severity), optCell(v.GPU)}
		if wide {
			row = append(row, optCell(v.XID), txt(dash(deref(v.XIDClass))), optCell(v.Rank), optCell(v.PID))
		}
		t.add(append(row, txt(v.Message))...)
	}
	return o.writeTable(w, t)
}

// spansDays says whether events fall on more than one UTC day, when a
// table needs the date as well as the time.
func spansDays(events []*api.Event) bool {
	if len(events) == 0 {
		return false
	}
	first, last := timeOf(events[0].GetTimeUnixNano()), timeOf(events[len(events)-1].GetTimeUnixNano())
	return first.YearDay() != last.YearDay() || first.Year() != last.Year()
}

func optCell[T ~int32 | ~uint32](v *T) cell {
	if v == nil {
		return txt("-")
	}
	return count(*v)
}

// CollectiveJSON is one (rank, communicator, op) aggregate in
// `gpuctl collectives -o json`.
type CollectiveJSON struct {
	Node          string     `json:"node"`
	PID           uint32     `json:"pid"`
	Job           *string    `json:"job"`
	Rank          int32      `json:"rank"`
	Op            string     `json:"op"`
	Comm          string     `json:"comm"`
	Seq           uint64     `json:"seq"`
	Bytes         uint64     `json:"bytes"`
	Calls         uint64     `json:"calls"`
	InCallSeconds float64    `json:"in_call_seconds"`
	LastCallTime  *time.Time `json:"last_call_time"`
	// From gpuctl's NCCL profiler plugin: 0 without it, where the calls'
	// times (on a GPU, the enqueue) are all there is.
	Completions  uint64  `json:"completions"`
	GPUSeconds   float64 `json:"gpu_seconds"`
	CompletedSeq uint64  `json:"completed_seq"`
}

// CollectiveFromAPI converts an aggregate to its JSON view.
func CollectiveFromAPI(c *api.CollectiveStat) CollectiveJSON {
	return CollectiveJSON{
		Node: c.GetNode(), PID: c.GetPid(), Job: optString(c.GetJob()), Rank: c.GetRank(), Op: c.GetOp().Short(),
		Comm: fmt.Sprintf("%#x", c.GetComm()), Seq: c.GetSeq(), Bytes: c.GetBytes(), Calls: c.GetCalls(),
		InCallSeconds: c.GetInCallSeconds(), LastCallTime: optTime(c.GetLastUnixNano()),
		Completions: c.GetCompletions(), GPUSeconds: c.GetGpuSeconds(), CompletedSeq: c.GetCompletedSeq(),
	}
}

// Collectives writes per-rank NCCL call aggregates.
func Collectives(w io.Writer, o Options, cs []*api.CollectiveStat) error {
	if o.Format == JSON {
		doc := struct {
			Collectives []CollectiveJSON `json:"collectives"`
		}{Collectives: []CollectiveJSON{}}
		for _, c := range cs {
			doc.Collectives = append(doc.Collectives, CollectiveFromAPI(c))
		}
		return writeJSON(w, doc)
	}
	now := o.now()
	t := tableData{empty: "no collectives: no NCCL call traced (tracing needs nodemon's eBPF probes)"}
	// Below -o wide, what a narrow terminal leaves out first: the pid (the
	// node and rank name the process), then the totals that AVG sums up.
	// AVG is the time in the call (on a GPU, the enqueue); GPU AVG the
	// time the work took, from the profiler plugin, "-" without it.
	t.cols = []column{{name: "NODE"}, {name: "JOB"}, {name: "RANK"}, {name: "PID", drop: 6}, {name: "COMM"}, {name: "OP"}, {name: "SEQ"},
		{name: "CALLS", drop: 5}, {name: "BYTES", drop: 4}, {name: "IN CALL", drop: 3}, {name: "AVG", drop: 2}, {name: "GPU AVG", drop: 1},
		{name: "LAST"}}
	avg := func(seconds float64, n uint64) cell {
		if n == 0 {
			return cell{text: "-"}
		}
		a := seconds / float64(n)
		return num(latency(time.Duration(a*1e9)), a)
	}
	for _, c := range cs {
		v := CollectiveFromAPI(c)
		last := timeOrZero(v.LastCallTime)
		t.add(txt(v.Node), txt(dash(deref(v.Job))), count(v.Rank), count(v.PID), txt(v.Comm), txt(v.Op), count(v.Seq), count(v.Calls),
			num(Bytes(v.Bytes), float64(v.Bytes)), num(latency(time.Duration(v.InCallSeconds*1e9)), v.InCallSeconds),
			avg(v.InCallSeconds, v.Calls), avg(v.GPUSeconds, v.Completions), num(age(now, last), now.Sub(last).Seconds()))
	}
	return o.writeTable(w, t)
}

// latency renders a call's time to the precision calls differ by (ns to
// ms), where Duration, made for spans, would show 0.0s.
func latency(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fus", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
