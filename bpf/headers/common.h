/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * common.h declares the few kernel types gpuctl's eBPF programs touch,
 * instead of a multi-megabyte vmlinux.h. Kernel structs carry
 * preserve_access_index so every field access is a CO-RE relocation that
 * the loader resolves against the running kernel's BTF: only the field
 * names and types here matter, not their order or offsets.
 */
#ifndef GPUCTL_BPF_COMMON_H
#define GPUCTL_BPF_COMMON_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;

typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

typedef _Bool bool;
#define true 1
#define false 0

/* Map types and update flags from the kernel's uapi bpf.h (stable ABI). */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_NO_PREALLOC = (1U << 0),
};

/* Address families and protocols (uapi, stable). */
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17

/* MSG_PEEK from uapi socket.h: a peek reads bytes without consuming them. */
#define MSG_PEEK 2

/*
 * x86-64 register file as saved on kernel entry; a uprobe's context. Field
 * names are the kernel's (struct pt_regs in arch/x86/include/asm/ptrace.h).
 */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
} __attribute__((preserve_access_index));

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__be16 u6_addr16[8];
		__be32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

/*
 * The kernel nests the address and port fields inside anonymous unions;
 * CO-RE finds them by name, so a flat declaration is enough.
 */
struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

/* Header of every tracepoint record. */
struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
} __attribute__((preserve_access_index));

/* sock:sock_send_length and sock:sock_recv_length. */
struct trace_event_raw_sock_msg_length {
	struct trace_entry ent;
	void *sk;
	__u16 family;
	__u16 protocol;
	int ret;
	int flags;
} __attribute__((preserve_access_index));

/*
 * tcp:tcp_retransmit_skb. The kernel's name for this record changed
 * (trace_event_raw_tcp_event_sk_skb, later trace_event_raw_tcp_retransmit_skb)
 * while the leading fields kept their places, so it is declared by its
 * tracefs format, without CO-RE.
 */
struct tcp_retransmit_skb_args {
	__u64 common; /* struct trace_entry */
	const void *skbaddr;
	const void *skaddr;
	int state;
};

#endif /* GPUCTL_BPF_COMMON_H */
