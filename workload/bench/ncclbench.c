/*
 * ncclbench: the cost of one call into libnccl.so.2, for measuring what an
 * eBPF uprobe on the call adds. It makes a 1-rank communicator (no network)
 * and times N calls of a cheap exported function, then prints one line:
 *   ns_per_call=<float>
 *
 *   ncclbench [--calls N] [--op allreduce|group]
 *     allreduce: ncclAllReduce of one float (default)
 *     group:     ncclGroupStart + ncclGroupEnd (two calls each, counted as two)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void usage(const char *msg) {
  fprintf(stderr, "ncclbench: %s\nusage: ncclbench [--calls N] [--op allreduce|group]\n", msg);
  exit(2);
}

int main(int argc, char **argv) {
  long calls = 1000000;
  const char *op = "allreduce";
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage("every flag needs a value");
    if (strcmp(argv[i], "--calls") == 0) {
      char *end;
      calls = strtol(argv[++i], &end, 10);
      if (*end || calls <= 0) usage("--calls must be a positive integer");
    } else if (strcmp(argv[i], "--op") == 0) {
      op = argv[++i];
      if (strcmp(op, "allreduce") != 0 && strcmp(op, "group") != 0)
        usage("--op must be allreduce or group");
    } else {
      usage("unknown flag");
    }
  }
  setenv("MASTER_ADDR", "127.0.0.1", 0);
  setenv("MASTER_PORT", "29500", 0);
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc == ncclSuccess) rc = ncclCommInitRank(&comm, 1, id, 0);
  if (rc != ncclSuccess) {
    fprintf(stderr, "ncclbench: init: %s\n", ncclGetErrorString(rc));
    return 1;
  }
  int group = strcmp(op, "group") == 0;
  float x = 1, y = 0;
  long n = group ? calls / 2 : calls;
  if (n < 1) n = 1;
  double t0 = now_ns();
  for (long i = 0; i < n; i++) {
    if (group) {
      rc = ncclGroupStart();
      if (rc == ncclSuccess) rc = ncclGroupEnd();
    } else {
      rc = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
    }
    if (rc != ncclSuccess) {
      fprintf(stderr, "ncclbench: call %ld: %s\n", i, ncclGetErrorString(rc));
      return 1;
    }
  }
  double elapsed = now_ns() - t0;
  if (!group && y != 1) {
    fprintf(stderr, "ncclbench: 1-rank all-reduce returned %g, want 1\n", (double)y);
    return 1;
  }
  printf("ns_per_call=%.2f\n", elapsed / (double)(group ? 2 * n : n));
  ncclCommDestroy(comm);
  return 0;
}
