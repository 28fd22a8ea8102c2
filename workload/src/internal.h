/*
 * internal.h: declarations shared by the library's translation units. Nothing
 * here is exported: the library is built with -fvisibility=hidden and only the
 * NCCL API in nccl.h carries default visibility.
 */
#ifndef GPUCTL_NCCL_INTERNAL_H_
#define GPUCTL_NCCL_INTERNAL_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"
#include "nccl_profiler.h"

#define NCCL_API __attribute__((visibility("default")))

/* The unique id as this library lays it out inside ncclUniqueId.internal. */
#define ID_MAGIC 0x4449474e43435047ULL /* "GPCCNGID" little-endian */
struct bootstrap_id {
  uint64_t magic;
  uint32_t version;
  uint32_t addrlen;
  unsigned char addr[28]; /* root's listening address: sockaddr_in or sockaddr_in6 */
};
_Static_assert(sizeof(struct bootstrap_id) <= NCCL_UNIQUE_ID_BYTES, "id too large");

enum conn_kind { CONN_RING = 1, CONN_P2P = 2 };

enum comm_state { COMM_PENDING = 0, COMM_READY = 1, COMM_FAILED = 2 };

struct ncclComm {
  int rank;
  int nranks;
  enum comm_state state;
  ncclResult_t async_error;
  struct sockaddr_storage root_addr; /* from the unique id */
  socklen_t root_len;

  int listen_fd;                    /* this rank's ephemeral listener */
  struct sockaddr_storage *addrs;   /* every rank's listener, from the root */
  socklen_t *addrlens;
  int next_fd, prev_fd;             /* ring: send to next, receive from prev */
  int *peer_fds;                    /* p2p connections by rank, -1 if none */

  char *scratch;                    /* reusable temporary buffer */
  size_t scratch_len;
  int timeout_s;                    /* bootstrap and connection set-up */
  char last_error[256];

  /* The profiler plugin's context for this communicator (prof.c). */
  void *prof_ctx;
  int prof_mask; /* events the plugin asked for; 0 without one */
  uint64_t prof_hash;
  uint64_t prof_seq; /* collectives enqueued, from 0, as NCCL's seqNumber */

  /* The communicator's "stream" when calls complete asynchronously: one
   * worker thread runs what the calls enqueued, in order. */
  pthread_t stream;
  int stream_started;
  int stream_stop;
  struct stream_op *queue_head, *queue_tail;
};

/* One queued or immediate operation. */
enum op_kind {
  OP_INIT,
  OP_ALLREDUCE,
  OP_ALLGATHER,
  OP_REDUCESCATTER,
  OP_BROADCAST,
  OP_REDUCE,
  OP_SEND,
  OP_RECV,
};

struct op {
  enum op_kind kind;
  struct ncclComm *comm;
  const void *sendbuff;
  void *recvbuff;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t redop;
  int root; /* root for broadcast/reduce, peer for send/recv */
  void *prof; /* the profiler's Coll event, NULL without one */
};

struct stream_op {
  struct op op;
  struct stream_op *next;
};

/* Errors: record on the comm and print to stderr. */
void comm_error(struct ncclComm *comm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void lib_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* dtype.c */
size_t dtype_size(ncclDataType_t t);
const char *dtype_name(ncclDataType_t t);
/* dst[i] = dst[i] op src[i] */
void reduce_into(void *dst, const void *src, size_t count, ncclDataType_t t, ncclRedOp_t op);
/* buf[i] = buf[i] / n, for ncclAvg */
void divide_by(void *buf, size_t count, ncclDataType_t t, int n);
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

/* net.c */
int env_timeout_s(void);
ncclResult_t id_from_env(struct bootstrap_id *id);
ncclResult_t bootstrap(struct ncclComm *comm);
ncclResult_t peer_connect(struct ncclComm *comm, const int *peers, int npeers);
ncclResult_t comm_fail(struct ncclComm *comm, ncclResult_t rc);
void comm_close_sockets(struct ncclComm *comm, int clean);

/* A directional byte transfer on a non-blocking socket. Transfers sharing an
 * fd and direction run in array order; everything else runs concurrently. */
struct xfer {
  int fd;
  int is_send;
  char *buf;
  size_t len;
  size_t done;
  int peer; /* rank at the other end, for messages */
  int fin;  /* done and on_done has run */
  /* Called when the transfer completes; an error fails the whole set. */
  ncclResult_t (*on_done)(struct ncclComm *comm, struct xfer *x);
};
ncclResult_t run_xfers(struct ncclComm *comm, struct xfer *x, int n);

/* coll.c */
ncclResult_t scratch_reserve(struct ncclComm *comm, size_t len);
ncclResult_t run_collective(const struct op *op);
ncclResult_t run_p2p(struct ncclComm *comm, const struct op *ops, int nops);

/* prof.c */
void prof_comm_init(struct ncclComm *c);
void prof_comm_fini(struct ncclComm *c);
void *prof_coll_start(struct ncclComm *c, const struct op *o);
void *prof_kernel_start(struct ncclComm *c, void *coll);
void prof_stop(void *event);

#endif /* GPUCTL_NCCL_INTERNAL_H_ */
