package nvml

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		code  uint32
		class api.XIDClass
		sev   api.Severity
	}{
		{13, api.XIDClass_XID_CLASS_RESTART_APP, api.Severity_SEVERITY_WARNING},
		{31, api.XIDClass_XID_CLASS_RESTART_APP, api.Severity_SEVERITY_WARNING},
		{43, api.XIDClass_XID_CLASS_RESTART_APP, api.Severity_SEVERITY_WARNING},
		{45, api.XIDClass_XID_CLASS_RESTART_APP, api.Severity_SEVERITY_WARNING},
		{94, api.XIDClass_XID_CLASS_RESTART_APP, api.Severity_SEVERITY_WARNING},
		{48, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{63, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{64, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{95, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{119, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{120, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{140, api.XIDClass_XID_CLASS_RESET_GPU, api.Severity_SEVERITY_CRITICAL},
		{74, api.XIDClass_XID_CLASS_REBOOT_NODE, api.Severity_SEVERITY_CRITICAL},
		{79, api.XIDClass_XID_CLASS_REBOOT_NODE, api.Severity_SEVERITY_CRITICAL},
		{92, api.XIDClass_XID_CLASS_HARDWARE, api.Severity_SEVERITY_CRITICAL},
		{143, api.XIDClass_XID_CLASS_HARDWARE, api.Severity_SEVERITY_CRITICAL},
		{0, api.XIDClass_XID_CLASS_UNSPECIFIED, api.Severity_SEVERITY_WARNING},
		{999, api.XIDClass_XID_CLASS_UNSPECIFIED, api.Severity_SEVERITY_WARNING},
	}
	for _, tc := range tests {
		if got := ClassifyXID(tc.code); got != tc.class {
			t.Errorf("ClassifyXID(%d) = %s, want %s", tc.code, got, tc.class)
		}
		if got := severityOf(ClassifyXID(tc.code)); got != tc.sev {
			t.Errorf("severity of Xid %d = %s, want %s", tc.code, got, tc.sev)
		}
	}
}

func TestDescribeXID(t *testing.T) {
	tests := []struct {
		code uint32
		want []string
	}{
		{79, []string{"Xid 79", "fallen off the bus", "reboot the node"}},
		{48, []string{"Xid 48", "double bit ECC", "reset the GPU"}},
		{13, []string{"Xid 13", "restart the application"}},
		{4242, []string{"Xid 4242", "not in the catalog"}},
	}
	for _, tc := range tests {
		got := DescribeXID(tc.code)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("DescribeXID(%d) = %q, missing %q", tc.code, got, w)
			}
		}
	}
}

// Every catalog entry has a class and a description, so no Xid NVIDIA
// documents is reported with an empty message.
func TestXIDCatalogComplete(t *testing.T) {
	for code, e := range xidCatalog {
		if e.class == api.XIDClass_XID_CLASS_UNSPECIFIED || e.desc == "" {
			t.Errorf("Xid %d: class %s, description %q", code, e.class, e.desc)
		}
	}
}
