package nvml

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestParseBusID(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"00000000:1B:00.0", "0000:1b:00.0", false},
		{"0000:1b:00.0", "0000:1b:00.0", false},
		{"1b:00.0", "0000:1b:00.0", false},
		{" 00000001:C4:1f.7 ", "0001:c4:1f.7", false},
		{"0000:1b:00", "", true},
		{"0000:1b:20.0", "", true}, // device is 5 bits
		{"0000:1b:00.8", "", true}, // function is 3 bits
		{"0000:100:00.0", "", true},
		{"zz:00.0", "", true},
		{"", "", true},
		{"0:0:0:0.0", "", true},
	}
	for _, tc := range tests {
		a, err := parseBusID(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseBusID(%q): err %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && a.String() != tc.want {
			t.Errorf("parseBusID(%q) = %s, want %s", tc.in, a, tc.want)
		}
	}
	if got := normalizeBusID("Not-A-Bus"); got != "not-a-bus" {
		t.Errorf("normalizeBusID of garbage = %q", got)
	}
}

func FuzzParseBusID(f *testing.F) {
	for _, s := range []string{"00000000:1B:00.0", "1b:00.0", "0:0:0.0", "::.", "ffffffff:ff:1f.7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseBusID(s)
		if err != nil {
			return
		}
		// A parsed address round-trips through its sysfs form.
		b, err := parseBusID(a.String())
		if err != nil || b != a {
			t.Fatalf("%q -> %s -> %+v, %v", s, a, b, err)
		}
	})
}

func fv(typ nvml.ValueType, ret nvml.Return, raw uint64) nvml.FieldValue {
	v := nvml.FieldValue{ValueType: uint32(typ), NvmlReturn: uint32(ret)}
	binary.LittleEndian.PutUint64(v.Value[:], raw)
	return v
}

func TestFieldUint(t *testing.T) {
	tests := []struct {
		name string
		v    nvml.FieldValue
		want uint64
		ok   bool
	}{
		{"ull", fv(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.SUCCESS, 1<<40), 1 << 40, true},
		{"ul", fv(nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.SUCCESS, 7), 7, true},
		{"uint ignores high bytes", fv(nvml.VALUE_TYPE_UNSIGNED_INT, nvml.SUCCESS, 1<<40|5), 5, true},
		{"ushort", fv(nvml.VALUE_TYPE_UNSIGNED_SHORT, nvml.SUCCESS, 1<<20|9), 9, true},
		{"sll", fv(nvml.VALUE_TYPE_SIGNED_LONG_LONG, nvml.SUCCESS, 12), 12, true},
		{"negative sll", fv(nvml.VALUE_TYPE_SIGNED_LONG_LONG, nvml.SUCCESS, math.MaxUint64), 0, false},
		{"sint", fv(nvml.VALUE_TYPE_SIGNED_INT, nvml.SUCCESS, 3), 3, true},
		{"negative sint", fv(nvml.VALUE_TYPE_SIGNED_INT, nvml.SUCCESS, 0xffffffff), 0, false},
		{"double", fv(nvml.VALUE_TYPE_DOUBLE, nvml.SUCCESS, math.Float64bits(42.9)), 42, true},
		{"nan", fv(nvml.VALUE_TYPE_DOUBLE, nvml.SUCCESS, math.Float64bits(math.NaN())), 0, false},
		{"not supported", fv(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.ERROR_NOT_SUPPORTED, 5), 0, false},
		{"unknown type", fv(nvml.VALUE_TYPE_COUNT, nvml.SUCCESS, 5), 0, false},
	}
	for _, tc := range tests {
		got, ok := fieldUint(&tc.v)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: fieldUint = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzFieldUint(f *testing.F) {
	f.Add(uint32(3), uint32(0), uint64(1))
	f.Add(uint32(0), uint32(0), math.Float64bits(-1))
	f.Add(uint32(4), uint32(3), uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, typ, ret uint32, raw uint64) {
		v := nvml.FieldValue{ValueType: typ, NvmlReturn: ret}
		binary.LittleEndian.PutUint64(v.Value[:], raw)
		n, ok := fieldUint(&v)
		if !ok && n != 0 {
			t.Fatalf("not ok but value %d", n)
		}
		if ok && nvml.Return(ret) != nvml.SUCCESS {
			t.Fatalf("ok for return %d", ret)
		}
	})
}

func TestCudaVersion(t *testing.T) {
	for in, want := range map[int]string{12040: "12.4", 11080: "11.8", 12090: "12.9", 0: ""} {
		if got := cudaVersion(in); got != want {
			t.Errorf("cudaVersion(%d) = %q, want %q", in, got, want)
		}
	}
}
