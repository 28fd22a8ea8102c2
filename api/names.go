package api

import (
	"fmt"
	"strings"
)

// Short returns the state's name as scripts see it: ready, cordoned,
// draining, down.
func (s NodeState) Short() string {
	switch s {
	case NodeState_NODE_STATE_READY:
		return "ready"
	case NodeState_NODE_STATE_CORDONED:
		return "cordoned"
	case NodeState_NODE_STATE_DRAINING:
		return "draining"
	case NodeState_NODE_STATE_DOWN:
		return "down"
	}
	return "unknown"
}

var opNames = map[NCCLOp]string{
	NCCLOp_NCCL_OP_ALL_REDUCE:     "allreduce",
	NCCLOp_NCCL_OP_ALL_GATHER:     "allgather",
	NCCLOp_NCCL_OP_REDUCE_SCATTER: "reducescatter",
	NCCLOp_NCCL_OP_BROADCAST:      "broadcast",
	NCCLOp_NCCL_OP_REDUCE:         "reduce",
	NCCLOp_NCCL_OP_SEND:           "send",
	NCCLOp_NCCL_OP_RECV:           "recv",
	NCCLOp_NCCL_OP_GROUP_START:    "groupstart",
	NCCLOp_NCCL_OP_GROUP_END:      "groupend",
	NCCLOp_NCCL_OP_COMM_INIT_RANK: "comminitrank",
}

// Short returns the op's lower-case name, e.g. allreduce.
func (o NCCLOp) Short() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return "unknown"
}

// Collective reports whether the op is a collective every rank of its
// communicator makes (all-reduce, all-gather, reduce-scatter, broadcast,
// reduce), numbered by the per-communicator sequence.
func (o NCCLOp) Collective() bool {
	switch o {
	case NCCLOp_NCCL_OP_ALL_REDUCE, NCCLOp_NCCL_OP_ALL_GATHER, NCCLOp_NCCL_OP_REDUCE_SCATTER,
		NCCLOp_NCCL_OP_BROADCAST, NCCLOp_NCCL_OP_REDUCE:
		return true
	}
	return false
}

// ParseNCCLOp accepts an op's short name, with or without the nccl prefix
// and in any case (AllReduce, ncclAllReduce, allreduce, all_reduce).
func ParseNCCLOp(s string) (NCCLOp, error) {
	k := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "_", ""))
	k = strings.TrimPrefix(k, "nccl")
	for op, n := range opNames {
		if n == k {
			return op, nil
		}
	}
	names := make([]string, 0, len(opNames))
	for op := NCCLOp_NCCL_OP_ALL_REDUCE; op <= NCCLOp_NCCL_OP_COMM_INIT_RANK; op++ {
		names = append(names, opNames[op])
	}
	return 0, fmt.Errorf("unknown NCCL op %q: use one of %s", s, strings.Join(names, ", "))
}

// Short returns the event kind's lower-case name, e.g. xid.
func (k EventKind) Short() string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "EVENT_KIND_"))
}

// Short returns the severity's lower-case name.
func (s Severity) Short() string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SEVERITY_"))
}

// Short returns the XID class's lower-case name, e.g. reset_gpu.
func (c XIDClass) Short() string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "XID_CLASS_"))
}

// Action says in words what the class asks the operator to do.
func (c XIDClass) Action() string {
	switch c {
	case XIDClass_XID_CLASS_NONE:
		return "no action needed"
	case XIDClass_XID_CLASS_RESTART_APP:
		return "restart the application"
	case XIDClass_XID_CLASS_RESET_GPU:
		return "reset the GPU"
	case XIDClass_XID_CLASS_REBOOT_NODE:
		return "reboot the node"
	case XIDClass_XID_CLASS_HARDWARE:
		return "inspect the hardware"
	}
	return "action unknown"
}

// GPUFault reports whether e makes its GPU unfit to run ranks, and why:
// an XID whose catalog class needs more than restarting the application
// (the class the node's XID catalog gave it, never the XID number), an
// uncorrectable ECC error, a GPU that fell off the bus. A job on that GPU
// is failed over and the node cordoned; an XID that only needs the
// application restarted crashes the ranks, which restart in place.
func GPUFault(e *Event) (string, bool) {
	switch e.GetKind() {
	case EventKind_EVENT_KIND_XID:
		switch c := e.GetXidClass(); c {
		case XIDClass_XID_CLASS_RESET_GPU, XIDClass_XID_CLASS_REBOOT_NODE, XIDClass_XID_CLASS_HARDWARE:
			return fmt.Sprintf("XID %d (%s)", e.GetXid(), c.Action()), true
		}
	case EventKind_EVENT_KIND_ECC:
		if e.GetSeverity() == Severity_SEVERITY_CRITICAL {
			return "uncorrectable ECC error", true
		}
	case EventKind_EVENT_KIND_GPU_LOST:
		if e.GetSeverity() == Severity_SEVERITY_CRITICAL {
			return "GPU lost (fell off the bus)", true
		}
	}
	return "", false
}

// Short returns a job state as people and scripts name it: pending,
// running, recovering, succeeded, failed or cancelled.
func (s JobState) Short() string {
	switch s {
	case JobState_JOB_STATE_PENDING:
		return "pending"
	case JobState_JOB_STATE_RUNNING:
		return "running"
	case JobState_JOB_STATE_RECOVERING:
		return "recovering"
	case JobState_JOB_STATE_SUCCEEDED:
		return "succeeded"
	case JobState_JOB_STATE_FAILED:
		return "failed"
	case JobState_JOB_STATE_CANCELLED:
		return "cancelled"
	}
	return "unknown"
}

// Ended reports whether a job in state s is over: succeeded, failed or
// cancelled.
func (s JobState) Ended() bool {
	return s == JobState_JOB_STATE_SUCCEEDED || s == JobState_JOB_STATE_FAILED || s == JobState_JOB_STATE_CANCELLED
}
