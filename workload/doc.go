// Package workload builds and locates gpuctl's reference workload: a C
// library with NCCL's ABI (build/libnccl.so.2) that runs real ring
// collectives over TCP on host memory, and the programs linked to it:
// ringtrain (a small data-parallel trainer that checkpoints the gpuctl way),
// ncclbench (the cost of one NCCL call, for measuring uprobe overhead) and
// colltest (a numerical check of every collective).
//
// The C sources live beside this file (include/, src/, ringtrain/, bench/,
// tests/) and are built by the Makefile here; Build runs it. eBPF uprobes on
// the library's exported ncclXxx symbols trace ringtrain exactly as they
// trace NVIDIA's libnccl.so.2.
//
// One difference from NVIDIA's library matters to launchers: ncclGetUniqueId
// does not return a random id but one that encodes MASTER_ADDR and
// MASTER_PORT (the torchrun convention), so every rank computes the same id
// from its environment and no side channel is needed to share it.
//
// ringtrain's stdout is a line protocol, one event per line:
//
//	start rank=R world=W local_rank=L job=J bytes=B state_bytes=S
//	resume step=N source=fresh|latest|GPUCTL_RESUME_STEP
//	step N loss=F state=HEX step_ms=F
//	checkpoint step=N bytes=B seconds=F
//	stop step=N reason=signal|steps
//
// It reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
// GPUCTL_CHECKPOINT_DIR, GPUCTL_RESUME_STEP, GPUCTL_JOB and, through the
// library, GPUCTL_NCCL_TIMEOUT_S (seconds allowed for rendezvous and
// connection set-up, default 60). SIGUSR1 asks for a checkpoint at the end of
// the current step, SIGTERM for a clean exit (status 0) at the end of it; the
// ranks agree on both each step, so signalling one rank is enough.
package workload
