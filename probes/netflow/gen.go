// Package netflow counts socket bytes and TCP retransmits per flow of every
// process on the host with eBPF tracepoints (sock:sock_send_length,
// sock:sock_recv_length, tcp:tcp_retransmit_skb) and hands them out as
// per-interval deltas.
package netflow

//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type flow_key -type flow_stats netflow ../../bpf/netflow.c -- -I../../bpf/headers
