package nvml

import (
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// Real NVML where the library loads; otherwise Open must say so in a way
// callers can test for. GPUCTL_REQUIRE_NVML=1 (set on GPU machines) turns a
// missing library into a failure, so a skip cannot hide a broken driver.
func TestOpen(t *testing.T) {
	lib, err := Open()
	if err != nil {
		if needs.NVML.Required() {
			t.Fatalf("%s=1 but Open failed: %v", needs.NVML, err)
		}
		if !errors.Is(err, ErrNoNVML) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
			t.Fatalf("Open without a driver: %v; want ErrNoNVML wrapping ERROR_LIBRARY_NOT_FOUND", err)
		}
		return
	}
	t.Cleanup(func() { lib.Shutdown() })
	s := NewSampler(lib, testLogger(t))
	gpus, driver, cuda, err := s.Inventory()
	if err != nil || len(gpus) == 0 || driver == "" || cuda == "" {
		t.Fatalf("real NVML inventory: %d GPUs, driver %q, CUDA %q, err %v", len(gpus), driver, cuda, err)
	}
	for _, g := range gpus {
		t.Logf("GPU %d %s %s %d MiB bus %s, %d NVLinks, limit %d mW", g.Index, g.Model, g.Uuid, g.MemTotalBytes>>20, g.PciBusId, len(g.NvlinkPeers), g.PowerLimitMw)
	}
	if _, err := s.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sample(time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		if g.Lost || g.PowerMw == 0 || g.TempC == 0 || g.SmClockMhz == 0 {
			t.Errorf("real GPU sample incomplete: %v", g)
		}
		t.Logf("sample: %v", g)
	}
}
