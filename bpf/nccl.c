//go:build ignore

/*
 * nccl.c traces the exported NCCL API of a libnccl.so with uprobes (entry)
 * and uretprobes (return): one record per call with its arguments, the
 * per-(pid, communicator) sequence number and the time spent inside.
 * Calls still inside the library are visible to user space in nccl_inflight,
 * which is how a rank stuck in a collective is found.
 *
 * On a GPU a collective's return is its enqueue. gpuctl's profiler plugin
 * (workload/profiler) calls gpuctl_coll_enqueued from inside the NCCL call
 * and gpuctl_coll_done when the collective's work has finished: the first
 * pairs the plugin's event with the call in flight on that thread, the
 * second sends a completion record for it with the work's start and end.
 *
 * Argument passing is x86-64 SysV: integer args 1-6 in rdi, rsi, rdx, rcx,
 * r8, r9; the 7th and later on the stack above the return address.
 */

#include "common.h"
#include <bpf/bpf_helpers.h>

char __license[] SEC("license") = "Dual BSD/GPL";

/* Operation ids; equal to api.NCCLOp so user space needs no table. */
enum nccl_op {
	NCCL_OP_ALL_REDUCE = 1,
	NCCL_OP_ALL_GATHER = 2,
	NCCL_OP_REDUCE_SCATTER = 3,
	NCCL_OP_BROADCAST = 4,
	NCCL_OP_REDUCE = 5,
	NCCL_OP_SEND = 6,
	NCCL_OP_RECV = 7,
	NCCL_OP_GROUP_START = 8,
	NCCL_OP_GROUP_END = 9,
	NCCL_OP_COMM_INIT_RANK = 10,
};

/*
 * nccl_call is one NCCL call: the value of nccl_inflight while the thread is
 * inside the library, and the ring-buffer record once it returns.
 */
struct nccl_call {
	__u64 start_ns; /* bpf_ktime_get_ns at entry (CLOCK_MONOTONIC) */
	__u64 end_ns;   /* at return; 0 while in flight */
	__u64 count;    /* element count argument */
	__u64 comm;     /* ncclComm_t handle */
	__u64 comm_out; /* ncclCommInitRank: the ncclComm_t* to read on return */
	__u64 seq;      /* per-(pid, comm, kind) sequence number, from 1; 0 if none */
	__u32 pid;
	__u32 tid;
	__u32 op;          /* enum nccl_op */
	__s32 datatype;    /* ncclDataType_t, -1 if the call has none */
	__s32 peer;        /* send/recv peer, broadcast/reduce root, else -1 */
	__s32 result;      /* ncclResult_t returned */
	__s32 comm_nranks; /* from ncclCommInitRank, 0 if unknown */
	__s32 comm_rank;   /* from ncclCommInitRank, -1 if unknown */
	__u32 depth;       /* nested traced calls while this one is in flight */
	__u32 done;        /* 1: a completion record from the profiler plugin */
	__u64 gpu_start_ns; /* completion records: when the work began */
	__u64 gpu_end_ns;   /* completion records: when it was done */
};

/* Sequence numbers are kept per kind so point-to-point traffic, which is
 * not symmetric across ranks, cannot skew the collective count that ranks
 * compare to find a laggard. */
enum seq_kind {
	SEQ_COLLECTIVE = 0,
	SEQ_P2P = 1,
};

struct seq_key {
	__u64 comm;
	__u32 pid;
	__u32 kind;
};

struct comm_key {
	__u64 comm;
	__u32 pid;
	__u32 _pad;
};

struct comm_info {
	__s32 nranks;
	__s32 rank;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} nccl_events SEC(".maps");

/* Calls in progress, by thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct nccl_call);
} nccl_inflight SEC(".maps");

/* Kept in the kernel so sequence numbers stay right when records are lost.
 * LRU: entries of processes that exited age out instead of filling it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct seq_key);
	__type(value, __u64);
} nccl_seq SEC(".maps");

/* Communicator size and rank from ncclCommInitRank, stamped on later calls. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct comm_key);
	__type(value, struct comm_info);
} nccl_comms SEC(".maps");

/* Collectives enqueued and not yet complete, by the plugin's event. LRU:
 * a collective whose completion never comes ages out. */
struct event_key {
	__u64 event;
	__u32 pid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct event_key);
	__type(value, struct nccl_call);
} nccl_enqueued SEC(".maps");

/* Records that could not be delivered: ring buffer full or in-flight map full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} nccl_lost SEC(".maps");

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *lost = bpf_map_lookup_elem(&nccl_lost, &zero);

	if (lost)
		*lost += 1; /* per-CPU slot: no other writer */
}

/* stack_arg reads the n-th (7, 8, ...) integer argument at function entry. */
static __always_inline __u64 stack_arg(struct pt_regs *ctx, int n)
{
	__u64 v = 0;
	/* sp points at the return address; argument 7 sits just above it. */
	unsigned long addr = ctx->sp + 8 * (n - 6);

	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline __u64 next_seq(__u32 pid, __u64 comm, __u32 kind)
{
	struct seq_key key = { .comm = comm, .pid = pid, .kind = kind };
	__u64 one = 1;
	__u64 *seq = bpf_map_lookup_elem(&nccl_seq, &key);

	if (!seq) {
		if (bpf_map_update_elem(&nccl_seq, &key, &one, BPF_NOEXIST) == 0)
			return 1;
		seq = bpf_map_lookup_elem(&nccl_seq, &key);
		if (!seq)
			return 0;
	}
	/*
	 * A communicator may not be used by two threads at once (NCCL's rule),
	 * so calls on one key never race and a plain increment is exact.
	 */
	*seq += 1;
	return *seq;
}

/* enter records a call's arguments in nccl_inflight under the thread id. */
static __always_inline int enter(__u32 op, __u64 count, __s32 datatype,
				 __u64 comm, __s32 peer, __u64 comm_out)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct nccl_call *outer = bpf_map_lookup_elem(&nccl_inflight, &tid);

	if (outer) {
		/*
		 * The library called one of its own exported functions (or a
		 * return probe was missed). Keep the outer call; its return
		 * unwinds the depth.
		 */
		outer->depth += 1;
		return 0;
	}

	struct nccl_call c = {
		.start_ns = bpf_ktime_get_ns(),
		.count = count,
		.comm = comm,
		.comm_out = comm_out,
		.pid = id >> 32,
		.tid = tid,
		.op = op,
		.datatype = datatype,
		.peer = peer,
		.comm_rank = -1,
	};

	switch (op) {
	case NCCL_OP_SEND:
	case NCCL_OP_RECV:
		c.seq = next_seq(c.pid, comm, SEQ_P2P);
		break;
	case NCCL_OP_GROUP_START:
	case NCCL_OP_GROUP_END:
	case NCCL_OP_COMM_INIT_RANK:
		break;
	default:
		c.seq = next_seq(c.pid, comm, SEQ_COLLECTIVE);
	}

	if (op != NCCL_OP_COMM_INIT_RANK && comm) {
		struct comm_key ck = { .comm = comm, .pid = c.pid };
		struct comm_info *info = bpf_map_lookup_elem(&nccl_comms, &ck);

		if (info) {
			c.comm_nranks = info->nranks;
			c.comm_rank = info->rank;
		}
	}

	if (bpf_map_update_elem(&nccl_inflight, &tid, &c, BPF_ANY))
		count_lost();
	return 0;
}

/* ncclAllReduce(send, recv, count, datatype, op, comm, stream) */
SEC("uprobe/ncclAllReduce")
int nccl_all_reduce(struct pt_regs *ctx)
{
	return enter(NCCL_OP_ALL_REDUCE, ctx->dx, (__s32)ctx->cx, ctx->r9, -1, 0);
}

/* ncclAllGather(send, recv, sendcount, datatype, comm, stream) */
SEC("uprobe/ncclAllGather")
int nccl_all_gather(struct pt_regs *ctx)
{
	return enter(NCCL_OP_ALL_GATHER, ctx->dx, (__s32)ctx->cx, ctx->r8, -1, 0);
}

/* ncclReduceScatter(send, recv, recvcount, datatype, op, comm, stream) */
SEC("uprobe/ncclReduceScatter")
int nccl_reduce_scatter(struct pt_regs *ctx)
{
	return enter(NCCL_OP_REDUCE_SCATTER, ctx->dx, (__s32)ctx->cx, ctx->r9, -1, 0);
}

/* ncclBroadcast(send, recv, count, datatype, root, comm, stream) */
SEC("uprobe/ncclBroadcast")
int nccl_broadcast(struct pt_regs *ctx)
{
	return enter(NCCL_OP_BROADCAST, ctx->dx, (__s32)ctx->cx, ctx->r9,
		     (__s32)ctx->r8, 0);
}

/* ncclReduce(send, recv, count, datatype, op, root, comm, stream) */
SEC("uprobe/ncclReduce")
int nccl_reduce(struct pt_regs *ctx)
{
	return enter(NCCL_OP_REDUCE, ctx->dx, (__s32)ctx->cx, stack_arg(ctx, 7),
		     (__s32)ctx->r9, 0);
}

/* ncclSend(buf, count, datatype, peer, comm, stream) */
SEC("uprobe/ncclSend")
int nccl_send(struct pt_regs *ctx)
{
	return enter(NCCL_OP_SEND, ctx->si, (__s32)ctx->dx, ctx->r8,
		     (__s32)ctx->cx, 0);
}

/* ncclRecv(buf, count, datatype, peer, comm, stream) */
SEC("uprobe/ncclRecv")
int nccl_recv(struct pt_regs *ctx)
{
	return enter(NCCL_OP_RECV, ctx->si, (__s32)ctx->dx, ctx->r8,
		     (__s32)ctx->cx, 0);
}

/* ncclGroupStart(void) */
SEC("uprobe/ncclGroupStart")
int nccl_group_start(struct pt_regs *ctx)
{
	return enter(NCCL_OP_GROUP_START, 0, -1, 0, -1, 0);
}

/* ncclGroupEnd(void) */
SEC("uprobe/ncclGroupEnd")
int nccl_group_end(struct pt_regs *ctx)
{
	return enter(NCCL_OP_GROUP_END, 0, -1, 0, -1, 0);
}

/*
 * ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank).
 * The 128-byte id is passed in memory on the stack and takes no register,
 * so rank is the third integer register. nranks and rank travel in the
 * count and peer slots until the return probe moves them.
 */
SEC("uprobe/ncclCommInitRank")
int nccl_comm_init_rank(struct pt_regs *ctx)
{
	return enter(NCCL_OP_COMM_INIT_RANK, ctx->si, -1, 0, (__s32)ctx->dx,
		     ctx->di);
}

/* reserve_copy puts a copy of c, ended now, in the ring buffer for the
 * caller to finish and submit; NULL (counted lost) when the ring is full. */
static __always_inline struct nccl_call *reserve_copy(const struct nccl_call *c)
{
	struct nccl_call *ev = bpf_ringbuf_reserve(&nccl_events, sizeof(*ev), 0);

	if (!ev) {
		count_lost();
		return NULL;
	}
	__builtin_memcpy(ev, c, sizeof(*ev));
	ev->end_ns = bpf_ktime_get_ns();
	return ev;
}

/* nccl_return completes whichever traced call the thread is returning from. */
SEC("uretprobe/nccl")
int nccl_return(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct nccl_call *c = bpf_map_lookup_elem(&nccl_inflight, &tid);

	if (!c)
		return 0; /* entered before the probe was attached */
	if (c->depth > 0) {
		c->depth -= 1;
		return 0;
	}

	struct nccl_call *ev = reserve_copy(c);

	if (!ev) {
		bpf_map_delete_elem(&nccl_inflight, &tid);
		return 0;
	}
	ev->result = (__s32)ctx->ax;

	if (ev->op == NCCL_OP_COMM_INIT_RANK) {
		__u64 handle = 0;

		if (ev->comm_out)
			bpf_probe_read_user(&handle, sizeof(handle),
					    (void *)ev->comm_out);
		ev->comm = handle;
		ev->comm_nranks = (__s32)ev->count;
		ev->comm_rank = ev->peer;
		ev->count = 0;
		ev->peer = -1;
		if (handle && ev->result == 0) {
			struct comm_key ck = { .comm = handle, .pid = ev->pid };
			struct comm_info info = { .nranks = ev->comm_nranks,
						  .rank = ev->comm_rank };
			struct seq_key sk = { .comm = handle, .pid = ev->pid };

			bpf_map_update_elem(&nccl_comms, &ck, &info, BPF_ANY);
			/* A new communicator at a reused address starts over. */
			sk.kind = SEQ_COLLECTIVE;
			bpf_map_delete_elem(&nccl_seq, &sk);
			sk.kind = SEQ_P2P;
			bpf_map_delete_elem(&nccl_seq, &sk);
		}
	}
	bpf_ringbuf_submit(ev, 0);
	bpf_map_delete_elem(&nccl_inflight, &tid);
	return 0;
}

/*
 * gpuctl_coll_enqueued(event, comm_hash, seq): the plugin's Coll event
 * started, on the thread inside the NCCL call that enqueues it.
 */
SEC("uprobe/gpuctl_coll_enqueued")
int gpuctl_coll_enqueued(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct nccl_call *c = bpf_map_lookup_elem(&nccl_inflight, &tid);

	if (!c || c->seq == 0)
		return 0; /* not inside a traced collective */

	struct event_key key = { .event = ctx->di, .pid = id >> 32 };

	if (bpf_map_update_elem(&nccl_enqueued, &key, c, BPF_ANY))
		count_lost();
	return 0;
}

/*
 * gpuctl_coll_done(event, comm_hash, seq, start_ns, end_ns): the
 * collective's work ran from start_ns to end_ns (CLOCK_MONOTONIC), on
 * whichever thread saw it end.
 */
SEC("uprobe/gpuctl_coll_done")
int gpuctl_coll_done(struct pt_regs *ctx)
{
	struct event_key key = { .event = ctx->di,
				 .pid = bpf_get_current_pid_tgid() >> 32 };
	struct nccl_call *c = bpf_map_lookup_elem(&nccl_enqueued, &key);

	if (!c)
		return 0; /* enqueued before the probe was attached */

	struct nccl_call *ev = reserve_copy(c);

	if (!ev) {
		bpf_map_delete_elem(&nccl_enqueued, &key);
		return 0;
	}
	ev->done = 1;
	ev->gpu_start_ns = ctx->cx;
	ev->gpu_end_ns = ctx->r8;
	bpf_ringbuf_submit(ev, 0);
	bpf_map_delete_elem(&nccl_enqueued, &key);
	return 0;
}
