/*
 * colltest: checks every collective x datatype x reduction op of libnccl.so.2
 * numerically against values computed here independently.
 *
 *   RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... colltest
 *       one rank of an n-rank check (start n processes)
 *   MASTER_ADDR=... MASTER_PORT=... colltest --local n
 *       n communicators in one process, created and driven through groups
 *
 * Inputs are small integers, so every sum and product is exact in every
 * datatype (bfloat16 included) and results must match bit for bit.
 * Exits 0 and prints "colltest ok checks=N" when everything matched.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* dtype_size and the half conversions, from dtype.c */
#include "nccl.h"

static int g_rank, g_n;
static long g_checks;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "colltest rank %d: FAIL: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

#define NCCLCHECK(call)                                                                   \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) die("%s returned %d (%s)", #call, r_, ncclGetErrorString(r_)); \
  } while (0)

static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

static int is_signed(ncclDataType_t t) {
  return t != ncclUint8 && t != ncclUint32 && t != ncclUint64;
}
static int is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

static void put(void *buf, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
    default: die("bad type");
  }
}

static double get(const void *buf, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return half_to_float(((const uint16_t *)buf)[i]);
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclBfloat16: return bf16_to_float(((const uint16_t *)buf)[i]);
    default: die("bad type");
  }
  return 0;
}

/* The input of rank r at element i for reduction op. */
static double input(int r, size_t i, ncclDataType_t t, ncclRedOp_t op) {
  if (op == ncclProd) {
    double v = (double)((r + i) % 3 + 1);
    return is_signed(t) && (r + i) % 5 == 0 ? -v : v;
  }
  int v = (int)((r * 5 + i * 3) % 7);
  return is_signed(t) ? v - 3 : v;
}

static double reduce_ref(int n, size_t i, ncclDataType_t t, ncclRedOp_t op) {
  double acc = input(0, i, t, op);
  for (int r = 1; r < n; r++) {
    double v = input(r, i, t, op);
    switch (op) {
      case ncclSum:
      case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      default: acc = v < acc ? v : acc; break;
    }
  }
  if (op != ncclAvg) return acc;
  if (!is_float(t)) return (double)((long long)acc / n); /* integer division truncates */
  if (t == ncclFloat64) return acc / n;
  return (double)((float)acc / (float)n);
}

static void *xmalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) die("out of memory");
  return p;
}

static void expect_equal(const void *got, const void *want, size_t count, ncclDataType_t t,
                         const char *what) {
  size_t es = dtype_size(t);
  for (size_t i = 0; i < count; i++) {
    if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0)
      die("%s: element %zu of %zu: got %g, want %g", what, i, count, get(got, i, t),
          get(want, i, t));
  }
  g_checks++;
}

static void check_all_reduce(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op, size_t count,
                             int in_place) {
  size_t es = dtype_size(t);
  char *send = xmalloc(count * es), *recv = xmalloc(count * es), *want = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) {
    put(send, i, t, input(g_rank, i, t, op));
    put(want, i, t, reduce_ref(g_n, i, t, op));
  }
  char what[128];
  snprintf(what, sizeof what, "allreduce %s %s count=%zu%s", dtype_name(t), op_names[op], count,
           in_place ? " in-place" : "");
  if (in_place) {
    NCCLCHECK(ncclAllReduce(send, send, count, t, op, comm, NULL));
    expect_equal(send, want, count, t, what);
  } else {
    NCCLCHECK(ncclAllReduce(send, recv, count, t, op, comm, NULL));
    expect_equal(recv, want, count, t, what);
  }
  free(send);
  free(recv);
  free(want);
}

static void check_reduce(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op, size_t count,
                         int root) {
  size_t es = dtype_size(t);
  char *send = xmalloc(count * es), *recv = xmalloc(count * es), *want = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) {
    put(send, i, t, input(g_rank, i, t, op));
    put(want, i, t, reduce_ref(g_n, i, t, op));
  }
  memset(recv, 0x5a, count * es);
  NCCLCHECK(ncclReduce(send, recv, count, t, op, root, comm, NULL));
  char what[128];
  snprintf(what, sizeof what, "reduce %s %s count=%zu root=%d", dtype_name(t), op_names[op],
           count, root);
  if (g_rank == root) expect_equal(recv, want, count, t, what);
  free(send);
  free(recv);
  free(want);
}

static void check_reduce_scatter(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op,
                                 size_t recvcount) {
  size_t es = dtype_size(t), total = recvcount * (size_t)g_n;
  char *send = xmalloc(total * es), *recv = xmalloc(recvcount * es), *want = xmalloc(recvcount * es);
  for (size_t i = 0; i < total; i++) put(send, i, t, input(g_rank, i, t, op));
  for (size_t i = 0; i < recvcount; i++)
    put(want, i, t, reduce_ref(g_n, (size_t)g_rank * recvcount + i, t, op));
  NCCLCHECK(ncclReduceScatter(send, recv, recvcount, t, op, comm, NULL));
  char what[128];
  snprintf(what, sizeof what, "reducescatter %s %s recvcount=%zu", dtype_name(t), op_names[op],
           recvcount);
  expect_equal(recv, want, recvcount, t, what);
  /* In place: recvbuff is this rank's chunk of sendbuff. */
  for (size_t i = 0; i < total; i++) put(send, i, t, input(g_rank, i, t, op));
  char *mine = send + (size_t)g_rank * recvcount * es;
  NCCLCHECK(ncclReduceScatter(send, mine, recvcount, t, op, comm, NULL));
  strncat(what, " in-place", sizeof what - strlen(what) - 1);
  expect_equal(mine, want, recvcount, t, what);
  free(send);
  free(recv);
  free(want);
}

static void check_all_gather(ncclComm_t comm, ncclDataType_t t, size_t sendcount) {
  size_t es = dtype_size(t), total = sendcount * (size_t)g_n;
  char *send = xmalloc(sendcount * es), *recv = xmalloc(total * es), *want = xmalloc(total * es);
  for (size_t i = 0; i < sendcount; i++) put(send, i, t, input(g_rank, i, t, ncclSum));
  for (int r = 0; r < g_n; r++)
    for (size_t i = 0; i < sendcount; i++)
      put(want, (size_t)r * sendcount + i, t, input(r, i, t, ncclSum));
  NCCLCHECK(ncclAllGather(send, recv, sendcount, t, comm, NULL));
  char what[128];
  snprintf(what, sizeof what, "allgather %s sendcount=%zu", dtype_name(t), sendcount);
  expect_equal(recv, want, total, t, what);
  memset(recv, 0, total * es);
  memcpy(recv + (size_t)g_rank * sendcount * es, send, sendcount * es);
  NCCLCHECK(ncclAllGather(recv + (size_t)g_rank * sendcount * es, recv, sendcount, t, comm, NULL));
  strncat(what, " in-place", sizeof what - strlen(what) - 1);
  expect_equal(recv, want, total, t, what);
  free(send);
  free(recv);
  free(want);
}

static void check_broadcast(ncclComm_t comm, ncclDataType_t t, size_t count, int root) {
  size_t es = dtype_size(t);
  char *buf = xmalloc(count * es), *want = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) {
    put(want, i, t, input(root, i, t, ncclSum));
    put(buf, i, t, g_rank == root ? input(root, i, t, ncclSum) : 1);
  }
  NCCLCHECK(ncclBroadcast(buf, buf, count, t, root, comm, NULL));
  char what[128];
  snprintf(what, sizeof what, "broadcast %s count=%zu root=%d", dtype_name(t), count, root);
  expect_equal(buf, want, count, t, what);
  free(buf);
  free(want);
}

/* Message size from rank a to rank b: differs per pair, some over 1 MiB so a
 * sequential blocking exchange would deadlock on full socket buffers. */
static size_t p2p_count(int a, int b) { return (size_t)((a * 7 + b * 3) % 5) * 90001 + 3; }

static void check_p2p(ncclComm_t comm) {
  int32_t **send = xmalloc(sizeof *send * (size_t)g_n), **recv = xmalloc(sizeof *recv * (size_t)g_n);
  for (int p = 0; p < g_n; p++) {
    size_t sc = p2p_count(g_rank, p), rc = p2p_count(p, g_rank);
    send[p] = xmalloc(sc * 4);
    recv[p] = xmalloc(rc * 4);
    for (size_t i = 0; i < sc; i++) send[p][i] = (int32_t)(g_rank * 1000003 + p * 1009 + (int)i);
  }
  /* All-to-all in one group, receives posted before sends on odd ranks. */
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < g_n; k++) {
    int p = (g_rank + k) % g_n;
    if (g_rank % 2) NCCLCHECK(ncclRecv(recv[p], p2p_count(p, g_rank), ncclInt32, p, comm, NULL));
    NCCLCHECK(ncclSend(send[p], p2p_count(g_rank, p), ncclInt32, p, comm, NULL));
    if (!(g_rank % 2)) NCCLCHECK(ncclRecv(recv[p], p2p_count(p, g_rank), ncclInt32, p, comm, NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int p = 0; p < g_n; p++) {
    size_t rc = p2p_count(p, g_rank);
    for (size_t i = 0; i < rc; i++)
      if (recv[p][i] != (int32_t)(p * 1000003 + g_rank * 1009 + (int)i))
        die("group send/recv from rank %d: element %zu: got %d", p, i, recv[p][i]);
    g_checks++;
  }
  /* Ring shift outside a group: small messages, blocking calls in an order
   * that cannot deadlock. */
  int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n;
  double out = g_rank + 0.5, in = -1;
  if (g_rank % 2 == 0) {
    NCCLCHECK(ncclSend(&out, 1, ncclFloat64, next, comm, NULL));
    NCCLCHECK(ncclRecv(&in, 1, ncclFloat64, prev, comm, NULL));
  } else {
    NCCLCHECK(ncclRecv(&in, 1, ncclFloat64, prev, comm, NULL));
    NCCLCHECK(ncclSend(&out, 1, ncclFloat64, next, comm, NULL));
  }
  if (in != prev + 0.5) die("ring send/recv: got %g from rank %d, want %g", in, prev, prev + 0.5);
  g_checks++;
  for (int p = 0; p < g_n; p++) {
    free(send[p]);
    free(recv[p]);
  }
  free(send);
  free(recv);
}

static void check_api(ncclComm_t comm) {
  int v = 0, n = 0, r = -1;
  NCCLCHECK(ncclGetVersion(&v));
  if (v != NCCL_VERSION_CODE) die("ncclGetVersion: got %d, want %d", v, NCCL_VERSION_CODE);
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &r));
  if (n != g_n || r != g_rank) die("count/rank: got %d/%d, want %d/%d", n, r, g_n, g_rank);
  float x = 1;
  struct {
    const char *what;
    ncclResult_t got, want;
  } cases[] = {
      {"bad datatype", ncclAllReduce(&x, &x, 1, (ncclDataType_t)42, ncclSum, comm, NULL),
       ncclInvalidArgument},
      {"bad op", ncclAllReduce(&x, &x, 1, ncclFloat, (ncclRedOp_t)9, comm, NULL),
       ncclInvalidArgument},
      {"bad root", ncclBroadcast(&x, &x, 1, ncclFloat, g_n, comm, NULL), ncclInvalidArgument},
      {"bad peer", ncclSend(&x, 1, ncclFloat, -1, comm, NULL), ncclInvalidArgument},
      {"NULL comm", ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, NULL, NULL),
       ncclInvalidArgument},
      {"NULL buffer", ncclAllReduce(NULL, &x, 1, ncclFloat, ncclSum, comm, NULL),
       ncclInvalidArgument},
      {"group end without start", ncclGroupEnd(), ncclInvalidUsage},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].got != cases[i].want)
      die("%s: got %d, want %d", cases[i].what, cases[i].got, cases[i].want);
    g_checks++;
  }
  if (strcmp(ncclGetErrorString(ncclRemoteError), "unknown result code") == 0 ||
      ncclGetLastError(comm)[0] == 0)
    die("error strings are missing");
}

/* Known half and bfloat16 encodings, including round-half-to-even ties. */
static void check_conversions(void) {
  struct {
    float f;
    uint16_t half, bf;
  } cases[] = {
      {1.0f, 0x3c00, 0x3f80},         {-2.0f, 0xc000, 0xc000},
      {65504.0f, 0x7bff, 0x4780},     {65520.0f, 0x7c00, 0x4780},
      {0x1p-24f, 0x0001, 0x3380},     {0x1p-25f, 0x0000, 0x3300},
      {1.0f + 0x1p-11f, 0x3c00, 0x3f80}, {1.0f + 0x3p-11f, 0x3c02, 0x3f80},
      {1.0f + 0x1p-8f, 0x3c04, 0x3f80},  {1.0f + 0x3p-8f, 0x3c0c, 0x3f82},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (float_to_half(cases[i].f) != cases[i].half)
      die("float_to_half(%a) = %#x, want %#x", cases[i].f, float_to_half(cases[i].f),
          cases[i].half);
    if (float_to_bf16(cases[i].f) != cases[i].bf)
      die("float_to_bf16(%a) = %#x, want %#x", cases[i].f, float_to_bf16(cases[i].f),
          cases[i].bf);
  }
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads may change */
    if (float_to_half(half_to_float((uint16_t)h)) != h) die("half %#x does not round-trip", h);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
    if (float_to_bf16(bf16_to_float((uint16_t)h)) != h) die("bf16 %#x does not round-trip", h);
  }
  g_checks++;
}

static void run_rank(ncclComm_t comm) {
  check_api(comm);
  static const size_t counts[] = {0, 1, 2, 3, 5, 17, 1000};
  for (int t = 0; t < ncclNumTypes; t++) {
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      for (int op = 0; op < ncclNumOps; op++) {
        check_all_reduce(comm, t, op, counts[c], (int)(c + op) % 2);
        check_reduce_scatter(comm, t, op, counts[c]);
        check_reduce(comm, t, op, counts[c], (int)(c + op) % g_n);
      }
      check_all_gather(comm, t, counts[c]);
      check_broadcast(comm, t, counts[c], (int)c % g_n);
    }
  }
  /* Large enough that ring chunks span several slices. */
  size_t big = ((size_t)1 << 18) * (size_t)g_n + 12345;
  check_all_reduce(comm, ncclFloat32, ncclSum, big, 0);
  check_all_reduce(comm, ncclBfloat16, ncclAvg, big, 1);
  check_reduce_scatter(comm, ncclInt64, ncclMax, big / (size_t)g_n);
  check_all_gather(comm, ncclUint8, big / 3);
  for (int root = 0; root < g_n; root++) {
    check_broadcast(comm, ncclFloat64, big / 4 + (size_t)root, root);
    check_reduce(comm, ncclInt32, ncclSum, big / 2 + (size_t)root, root);
  }
  check_p2p(comm);
}

struct local_rank {
  ncclComm_t comm;
  float *buf;
  size_t count;
};

/* n communicators in one process, as one process driving several GPUs does:
 * init, all-reduce and send/recv all inside groups. */
static void run_local(int n) {
  g_n = n;
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  struct local_rank *ranks = calloc((size_t)n, sizeof *ranks);
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) NCCLCHECK(ncclCommInitRank(&ranks[r].comm, n, id, r));
  NCCLCHECK(ncclGroupEnd());
  size_t count = 300001;
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    ranks[r].buf = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) ranks[r].buf[i] = (float)input(r, i, ncclFloat32, ncclSum);
    NCCLCHECK(ncclAllReduce(ranks[r].buf, ranks[r].buf, count, ncclFloat32, ncclSum,
                            ranks[r].comm, NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count; i++)
      if (ranks[r].buf[i] != (float)reduce_ref(n, i, ncclFloat32, ncclSum))
        die("local allreduce: comm %d element %zu: got %g", r, i, ranks[r].buf[i]);
    g_checks++;
  }
  /* Each comm sends its buffer to the next one. */
  float **in = xmalloc(sizeof *in * (size_t)n);
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    in[r] = xmalloc(count * sizeof(float));
    NCCLCHECK(ncclSend(ranks[r].buf, count, ncclFloat32, (r + 1) % n, ranks[r].comm, NULL));
    NCCLCHECK(ncclRecv(in[r], count, ncclFloat32, (r + n - 1) % n, ranks[r].comm, NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    if (memcmp(in[r], ranks[(r + n - 1) % n].buf, count * sizeof(float)) != 0)
      die("local send/recv: comm %d got the wrong data", r);
    g_checks++;
    free(in[r]);
  }
  for (int r = 0; r < n; r++) {
    NCCLCHECK(ncclCommDestroy(ranks[r].comm));
    free(ranks[r].buf);
  }
  free(in);
  free(ranks);
}

int main(int argc, char **argv) {
  check_conversions();
  if (argc == 3 && strcmp(argv[1], "--local") == 0) {
    int n = atoi(argv[2]);
    if (n < 1) die("--local needs a rank count >= 1");
    run_local(n);
    printf("colltest ok checks=%ld\n", g_checks);
    return 0;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p colltest\n"
                    "       MASTER_ADDR=a MASTER_PORT=p colltest --local n\n");
    return 2;
  }
  const char *rs = getenv("RANK"), *ns = getenv("WORLD_SIZE");
  if (!rs || !ns) die("RANK and WORLD_SIZE must be set");
  g_rank = atoi(rs);
  g_n = atoi(ns);
  ncclUniqueId id;
  ncclComm_t comm;
  NCCLCHECK(ncclGetUniqueId(&id));
  NCCLCHECK(ncclCommInitRank(&comm, g_n, id, g_rank));
  run_rank(comm);
  NCCLCHECK(ncclCommDestroy(comm));
  printf("colltest ok checks=%ld\n", g_checks);
  return 0;
}
