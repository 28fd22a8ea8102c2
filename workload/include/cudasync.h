/*
 * cudasync.h: the one CUDA runtime call a training loop makes to wait for
 * its collectives, cudaStreamSynchronize, with the runtime's signature.
 * The reference libnccl.so.2 defines it (it has no CUDA runtime to defer
 * to): it returns once every collective enqueued on any communicator has
 * completed. A program built against real NCCL gets it from libcudart.
 */
#ifndef GPUCTL_CUDASYNC_H
#define GPUCTL_CUDASYNC_H

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaError_t: 0 is cudaSuccess. */
int cudaStreamSynchronize(cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
