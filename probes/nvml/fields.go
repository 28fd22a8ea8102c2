package nvml

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// putU64 stores n the way NVML fills FieldValue.Value (host byte order;
// every platform nodemon runs on is little-endian).
func putU64(b []byte, n uint64) { binary.LittleEndian.PutUint64(b, n) }

// fieldUint decodes an NVML field value as an unsigned integer. ok is false
// when NVML did not return the field or its type is not a count.
func fieldUint(v *nvml.FieldValue) (n uint64, ok bool) {
	if nvml.Return(v.NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	b := v.Value[:]
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG:
		return binary.LittleEndian.Uint64(b), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(b)), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		if s := int64(binary.LittleEndian.Uint64(b)); s >= 0 {
			return uint64(s), true
		}
	case nvml.VALUE_TYPE_SIGNED_INT:
		if s := int32(binary.LittleEndian.Uint32(b)); s >= 0 {
			return uint64(s), true
		}
	case nvml.VALUE_TYPE_DOUBLE:
		f := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if f >= 0 && f < math.MaxUint64 {
			return uint64(f), true
		}
	}
	return 0, false
}

// busAddr is a PCI address.
type busAddr struct {
	domain, bus, device, function uint32
}

// parseBusID parses a PCI address in any of the forms NVML and sysfs use:
// "00000000:1B:00.0", "0000:1b:00.0", "1b:00.0".
func parseBusID(s string) (busAddr, error) {
	var a busAddr
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return a, fmt.Errorf("PCI address %q: want domain:bus:device.function", s)
	}
	devFn := strings.SplitN(parts[2], ".", 2)
	if len(devFn) != 2 {
		return a, fmt.Errorf("PCI address %q: no '.' before the function", s)
	}
	fields := []struct {
		s    string
		dst  *uint32
		bits int
		what string
	}{
		{parts[0], &a.domain, 32, "domain"},
		{parts[1], &a.bus, 8, "bus"},
		{devFn[0], &a.device, 5, "device"},
		{devFn[1], &a.function, 3, "function"},
	}
	for _, f := range fields {
		if f.s == "" || len(f.s) > 8 {
			return a, fmt.Errorf("PCI address %q: %s %q is not 1-8 hex digits", s, f.what, f.s)
		}
		v, err := strconv.ParseUint(f.s, 16, f.bits)
		if err != nil {
			return a, fmt.Errorf("PCI address %q: %s %q out of range", s, f.what, f.s)
		}
		*f.dst = uint32(v)
	}
	return a, nil
}

// String formats the address as sysfs does: "0000:1b:00.0".
func (a busAddr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.device, a.function)
}

// normalizeBusID returns the sysfs form of a PCI address, or s trimmed and
// lower-cased if it does not parse.
func normalizeBusID(s string) string {
	a, err := parseBusID(s)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(s))
	}
	return a.String()
}

// cString turns a NUL-terminated C char array into a string.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// cudaVersion formats NVML's CUDA driver version (e.g. 12040) as "12.4".
func cudaVersion(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}
