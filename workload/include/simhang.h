/*
 * Hangs on a simulated GPU, for `gpuctl fault NODE hang --gpu N --where W`:
 * nodemon writes W ("inside" or "outside") to $GPUCTL_SIM_KERNEL_DIR/hang-N
 * and removes it to clear the fault. A rank on GPU N (the first of its
 * CUDA_VISIBLE_DEVICES) stops there until the file goes: the reference
 * libnccl.so.2 inside a collective, after its transfers and before it
 * returns (as a kernel that never completes: the peers finish, the call
 * does not), and ringtrain between steps. Without a simulated GPU nothing
 * is read.
 */
#ifndef GPUCTL_SIMHANG_H
#define GPUCTL_SIMHANG_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* sim_hang_path fills path with this rank's hang file; 0 when there is none
 * to watch. */
static inline int sim_hang_path(char *path, size_t size) {
  const char *dir = getenv("GPUCTL_SIM_KERNEL_DIR"), *gpus = getenv("CUDA_VISIBLE_DEVICES");
  if (!dir || !*dir || !gpus || *gpus < '0' || *gpus > '9') return 0;
  int n = snprintf(path, size, "%s/hang-%ld", dir, strtol(gpus, NULL, 10));
  return n > 0 && (size_t)n < size;
}

/* sim_hang_is reports whether the hang file says where. */
static inline int sim_hang_is(const char *path, const char *where) {
  char buf[16] = "";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  size_t w = strlen(where);
  return n >= (ssize_t)w && strncmp(buf, where, w) == 0;
}

/* sim_hang blocks while the hang file says where, asleep as a host thread
 * waiting on a kernel that never ends. */
static inline void sim_hang(const char *where) {
  static __thread int known;
  static __thread char path[4096];
  if (known == 0) known = sim_hang_path(path, sizeof path) ? 1 : -1;
  if (known < 0) return;
  while (sim_hang_is(path, where)) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

#endif
