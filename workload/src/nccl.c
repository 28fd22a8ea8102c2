/*
 * nccl.c: the exported NCCL API. Each entry point validates its arguments
 * and then either runs the operation or, between ncclGroupStart and
 * ncclGroupEnd, queues it. Entry points never call each other, so one call by
 * the application is exactly one hit on the symbol's uprobe.
 *
 * With REFNCCL_ASYNC=1 a collective outside a group completes the way
 * it does on a GPU: the call enqueues it on its communicator's stream (a
 * worker thread) and returns, and the application waits for it with
 * cudaStreamSynchronize, which this library provides for that (see
 * cudasync.h). Grouped calls run at ncclGroupEnd, as before.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "simhang.h"

/* Group state is per thread, as in NCCL. */
static __thread int group_depth;
static __thread struct op *group_ops;
static __thread int group_n, group_cap;
static __thread char thread_last_error[256];

/* Operations enqueued on any stream and not yet complete, for
 * cudaStreamSynchronize. */
static pthread_mutex_t stream_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stream_cv = PTHREAD_COND_INITIALIZER;
static long stream_pending;

static int async_mode(void) {
  static int mode = -1;
  if (mode < 0) {
    const char *v = getenv("REFNCCL_ASYNC");
    mode = v && strcmp(v, "1") == 0;
  }
  return mode;
}

void lib_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_last_error, sizeof thread_last_error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "gpuctl-nccl: %s\n", thread_last_error);
}

void comm_error(struct ncclComm *comm, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(comm->last_error, sizeof comm->last_error, fmt, ap);
  va_end(ap);
  snprintf(thread_last_error, sizeof thread_last_error, "%s", comm->last_error);
  fprintf(stderr, "gpuctl-nccl: rank %d/%d: %s\n", comm->rank, comm->nranks, comm->last_error);
}

/* After a transport failure the byte streams between ranks are out of step,
 * so the communicator is unusable until it is destroyed. */
ncclResult_t comm_fail(struct ncclComm *comm, ncclResult_t rc) {
  if (rc == ncclSystemError || rc == ncclRemoteError || rc == ncclInternalError ||
      (rc == ncclInvalidUsage && comm->state == COMM_READY)) {
    comm->state = COMM_FAILED;
    if (comm->async_error == ncclSuccess) comm->async_error = rc;
  }
  return rc;
}

static int is_reducing(enum op_kind k) {
  return k == OP_ALLREDUCE || k == OP_REDUCESCATTER || k == OP_REDUCE;
}

static const char *op_name(enum op_kind k) {
  static const char *names[] = {"ncclCommInitRank", "ncclAllReduce", "ncclAllGather",
                                "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
                                "ncclSend",          "ncclRecv"};
  return names[k];
}

static ncclResult_t validate(const struct op *o) {
  const char *name = op_name(o->kind);
  struct ncclComm *c = o->comm;
  if (!c) {
    lib_error("%s: comm is NULL", name);
    return ncclInvalidArgument;
  }
  if (c->state == COMM_FAILED) {
    snprintf(thread_last_error, sizeof thread_last_error,
             "%s: communicator failed earlier (%.180s); destroy it and create a new one", name,
             c->last_error);
    return c->async_error != ncclSuccess ? c->async_error : ncclInvalidUsage;
  }
  if (c->state == COMM_PENDING && group_depth == 0) {
    comm_error(c, "%s: communicator is not initialized yet (its ncclCommInitRank is inside a "
                  "group that has not ended)",
               name);
    return ncclInvalidUsage;
  }
  if ((int)o->dtype < 0 || o->dtype >= ncclNumTypes) {
    comm_error(c, "%s: datatype %d is not an ncclDataType_t", name, (int)o->dtype);
    return ncclInvalidArgument;
  }
  if (is_reducing(o->kind) && ((int)o->redop < 0 || o->redop >= ncclNumOps)) {
    comm_error(c, "%s: reduction op %d is not an ncclRedOp_t", name, (int)o->redop);
    return ncclInvalidArgument;
  }
  if ((o->kind == OP_BROADCAST || o->kind == OP_REDUCE || o->kind == OP_SEND ||
       o->kind == OP_RECV) &&
      (o->root < 0 || o->root >= c->nranks)) {
    comm_error(c, "%s: %s %d is outside 0..%d", name,
               o->kind == OP_SEND || o->kind == OP_RECV ? "peer" : "root", o->root,
               c->nranks - 1);
    return ncclInvalidArgument;
  }
  if (o->count > ((size_t)1 << 40)) {
    comm_error(c, "%s: count %zu is implausibly large", name, o->count);
    return ncclInvalidArgument;
  }
  if (o->count > 0) {
    int need_send = o->kind != OP_RECV && !(o->kind == OP_BROADCAST && o->root != c->rank);
    int need_recv = o->kind != OP_SEND && !(o->kind == OP_REDUCE && o->root != c->rank);
    if ((need_send && !o->sendbuff) || (need_recv && !o->recvbuff)) {
      comm_error(c, "%s: %s is NULL", name, need_send && !o->sendbuff ? "sendbuff" : "recvbuff");
      return ncclInvalidArgument;
    }
  }
  return ncclSuccess;
}

static ncclResult_t execute(struct op *o) {
  struct ncclComm *c = o->comm;
  ncclResult_t rc;
  switch (o->kind) {
    case OP_INIT:
      rc = bootstrap(c);
      if (rc == ncclSuccess) {
        c->state = COMM_READY;
        prof_comm_init(c);
      } else {
        c->state = COMM_FAILED;
        c->async_error = rc;
      }
      return rc;
    case OP_SEND:
    case OP_RECV:
      return comm_fail(c, run_p2p(c, o, 1));
    default: {
      /* The kernel's event spans the transfers and a simulated hang, so a
       * hung "kernel" is enqueued but never complete. */
      void *kernel = prof_kernel_start(c, o->prof);
      rc = run_collective(o);
      sim_hang("inside");
      prof_stop(kernel);
      return comm_fail(c, rc);
    }
  }
}

static void *stream_main(void *arg) {
  struct ncclComm *c = arg;
  pthread_mutex_lock(&stream_mu);
  for (;;) {
    while (!c->queue_head && !c->stream_stop) pthread_cond_wait(&stream_cv, &stream_mu);
    struct stream_op *so = c->queue_head;
    if (!so) break; /* stopping, and nothing left to run */
    pthread_mutex_unlock(&stream_mu);
    /* A failed communicator fails what is still queued, as a GPU stream
     * does after a fault; the error is the communicator's async error. */
    if (c->state != COMM_FAILED) execute(&so->op);
    pthread_mutex_lock(&stream_mu);
    c->queue_head = so->next;
    if (!c->queue_head) c->queue_tail = NULL;
    free(so);
    stream_pending--;
    pthread_cond_broadcast(&stream_cv);
  }
  pthread_mutex_unlock(&stream_mu);
  return NULL;
}

/* enqueue puts o on its communicator's stream, starting the stream's
 * thread on first use. */
static ncclResult_t enqueue(struct op *o) {
  struct ncclComm *c = o->comm;
  struct stream_op *so = malloc(sizeof *so);
  if (!so) {
    comm_error(c, "%s: out of memory enqueuing", op_name(o->kind));
    return ncclSystemError;
  }
  so->op = *o;
  so->next = NULL;
  pthread_mutex_lock(&stream_mu);
  if (!c->stream_started) {
    if (pthread_create(&c->stream, NULL, stream_main, c) != 0) {
      pthread_mutex_unlock(&stream_mu);
      free(so);
      comm_error(c, "%s: cannot start the communicator's stream thread", op_name(o->kind));
      return ncclSystemError;
    }
    c->stream_started = 1;
  }
  if (c->queue_tail)
    c->queue_tail->next = so;
  else
    c->queue_head = so;
  c->queue_tail = so;
  stream_pending++;
  pthread_cond_broadcast(&stream_cv);
  pthread_mutex_unlock(&stream_mu);
  return ncclSuccess;
}

/* stream_close runs what c's stream still holds and ends its thread. */
static void stream_close(struct ncclComm *c) {
  if (!c->stream_started) return;
  pthread_mutex_lock(&stream_mu);
  c->stream_stop = 1;
  pthread_cond_broadcast(&stream_cv);
  pthread_mutex_unlock(&stream_mu);
  pthread_join(c->stream, NULL);
  c->stream_started = 0;
}

/* cudaStreamSynchronize waits until every operation enqueued on any
 * communicator has completed; the reference library has one device, so
 * the stream named does not narrow it. Errors are the communicators'
 * (ncclCommGetAsyncError), as on a GPU. */
NCCL_API int cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  pthread_mutex_lock(&stream_mu);
  while (stream_pending > 0) pthread_cond_wait(&stream_cv, &stream_mu);
  pthread_mutex_unlock(&stream_mu);
  return 0;
}

static ncclResult_t submit(struct op *o) {
  ncclResult_t rc = validate(o);
  if (rc != ncclSuccess) return rc;
  int coll = o->kind != OP_SEND && o->kind != OP_RECV;
  if (coll) o->prof = prof_coll_start(o->comm, o);
  if (group_depth == 0 && coll && async_mode()) {
    rc = enqueue(o);
    prof_stop(o->prof); /* NCCL stops the Coll event once it is enqueued */
    return rc;
  }
  if (coll) prof_stop(o->prof);
  if (group_depth == 0) return execute(o);
  if (group_n == group_cap) {
    int cap = group_cap ? group_cap * 2 : 16;
    struct op *p = realloc(group_ops, sizeof *p * (size_t)cap);
    if (!p) {
      lib_error("%s: out of memory queuing a grouped call", op_name(o->kind));
      return ncclSystemError;
    }
    group_ops = p;
    group_cap = cap;
  }
  group_ops[group_n++] = *o;
  return ncclSuccess;
}

/* The queued operations of one communicator, run in order; consecutive
 * sends and receives run together. */
struct comm_batch {
  struct op *ops;
  int n;
  ncclResult_t rc;
};

static void *run_batch(void *arg) {
  struct comm_batch *b = arg;
  b->rc = ncclSuccess;
  for (int i = 0; i < b->n && b->rc == ncclSuccess;) {
    struct op *o = &b->ops[i];
    if (o->comm->state == COMM_FAILED) {
      b->rc = o->comm->async_error != ncclSuccess ? o->comm->async_error : ncclInvalidUsage;
      break;
    }
    if (o->kind == OP_SEND || o->kind == OP_RECV) {
      int j = i;
      while (j < b->n && (b->ops[j].kind == OP_SEND || b->ops[j].kind == OP_RECV)) j++;
      b->rc = comm_fail(o->comm, run_p2p(o->comm, o, j - i));
      i = j;
    } else {
      b->rc = execute(o);
      i++;
    }
  }
  return NULL;
}

NCCL_API ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) {
    lib_error("ncclGroupEnd without a matching ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--group_depth > 0) return ncclSuccess;
  struct op *ops = group_ops;
  int n = group_n;
  group_ops = NULL;
  group_n = group_cap = 0;
  if (n == 0) return ncclSuccess;

  /* Stable partition by communicator. Several communicators in one group
   * (one process driving several ranks) each get a thread, because each
   * one's transfers wait on the others. */
  struct op *sorted = malloc(sizeof *sorted * (size_t)n);
  struct comm_batch *batches = calloc((size_t)n, sizeof *batches);
  pthread_t *threads = calloc((size_t)n, sizeof *threads);
  int nb = 0;
  ncclResult_t rc = ncclSuccess;
  if (!sorted || !batches || !threads) {
    lib_error("ncclGroupEnd: out of memory");
    rc = ncclSystemError;
    goto out;
  }
  char *taken = calloc((size_t)n, 1);
  if (!taken) {
    rc = ncclSystemError;
    goto out;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (taken[i]) continue;
    batches[nb].ops = &sorted[k];
    for (int j = i; j < n; j++) {
      if (!taken[j] && ops[j].comm == ops[i].comm) {
        sorted[k++] = ops[j];
        taken[j] = 1;
        batches[nb].n++;
      }
    }
    nb++;
  }
  free(taken);
  for (int b = 1; b < nb; b++) {
    if (pthread_create(&threads[b], NULL, run_batch, &batches[b]) != 0) {
      lib_error("ncclGroupEnd: cannot start a thread for communicator %d of %d", b + 1, nb);
      batches[b].ops = NULL; /* marks "not started" */
      batches[b].rc = ncclSystemError;
    }
  }
  run_batch(&batches[0]);
  for (int b = 1; b < nb; b++)
    if (batches[b].ops) pthread_join(threads[b], NULL);
  for (int b = 0; b < nb; b++)
    if (rc == ncclSuccess && batches[b].rc != ncclSuccess) rc = batches[b].rc;
out:
  free(ops);
  free(sorted);
  free(batches);
  free(threads);
  return rc;
}

NCCL_API ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) {
    lib_error("ncclGetUniqueId: uniqueId is NULL");
    return ncclInvalidArgument;
  }
  struct bootstrap_id id;
  ncclResult_t rc = id_from_env(&id);
  if (rc != ncclSuccess) return rc;
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, &id, sizeof id);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                       int rank) {
  if (!comm) {
    lib_error("ncclCommInitRank: comm is NULL");
    return ncclInvalidArgument;
  }
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    lib_error("ncclCommInitRank: rank %d of %d ranks is invalid (need 0 <= rank < nranks)", rank,
              nranks);
    return ncclInvalidArgument;
  }
  struct bootstrap_id id;
  memcpy(&id, commId.internal, sizeof id);
  if (id.magic != ID_MAGIC || id.version != 1 || id.addrlen == 0 ||
      id.addrlen > sizeof id.addr) {
    lib_error("ncclCommInitRank: the unique id was not made by this library's ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->rank = rank;
  c->nranks = nranks;
  memcpy(&c->root_addr, id.addr, id.addrlen);
  c->root_len = id.addrlen;
  c->listen_fd = c->next_fd = c->prev_fd = -1;
  c->timeout_s = env_timeout_s();
  c->addrs = calloc((size_t)nranks, sizeof *c->addrs);
  c->addrlens = calloc((size_t)nranks, sizeof *c->addrlens);
  c->peer_fds = malloc(sizeof *c->peer_fds * (size_t)nranks);
  if (!c->addrs || !c->addrlens || !c->peer_fds) {
    free(c->addrs);
    free(c->addrlens);
    free(c->peer_fds);
    free(c);
    return ncclSystemError;
  }
  for (int i = 0; i < nranks; i++) c->peer_fds[i] = -1;
  struct op o = {.kind = OP_INIT, .comm = c};
  *comm = c;
  if (group_depth > 0) return submit(&o);
  ncclResult_t rc = execute(&o);
  if (rc != ncclSuccess) {
    comm_close_sockets(c, 0);
    free(c->addrs);
    free(c->addrlens);
    free(c->peer_fds);
    free(c);
    *comm = NULL;
  }
  return rc;
}

static void comm_free(struct ncclComm *c, int clean) {
  if (!clean && c->stream_started) {
    /* Aborting: fail what is queued instead of running it. */
    c->state = COMM_FAILED;
  }
  stream_close(c);
  prof_comm_fini(c);
  comm_close_sockets(c, clean);
  free(c->addrs);
  free(c->addrlens);
  free(c->peer_fds);
  free(c->scratch);
  free(c);
}

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm_free(comm, comm->state == COMM_READY);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm_free(comm, 0);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || !asyncError) return ncclInvalidArgument;
  *asyncError = comm->async_error;
  return ncclSuccess;
}

NCCL_API const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (see the message on stderr)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

NCCL_API const char *ncclGetLastError(ncclComm_t comm) {
  if (comm && comm->last_error[0]) return comm->last_error;
  return thread_last_error;
}

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_ALLREDUCE, comm, sendbuff, recvbuff, count, datatype, op, 0, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm,
                                    cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_ALLGATHER, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_REDUCESCATTER, comm, sendbuff, recvbuff, recvcount, datatype, op, 0, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_BROADCAST, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_REDUCE, comm, sendbuff, recvbuff, count, datatype, op, root, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_SEND, comm, sendbuff, NULL, count, datatype, ncclSum, peer, NULL};
  return submit(&o);
}

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  struct op o = {OP_RECV, comm, NULL, recvbuff, count, datatype, ncclSum, peer, NULL};
  return submit(&o);
}
