package views

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// ObserveFormat is an output format of `gpuctl observe`.
type ObserveFormat string

// The formats of the observe stream.
const (
	Compact   ObserveFormat = "compact"
	JSONLines ObserveFormat = "json"
)

// ParseObserveFormat validates observe's -o value.
func ParseObserveFormat(s string) (ObserveFormat, error) {
	switch f := ObserveFormat(s); f {
	case Compact, JSONLines:
		return f, nil
	}
	return "", fmt.Errorf("unknown output format %q: use compact or json", s)
}

// CollectiveLineJSON is a line of type "collective" of `gpuctl observe
// -o json`: one traced NCCL call.
type CollectiveLineJSON struct {
	Type            string    `json:"type"`
	Time            time.Time `json:"time"`
	Node            string    `json:"node"`
	PID             uint32    `json:"pid"`
	Job             *string   `json:"job"`
	Rank            int32     `json:"rank"`
	Op              string    `json:"op"`
	Comm            string    `json:"comm"`
	Seq             uint64    `json:"seq"`
	Count           uint64    `json:"count"`
	Datatype        string    `json:"datatype"`
	Bytes           uint64    `json:"bytes"`
	DurationSeconds float64   `json:"duration_seconds"`
	// Peer is the peer rank of send/recv and the root of broadcast and
	// reduce; null for the others.
	Peer   *int32 `json:"peer"`
	Result string `json:"result"`
}

// FlowLineJSON is a line of type "flow": one socket flow's traffic over
// one sampling interval.
type FlowLineJSON struct {
	Type        string    `json:"type"`
	Time        time.Time `json:"time"`
	Node        string    `json:"node"`
	PID         uint32    `json:"pid"`
	Job         *string   `json:"job"`
	Rank        int32     `json:"rank"`
	LocalAddr   string    `json:"local_addr"`
	RemoteAddr  string    `json:"remote_addr"`
	Protocol    string    `json:"protocol"`
	TxBytes     uint64    `json:"tx_bytes"`
	RxBytes     uint64    `json:"rx_bytes"`
	Retransmits uint64    `json:"retransmits"`
}

// LostLineJSON is a line of type "lost": records missed since the
// observer started, because it fell behind and at the nodes.
type LostLineJSON struct {
	Type         string    `json:"type"`
	Time         time.Time `json:"time"`
	LostByServer uint64    `json:"lost_by_server"`
	LostAtNodes  uint64    `json:"lost_at_nodes"`
}

// ncclDatatypes are ncclDataType_t's names (nccl.h), lower case.
var ncclDatatypes = []string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
	"float8e4m3", "float8e5m2"}

// NCCLDatatype names an ncclDataType_t value.
func NCCLDatatype(v int32) string {
	if v >= 0 && int(v) < len(ncclDatatypes) {
		return ncclDatatypes[v]
	}
	return "unknown"
}

// ncclResults are ncclResult_t's names (nccl.h) in snake case.
var ncclResults = []string{"success", "unhandled_cuda_error", "system_error", "internal_error", "invalid_argument", "invalid_usage",
	"remote_error", "in_progress"}

// NCCLResult names an ncclResult_t value.
func NCCLResult(v int32) string {
	if v >= 0 && int(v) < len(ncclResults) {
		return ncclResults[v]
	}
	return "unknown"
}

// ObserveWriter prints observed items and, whenever the loss counters
// move, a line saying how many records were lost and where.
type ObserveWriter struct {
	w                         io.Writer
	f                         ObserveFormat
	lostByServer, lostAtNodes uint64
	baseServer, baseNodes     uint64
	started                   bool
}

// NewObserveWriter returns a writer in format f.
func NewObserveWriter(w io.Writer, f ObserveFormat) *ObserveWriter {
	return &ObserveWriter{w: w, f: f}
}

// Batch writes one batch from the server.
func (o *ObserveWriter) Batch(b *api.ObserveBatch) error {
	if !o.started {
		// Node losses before this observer started are history, not news.
		o.started = true
		o.baseNodes = b.GetLostAtNodes()
		o.lostAtNodes = b.GetLostAtNodes()
	}
	for _, it := range b.GetItems() {
		if err := o.item(it); err != nil {
			return err
		}
	}
	if b.GetLostByServer() != o.lostByServer || b.GetLostAtNodes() != o.lostAtNodes {
		o.lostByServer, o.lostAtNodes = b.GetLostByServer(), b.GetLostAtNodes()
		return o.lost()
	}
	return nil
}

// Lost returns records lost since this observer started: behind on the
// server, and at the nodes (eBPF ring buffer overflow).
func (o *ObserveWriter) Lost() (byServer, atNodes uint64) {
	return o.lostByServer - o.baseServer, o.lostAtNodes - o.baseNodes
}

func (o *ObserveWriter) lost() error {
	byServer, atNodes := o.Lost()
	if o.f == JSONLines {
		return json.NewEncoder(o.w).Encode(LostLineJSON{Type: "lost", Time: time.Now().UTC(), LostByServer: byServer, LostAtNodes: atNodes})
	}
	_, err := fmt.Fprintf(o.w, "# lost so far: %d records dropped because this observer fell behind, %d lost at nodes (eBPF ring buffer full)\n", byServer, atNodes)
	return err
}

// Summary writes the closing loss line of a finished stream.
func (o *ObserveWriter) Summary() error { return o.lost() }

func (o *ObserveWriter) item(it *api.ObserveItem) error {
	v := ObservedFromAPI(it)
	if o.f == JSONLines {
		return json.NewEncoder(o.w).Encode(v)
	}
	var err error
	switch v := v.(type) {
	case CollectiveLineJSON:
		peer := ""
		if v.Peer != nil {
			peer = fmt.Sprintf(" peer=%d", *v.Peer)
		}
		_, err = fmt.Fprintf(o.w, "%s %s %s rank=%d pid=%d %-13s comm=%s seq=%d bytes=%s%s %s\n",
			v.Time.Local().Format("15:04:05.000000"), api.EscapeText(v.Node), api.EscapeText(dash(deref(v.Job))), v.Rank, v.PID, v.Op, v.Comm, v.Seq,
			Bytes(v.Bytes), peer, latency(time.Duration(v.DurationSeconds*1e9)))
	case FlowLineJSON:
		_, err = fmt.Fprintf(o.w, "%s %s %s pid=%d %s %s -> %s tx=%s rx=%s retrans=%d\n",
			v.Time.Local().Format("15:04:05.000000"), api.EscapeText(v.Node), api.EscapeText(dash(deref(v.Job))), v.PID, api.EscapeText(v.Protocol),
			api.EscapeText(v.LocalAddr), api.EscapeText(v.RemoteAddr), Bytes(v.TxBytes), Bytes(v.RxBytes), v.Retransmits)
	}
	return err
}

// ObservedFromAPI converts an observed item to its JSON line: a
// CollectiveLineJSON or a FlowLineJSON.
func ObservedFromAPI(it *api.ObserveItem) any {
	if c := it.GetCollective(); c != nil {
		out := CollectiveLineJSON{
			Type: "collective", Time: timeOf(c.GetStartUnixNano()), Node: it.GetNode(), PID: c.GetPid(), Job: optString(c.GetJob()),
			Rank: c.GetRank(), Op: c.GetOp().Short(), Comm: fmt.Sprintf("%#x", c.GetComm()), Seq: c.GetSeq(), Count: c.GetCount(),
			Datatype: NCCLDatatype(c.GetDatatype()), Bytes: c.GetBytes(), DurationSeconds: time.Duration(c.GetDurationNs()).Seconds(),
			Result: NCCLResult(c.GetResult()),
		}
		if c.GetPeer() >= 0 {
			out.Peer = ptr(c.GetPeer())
		}
		return out
	}
	f := it.GetFlow()
	return FlowLineJSON{
		Type: "flow", Time: timeOf(f.GetTimeUnixNano()), Node: it.GetNode(), PID: f.GetPid(), Job: optString(f.GetJob()), Rank: f.GetRank(),
		LocalAddr: f.GetLocalAddr(), RemoteAddr: f.GetRemoteAddr(), Protocol: f.GetProtocol(), TxBytes: f.GetTxBytes(),
		RxBytes: f.GetRxBytes(), Retransmits: f.GetRetransmits(),
	}
}
