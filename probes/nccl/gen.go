// Package nccl traces every NCCL call of every process on the host with
// eBPF uprobes on the exported API of each libnccl.so it finds: the
// collective, element count, bytes, communicator, per-communicator sequence
// number, peer and time inside the call, and the calls still in progress.
package nccl

//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type nccl_call nccl ../../bpf/nccl.c -- -I../../bpf/headers
