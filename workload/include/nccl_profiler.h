/*
 * nccl_profiler.h: the part of NCCL's profiler plugin interface, version 3
 * (the `ncclProfiler_v3` symbol, introduced in NCCL 2.25 and still looked up
 * by 2.26 through 2.28 after their newer versions), that gpuctl uses. The
 * layout of every struct and the enum values are NCCL's, so the plugin
 * built from this header loads into a real libnccl.so.2 and the reference
 * library calls it the way NCCL does.
 *
 * What NCCL promises (ext-profiler/README.md): init and finalize once per
 * communicator; a Coll event is started and stopped on the calling thread
 * while the collective is enqueued, so its stop means "enqueued", not
 * "done"; its children, ProxyOp events (network transfers, on the proxy
 * thread) and KernelCh events (the kernel's progress on a channel), carry
 * the Coll event's handle in parentObj and stop when that work is done.
 */
#ifndef GPUCTL_NCCL_PROFILER_H_
#define GPUCTL_NCCL_PROFILER_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
};

/* Event states; gpuctl records none of them, so only the type is needed. */
typedef int ncclProfilerEventState_v3_t;

typedef struct {
  uint8_t type;    /* one of the ncclProfile* bits */
  void *parentObj; /* the parent event's handle, as startEvent returned it */
  int rank;
  union {
    struct {
      const char *name;
      uint64_t commHash;
      uint64_t seqNumber; /* per communicator, from 0 */
      const char *func;
      const void *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *name;
      uint64_t commHash;
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
    } p2p;
    struct {
      pid_t pid; /* the process that made the operation (PXN may run it in another) */
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v3_t;

typedef union {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} ncclProfilerEventStateArgs_v3_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, int *eActivationMask);
  ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v3_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v3_t eState,
                                   ncclProfilerEventStateArgs_v3_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} ncclProfiler_v3_t;

#define NCCL_PROFILER_SYMBOL "ncclProfiler_v3"

#endif /* GPUCTL_NCCL_PROFILER_H_ */
