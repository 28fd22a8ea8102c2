package nvml

import (
	"fmt"

	"github.com/gpuctl/gpuctl/api"
)

// xidEntry is one row of the catalog below.
type xidEntry struct {
	class api.XIDClass
	desc  string
}

// xidCatalog maps an Xid to the resolution NVIDIA's catalog gives for it.
//
// Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and
// newer, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
// column "Resolution Bucket (Immediate Action)", and NVIDIA's dynamic page
// retirement and GPU memory error management guides for 48/63/64/94/95.
// Buckets become classes as follows:
//
//	RESTART_APP                      -> XID_CLASS_RESTART_APP
//	RESET_GPU, WORKFLOW_XID_48       -> XID_CLASS_RESET_GPU
//	RESTART_BM, RESTART_VM           -> XID_CLASS_REBOOT_NODE
//	CONTACT_SUPPORT, CHECK_MECHANICALS -> XID_CLASS_HARDWARE
//	IGNORE                           -> XID_CLASS_NONE
//
// Xid 74 (NVLink) is classed REBOOT_NODE: on an NVSwitch system the fabric
// spans every GPU of the node and a link that failed training comes back
// with the node, not with one GPU reset. Codes absent from the table are
// XID_CLASS_UNSPECIFIED; their events carry warning severity so that an
// unknown code is seen, never silently dropped.
var xidCatalog = map[uint32]xidEntry{
	8:   {api.XIDClass_XID_CLASS_RESTART_APP, "GPU stopped processing (channel idle timeout)"},
	11:  {api.XIDClass_XID_CLASS_RESTART_APP, "invalid or corrupted push buffer stream"},
	13:  {api.XIDClass_XID_CLASS_RESTART_APP, "graphics engine exception"},
	31:  {api.XIDClass_XID_CLASS_RESTART_APP, "GPU memory page fault"},
	32:  {api.XIDClass_XID_CLASS_RESTART_APP, "invalid or corrupted push buffer stream"},
	43:  {api.XIDClass_XID_CLASS_RESTART_APP, "GPU stopped processing (channel reset)"},
	45:  {api.XIDClass_XID_CLASS_RESTART_APP, "preemptive cleanup after previous errors"},
	46:  {api.XIDClass_XID_CLASS_RESET_GPU, "GPU stopped processing"},
	48:  {api.XIDClass_XID_CLASS_RESET_GPU, "double bit ECC error"},
	54:  {api.XIDClass_XID_CLASS_HARDWARE, "auxiliary power is not connected to the GPU board"},
	61:  {api.XIDClass_XID_CLASS_RESET_GPU, "internal micro-controller breakpoint/warning"},
	62:  {api.XIDClass_XID_CLASS_RESET_GPU, "internal micro-controller halt"},
	63:  {api.XIDClass_XID_CLASS_RESET_GPU, "ECC page retirement or row remapping recorded (reset to activate)"},
	64:  {api.XIDClass_XID_CLASS_RESET_GPU, "ECC page retirement or row remapping recording failure"},
	68:  {api.XIDClass_XID_CLASS_RESTART_APP, "NVDEC0 exception"},
	69:  {api.XIDClass_XID_CLASS_RESTART_APP, "graphics engine class error"},
	74:  {api.XIDClass_XID_CLASS_REBOOT_NODE, "NVLink error"},
	79:  {api.XIDClass_XID_CLASS_REBOOT_NODE, "GPU has fallen off the bus"},
	92:  {api.XIDClass_XID_CLASS_HARDWARE, "high single-bit ECC error rate"},
	94:  {api.XIDClass_XID_CLASS_RESTART_APP, "contained ECC error (only the faulting application is affected)"},
	95:  {api.XIDClass_XID_CLASS_RESET_GPU, "uncontained ECC error"},
	119: {api.XIDClass_XID_CLASS_RESET_GPU, "GSP RPC timeout"},
	120: {api.XIDClass_XID_CLASS_RESET_GPU, "GSP error"},
	123: {api.XIDClass_XID_CLASS_HARDWARE, "SPI PMU RPC write failure"},
	137: {api.XIDClass_XID_CLASS_RESTART_APP, "NVLink FLA privilege error"},
	140: {api.XIDClass_XID_CLASS_RESET_GPU, "unrecovered ECC error"},
	143: {api.XIDClass_XID_CLASS_HARDWARE, "GPU initialization failure"},
}

// ClassifyXID returns the resolution class NVIDIA's Xid catalog gives for
// code, XID_CLASS_UNSPECIFIED when the catalog has no entry for it.
func ClassifyXID(code uint32) api.XIDClass {
	if e, ok := xidCatalog[code]; ok {
		return e.class
	}
	return api.XIDClass_XID_CLASS_UNSPECIFIED
}

// DescribeXID returns a short description of code and the action its class
// asks for, for event messages.
func DescribeXID(code uint32) string {
	e, ok := xidCatalog[code]
	if !ok {
		return fmt.Sprintf("Xid %d (not in the catalog; check NVIDIA's Xid documentation)", code)
	}
	return fmt.Sprintf("Xid %d: %s (%s)", code, e.desc, e.class.Action())
}

// severityOf maps a resolution class to an event severity: anything that
// takes the GPU or node out of service is critical.
func severityOf(c api.XIDClass) api.Severity {
	switch c {
	case api.XIDClass_XID_CLASS_NONE:
		return api.Severity_SEVERITY_INFO
	case api.XIDClass_XID_CLASS_RESET_GPU, api.XIDClass_XID_CLASS_REBOOT_NODE, api.XIDClass_XID_CLASS_HARDWARE:
		return api.Severity_SEVERITY_CRITICAL
	}
	return api.Severity_SEVERITY_WARNING
}
