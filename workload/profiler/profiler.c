/*
 * libnccl-profiler-gpuctl.so: gpuctl's NCCL profiler plugin. It tells
 * nodemon when each collective's work really ran, which on a GPU is not
 * when ncclAllReduce returns (that is the enqueue): NCCL stops a Coll event
 * once the collective is enqueued, and the ProxyOp and KernelCh events
 * under it stop when the network transfers and the kernel are done.
 *
 * The plugin sends nothing anywhere. It calls two empty functions that
 * nodemon puts uprobes on: gpuctl_coll_enqueued on the thread inside the
 * NCCL call (where nodemon's probe on that call knows the communicator
 * handle and the sequence number it counts), and gpuctl_coll_done when the
 * last child event of the collective stops, with when its first child
 * started and when its last one stopped (CLOCK_MONOTONIC, the eBPF clock).
 * Without nodemon the calls cost a few nanoseconds each.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler.h"

#define EXPORT __attribute__((visibility("default")))
#define HOOK __attribute__((visibility("default"), noinline, used))

/*
 * Collective events live in a ring per communicator and are never freed:
 * NCCL stops a Coll event before its children start, and gives no sign
 * that the last child has come, so a slot is reused only after RING_SLOTS
 * later collectives on the same communicator, long after its work ended.
 */
#define RING_SLOTS 4096

struct coll_event {
  struct comm_ctx *ctx;
  uint64_t comm_hash;
  uint64_t seq;
  _Atomic int refs;          /* the Coll event until it stops, plus running children */
  _Atomic int children;      /* children started so far */
  _Atomic uint64_t start_ns; /* when the first child started */
};

struct comm_ctx {
  pid_t pid;
  _Atomic uint64_t next;
  /* What NCCL handed the communicator, said at finalize with NCCL_DEBUG=INFO. */
  _Atomic uint64_t colls, proxy_ops, kernel_chs, done;
  struct coll_event ring[RING_SLOTS];
};

/* A child's handle is its parent's address with the low bit set, so a
 * child needs no memory of its own. */
#define CHILD_TAG ((uintptr_t)1)

/*
 * The hooks are a 5-byte nop and a return, as USDT probes are: a uprobe on
 * a nop5 is one the kernel can turn into a cheap call (x86, Linux 6.18+)
 * instead of a trap per hit. Their arguments are the SysV registers
 * nodemon's probes read.
 */
#define UNUSED __attribute__((unused))

HOOK __attribute__((naked)) void gpuctl_coll_enqueued(UNUSED const void *event,
                                                      UNUSED uint64_t comm_hash, UNUSED uint64_t seq) {
  __asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n\tret"); /* nopl 0(%rax,%rax,1) */
}

HOOK __attribute__((naked)) void gpuctl_coll_done(UNUSED const void *event, UNUSED uint64_t comm_hash,
                                                  UNUSED uint64_t seq, UNUSED uint64_t start_ns,
                                                  UNUSED uint64_t end_ns) {
  __asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n\tret"); /* nopl 0(%rax,%rax,1) */
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static ncclResult_t prof_init(void **context, int *mask) {
  struct comm_ctx *c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError; /* NCCL then runs without the plugin */
  c->pid = getpid();
  *context = c;
  *mask = ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh;
  return ncclSuccess;
}

static ncclResult_t prof_start(void *context, void **handle, ncclProfilerEventDescr_v3_t *d) {
  struct comm_ctx *c = context;
  *handle = NULL;
  switch (d->type) {
    case ncclProfileColl: {
      struct coll_event *e = &c->ring[atomic_fetch_add(&c->next, 1) % RING_SLOTS];
      e->ctx = c;
      e->comm_hash = d->coll.commHash;
      e->seq = d->coll.seqNumber;
      atomic_store(&e->refs, 1);
      atomic_store(&e->children, 0);
      atomic_store(&e->start_ns, 0);
      *handle = e;
      atomic_fetch_add(&c->colls, 1);
      gpuctl_coll_enqueued(e, e->comm_hash, e->seq);
      return ncclSuccess;
    }
    case ncclProfileProxyOp:
      /* Under PXN another process's proxy runs the operation; its parent
       * pointer is not ours to read. */
      if (d->proxyOp.pid != c->pid) return ncclSuccess;
      /* fall through */
    case ncclProfileKernelCh: {
      struct coll_event *e = d->parentObj;
      /* Children of point-to-point calls have no Coll parent here. */
      if (!e || ((uintptr_t)e & CHILD_TAG) || e->ctx != c) return ncclSuccess;
      atomic_fetch_add(d->type == ncclProfileProxyOp ? &c->proxy_ops : &c->kernel_chs, 1);
      atomic_fetch_add(&e->refs, 1);
      atomic_fetch_add(&e->children, 1);
      uint64_t zero = 0;
      atomic_compare_exchange_strong(&e->start_ns, &zero, now_ns());
      *handle = (void *)((uintptr_t)e | CHILD_TAG);
      return ncclSuccess;
    }
    default:
      return ncclSuccess;
  }
}

static ncclResult_t prof_stop(void *handle) {
  if (!handle) return ncclSuccess;
  struct coll_event *e = (struct coll_event *)((uintptr_t)handle & ~CHILD_TAG);
  /* Done when nothing of it runs any more and some work was seen: a Coll
   * event that stops before its children start is only enqueued. */
  if (atomic_fetch_sub(&e->refs, 1) == 1 && atomic_load(&e->children) > 0) {
    atomic_fetch_add(&e->ctx->done, 1);
    gpuctl_coll_done(e, e->comm_hash, e->seq, atomic_load(&e->start_ns), now_ns());
  }
  return ncclSuccess;
}

static ncclResult_t prof_record(void *handle, ncclProfilerEventState_v3_t state,
                                ncclProfilerEventStateArgs_v3_t *args) {
  (void)handle, (void)state, (void)args;
  return ncclSuccess;
}

static ncclResult_t prof_finalize(void *context) {
  struct comm_ctx *c = context;
  /* Whether NCCL loaded the plugin and which events it gave it, beside
   * NCCL's own INFO lines: on a host where no completion shows, this says
   * why. */
  const char *debug = getenv("NCCL_DEBUG");
  if (debug && strcasecmp(debug, "INFO") == 0)
    fprintf(stderr, "gpuctl profiler plugin: pid %d: %llu collectives, %llu proxy ops, %llu kernel channels, %llu completed\n",
            (int)c->pid, (unsigned long long)c->colls, (unsigned long long)c->proxy_ops,
            (unsigned long long)c->kernel_chs, (unsigned long long)c->done);
  free(context);
  return ncclSuccess;
}

EXPORT const ncclProfiler_v3_t ncclProfiler_v3 = {
    .name = "gpuctl",
    .init = prof_init,
    .startEvent = prof_start,
    .stopEvent = prof_stop,
    .recordEventState = prof_record,
    .finalize = prof_finalize,
};
