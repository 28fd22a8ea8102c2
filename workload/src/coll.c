/*
 * coll.c: ring algorithms over the transfer engine.
 *
 * All-reduce is reduce-scatter then all-gather around the ring (2(n-1)/n of
 * the buffer crosses each link, as in NCCL's ring algorithm). Chunks are split
 * as evenly as the count allows, so any count works, including count < nranks
 * (some chunks are then empty). Each ring step is cut into slices of at most
 * SLICE_BYTES so the scratch buffer stays small. Broadcast and reduce are
 * pipelined chains along the ring.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SLICE_BYTES (1u << 20)

ncclResult_t scratch_reserve(struct ncclComm *comm, size_t len) {
  if (len <= comm->scratch_len) return ncclSuccess;
  char *p = realloc(comm->scratch, len);
  if (!p) {
    comm_error(comm, "out of memory allocating %zu bytes of scratch", len);
    return ncclSystemError;
  }
  comm->scratch = p;
  comm->scratch_len = len;
  return ncclSuccess;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Element offset of chunk i when count elements are split into n chunks. */
static size_t chunk_off(size_t count, int n, int i) {
  size_t q = count / (size_t)n, r = count % (size_t)n;
  return q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

static size_t chunk_len(size_t count, int n, int i) {
  return chunk_off(count, n, i + 1) - chunk_off(count, n, i);
}

static void set_xfer(struct xfer *x, int fd, int is_send, void *buf, size_t len, int peer) {
  memset(x, 0, sizeof *x);
  x->fd = fd;
  x->is_send = is_send;
  x->buf = buf;
  x->len = len;
  x->peer = peer;
}

static int next_rank(const struct ncclComm *c) { return (c->rank + 1) % c->nranks; }
static int prev_rank(const struct ncclComm *c) { return (c->rank + c->nranks - 1) % c->nranks; }

/* Sends one byte range to next while receiving another from prev. */
static ncclResult_t exchange(struct ncclComm *c, const void *sbuf, size_t slen, void *rbuf,
                             size_t rlen) {
  struct xfer x[2];
  set_xfer(&x[0], c->next_fd, 1, (void *)sbuf, slen, next_rank(c));
  set_xfer(&x[1], c->prev_fd, 0, rbuf, rlen, prev_rank(c));
  return run_xfers(c, x, 2);
}

/*
 * Reduce-scatter phase in place on buf: afterwards rank r holds chunk r fully
 * reduced. At step s rank r sends chunk r-s-1 (which it received and reduced
 * at step s-1) and receives chunk r-s-2 from prev.
 */
static ncclResult_t ring_reduce_scatter(struct ncclComm *c, char *buf, size_t count,
                                        ncclDataType_t t, ncclRedOp_t op) {
  int n = c->nranks, r = c->rank;
  size_t es = dtype_size(t), slice = SLICE_BYTES / es;
  ncclResult_t rc = scratch_reserve(c, slice * es);
  if (rc != ncclSuccess) return rc;
  for (int s = 0; s < n - 1; s++) {
    int sc = mod(r - s - 1, n), rcv = mod(r - s - 2, n);
    size_t soff = chunk_off(count, n, sc), slen = chunk_len(count, n, sc);
    size_t roff = chunk_off(count, n, rcv), rlen = chunk_len(count, n, rcv);
    for (size_t k = 0; k < slen || k < rlen; k += slice) {
      size_t sl = k < slen ? (slen - k < slice ? slen - k : slice) : 0;
      size_t rl = k < rlen ? (rlen - k < slice ? rlen - k : slice) : 0;
      rc = exchange(c, buf + (soff + k) * es, sl * es, c->scratch, rl * es);
      if (rc != ncclSuccess) return rc;
      reduce_into(buf + (roff + k) * es, c->scratch, rl, t, op);
    }
  }
  return ncclSuccess;
}

/* All-gather phase in place on buf, starting with rank r holding chunk r. */
static ncclResult_t ring_all_gather(struct ncclComm *c, char *buf, size_t count, size_t es) {
  int n = c->nranks, r = c->rank;
  for (int s = 0; s < n - 1; s++) {
    int sc = mod(r - s, n), rcv = mod(r - s - 1, n);
    ncclResult_t rc =
        exchange(c, buf + chunk_off(count, n, sc) * es, chunk_len(count, n, sc) * es,
                 buf + chunk_off(count, n, rcv) * es, chunk_len(count, n, rcv) * es);
    if (rc != ncclSuccess) return rc;
  }
  return ncclSuccess;
}

static ncclResult_t all_reduce(struct ncclComm *c, const struct op *o) {
  size_t es = dtype_size(o->dtype);
  char *buf = o->recvbuff;
  if (o->sendbuff != o->recvbuff) memmove(buf, o->sendbuff, o->count * es);
  if (c->nranks == 1) return ncclSuccess;
  ncclResult_t rc = ring_reduce_scatter(c, buf, o->count, o->dtype, o->redop);
  if (rc != ncclSuccess) return rc;
  if (o->redop == ncclAvg) {
    size_t off = chunk_off(o->count, c->nranks, c->rank);
    divide_by(buf + off * es, chunk_len(o->count, c->nranks, c->rank), o->dtype, c->nranks);
  }
  return ring_all_gather(c, buf, o->count, es);
}

static ncclResult_t reduce_scatter(struct ncclComm *c, const struct op *o) {
  size_t es = dtype_size(o->dtype), total = o->count * (size_t)c->nranks;
  if (c->nranks == 1) {
    memmove(o->recvbuff, o->sendbuff, o->count * es);
    return ncclSuccess;
  }
  /* Work on a private copy: sendbuff must not change, and recvbuff may alias
   * this rank's chunk of it (NCCL's in-place convention). */
  char *copy = malloc(total * es + 1);
  if (!copy) {
    comm_error(c, "out of memory allocating %zu bytes", total * es);
    return ncclSystemError;
  }
  memcpy(copy, o->sendbuff, total * es);
  ncclResult_t rc = ring_reduce_scatter(c, copy, total, o->dtype, o->redop);
  if (rc == ncclSuccess) {
    char *mine = copy + (size_t)c->rank * o->count * es;
    if (o->redop == ncclAvg) divide_by(mine, o->count, o->dtype, c->nranks);
    memcpy(o->recvbuff, mine, o->count * es);
  }
  free(copy);
  return rc;
}

static ncclResult_t all_gather(struct ncclComm *c, const struct op *o) {
  size_t es = dtype_size(o->dtype);
  char *buf = o->recvbuff, *mine = buf + (size_t)c->rank * o->count * es;
  if (o->sendbuff != mine) memmove(mine, o->sendbuff, o->count * es);
  if (c->nranks == 1) return ncclSuccess;
  return ring_all_gather(c, buf, o->count * (size_t)c->nranks, es);
}

/* Chain root -> root+1 -> ... -> root-1, slice by slice, forwarding slice k
 * while slice k+1 arrives. */
static ncclResult_t broadcast(struct ncclComm *c, const struct op *o) {
  size_t bytes = o->count * dtype_size(o->dtype);
  int n = c->nranks, pos = mod(c->rank - o->root, n);
  char *buf = o->recvbuff;
  if (pos == 0 && o->sendbuff != o->recvbuff) memmove(buf, o->sendbuff, bytes);
  if (n == 1 || bytes == 0) return ncclSuccess;
  struct xfer x[2];
  if (pos == 0) {
    set_xfer(&x[0], c->next_fd, 1, buf, bytes, next_rank(c));
    return run_xfers(c, x, 1);
  }
  size_t first = bytes < SLICE_BYTES ? bytes : SLICE_BYTES;
  set_xfer(&x[0], c->prev_fd, 0, buf, pos == n - 1 ? bytes : first, prev_rank(c));
  ncclResult_t rc = run_xfers(c, x, 1);
  if (rc != ncclSuccess || pos == n - 1) return rc;
  for (size_t off = 0; off < bytes; off += SLICE_BYTES) {
    size_t len = bytes - off < SLICE_BYTES ? bytes - off : SLICE_BYTES;
    size_t noff = off + len, nlen = bytes - noff < SLICE_BYTES ? bytes - noff : SLICE_BYTES;
    set_xfer(&x[0], c->next_fd, 1, buf + off, len, next_rank(c));
    set_xfer(&x[1], c->prev_fd, 0, buf + noff, nlen, prev_rank(c));
    if ((rc = run_xfers(c, x, noff < bytes ? 2 : 1)) != ncclSuccess) return rc;
  }
  return ncclSuccess;
}

/* Chain root+1 -> root+2 -> ... -> root, each rank adding its contribution,
 * slice by slice, forwarding slice k while slice k+1 arrives. */
static ncclResult_t reduce(struct ncclComm *c, const struct op *o) {
  size_t es = dtype_size(o->dtype), bytes = o->count * es;
  size_t slice = (SLICE_BYTES / es) * es;
  int n = c->nranks, pos = mod(c->rank - o->root - 1, n);
  const char *mine = o->sendbuff;
  if (n == 1) {
    memmove(o->recvbuff, o->sendbuff, bytes);
    return ncclSuccess;
  }
  if (bytes == 0) return ncclSuccess;
  struct xfer x[2];
  if (pos == 0) {
    set_xfer(&x[0], c->next_fd, 1, (void *)mine, bytes, next_rank(c));
    return run_xfers(c, x, 1);
  }
  ncclResult_t rc = scratch_reserve(c, 2 * slice);
  if (rc != ncclSuccess) return rc;
  char *tmp = c->scratch, *acc = c->scratch + slice;
  if (pos == n - 1) { /* the root: accumulate straight into recvbuff */
    char *out = o->recvbuff;
    if (o->sendbuff != o->recvbuff) memmove(out, mine, bytes);
    for (size_t off = 0; off < bytes; off += slice) {
      size_t len = bytes - off < slice ? bytes - off : slice;
      set_xfer(&x[0], c->prev_fd, 0, tmp, len, prev_rank(c));
      if ((rc = run_xfers(c, x, 1)) != ncclSuccess) return rc;
      reduce_into(out + off, tmp, len / es, o->dtype, o->redop);
    }
    if (o->redop == ncclAvg) divide_by(out, o->count, o->dtype, n);
    return ncclSuccess;
  }
  size_t first = bytes < slice ? bytes : slice;
  set_xfer(&x[0], c->prev_fd, 0, tmp, first, prev_rank(c));
  if ((rc = run_xfers(c, x, 1)) != ncclSuccess) return rc;
  for (size_t off = 0; off < bytes; off += slice) {
    size_t len = bytes - off < slice ? bytes - off : slice;
    size_t noff = off + len, nlen = bytes - noff < slice ? bytes - noff : slice;
    memcpy(acc, mine + off, len);
    reduce_into(acc, tmp, len / es, o->dtype, o->redop);
    set_xfer(&x[0], c->next_fd, 1, acc, len, next_rank(c));
    set_xfer(&x[1], c->prev_fd, 0, tmp, nlen, prev_rank(c));
    if ((rc = run_xfers(c, x, noff < bytes ? 2 : 1)) != ncclSuccess) return rc;
  }
  return ncclSuccess;
}

ncclResult_t run_collective(const struct op *o) {
  struct ncclComm *c = o->comm;
  switch (o->kind) {
    case OP_ALLREDUCE: return all_reduce(c, o);
    case OP_ALLGATHER: return all_gather(c, o);
    case OP_REDUCESCATTER: return reduce_scatter(c, o);
    case OP_BROADCAST: return broadcast(c, o);
    case OP_REDUCE: return reduce(c, o);
    default:
      comm_error(c, "internal: operation %d is not a collective", (int)o->kind);
      return ncclInternalError;
  }
}

/* A message's 8-byte length header arrived: it must match the posted receive,
 * which is the transfer right after it. */
static ncclResult_t check_header(struct ncclComm *c, struct xfer *x) {
  uint64_t sent;
  memcpy(&sent, x->buf, sizeof sent);
  if (sent != x[1].len) {
    comm_error(c, "rank %d sent %llu bytes but this rank posted a receive of %zu bytes "
                  "(ncclSend and ncclRecv counts and types must match)",
               x->peer, (unsigned long long)sent, x[1].len);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/*
 * Runs a batch of sends and receives together: every message to or from a
 * peer moves concurrently through one poll loop, so any pattern that NCCL
 * allows inside a group (rings, all-to-all, both directions at once) completes
 * without deadlock. Messages to one peer keep their order.
 */
ncclResult_t run_p2p(struct ncclComm *c, const struct op *ops, int nops) {
  int n = c->nranks;
  int *peers = calloc((size_t)n, sizeof *peers);
  int *need = calloc((size_t)n, sizeof *need);
  struct xfer *x = calloc((size_t)nops * 2 + 1, sizeof *x);
  uint64_t *hdr = calloc((size_t)nops + 1, sizeof *hdr);
  int npeers = 0, nx = 0;
  ncclResult_t rc = ncclSuccess;
  if (!peers || !need || !x || !hdr) {
    comm_error(c, "out of memory");
    rc = ncclSystemError;
    goto out;
  }
  /* Messages to self: the k-th send pairs with the k-th receive. */
  int si = 0, ri = 0;
  for (;;) {
    while (si < nops && !(ops[si].kind == OP_SEND && ops[si].root == c->rank)) si++;
    while (ri < nops && !(ops[ri].kind == OP_RECV && ops[ri].root == c->rank)) ri++;
    if (si == nops && ri == nops) break;
    if (si == nops || ri == nops) {
      comm_error(c, "an ncclSend to self needs a matching ncclRecv from self in the same group");
      rc = ncclInvalidUsage;
      goto out;
    }
    size_t sb = ops[si].count * dtype_size(ops[si].dtype);
    size_t rb = ops[ri].count * dtype_size(ops[ri].dtype);
    if (sb != rb) {
      comm_error(c, "ncclSend to self of %zu bytes does not match ncclRecv of %zu bytes", sb, rb);
      rc = ncclInvalidUsage;
      goto out;
    }
    memmove(ops[ri].recvbuff, ops[si].sendbuff, sb);
    si++;
    ri++;
  }
  for (int i = 0; i < nops; i++) {
    int p = ops[i].root;
    if (p != c->rank && !need[p]) {
      need[p] = 1;
      peers[npeers++] = p;
    }
  }
  if ((rc = peer_connect(c, peers, npeers)) != ncclSuccess) goto out;
  for (int i = 0; i < nops; i++) {
    const struct op *o = &ops[i];
    if (o->root == c->rank) continue;
    size_t bytes = o->count * dtype_size(o->dtype);
    int fd = c->peer_fds[o->root];
    if (o->kind == OP_SEND) {
      hdr[i] = bytes;
      set_xfer(&x[nx++], fd, 1, &hdr[i], sizeof hdr[i], o->root);
      set_xfer(&x[nx++], fd, 1, (void *)o->sendbuff, bytes, o->root);
    } else {
      set_xfer(&x[nx], fd, 0, &hdr[i], sizeof hdr[i], o->root);
      x[nx++].on_done = check_header;
      set_xfer(&x[nx++], fd, 0, o->recvbuff, bytes, o->root);
    }
  }
  rc = run_xfers(c, x, nx);
out:
  free(peers);
  free(need);
  free(x);
  free(hdr);
  return rc;
}
