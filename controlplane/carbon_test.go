package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler"
)

func TestCarbonPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.carbon")
	bad := filepath.Join(dir, "bad.carbon")
	for path, text := range map[string]string{good: "site=eu" + strings.Repeat(" 100", 24) + "\n", bad: "# curves\nsite=eu 1 2 3\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		cfg     Config
		name    string
		wantErr string
	}{
		{Config{}, "fifo", ""},
		{Config{CarbonIntensity: good}, "fifo", ""},
		{Config{CarbonIntensity: good, CarbonAware: true}, "fifo+carbon", ""},
		{Config{CarbonAware: true}, "", "--carbon-aware needs --carbon-intensity FILE"},
		{Config{CarbonIntensity: bad, CarbonAware: true}, "", "bad.carbon:2: site=eu has 3 values; give 24"},
		{Config{CarbonIntensity: filepath.Join(dir, "none")}, "", "--carbon-intensity: open"},
	} {
		p, err := carbonPolicy(tc.cfg, scheduler.FIFO{})
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: error %v; want %q", tc.cfg, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || p.Name() != tc.name):
			t.Errorf("%+v: %v, %v; want policy %s", tc.cfg, p, err, tc.name)
		}
	}
}
