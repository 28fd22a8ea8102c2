/*
 * ringtrain: a data-parallel training loop in miniature, linked to the NCCL
 * API. Each step it "computes" (a CPU busy loop standing in for the GPU, or,
 * under $GPUCTL_SIM_KERNEL_DIR, a sleep it reports as kernel time), then
 * all-reduces a float32 gradient filled deterministically from (rank, step),
 * checks the sum exactly, and applies an update to its replicated state.
 *
 * Checkpoint convention (gpuctl's): on SIGUSR1 and every --ckpt-interval
 * steps each rank writes $GPUCTL_CHECKPOINT_DIR/step-N/rank-R.bin (tmp file,
 * fsync, rename), the ranks agree with an all-reduce, then rank 0 writes the
 * `latest` marker (content: N, or `N attempt=A` when GPUCTL_ATTEMPT is set)
 * the same way. The attempt is the marker's epoch: under a lock on
 * `latest.lock`, rank 0 refuses to commit over a marker of a newer attempt
 * (its own attempt has been superseded) and exits with status 3. SIGTERM ends the run cleanly at
 * the end of the step. Ranks agree each step, with a small all-reduce, on
 * whether any of them was signalled, so they checkpoint and stop at the same
 * step even when the signals reach them at different times.
 *
 * stdout, one line per event, flushed at once:
 *   start rank=R world=W local_rank=L job=J bytes=B state_bytes=S
 *   resume step=N source=fresh|latest|GPUCTL_RESUME_STEP
 *   step N loss=F state=HEX step_ms=F
 *   checkpoint step=N bytes=B seconds=F
 *   stop step=N reason=signal|steps
 * Exit status: 0 done or stopped, 1 runtime failure, 2 bad usage, 3 superseded
 * (a newer attempt committed a checkpoint in the same directory).
 *
 * A hang injected on its simulated GPU (simhang.h) stops it between steps.
 *
 * Simulated GPUs (nodemon --sim) give ranks GPUCTL_SIM_KERNEL_DIR: the rank
 * then sleeps through its compute phase, as a host thread waits on a
 * kernel, and keeps $GPUCTL_SIM_KERNEL_DIR/<pid> holding its total kernel
 * time in nanoseconds (decimal; replaced by rename, so a reader sees a
 * whole number), which the simulated GPU counts as utilization. Its compute
 * follows its GPU's clocks: each step it reads $GPUCTL_SIM_KERNEL_DIR/gpu-N.speed
 * (N the first of CUDA_VISIBLE_DEVICES; a fraction of full speed, missing = 1)
 * and computes for compute_ms / speed, so a throttled or slowed GPU slows it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudasync.h"
#include "nccl.h"
#include "simhang.h"

#define CKPT_MAGIC "RNGTCKP1"
#define CKPT_VERSION 1

/* On-disk checkpoint header, little-endian, followed by state_bytes of state. */
struct ckpt_header {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  uint32_t world;
  uint32_t reserved;
  uint64_t step;
  uint64_t state_bytes;
  uint64_t checksum;
  char job[64];
};

struct opts {
  long steps;
  double compute_ms;
  size_t bytes;
  long ckpt_interval;
  size_t state_bytes;
};

static volatile sig_atomic_t ckpt_requested, stop_requested;
static int g_rank = -1;
static const char *g_job = "ringtrain";
/* This run's attempt (GPUCTL_ATTEMPT), the epoch its checkpoints carry; 0 unknown. */
static long g_attempt;

static void on_usr1(int sig) {
  (void)sig;
  ckpt_requested = 1;
}
static void on_term(int sig) {
  (void)sig;
  stop_requested = 1;
}

static void fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ringtrain rank %d (%s): ", g_rank, g_job);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(code);
}

static void out(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

#define NCCLCHECK(call)                                                                   \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) fail(1, "%s failed: %s", #call, ncclGetErrorString(r_)); \
  } while (0)

/* stream_sync waits for the collectives enqueued so far, as a training loop
 * waits on its stream before reading what they wrote, and fails on the
 * communicator's error as NCCLCHECK does. */
static void stream_sync(ncclComm_t comm) {
  if (cudaStreamSynchronize(NULL) != 0) fail(1, "cudaStreamSynchronize failed");
  ncclResult_t async_rc;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async_rc));
  if (async_rc != ncclSuccess) fail(1, "collective failed: %s", ncclGetErrorString(async_rc));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses a byte size: digits with an optional K, M or G (powers of 1024). */
static int parse_size(const char *s, size_t *out_v) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *s == '-') return -1;
  unsigned long long mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1ULL << 10, end++;
  else if (*end == 'M' || *end == 'm') mul = 1ULL << 20, end++;
  else if (*end == 'G' || *end == 'g') mul = 1ULL << 30, end++;
  if (*end || v > (1ULL << 40) / mul) return -1;
  *out_v = (size_t)(v * mul);
  return 0;
}

static int parse_long(const char *s, long *out_v) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *out_v = v;
  return 0;
}

static void usage(const char *msg) {
  fprintf(stderr,
          "ringtrain: %s\n"
          "usage: ringtrain [--steps N] [--compute-ms MS] [--bytes B] [--ckpt-interval STEPS]\n"
          "                 [--state-bytes B]\n"
          "  --steps N            last step to run; 0 runs until SIGTERM (default 0)\n"
          "  --compute-ms MS      compute time per step: a busy loop, or a sleep reported as\n"
          "                       kernel time under GPUCTL_SIM_KERNEL_DIR (default 100)\n"
          "  --bytes B            all-reduce payload per step, float32; K/M/G suffixes (default 1M)\n"
          "  --ckpt-interval N    checkpoint every N steps; 0: only on SIGUSR1 (default 0)\n"
          "  --state-bytes B      per-rank state saved in checkpoints, multiple of 8 (default 1M)\n"
          "env: RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT GPUCTL_CHECKPOINT_DIR\n"
          "     GPUCTL_RESUME_STEP GPUCTL_JOB GPUCTL_NCCL_TIMEOUT_S\n",
          msg);
  exit(2);
}

static struct opts parse_args(int argc, char **argv) {
  struct opts o = {.steps = 0, .compute_ms = 100, .bytes = 1 << 20, .ckpt_interval = 0,
                   .state_bytes = 1 << 20};
  for (int i = 1; i < argc; i++) {
    char *name = argv[i], *val = strchr(name, '=');
    char buf[64];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) usage("help");
    if (val) {
      snprintf(buf, sizeof buf, "%.*s", (int)(val - name), name);
      name = buf;
      val++;
    } else {
      if (i + 1 >= argc) {
        snprintf(buf, sizeof buf, "%s needs a value", name);
        usage(buf);
      }
      val = argv[++i];
    }
    char msg[160];
    snprintf(msg, sizeof msg, "bad value %s for %s", val, name);
    if (strcmp(name, "--steps") == 0) {
      if (parse_long(val, &o.steps) < 0 || o.steps < 0) usage(msg);
    } else if (strcmp(name, "--compute-ms") == 0) {
      char *end;
      o.compute_ms = strtod(val, &end);
      if (*end || end == val || !(o.compute_ms >= 0) || o.compute_ms > 3.6e6) usage(msg);
    } else if (strcmp(name, "--bytes") == 0) {
      if (parse_size(val, &o.bytes) < 0 || o.bytes < 4 || o.bytes % 4)
        usage("--bytes must be a positive multiple of 4 (float32 elements)");
    } else if (strcmp(name, "--ckpt-interval") == 0) {
      if (parse_long(val, &o.ckpt_interval) < 0 || o.ckpt_interval < 0) usage(msg);
    } else if (strcmp(name, "--state-bytes") == 0) {
      if (parse_size(val, &o.state_bytes) < 0 || o.state_bytes < 8 || o.state_bytes % 8)
        usage("--state-bytes must be a positive multiple of 8");
    } else {
      snprintf(msg, sizeof msg, "unknown flag %s", name);
      usage(msg);
    }
  }
  return o;
}

static int env_int(const char *name, int def, int min, int max) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  long v;
  if (parse_long(s, &v) < 0 || v < min || v > max)
    fail(2, "%s=%s is not an integer in %d..%d", name, s, min, max);
  return (int)v;
}

/* Mixes 64 bits well (splitmix64's finalizer). */
static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t checksum(const uint64_t *w, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ULL;
  return h;
}

/* The state is replicated like data-parallel weights: it depends only on the
 * step, so a resumed run continues exactly where an uninterrupted one was. */
static void init_state(uint64_t *w, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] = mix(i + 1);
}
static void update_state(uint64_t *w, size_t n, long step) {
  uint64_t g = mix((uint64_t)step * 0x9e3779b97f4a7c15ULL);
  for (size_t i = 0; i < n; i++) w[i] = w[i] * 6364136223846793005ULL + (g ^ i);
}

static const char *g_kernel_dir;
static uint64_t g_kernel_ns;

/* Publishes the kernel time so far; a failure only loses the GPU's load. */
static void report_kernel_time(void) {
  char path[4096], tmp[4112], body[32];
  snprintf(path, sizeof path, "%s/%d", g_kernel_dir, (int)getpid());
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int n = snprintf(body, sizeof body, "%llu\n", (unsigned long long)g_kernel_ns);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, body, (size_t)n);
  close(fd);
  if (w == n) rename(tmp, path);
}

static char g_speed_path[4096];

/* The share of full speed this rank's simulated GPU runs at now: 1 unless
 * the simulated host says less (clamped so a bad file cannot stop the rank). */
static double gpu_speed(void) {
  if (!g_speed_path[0]) return 1;
  FILE *f = fopen(g_speed_path, "re");
  if (!f) return 1;
  double v = 1;
  if (fscanf(f, "%lf", &v) != 1 || !(v > 0)) v = 1;
  fclose(f);
  if (v < 0.05) v = 0.05;
  if (v > 1) v = 1;
  return v;
}

static void compute(double ms) {
  ms /= gpu_speed();
  double start = now_s(), end = start + ms / 1000.0;
  if (g_kernel_dir) {
    struct timespec ts = {(time_t)(ms / 1000.0), (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !stop_requested) {
    }
    g_kernel_ns += (uint64_t)((now_s() - start) * 1e9);
    report_kernel_time();
    return;
  }
  volatile double sink = 1.0;
  while (now_s() < end)
    for (int i = 0; i < 4096; i++) sink = sink * 1.0000001 + 1e-9;
}

/* Gradient element i of rank r at step s is (r%16+1) * ((i%251*7 + s%251)%251 + 1):
 * small integers, so the float32 sum over ranks is exact (it stays below
 * 2^24 for up to 4000 ranks). It repeats every 251 elements, so one period
 * (times a scale) is built and tiled: a step's fill and check cost a copy
 * and a compare rather than two divisions an element. */
static void pattern(float period[251], long scale, long step) {
  for (size_t j = 0; j < 251; j++) period[j] = (float)(scale * (long)((j * 7 + (size_t)(step % 251)) % 251 + 1));
}

static void fill_grad(float *buf, size_t n, int r, long step) {
  float period[251];
  pattern(period, r % 16 + 1, step);
  for (size_t i = 0; i < n; i += 251) memcpy(buf + i, period, (n - i < 251 ? n - i : 251) * sizeof(float));
}

static void verify(const float *buf, size_t n, long step, int world) {
  long s = 0;
  for (int r = 0; r < world; r++) s += r % 16 + 1;
  float period[251];
  pattern(period, s, step);
  for (size_t i = 0; i < n; i += 251) {
    size_t m = n - i < 251 ? n - i : 251;
    if (memcmp(buf + i, period, m * sizeof(float)) == 0) continue;
    for (size_t j = 0; j < m; j++)
      if (buf[i + j] != period[j])
        fail(1, "step %ld: all-reduce result is wrong at element %zu of %zu: got %.1f, want %.1f",
             step, i + j, n, (double)buf[i + j], (double)period[j]);
  }
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* Writes path atomically: tmp file, fsync, rename, fsync of the directory. */
static int write_atomic(const char *dir, const char *path, const void *a, size_t alen,
                        const void *b, size_t blen, char *err, size_t errlen) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "create %s: %s", tmp, strerror(errno));
    return -1;
  }
  if (write_all(fd, a, alen) < 0 || (blen && write_all(fd, b, blen) < 0) || fsync(fd) < 0) {
    snprintf(err, errlen, "write %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return -1;
  }
  if (close(fd) < 0 || rename(tmp, path) < 0 || fsync_dir(dir) < 0) {
    snprintf(err, errlen, "commit %s: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int mkdir_p(const char *dir) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", dir);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* Parses a `latest` marker, trimmed: "N" or "N attempt=A" (A > 0). */
static int parse_marker(char *s, long *step, long *attempt) {
  *attempt = 0;
  char *sp = s;
  while (*sp >= '0' && *sp <= '9') sp++;
  if (sp == s) return -1;
  char *rest = NULL;
  if (*sp) {
    if (*sp != ' ' && *sp != '\t') return -1;
    *sp++ = 0;
    while (*sp == ' ' || *sp == '\t') sp++;
    rest = sp;
  }
  if (parse_long(s, step) < 0 || *step < 0) return -1;
  if (rest) {
    if (strncmp(rest, "attempt=", 8) != 0 || rest[8] < '0' || rest[8] > '9') return -1;
    if (parse_long(rest + 8, attempt) < 0 || *attempt <= 0 || *attempt > 4294967295L) return -1;
  }
  return 0;
}

/* Reads and trims the marker into buf; returns its length, -1 when there is
 * none, -2 on a read error (errno set). */
static ssize_t read_marker(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? -1 : -2;
  ssize_t n;
  do n = read(fd, buf, size - 1);
  while (n < 0 && errno == EINTR);
  int saved = errno;
  close(fd);
  if (n < 0) {
    errno = saved;
    return -2;
  }
  buf[n] = 0;
  return n;
}

static void trim(char **s, char *e) {
  while (*s < e && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')) (*s)++;
  while (e > *s && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
}

/* Commits step as `latest`, refusing when a newer attempt already moved it:
 * a superseded rank must never cover its successor's checkpoint. */
static void commit_latest(const char *ckdir, long step) {
  char latest[4160], lock[4160], val[48], cur[64], err[4400] = "";
  snprintf(latest, sizeof latest, "%s/latest", ckdir);
  snprintf(lock, sizeof lock, "%s/latest.lock", ckdir);
  int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lfd < 0 || flock(lfd, LOCK_EX) < 0) fail(1, "checkpoint step %ld: lock %s: %s", step, lock, strerror(errno));
  ssize_t n = read_marker(latest, cur, sizeof cur);
  if (n >= 0 && g_attempt > 0) {
    char *s = cur;
    trim(&s, cur + n);
    long cur_step, cur_attempt;
    if (parse_marker(s, &cur_step, &cur_attempt) == 0 && cur_attempt > g_attempt) {
      fprintf(stderr, "ringtrain rank %d (%s): checkpoint step %ld refused: `latest` (step %ld) was committed by attempt %ld "
                      "and this rank belongs to attempt %ld, which is superseded; stopping\n",
              g_rank, g_job, step, cur_step, cur_attempt, g_attempt);
      exit(3);
    }
  }
  int len = g_attempt > 0 ? snprintf(val, sizeof val, "%ld attempt=%ld", step, g_attempt)
                          : snprintf(val, sizeof val, "%ld", step);
  if (write_atomic(ckdir, latest, val, (size_t)len, NULL, 0, err, sizeof err) < 0)
    fail(1, "checkpoint step %ld: %s", step, err);
  close(lfd);
}

static void checkpoint(ncclComm_t comm, const char *ckdir, long step, int rank, int world,
                       const uint64_t *state, size_t state_bytes) {
  double t0 = now_s();
  char dir[4096], path[4160], err[4400] = "";
  snprintf(dir, sizeof dir, "%s/step-%ld", ckdir, step);
  snprintf(path, sizeof path, "%s/rank-%d.bin", dir, rank);
  struct ckpt_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, CKPT_MAGIC, 8);
  h.version = CKPT_VERSION;
  h.rank = (uint32_t)rank;
  h.world = (uint32_t)world;
  h.step = (uint64_t)step;
  h.state_bytes = state_bytes;
  h.checksum = checksum(state, state_bytes / 8);
  snprintf(h.job, sizeof h.job, "%s", g_job);
  int ok = 1;
  if (mkdir_p(dir) < 0) {
    snprintf(err, sizeof err, "create %s: %s", dir, strerror(errno));
    ok = 0;
  } else if (write_atomic(dir, path, &h, sizeof h, state, state_bytes, err, sizeof err) < 0) {
    ok = 0;
  }
  if (!ok) fprintf(stderr, "ringtrain rank %d (%s): checkpoint step %ld: %s\n", rank, g_job, step, err);
  /* Every rank's file is durable before the marker moves. */
  int all_ok = ok;
  NCCLCHECK(ncclAllReduce(&ok, &all_ok, 1, ncclInt32, ncclMin, comm, NULL));
  stream_sync(comm);
  if (!all_ok) {
    fprintf(stderr, "ringtrain rank %d (%s): checkpoint step %ld failed on some rank; "
                    "`latest` not moved, training continues\n",
            rank, g_job, step);
    return;
  }
  if (rank == 0) commit_latest(ckdir, step);
  out("checkpoint step=%ld bytes=%zu seconds=%.3f\n", step, sizeof h + state_bytes, now_s() - t0);
}

/* Reads `latest`. Returns the step, or -1 when there is no marker. */
static long read_latest(const char *ckdir) {
  char path[4160], buf[64];
  snprintf(path, sizeof path, "%s/latest", ckdir);
  ssize_t n = read_marker(path, buf, sizeof buf);
  if (n == -1) return -1;
  if (n < 0) fail(1, "read %s: %s", path, strerror(errno));
  char *s = buf;
  int whole = n != (ssize_t)sizeof buf - 1 && strlen(buf) == (size_t)n;
  trim(&s, buf + n);
  long v, attempt;
  if (!whole || parse_marker(s, &v, &attempt) < 0)
    fail(1, "malformed checkpoint marker %s: want a step number (optionally \"attempt=N\" after it), got \"%.20s\"; "
            "fix or delete it, or set GPUCTL_RESUME_STEP",
         path, buf);
  return v;
}

/* Loads this rank's state at step. A file from a run with fewer ranks may be
 * missing; the state is replicated, so rank 0's then serves. */
static void load_checkpoint(const char *ckdir, long step, int rank, uint64_t *state,
                            size_t state_bytes) {
  char path[4160];
  snprintf(path, sizeof path, "%s/step-%ld/rank-%d.bin", ckdir, step, rank);
  int fd = open(path, O_RDONLY | O_CLOEXEC), file_rank = rank;
  if (fd < 0 && errno == ENOENT && rank != 0) {
    char alt[4160];
    snprintf(alt, sizeof alt, "%s/step-%ld/rank-0.bin", ckdir, step);
    int afd = open(alt, O_RDONLY | O_CLOEXEC);
    if (afd >= 0) {
      fprintf(stderr, "ringtrain rank %d (%s): %s is missing; loading the replicated state "
                      "from %s\n",
              rank, g_job, path, alt);
      snprintf(path, sizeof path, "%s", alt);
      fd = afd;
      file_rank = 0;
    } else {
      errno = ENOENT;
    }
  }
  if (fd < 0) fail(1, "cannot open checkpoint %s: %s", path, strerror(errno));
  struct ckpt_header h;
  ssize_t n = read(fd, &h, sizeof h);
  if (n != (ssize_t)sizeof h)
    fail(1, "checkpoint %s is truncated: %zd of %zu header bytes", path, n < 0 ? 0 : n, sizeof h);
  if (memcmp(h.magic, CKPT_MAGIC, 8) != 0)
    fail(1, "checkpoint %s is not a ringtrain checkpoint (bad magic)", path);
  if (h.version != CKPT_VERSION)
    fail(1, "checkpoint %s has format version %u; this ringtrain reads version %d", path,
         h.version, CKPT_VERSION);
  if (h.rank != (uint32_t)file_rank)
    fail(1, "checkpoint %s was written by rank %u, not rank %d", path, h.rank, file_rank);
  if (h.step != (uint64_t)step)
    fail(1, "checkpoint %s holds step %llu, expected %ld", path, (unsigned long long)h.step, step);
  if (h.state_bytes != state_bytes)
    fail(1, "checkpoint %s holds %llu bytes of state but --state-bytes is %zu; "
            "restart with --state-bytes %llu",
         path, (unsigned long long)h.state_bytes, state_bytes, (unsigned long long)h.state_bytes);
  size_t got = 0;
  while (got < state_bytes) {
    n = read(fd, (char *)state + got, state_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  char extra;
  ssize_t more = read(fd, &extra, 1);
  close(fd);
  if (got != state_bytes)
    fail(1, "checkpoint %s is truncated: %zu of %zu state bytes", path, got, state_bytes);
  if (more != 0) fail(1, "checkpoint %s has trailing bytes after the state", path);
  if (checksum(state, state_bytes / 8) != h.checksum)
    fail(1, "checkpoint %s is corrupt: checksum mismatch", path);
}

int main(int argc, char **argv) {
  struct opts o = parse_args(argc, argv);
  const char *job = getenv("GPUCTL_JOB");
  if (job && *job) g_job = job;
  const char *att = getenv("GPUCTL_ATTEMPT");
  if (att && *att && (parse_long(att, &g_attempt) < 0 || g_attempt < 0))
    fail(2, "GPUCTL_ATTEMPT=%s is not an attempt number", att);
  int world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  int rank = env_int("RANK", 0, 0, world - 1);
  int local_rank = env_int("LOCAL_RANK", rank, 0, 1 << 20);
  g_rank = rank;
  if (world == 1) { /* a single rank needs no rendezvous address */
    setenv("MASTER_ADDR", "127.0.0.1", 0);
    setenv("MASTER_PORT", "29500", 0);
  } else if (!getenv("MASTER_ADDR") || !getenv("MASTER_PORT")) {
    fail(2, "WORLD_SIZE=%d needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port)",
         world);
  }
  const char *ckdir = getenv("GPUCTL_CHECKPOINT_DIR");
  if (ckdir && !*ckdir) ckdir = NULL;
  g_kernel_dir = getenv("GPUCTL_SIM_KERNEL_DIR");
  if (g_kernel_dir && !*g_kernel_dir) g_kernel_dir = NULL;
  if (g_kernel_dir) {
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int gpu = cvd && *cvd >= '0' && *cvd <= '9' ? atoi(cvd) : local_rank;
    snprintf(g_speed_path, sizeof g_speed_path, "%s/gpu-%d.speed", g_kernel_dir, gpu);
  }

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  size_t count = o.bytes / 4, words = o.state_bytes / 8;
  float *buf = malloc(o.bytes);
  uint64_t *state = malloc(o.state_bytes);
  if (!buf || !state) fail(1, "out of memory for %zu + %zu bytes", o.bytes, o.state_bytes);

  out("start rank=%d world=%d local_rank=%d job=%s bytes=%zu state_bytes=%zu\n", rank, world,
      local_rank, g_job, o.bytes, o.state_bytes);

  /* Where to resume: GPUCTL_RESUME_STEP, else `latest`, else the beginning. */
  long resume = 0;
  const char *source = "fresh";
  const char *rs = getenv("GPUCTL_RESUME_STEP");
  long env_step = -1;
  if (rs && *rs && parse_long(rs, &env_step) < 0)
    fail(2, "GPUCTL_RESUME_STEP=%s is not an integer", rs);
  if (env_step >= 0) {
    resume = env_step;
    source = "GPUCTL_RESUME_STEP";
  } else if (ckdir) {
    long l = read_latest(ckdir);
    if (l >= 0) {
      resume = l;
      source = "latest";
    }
  }
  if (resume > 0 && !ckdir)
    fail(2, "GPUCTL_RESUME_STEP=%ld needs GPUCTL_CHECKPOINT_DIR to find the checkpoint", resume);
  if (o.steps > 0 && resume >= o.steps)
    fail(2, "resume step %ld is not before --steps %ld; nothing to do", resume, o.steps);

  /* Two communicators, as training frameworks keep a separate group for
   * control traffic: `comm` carries exactly one gradient all-reduce per
   * step, `ctrl` the resume agreement, the per-step signal vote and the
   * checkpoint barrier. Its rendezvous is at MASTER_PORT+1. */
  ncclUniqueId id, ctrl_id;
  ncclComm_t comm, ctrl;
  NCCLCHECK(ncclGetUniqueId(&id));
  NCCLCHECK(ncclCommInitRank(&comm, world, id, rank));
  {
    const char *mp = getenv("MASTER_PORT");
    long port = 0;
    if (!mp || parse_long(mp, &port) < 0 || port < 1 || port >= 65535)
      fail(2, "MASTER_PORT=%s must be a TCP port below 65535 (the control group uses MASTER_PORT+1)",
           mp ? mp : "");
    char saved[16], next[16];
    snprintf(saved, sizeof saved, "%ld", port);
    snprintf(next, sizeof next, "%ld", port + 1);
    setenv("MASTER_PORT", next, 1);
    NCCLCHECK(ncclGetUniqueId(&ctrl_id));
    setenv("MASTER_PORT", saved, 1);
  }
  NCCLCHECK(ncclCommInitRank(&ctrl, world, ctrl_id, rank));

  /* Every rank must resume from the same step. */
  int64_t agree[2] = {resume, -resume}, agreed[2];
  NCCLCHECK(ncclAllReduce(agree, agreed, 2, ncclInt64, ncclMax, ctrl, NULL));
  stream_sync(ctrl);
  if (agreed[0] != -agreed[1])
    fail(1, "ranks disagree on the resume step (this rank: %ld from %s; range %lld..%lld); "
            "set GPUCTL_RESUME_STEP on every rank",
         resume, source, (long long)-agreed[1], (long long)agreed[0]);

  init_state(state, words);
  if (resume > 0) load_checkpoint(ckdir, resume, rank, state, o.state_bytes);
  out("resume step=%ld source=%s\n", resume, source);

  const char *reason = "steps";
  long step = resume + 1;
  for (; o.steps == 0 || step <= o.steps; step++) {
    sim_hang("outside");
    double t0 = now_s();
    compute(o.compute_ms);
    fill_grad(buf, count, rank, step);
    NCCLCHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL));
    stream_sync(comm);
    verify(buf, count, step, world);
    update_state(state, words, step);

    /* Agree on signals: any rank asked means every rank acts this step. */
    int32_t flags[2] = {stop_requested, ckpt_requested}, any[2];
    NCCLCHECK(ncclAllReduce(flags, any, 2, ncclInt32, ncclMax, ctrl, NULL));
    stream_sync(ctrl);
    if (any[1]) ckpt_requested = 0;

    uint64_t digest = checksum(state, words);
    double loss = 2.5 / sqrt((double)step) + (double)(digest % 1000) * 1e-5;
    out("step %ld loss=%.6f state=%016llx step_ms=%.1f\n", step, loss,
        (unsigned long long)digest, (now_s() - t0) * 1000);

    int want_ckpt = any[1] || (o.ckpt_interval > 0 && step % o.ckpt_interval == 0);
    if (want_ckpt) {
      if (ckdir)
        checkpoint(ctrl, ckdir, step, rank, world, state, o.state_bytes);
      else
        fprintf(stderr, "ringtrain rank %d (%s): checkpoint at step %ld skipped: "
                        "GPUCTL_CHECKPOINT_DIR is not set\n",
                rank, g_job, step);
    }
    if (any[0]) {
      reason = "signal";
      break;
    }
  }
  if (step > o.steps && o.steps > 0) step = o.steps;
  out("stop step=%ld reason=%s\n", step, reason);
  ncclCommDestroy(ctrl);
  ncclCommDestroy(comm);
  free(buf);
  free(state);
  return 0;
}
