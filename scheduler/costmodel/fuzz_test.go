package costmodel

import (
	"encoding/json"
	"testing"
)

// FuzzTunablesJSON checks the tunables decoder: anything it accepts
// writes back and reads back the same.
func FuzzTunablesJSON(f *testing.F) {
	data, _ := json.Marshal(DefaultTunables())
	f.Add(data)
	f.Add([]byte(`{"mtbf_seconds": "3h", "reserved_bytes": "3GiB", "checkpoint_write_bytes_per_second": "2TB/s"}`))
	f.Add([]byte(`{"dp_overlap": 2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tu := DefaultTunables()
		if err := json.Unmarshal(data, &tu); err != nil {
			return
		}
		out, err := json.Marshal(tu)
		if err != nil {
			t.Fatalf("accepted tunables do not marshal: %v", err)
		}
		back := DefaultTunables()
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("re-read %s: %v", out, err)
		}
		again, _ := json.Marshal(back)
		if string(again) != string(out) {
			t.Fatalf("round trip changed the tunables:\n%s\n%s", out, again)
		}
	})
}

// FuzzSet checks the unit-aware value parsers behind --set: no value
// panics, and a value accepted for a byte count, rate or duration is not
// negative.
func FuzzSet(f *testing.F) {
	for _, s := range [][2]string{{"hbm_bytes", "80GiB"}, {"net_bytes_per_second", "50GB/s"}, {"checkpoint_interval_seconds", "30m"},
		{"mtbf_seconds", "1e300"}, {"reserved_bytes", "-1"}, {"nvlink_gbps", "NaN"}, {"gpus_per_node", "0"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		hw, _ := LookupHardware("h100")
		if err := hw.Set(key, value); err == nil && (hw.HBMBytes < 0 || hw.NetBytesPerSec < 0 || hw.NVLinkBytesPerSec < 0 || hw.GPUsPerNode <= 0) {
			t.Fatalf("Set(%q, %q) left %+v", key, value, hw)
		}
		tu := DefaultTunables()
		if err := tu.Set(key, value); err == nil && (tu.ReservedBytes < 0 || tu.CheckpointInterval < 0 || tu.MTBF < 0 || tu.CheckpointWriteBytesPerSec < 0) {
			t.Fatalf("Set(%q, %q) left %+v", key, value, tu)
		}
	})
}
