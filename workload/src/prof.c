/*
 * prof.c: loads an NCCL profiler plugin the way NCCL 2.25+ does
 * (NCCL_PROFILER_PLUGIN names the library, or NAME for
 * libnccl-profiler-NAME.so; the symbol ncclProfiler_v3) and reports
 * collectives to it at the same points: a Coll event started and stopped
 * while the call enqueues, and a KernelCh event under it while the work
 * runs on the communicator's stream.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const ncclProfiler_v3_t *plugin;
static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;

static void *open_plugin(const char *name) {
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib || strchr(name, '/')) return lib;
  char path[512];
  snprintf(path, sizeof path, "libnccl-profiler-%s.so", name);
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void load_plugin(void) {
  const char *name = getenv("NCCL_PROFILER_PLUGIN");
  if (!name || !*name) return;
  void *lib = open_plugin(name);
  if (!lib) {
    fprintf(stderr, "gpuctl-nccl: NCCL_PROFILER_PLUGIN=%s: cannot load it (%s); running without a profiler\n",
            name, dlerror());
    return;
  }
  plugin = dlsym(lib, NCCL_PROFILER_SYMBOL);
  if (!plugin)
    fprintf(stderr, "gpuctl-nccl: NCCL_PROFILER_PLUGIN=%s has no %s; running without a profiler\n",
            name, NCCL_PROFILER_SYMBOL);
}

/* The same for every rank of a communicator, as NCCL's commHash is. */
static uint64_t comm_hash(const struct ncclComm *c) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const unsigned char *p = (const unsigned char *)&c->root_addr;
  for (socklen_t i = 0; i < c->root_len; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

void prof_comm_init(struct ncclComm *c) {
  pthread_once(&plugin_once, load_plugin);
  c->prof_ctx = NULL;
  c->prof_mask = 0;
  c->prof_hash = comm_hash(c);
  if (!plugin) return;
  int mask = 0;
  if (plugin->init(&c->prof_ctx, &mask) != ncclSuccess) {
    c->prof_ctx = NULL;
    return;
  }
  c->prof_mask = mask;
}

void prof_comm_fini(struct ncclComm *c) {
  if (plugin && c->prof_mask) plugin->finalize(c->prof_ctx);
  c->prof_mask = 0;
}

static const char *coll_func(enum op_kind k) {
  switch (k) {
    case OP_ALLREDUCE: return "AllReduce";
    case OP_ALLGATHER: return "AllGather";
    case OP_REDUCESCATTER: return "ReduceScatter";
    case OP_BROADCAST: return "Broadcast";
    case OP_REDUCE: return "Reduce";
    default: return "";
  }
}

void *prof_coll_start(struct ncclComm *c, const struct op *o) {
  if (!(c->prof_mask & ncclProfileColl)) return NULL;
  ncclProfilerEventDescr_v3_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl;
  d.rank = c->rank;
  d.coll.name = "";
  d.coll.commHash = c->prof_hash;
  d.coll.seqNumber = c->prof_seq++;
  d.coll.func = coll_func(o->kind);
  d.coll.sendBuff = o->sendbuff;
  d.coll.recvBuff = o->recvbuff;
  d.coll.count = o->count;
  d.coll.root = o->root;
  d.coll.datatype = dtype_name(o->dtype);
  d.coll.nMaxChannels = 1;
  d.coll.algo = "Ring";
  d.coll.proto = "Simple";
  void *h = NULL;
  plugin->startEvent(c->prof_ctx, &h, &d);
  return h;
}

void *prof_kernel_start(struct ncclComm *c, void *coll) {
  if (!coll || !(c->prof_mask & ncclProfileKernelCh)) return NULL;
  ncclProfilerEventDescr_v3_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelCh;
  d.parentObj = coll;
  d.rank = c->rank;
  d.kernelCh.channelId = 0;
  void *h = NULL;
  plugin->startEvent(c->prof_ctx, &h, &d);
  return h;
}

void prof_stop(void *event) {
  if (event) plugin->stopEvent(event);
}
