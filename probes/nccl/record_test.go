//go:build linux && amd64

package nccl

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

func encode(t testing.TB, c ncclNcclCall) []byte {
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, c); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeCall(t *testing.T) {
	c := ncclNcclCall{StartNs: 10, EndNs: 25, Count: 1024, Comm: 0xdead, Seq: 3, Pid: 7, Tid: 8,
		Op: uint32(api.NCCLOp_NCCL_OP_ALL_REDUCE), Datatype: 7, Peer: -1, CommNranks: 4, CommRank: 1}
	raw := encode(t, c)
	for _, tc := range []struct {
		name string
		raw  []byte
		err  bool
	}{
		{"exact", raw, false},
		{"padded by the ring buffer", append(append([]byte{}, raw...), 0, 0, 0, 0, 0, 0, 0, 0), false},
		{"short", raw[:len(raw)-1], true},
		{"empty", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCall(tc.raw)
			if (err != nil) != tc.err {
				t.Fatalf("decodeCall error = %v, want error %v", err, tc.err)
			}
			if !tc.err && got != c {
				t.Errorf("decodeCall = %+v, want %+v", got, c)
			}
		})
	}
}

func TestRecord(t *testing.T) {
	const off = 1_000_000_000
	for _, tc := range []struct {
		name string
		call ncclNcclCall
		now  uint64
		want *api.CollectiveRecord
	}{
		{
			name: "all-reduce float32",
			call: ncclNcclCall{StartNs: 100, EndNs: 350, Count: 1000, Datatype: 7, Comm: 5, Seq: 2, Pid: 1, Tid: 2, Op: 1, Peer: -1, CommNranks: 2, CommRank: 1},
			want: &api.CollectiveRecord{StartUnixNano: off + 100, DurationNs: 250, Pid: 1, Tid: 2, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE,
				Count: 1000, Datatype: 7, Bytes: 4000, Comm: 5, Seq: 2, Peer: -1, Rank: -1, CommNranks: 2, CommRank: 1},
		},
		{
			name: "send bfloat16 to peer 3",
			call: ncclNcclCall{StartNs: 1, EndNs: 2, Count: 10, Datatype: 9, Op: 6, Peer: 3, Seq: 1, CommRank: -1},
			want: &api.CollectiveRecord{StartUnixNano: off + 1, DurationNs: 1, Op: api.NCCLOp_NCCL_OP_SEND,
				Count: 10, Datatype: 9, Bytes: 20, Peer: 3, Seq: 1, Rank: -1, CommRank: -1},
		},
		{
			name: "group start has no datatype or bytes",
			call: ncclNcclCall{StartNs: 5, EndNs: 9, Op: 8, Datatype: -1, Peer: -1, CommRank: -1},
			want: &api.CollectiveRecord{StartUnixNano: off + 5, DurationNs: 4, Op: api.NCCLOp_NCCL_OP_GROUP_START,
				Datatype: -1, Peer: -1, Rank: -1, CommRank: -1},
		},
		{
			name: "unknown datatype counts no bytes",
			call: ncclNcclCall{StartNs: 5, EndNs: 9, Op: 2, Count: 8, Datatype: 42, Peer: -1},
			want: &api.CollectiveRecord{StartUnixNano: off + 5, DurationNs: 4, Op: api.NCCLOp_NCCL_OP_ALL_GATHER,
				Count: 8, Datatype: 42, Peer: -1, Rank: -1},
		},
		{
			name: "in flight",
			call: ncclNcclCall{StartNs: 100, Op: 1, Count: 4, Datatype: 4, Peer: -1, Seq: 9},
			now:  600,
			want: &api.CollectiveRecord{StartUnixNano: off + 100, DurationNs: 500, InProgress: true, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE,
				Count: 4, Datatype: 4, Bytes: 32, Peer: -1, Seq: 9, Rank: -1},
		},
		{
			name: "completion carries the work's span",
			call: ncclNcclCall{StartNs: 100, EndNs: 900, Op: 1, Count: 4, Datatype: 7, Comm: 5, Seq: 3, Peer: -1, CommNranks: 2, CommRank: 1, Done: 1, GpuStartNs: 300, GpuEndNs: 800},
			want: &api.CollectiveRecord{StartUnixNano: off + 100, DurationNs: 500, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Count: 4, Datatype: 7, Bytes: 16,
				Comm: 5, Seq: 3, Peer: -1, Rank: -1, CommNranks: 2, CommRank: 1, Completion: true, GpuStartUnixNano: off + 300, GpuEndUnixNano: off + 800},
		},
		{
			name: "completion with a span backwards keeps no times",
			call: ncclNcclCall{StartNs: 100, EndNs: 900, Op: 1, Seq: 3, Datatype: -1, Peer: -1, Done: 1, GpuStartNs: 800, GpuEndNs: 300},
			want: &api.CollectiveRecord{StartUnixNano: off + 100, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Datatype: -1, Seq: 3, Peer: -1, Rank: -1, Completion: true},
		},
		{
			name: "comm init reports the communicator's shape",
			call: ncclNcclCall{StartNs: 1, EndNs: 11, Op: 10, Comm: 77, Datatype: -1, Peer: -1, CommNranks: 8, CommRank: 5, Result: 2},
			want: &api.CollectiveRecord{StartUnixNano: off + 1, DurationNs: 10, Op: api.NCCLOp_NCCL_OP_COMM_INIT_RANK,
				Comm: 77, Datatype: -1, Peer: -1, Rank: -1, CommNranks: 8, CommRank: 5, Result: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.call.record(off, tc.now)
			if got.String() != tc.want.String() {
				t.Errorf("record =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

// FuzzDecodeCall feeds arbitrary ring-buffer bytes through the decoder and
// the conversion to the wire form.
func FuzzDecodeCall(f *testing.F) {
	f.Add(encode(f, ncclNcclCall{StartNs: 1, EndNs: 2, Op: 1, Count: 3, Datatype: 7}))
	f.Add(encode(f, ncclNcclCall{StartNs: 9, Op: 10, CommNranks: -1}))
	f.Add(encode(f, ncclNcclCall{StartNs: 1, EndNs: 5, Op: 1, Seq: 1, Done: 1, GpuStartNs: 2, GpuEndNs: 4}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := decodeCall(raw)
		if err != nil {
			if len(raw) >= callSize {
				t.Fatalf("decodeCall of %d bytes failed: %v", len(raw), err)
			}
			return
		}
		if !bytes.Equal(encode(t, c), raw[:callSize]) {
			t.Fatal("decoded record does not encode back to its bytes")
		}
		r := c.record(0, c.StartNs+1)
		if r.Completion && r.GpuEndUnixNano < r.GpuStartUnixNano {
			t.Fatalf("completion ends before it starts: %v", r)
		}
		if r.DurationNs < 0 {
			t.Fatalf("negative duration %d from %+v", r.DurationNs, c)
		}
	})
}
