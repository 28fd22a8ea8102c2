// Package rdma reads the port counters of the host's RDMA devices
// (InfiniBand and RoCE) from sysfs.
package rdma

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// SysfsRoot is where the kernel lists RDMA devices.
const SysfsRoot = "/sys/class/infiniband"

// Read returns one sample per port of every device under root (normally
// SysfsRoot), with the counters of ports/N/counters and ports/N/hw_counters
// keyed by file name; a hw_counters name that repeats one of counters gets
// the prefix "hw_". Counters are the raw values the driver reports:
// port_xmit_data and port_rcv_data count 4-byte words, as the InfiniBand
// specification defines them. A host without RDMA (no root) has no samples
// and no error; counters that cannot be read or parsed are skipped, since
// drivers expose files that refuse reads for unsupported counters.
func Read(root string, now time.Time) ([]*api.RDMAPortSample, error) {
	devs, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read rdma devices in %s: %w", root, err)
	}
	var out []*api.RDMAPortSample
	for _, d := range devs {
		portsDir := filepath.Join(root, d.Name(), "ports")
		ports, err := os.ReadDir(portsDir)
		if err != nil {
			continue // not a device directory, or it went away
		}
		for _, p := range ports {
			n, err := strconv.ParseUint(p.Name(), 10, 32)
			if err != nil {
				continue
			}
			s := &api.RDMAPortSample{
				TimeUnixNano: now.UnixNano(),
				Device:       d.Name(),
				Port:         uint32(n),
				Counters:     make(map[string]uint64),
			}
			readCounters(filepath.Join(portsDir, p.Name(), "counters"), "", s.Counters)
			readCounters(filepath.Join(portsDir, p.Name(), "hw_counters"), "hw_", s.Counters)
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Device != out[j].Device {
			return out[i].Device < out[j].Device
		}
		return out[i].Port < out[j].Port
	})
	return out, nil
}

// readCounters adds each counter file in dir to into; a name already
// present is stored with prefix.
func readCounters(dir, prefix string, into map[string]uint64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		v, err := ParseCounter(b)
		if err != nil {
			continue
		}
		name := e.Name()
		if _, dup := into[name]; dup {
			name = prefix + name
		}
		into[name] = v
	}
}

// ParseCounter parses the contents of one sysfs counter file: a decimal
// (or 0x-prefixed hexadecimal) unsigned integer and optional whitespace.
func ParseCounter(b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, errors.New("empty counter file")
	}
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("counter %q: %w", s, err)
		}
		return v, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counter %q: %w", s, err)
	}
	return v, nil
}
