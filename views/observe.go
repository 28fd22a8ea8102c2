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

// ObservedJSON is one line of `gpuctl observe -o json`: a traced NCCL call
// (type "collective"), a network flow sample (type "flow"), or a report of
// records lost since the previous one (type "lost").
type ObservedJSON struct {
	Type         string    `json:"type"`
	Time         time.Time `json:"time"`
	Node         string    `json:"node,omitempty"`
	PID          uint32    `json:"pid,omitempty"`
	Job          string    `json:"job,omitempty"`
	Rank         *int32    `json:"rank,omitempty"`
	Op           string    `json:"op,omitempty"`
	Comm         string    `json:"comm,omitempty"`
	Seq          uint64    `json:"seq,omitempty"`
	Count        uint64    `json:"count,omitempty"`
	Datatype     *int32    `json:"datatype,omitempty"`
	Bytes        uint64    `json:"bytes,omitempty"`
	DurationNs   int64     `json:"duration_ns,omitempty"`
	Peer         *int32    `json:"peer,omitempty"`
	Result       int32     `json:"result,omitempty"`
	Local        string    `json:"local,omitempty"`
	Remote       string    `json:"remote,omitempty"`
	Protocol     string    `json:"protocol,omitempty"`
	TxBytes      uint64    `json:"tx_bytes,omitempty"`
	RxBytes      uint64    `json:"rx_bytes,omitempty"`
	Retransmits  uint64    `json:"retransmits,omitempty"`
	LostByServer uint64    `json:"lost_by_server,omitempty"`
	LostAtNodes  uint64    `json:"lost_at_nodes,omitempty"`
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
		return json.NewEncoder(o.w).Encode(ObservedJSON{Type: "lost", Time: time.Now().UTC(), LostByServer: byServer, LostAtNodes: atNodes})
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
	ts := v.Time.Local().Format("15:04:05.000000")
	var err error
	switch v.Type {
	case "collective":
		peer := ""
		if v.Peer != nil && *v.Peer >= 0 {
			peer = fmt.Sprintf(" peer=%d", *v.Peer)
		}
		_, err = fmt.Fprintf(o.w, "%s %s %s rank=%d pid=%d %-13s comm=%s seq=%d bytes=%s%s %s\n",
			ts, v.Node, dash(v.Job), *v.Rank, v.PID, v.Op, v.Comm, v.Seq, Bytes(v.Bytes), peer, fmtDuration(time.Duration(v.DurationNs)))
	case "flow":
		_, err = fmt.Fprintf(o.w, "%s %s %s pid=%d %s %s -> %s tx=%s rx=%s retrans=%d\n",
			ts, v.Node, dash(v.Job), v.PID, v.Protocol, v.Local, v.Remote, Bytes(v.TxBytes), Bytes(v.RxBytes), v.Retransmits)
	}
	return err
}

// ObservedFromAPI converts an observed item to its JSON view.
func ObservedFromAPI(it *api.ObserveItem) ObservedJSON {
	if c := it.GetCollective(); c != nil {
		rank, dt, peer := c.GetRank(), c.GetDatatype(), c.GetPeer()
		return ObservedJSON{
			Type: "collective", Time: timeOf(c.GetStartUnixNano()), Node: it.GetNode(), PID: c.GetPid(), Job: c.GetJob(),
			Rank: &rank, Op: c.GetOp().Short(), Comm: fmt.Sprintf("%#x", c.GetComm()), Seq: c.GetSeq(), Count: c.GetCount(),
			Datatype: &dt, Bytes: c.GetBytes(), DurationNs: c.GetDurationNs(), Peer: &peer, Result: c.GetResult(),
		}
	}
	f := it.GetFlow()
	rank := f.GetRank()
	return ObservedJSON{
		Type: "flow", Time: timeOf(f.GetTimeUnixNano()), Node: it.GetNode(), PID: f.GetPid(), Job: f.GetJob(), Rank: &rank,
		Local: f.GetLocalAddr(), Remote: f.GetRemoteAddr(), Protocol: f.GetProtocol(), TxBytes: f.GetTxBytes(),
		RxBytes: f.GetRxBytes(), Retransmits: f.GetRetransmits(),
	}
}
