package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := []*AgentMessage{
		{Body: &AgentMessage_Hello{Hello: &Hello{Version: CurrentVersion(), Role: "node"}}},
		{Body: &AgentMessage_Heartbeat{Heartbeat: &Heartbeat{Seq: 7}}},
		{Body: &AgentMessage_Telemetry{Telemetry: &Telemetry{Gpus: []*GPUSample{{Index: 3, PowerMw: 700000}}}}},
	}
	for _, m := range in {
		if err := WriteFrame(&buf, m); err != nil {
			t.Fatal(err)
		}
	}
	r := NewFrameReader(&buf)
	for i, want := range in {
		got := &AgentMessage{}
		if err := r.Read(got); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("frame %d = %v, want %v", i, got, want)
		}
	}
	if err := r.Read(&AgentMessage{}); !errors.Is(err, io.EOF) {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestFrameReaderRejectsBadInput(t *testing.T) {
	var full bytes.Buffer
	if err := WriteFrame(&full, &Heartbeat{Seq: 99, TimeUnixNano: 1}); err != nil {
		t.Fatal(err)
	}
	huge := binary.AppendUvarint(nil, MaxFrameSize+1)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"truncated body", full.Bytes()[:full.Len()-1], io.ErrUnexpectedEOF},
		{"oversized length", huge, ErrFrameTooLarge},
		{"garbage body", []byte{3, 0xff, 0xff, 0xff}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := NewFrameReader(bytes.NewReader(tc.in)).Read(&Heartbeat{})
			if err == nil {
				t.Fatal("bad input accepted")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCheckVersion(t *testing.T) {
	tests := []struct {
		name string
		v    *Version
		ok   bool
	}{
		{"same", CurrentVersion(), true},
		{"newer minor", &Version{Major: ProtocolMajor, Minor: ProtocolMinor + 3}, true},
		{"other major", &Version{Major: ProtocolMajor + 1}, false},
		{"missing", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckVersion(tc.v); (err == nil) != tc.ok {
				t.Fatalf("CheckVersion(%v) = %v", tc.v, err)
			}
		})
	}
}

func FuzzFrameReader(f *testing.F) {
	var seed bytes.Buffer
	WriteFrame(&seed, &AgentMessage{Body: &AgentMessage_Event{Event: &Event{Seq: 1, Xid: 79, Message: "fell off the bus"}}})
	f.Add(seed.Bytes())
	f.Add([]byte{0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewFrameReader(bytes.NewReader(b))
		for i := 0; i < 64; i++ {
			m := &AgentMessage{}
			if err := r.Read(m); err != nil {
				return
			}
			// Whatever decoded must encode again.
			var out bytes.Buffer
			if err := WriteFrame(&out, m); err != nil {
				t.Fatalf("re-encode decoded frame: %v", err)
			}
		}
	})
}

func TestParseNCCLOp(t *testing.T) {
	tests := []struct {
		in   string
		want NCCLOp
		ok   bool
	}{
		{"allreduce", NCCLOp_NCCL_OP_ALL_REDUCE, true},
		{"ncclAllReduce", NCCLOp_NCCL_OP_ALL_REDUCE, true},
		{"all_gather", NCCLOp_NCCL_OP_ALL_GATHER, true},
		{"Send", NCCLOp_NCCL_OP_SEND, true},
		{"alltoall", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseNCCLOp(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseNCCLOp(%q) = %v, %v", tc.in, got, err)
		}
		if tc.ok && got.Short() == "unknown" {
			t.Errorf("%v has no short name", got)
		}
	}
}
