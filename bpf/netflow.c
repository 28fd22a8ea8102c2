//go:build ignore

/*
 * netflow.c counts socket bytes and TCP retransmits per flow: (pid,
 * protocol, local address:port, remote address:port). User space drains the
 * counters each interval; two maps take turns so that draining one never
 * races with the programs updating the other.
 */

#include "common.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual BSD/GPL";

struct flow_key {
	__u8 laddr[16]; /* IPv4 in the first 4 bytes */
	__u8 raddr[16];
	__u32 pid;
	__u16 family; /* AF_INET or AF_INET6 */
	__u16 protocol; /* IPPROTO_TCP or IPPROTO_UDP */
	__u16 lport; /* host byte order */
	__u16 rport; /* host byte order */
	__u32 _pad;
};

struct flow_stats {
	__u64 tx_bytes;
	__u64 rx_bytes;
	__u64 retransmits;
};

#define MAX_FLOWS 16384

struct flow_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct flow_stats);
	/* Entries are freed after an RCU grace period, never reused under a
	 * program still holding a pointer into them. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct flow_map flows_0 SEC(".maps");
struct flow_map flows_1 SEC(".maps");

/* Which of flows_0/flows_1 programs write to; user space flips it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} flows_active SEC(".maps");

/* Socket owner, so a retransmit from softirq is charged to the right pid. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, __u64);
	__type(value, __u32);
} sock_owner SEC(".maps");

/* Updates dropped because the flow map was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} flows_lost SEC(".maps");

enum stat_kind {
	STAT_TX,
	STAT_RX,
	STAT_RETRANS,
};

static __always_inline bool read_flow(struct sock *sk, struct flow_key *key)
{
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);

	key->family = family;
	key->protocol = BPF_CORE_READ(sk, sk_protocol);
	key->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	key->rport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (family == AF_INET) {
		__be32 l = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		__be32 r = BPF_CORE_READ(sk, __sk_common.skc_daddr);

		__builtin_memcpy(key->laddr, &l, 4);
		__builtin_memcpy(key->raddr, &r, 4);
		return true;
	}
	if (family == AF_INET6) {
		BPF_CORE_READ_INTO(key->laddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(key->raddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
		return true;
	}
	return false;
}

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *lost = bpf_map_lookup_elem(&flows_lost, &zero);

	if (lost)
		*lost += 1; /* per-CPU slot: no other writer */
}

static __always_inline void add(struct flow_key *key, enum stat_kind kind, __u64 n)
{
	__u32 zero = 0;
	__u32 *active = bpf_map_lookup_elem(&flows_active, &zero);
	void *flows = (active && *active) ? (void *)&flows_1 : (void *)&flows_0;
	struct flow_stats *st = bpf_map_lookup_elem(flows, key);

	if (!st) {
		struct flow_stats init = {};

		if (bpf_map_update_elem(flows, key, &init, BPF_NOEXIST) != 0) {
			/* Another CPU may have inserted it first; else it is full. */
			st = bpf_map_lookup_elem(flows, key);
			if (!st) {
				count_lost();
				return;
			}
		} else {
			st = bpf_map_lookup_elem(flows, key);
			if (!st)
				return; /* drained in between; the next event recounts */
		}
	}
	switch (kind) {
	case STAT_TX:
		__sync_fetch_and_add(&st->tx_bytes, n);
		break;
	case STAT_RX:
		__sync_fetch_and_add(&st->rx_bytes, n);
		break;
	case STAT_RETRANS:
		__sync_fetch_and_add(&st->retransmits, n);
		break;
	}
}

static __always_inline int on_length(struct trace_event_raw_sock_msg_length *ctx,
				     enum stat_kind kind)
{
	int ret = ctx->ret;
	__u16 family = ctx->family;
	__u16 protocol = ctx->protocol;

	if (ret <= 0 || (ctx->flags & MSG_PEEK))
		return 0;
	if (family != AF_INET && family != AF_INET6)
		return 0;
	if (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP)
		return 0;

	struct sock *sk = ctx->sk;
	struct flow_key key = {};

	if (!read_flow(sk, &key))
		return 0;
	key.pid = bpf_get_current_pid_tgid() >> 32;

	__u64 skp = (__u64)sk;
	__u32 *owner = bpf_map_lookup_elem(&sock_owner, &skp);

	if (!owner || *owner != key.pid)
		bpf_map_update_elem(&sock_owner, &skp, &key.pid, BPF_ANY);

	add(&key, kind, (__u64)ret);
	return 0;
}

SEC("tracepoint/sock/sock_send_length")
int sock_send_length(struct trace_event_raw_sock_msg_length *ctx)
{
	return on_length(ctx, STAT_TX);
}

SEC("tracepoint/sock/sock_recv_length")
int sock_recv_length(struct trace_event_raw_sock_msg_length *ctx)
{
	return on_length(ctx, STAT_RX);
}

SEC("tracepoint/tcp/tcp_retransmit_skb")
int tcp_retransmit_skb(struct tcp_retransmit_skb_args *ctx)
{
	struct sock *sk = (struct sock *)ctx->skaddr;
	struct flow_key key = {};

	if (!sk || !read_flow(sk, &key))
		return 0;

	/* Often runs from a timer, not in the owner's context. */
	__u64 skp = (__u64)sk;
	__u32 *owner = bpf_map_lookup_elem(&sock_owner, &skp);

	key.pid = owner ? *owner : 0;
	add(&key, STAT_RETRANS, 1);
	return 0;
}
