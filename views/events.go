package views

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// EventJSON is one event in `gpuctl events -o json`.
type EventJSON struct {
	Time     time.Time         `json:"time"`
	Node     string            `json:"node"`
	Seq      uint64            `json:"seq,omitempty"`
	Kind     string            `json:"kind"`
	Severity string            `json:"severity"`
	Message  string            `json:"message"`
	GPU      *int32            `json:"gpu,omitempty"`
	GPUUUID  string            `json:"gpu_uuid,omitempty"`
	XID      uint32            `json:"xid,omitempty"`
	XIDClass string            `json:"xid_class,omitempty"`
	Count    uint32            `json:"count,omitempty"`
	PID      uint32            `json:"pid,omitempty"`
	Job      string            `json:"job,omitempty"`
	Rank     *int32            `json:"rank,omitempty"`
	ExitCode *int32            `json:"exit_code,omitempty"`
	Signal   string            `json:"signal,omitempty"`
	Attrs    map[string]string `json:"attrs,omitempty"`
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
		Time: timeOf(e.GetTimeUnixNano()), Node: e.GetNode(), Seq: e.GetSeq(), Kind: e.GetKind().Short(),
		Severity: e.GetSeverity().Short(), Message: e.GetMessage(), GPUUUID: e.GetGpuUuid(), XID: e.GetXid(),
		Count: e.GetCount(), PID: e.GetPid(), Job: e.GetJob(), Signal: e.GetSignal(), Attrs: e.GetAttrs(),
	}
	if isGPUEvent(e.GetKind()) {
		g := e.GetGpuIndex()
		out.GPU = &g
	}
	if e.GetXid() != 0 {
		out.XIDClass = e.GetXidClass().Short()
	}
	if e.GetJob() != "" {
		r := e.GetRank()
		out.Rank = &r
	}
	if e.GetKind() == api.EventKind_EVENT_KIND_PROCESS_EXIT {
		c := e.GetExitCode()
		out.ExitCode = &c
	}
	return out
}

// Events writes events, oldest first.
func Events(w io.Writer, f Format, events []*api.Event) error {
	if f == JSON {
		doc := struct {
			Events []EventJSON `json:"events"`
		}{Events: []EventJSON{}}
		for _, e := range events {
			doc.Events = append(doc.Events, EventFromAPI(e))
		}
		return writeJSON(w, doc)
	}
	header := []string{"TIME", "NODE", "KIND", "SEVERITY", "GPU", "MESSAGE"}
	if f == Wide {
		header = append(header, "XID", "CLASS", "JOB", "RANK", "PID")
	}
	var rows [][]string
	for _, e := range events {
		v := EventFromAPI(e)
		gpu := "-"
		if v.GPU != nil {
			gpu = strconv.Itoa(int(*v.GPU))
		}
		row := []string{v.Time.Format("2006-01-02T15:04:05.000Z"), v.Node, v.Kind, v.Severity, gpu, v.Message}
		if f == Wide {
			xid, rank, pid := "-", "-", "-"
			if v.XID != 0 {
				xid = strconv.Itoa(int(v.XID))
			}
			if v.Rank != nil {
				rank = strconv.Itoa(int(*v.Rank))
			}
			if v.PID != 0 {
				pid = strconv.Itoa(int(v.PID))
			}
			row = append(row, xid, dash(v.XIDClass), dash(v.Job), rank, pid)
		}
		rows = append(rows, row)
	}
	return table(w, header, rows)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// CollectiveJSON is one (rank, communicator, op) aggregate in
// `gpuctl collectives -o json`.
type CollectiveJSON struct {
	Node          string    `json:"node"`
	PID           uint32    `json:"pid"`
	Job           string    `json:"job,omitempty"`
	Rank          int32     `json:"rank"`
	Op            string    `json:"op"`
	Comm          string    `json:"comm"`
	Seq           uint64    `json:"seq"`
	Bytes         uint64    `json:"bytes"`
	Calls         uint64    `json:"calls"`
	InCallSeconds float64   `json:"in_call_seconds"`
	Last          time.Time `json:"last"`
}

// CollectiveFromAPI converts an aggregate to its JSON view.
func CollectiveFromAPI(c *api.CollectiveStat) CollectiveJSON {
	return CollectiveJSON{
		Node: c.GetNode(), PID: c.GetPid(), Job: c.GetJob(), Rank: c.GetRank(), Op: c.GetOp().Short(),
		Comm: fmt.Sprintf("%#x", c.GetComm()), Seq: c.GetSeq(), Bytes: c.GetBytes(), Calls: c.GetCalls(),
		InCallSeconds: c.GetInCallSeconds(), Last: timeOf(c.GetLastUnixNano()),
	}
}

// Collectives writes per-rank NCCL call aggregates.
func Collectives(w io.Writer, f Format, cs []*api.CollectiveStat, now time.Time) error {
	if f == JSON {
		doc := struct {
			Collectives []CollectiveJSON `json:"collectives"`
		}{Collectives: []CollectiveJSON{}}
		for _, c := range cs {
			doc.Collectives = append(doc.Collectives, CollectiveFromAPI(c))
		}
		return writeJSON(w, doc)
	}
	header := []string{"NODE", "JOB", "RANK", "PID", "COMM", "OP", "SEQ", "CALLS", "BYTES", "IN CALL", "AVG", "LAST"}
	var rows [][]string
	for _, c := range cs {
		v := CollectiveFromAPI(c)
		avg := "-"
		if v.Calls > 0 {
			avg = fmtDuration(time.Duration(v.InCallSeconds / float64(v.Calls) * 1e9))
		}
		row := []string{v.Node, dash(v.Job), strconv.Itoa(int(v.Rank)), strconv.Itoa(int(v.PID)), v.Comm, v.Op,
			strconv.FormatUint(v.Seq, 10), strconv.FormatUint(v.Calls, 10), Bytes(v.Bytes),
			fmtDuration(time.Duration(v.InCallSeconds * 1e9)), avg, age(now, v.Last)}
		rows = append(rows, row)
	}
	return table(w, header, rows)
}

func fmtDuration(d time.Duration) string {
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
