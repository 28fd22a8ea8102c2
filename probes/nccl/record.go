//go:build linux && amd64

package nccl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gpuctl/gpuctl/api"
)

// callSize is the size of one ring-buffer record, struct nccl_call in bpf/nccl.c.
var callSize = binary.Size(ncclNcclCall{})

// decodeCall decodes one ring-buffer record. The kernel may pad a record
// to 8 bytes, so trailing bytes are allowed; a short one is an error.
func decodeCall(raw []byte) (ncclNcclCall, error) {
	var c ncclNcclCall
	if len(raw) < callSize {
		return c, fmt.Errorf("nccl record is %d bytes, want %d: the loaded object and this binary disagree", len(raw), callSize)
	}
	if err := binary.Read(bytes.NewReader(raw[:callSize]), binary.NativeEndian, &c); err != nil {
		return c, fmt.Errorf("decode nccl record: %w", err)
	}
	return c, nil
}

// record turns a traced call into the wire form. bootOffset is unix time
// minus CLOCK_MONOTONIC, in ns; nowMono is the monotonic time used for the
// duration of a call still in flight.
func (c *ncclNcclCall) record(bootOffset int64, nowMono uint64) *api.CollectiveRecord {
	r := &api.CollectiveRecord{
		StartUnixNano: int64(c.StartNs) + bootOffset,
		Pid:           c.Pid,
		Tid:           c.Tid,
		Op:            api.NCCLOp(c.Op),
		Comm:          c.Comm,
		Seq:           c.Seq,
		Peer:          c.Peer,
		Result:        c.Result,
		CommNranks:    c.CommNranks,
		CommRank:      c.CommRank,
		Datatype:      -1,
		Rank:          -1,
	}
	switch r.Op {
	case api.NCCLOp_NCCL_OP_ALL_REDUCE, api.NCCLOp_NCCL_OP_ALL_GATHER, api.NCCLOp_NCCL_OP_REDUCE_SCATTER,
		api.NCCLOp_NCCL_OP_BROADCAST, api.NCCLOp_NCCL_OP_REDUCE, api.NCCLOp_NCCL_OP_SEND, api.NCCLOp_NCCL_OP_RECV:
		r.Count = c.Count
		r.Datatype = c.Datatype
		r.Bytes = c.Count * DatatypeSize(c.Datatype)
	}
	if c.Done != 0 {
		// The work's own span; the call's entry stays in StartUnixNano.
		r.Completion = true
		// A monotonic clock past 2^62 ns (146 years up) is a corrupt
		// record, and would overflow in unix time.
		if c.GpuStartNs != 0 && c.GpuEndNs >= c.GpuStartNs && c.GpuEndNs < 1<<62 {
			r.GpuStartUnixNano = int64(c.GpuStartNs) + bootOffset
			r.GpuEndUnixNano = int64(c.GpuEndNs) + bootOffset
			r.DurationNs = nanos(c.GpuEndNs - c.GpuStartNs)
		}
		return r
	}
	switch {
	case c.EndNs >= c.StartNs && c.EndNs != 0:
		r.DurationNs = nanos(c.EndNs - c.StartNs)
	case c.EndNs == 0 && nowMono > c.StartNs:
		r.InProgress = true
		r.DurationNs = nanos(nowMono - c.StartNs)
	case c.EndNs == 0:
		r.InProgress = true
	}
	return r
}

// nanos converts a kernel duration, saturating rather than going negative
// on a corrupt record.
func nanos(d uint64) int64 {
	if d > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(d)
}
