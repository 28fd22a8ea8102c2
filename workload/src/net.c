/*
 * net.c: TCP plumbing. Bootstrap (root rendezvous, address table, ring),
 * lazily opened peer connections, and the poll-driven transfer engine that
 * every collective and send/recv runs on.
 *
 * Every socket is non-blocking with TCP_NODELAY. Set-up steps (reaching the
 * root, waiting for ranks, connecting the ring) run under a deadline from
 * GPUCTL_NCCL_TIMEOUT_S; data transfers have none, so a stopped peer stalls
 * its neighbours until it resumes, and a dead one (socket closed) fails them.
 *
 * On a simulated host (GPUCTL_SIM_KERNEL_DIR set) the file link.speed there
 * may hold a fraction of full speed below 1: every transfer batch is then
 * paced (by a sleep) to that share of the best rate batches reach at full speed
 * (at most a nominal 1 GB/s),
 * as a degraded link would. The file is read at most every 100 ms.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define DEFAULT_TIMEOUT_S 60
#define HELLO_MAGIC 0x6f6c6c65684e4347ULL   /* "GCNhello" */
#define GOODBYE_MAGIC 0x657962646f6f4721ULL /* "!Goodbye" */

/* The first message on every connection: who is calling and why. */
struct hello {
  uint64_t magic;
  uint32_t kind; /* CONN_RING, CONN_P2P, or HELLO_BOOT */
  int32_t rank;
  int32_t nranks;
  uint32_t addrlen;
  struct sockaddr_storage addr; /* HELLO_BOOT: the sender's listener */
};
#define HELLO_BOOT 3

/* The root's answer to a HELLO_BOOT, followed by the table when status is 0. */
struct boot_reply {
  uint64_t magic;
  int32_t status;
  int32_t nranks;
  char message[160];
};

struct table_entry {
  uint32_t addrlen;
  uint32_t pad;
  struct sockaddr_storage addr;
};

int env_timeout_s(void) {
  const char *s = getenv("GPUCTL_NCCL_TIMEOUT_S");
  if (!s || !*s) return DEFAULT_TIMEOUT_S;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v <= 0 || v > 86400) {
    lib_error("GPUCTL_NCCL_TIMEOUT_S=%s is not a number of seconds in 1..86400; using %d", s,
              DEFAULT_TIMEOUT_S);
    return DEFAULT_TIMEOUT_S;
  }
  return (int)v;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before deadline (-1 deadline: wait forever). */
static int remaining_ms(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - now_ms();
  if (left < 0) return 0;
  return left > 1000000 ? 1000000 : (int)left;
}

static void fmt_addr(const struct sockaddr *sa, socklen_t len, char *out, size_t outlen) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    snprintf(out, outlen, "<unprintable address>");
    return;
  }
  if (sa->sa_family == AF_INET6)
    snprintf(out, outlen, "[%.64s]:%.8s", host, serv);
  else
    snprintf(out, outlen, "%.64s:%.8s", host, serv);
}

static void set_port(struct sockaddr_storage *ss, uint16_t port) {
  if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons(port);
}

static int tune_socket(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) return -1;
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
  return 0;
}

ncclResult_t id_from_env(struct bootstrap_id *id) {
  const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (!host || !*host || !port || !*port) {
    lib_error("ncclGetUniqueId: MASTER_ADDR and MASTER_PORT must be set to the address and "
              "port rank 0 listens on (for example MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)");
    return ncclInvalidUsage;
  }
  char *end;
  long p = strtol(port, &end, 10);
  if (*end || p < 1 || p > 65535) {
    lib_error("ncclGetUniqueId: MASTER_PORT=%s is not a TCP port (1..65535)", port);
    return ncclInvalidUsage;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0 || !res) {
    lib_error("ncclGetUniqueId: cannot resolve MASTER_ADDR=%s: %s", host, gai_strerror(rc));
    return ncclSystemError;
  }
  if (res->ai_addrlen > sizeof id->addr) {
    freeaddrinfo(res);
    lib_error("ncclGetUniqueId: MASTER_ADDR=%s has an unsupported address family", host);
    return ncclInvalidUsage;
  }
  memset(id, 0, sizeof *id);
  id->magic = ID_MAGIC;
  id->version = 1;
  id->addrlen = (uint32_t)res->ai_addrlen;
  memcpy(&id->addr, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return ncclSuccess;
}

/* Plain blocking-style I/O over a non-blocking socket, under a deadline. */
static ncclResult_t io_all(struct ncclComm *comm, int fd, void *buf, size_t len, int is_send,
                           int64_t deadline, const char *what) {
  char *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t r = is_send ? send(fd, p + done, len - done, MSG_NOSIGNAL)
                        : recv(fd, p + done, len - done, 0);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0) {
      comm_error(comm, "%s: connection closed by the other side", what);
      return ncclRemoteError;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      comm_error(comm, "%s: %s", what, strerror(errno));
      return (errno == ECONNRESET || errno == EPIPE) ? ncclRemoteError : ncclSystemError;
    }
    struct pollfd pfd = {.fd = fd, .events = is_send ? POLLOUT : POLLIN};
    int n = poll(&pfd, 1, remaining_ms(deadline));
    if (n < 0 && errno != EINTR) {
      comm_error(comm, "%s: poll: %s", what, strerror(errno));
      return ncclSystemError;
    }
    if (n == 0) {
      comm_error(comm, "%s: timed out after %d s (GPUCTL_NCCL_TIMEOUT_S)", what, comm->timeout_s);
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

static int listen_on(const struct sockaddr_storage *addr, socklen_t len, int reuse) {
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (const struct sockaddr *)addr, len) < 0 || listen(fd, 512) < 0 ||
      tune_socket(fd) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* Connects under a deadline, retrying while nobody listens yet (the root may
 * start after the other ranks). Returns a tuned fd, or -1 with errno set. */
static int connect_deadline(const struct sockaddr_storage *addr, socklen_t len, int64_t deadline) {
  int last = ETIMEDOUT;
  for (;;) {
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (tune_socket(fd) < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    int rc = connect(fd, (const struct sockaddr *)addr, len);
    if (rc < 0 && (errno == EINPROGRESS || errno == EINTR)) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int n;
      do n = poll(&pfd, 1, remaining_ms(deadline));
      while (n < 0 && errno == EINTR);
      if (n <= 0) {
        close(fd);
        errno = n == 0 ? last : errno;
        return -1;
      }
      int err = 0;
      socklen_t elen = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      rc = err ? -1 : 0;
      errno = err;
    }
    if (rc == 0) return fd;
    last = errno;
    close(fd);
    if (last != ECONNREFUSED && last != ECONNRESET && last != ETIMEDOUT && last != ENETUNREACH &&
        last != EHOSTUNREACH && last != ECONNABORTED) {
      errno = last;
      return -1;
    }
    if (remaining_ms(deadline) == 0) {
      errno = last;
      return -1;
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static ncclResult_t send_hello(struct ncclComm *comm, int fd, uint32_t kind, int64_t deadline,
                               const struct sockaddr_storage *addr, socklen_t addrlen) {
  struct hello h;
  memset(&h, 0, sizeof h);
  h.magic = HELLO_MAGIC;
  h.kind = kind;
  h.rank = comm->rank;
  h.nranks = comm->nranks;
  if (addr) {
    h.addrlen = addrlen;
    memcpy(&h.addr, addr, addrlen);
  }
  return io_all(comm, fd, &h, sizeof h, 1, deadline, "send hello");
}

/*
 * Accepts connections until one of kind `kind` from rank `want` arrives.
 * Peer connections from other ranks that arrive meanwhile are kept for later.
 * While waiting, the ring sockets are watched so that the death of a
 * neighbour ends the wait with an error instead of a hang.
 */
static int accept_from(struct ncclComm *comm, int want, uint32_t kind, int64_t deadline,
                       ncclResult_t *rc) {
  int watch_next = 1, watch_prev = 1;
  for (;;) {
    if (kind == CONN_P2P && comm->peer_fds[want] >= 0) {
      int fd = comm->peer_fds[want];
      return fd;
    }
    struct pollfd pfd[3] = {{.fd = comm->listen_fd, .events = POLLIN}};
    int np = 1;
    if (watch_next && comm->next_fd >= 0)
      pfd[np++] = (struct pollfd){.fd = comm->next_fd, .events = POLLRDHUP};
    if (watch_prev && comm->prev_fd >= 0)
      pfd[np++] = (struct pollfd){.fd = comm->prev_fd, .events = POLLRDHUP};
    int n = poll(pfd, np, remaining_ms(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      comm_error(comm, "waiting for rank %d to connect: poll: %s", want, strerror(errno));
      *rc = ncclSystemError;
      return -1;
    }
    if (n == 0) {
      comm_error(comm, "rank %d did not connect within %d s (GPUCTL_NCCL_TIMEOUT_S)", want,
                 comm->timeout_s);
      *rc = ncclSystemError;
      return -1;
    }
    for (int i = 1; i < np; i++) {
      if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        uint64_t bye = 0;
        if (recv(pfd[i].fd, &bye, sizeof bye, MSG_PEEK | MSG_DONTWAIT) == sizeof bye &&
            bye == GOODBYE_MAGIC) {
          /* The neighbour destroyed its communicator cleanly: stop watching. */
          if (pfd[i].fd == comm->next_fd) watch_next = 0;
          else watch_prev = 0;
          continue;
        }
        comm_error(comm, "waiting for rank %d to connect: ring neighbour rank %d closed its "
                         "connection (did it exit?)",
                   want, pfd[i].fd == comm->next_fd ? (comm->rank + 1) % comm->nranks
                                                    : (comm->rank + comm->nranks - 1) % comm->nranks);
        *rc = ncclRemoteError;
        return -1;
      }
    }
    if (!(pfd[0].revents & POLLIN)) continue;
    int fd = accept4(comm->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      comm_error(comm, "accept: %s", strerror(errno));
      *rc = ncclSystemError;
      return -1;
    }
    if (tune_socket(fd) < 0) {
      close(fd);
      continue;
    }
    struct hello h;
    int64_t hello_deadline = now_ms() + (int64_t)comm->timeout_s * 1000;
    if (io_all(comm, fd, &h, sizeof h, 0, hello_deadline, "read hello") != ncclSuccess ||
        h.magic != HELLO_MAGIC || h.nranks != comm->nranks || h.rank < 0 ||
        h.rank >= comm->nranks || (h.kind != CONN_RING && h.kind != CONN_P2P)) {
      lib_error("rank %d: dropped a connection that is not from this communicator", comm->rank);
      close(fd);
      continue;
    }
    if (h.kind == kind && h.rank == want) {
      if (kind == CONN_P2P) comm->peer_fds[want] = fd;
      return fd;
    }
    if (h.kind == CONN_P2P && comm->peer_fds[h.rank] < 0) {
      comm->peer_fds[h.rank] = fd;
      continue;
    }
    lib_error("rank %d: dropped an unexpected connection from rank %d", comm->rank, h.rank);
    close(fd);
  }
}

/* Root side of the rendezvous: collect every rank's listener, send the table. */
static ncclResult_t root_gather(struct ncclComm *comm, int root_fd, int64_t deadline) {
  int n = comm->nranks;
  int *fds = calloc((size_t)n, sizeof *fds);
  struct table_entry *table = calloc((size_t)n, sizeof *table);
  ncclResult_t rc = ncclSuccess;
  if (!fds || !table) {
    free(fds);
    free(table);
    comm_error(comm, "out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < n; i++) fds[i] = -1;
  table[0].addrlen = comm->addrlens[0];
  memcpy(&table[0].addr, &comm->addrs[0], comm->addrlens[0]);
  int joined = 1;
  while (joined < n) {
    struct pollfd pfd = {.fd = root_fd, .events = POLLIN};
    int pr = poll(&pfd, 1, remaining_ms(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      char missing[256] = "";
      size_t off = 0;
      for (int i = 1; i < n && off < sizeof missing - 16; i++)
        if (fds[i] < 0) off += (size_t)snprintf(missing + off, sizeof missing - off, " %d", i);
      comm_error(comm, "bootstrap root: only %d of %d ranks joined within %d s "
                       "(GPUCTL_NCCL_TIMEOUT_S); missing ranks:%s",
                 joined, n, comm->timeout_s, missing);
      rc = ncclSystemError;
      goto out;
    }
    int fd = accept4(root_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (tune_socket(fd) < 0) {
      close(fd);
      continue;
    }
    struct hello h;
    if (io_all(comm, fd, &h, sizeof h, 0, deadline, "bootstrap root: read hello") != ncclSuccess ||
        h.magic != HELLO_MAGIC || h.kind != HELLO_BOOT) {
      close(fd);
      continue;
    }
    struct boot_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.magic = HELLO_MAGIC;
    rep.nranks = n;
    if (h.nranks != n)
      snprintf(rep.message, sizeof rep.message,
               "rank %d says the job has %d ranks, rank 0 says %d (check WORLD_SIZE)", h.rank,
               h.nranks, n);
    else if (h.rank <= 0 || h.rank >= n)
      snprintf(rep.message, sizeof rep.message, "rank %d is out of range 1..%d", h.rank, n - 1);
    else if (fds[h.rank] >= 0)
      snprintf(rep.message, sizeof rep.message,
               "rank %d joined twice (two processes with the same RANK?)", h.rank);
    else if (h.addrlen == 0 || h.addrlen > sizeof h.addr)
      snprintf(rep.message, sizeof rep.message, "rank %d sent a bad address", h.rank);
    if (rep.message[0]) {
      rep.status = 1;
      lib_error("bootstrap root: rejected a rank: %s", rep.message);
      io_all(comm, fd, &rep, sizeof rep, 1, deadline, "bootstrap root: reply");
      close(fd);
      continue;
    }
    fds[h.rank] = fd;
    table[h.rank].addrlen = h.addrlen;
    memcpy(&table[h.rank].addr, &h.addr, h.addrlen);
    joined++;
  }
  struct boot_reply ok;
  memset(&ok, 0, sizeof ok);
  ok.magic = HELLO_MAGIC;
  ok.nranks = n;
  for (int i = 1; i < n; i++) {
    rc = io_all(comm, fds[i], &ok, sizeof ok, 1, deadline, "bootstrap root: reply");
    if (rc == ncclSuccess)
      rc = io_all(comm, fds[i], table, sizeof *table * (size_t)n, 1, deadline,
                  "bootstrap root: send table");
    if (rc != ncclSuccess) goto out;
  }
  for (int i = 1; i < n; i++) {
    comm->addrlens[i] = table[i].addrlen;
    memcpy(&comm->addrs[i], &table[i].addr, table[i].addrlen);
  }
out:
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  free(table);
  return rc;
}

/* Non-root side: report this rank's listener to the root, get the table. */
static ncclResult_t join_root(struct ncclComm *comm, int64_t deadline) {
  char root[128];
  fmt_addr((struct sockaddr *)&comm->root_addr, comm->root_len, root, sizeof root);
  int fd = connect_deadline(&comm->root_addr, comm->root_len, deadline);
  if (fd < 0) {
    comm_error(comm, "cannot reach bootstrap root %s (MASTER_ADDR/MASTER_PORT) within %d s "
                     "(GPUCTL_NCCL_TIMEOUT_S): %s; is rank 0 running?",
               root, comm->timeout_s, strerror(errno));
    return ncclSystemError;
  }
  /* Listen on the local address that routes to the root: reachable by peers. */
  struct sockaddr_storage local;
  socklen_t llen = sizeof local;
  ncclResult_t rc = ncclSuccess;
  if (getsockname(fd, (struct sockaddr *)&local, &llen) < 0) {
    comm_error(comm, "getsockname: %s", strerror(errno));
    rc = ncclSystemError;
    goto out;
  }
  set_port(&local, 0);
  comm->listen_fd = listen_on(&local, llen, 0);
  if (comm->listen_fd < 0) {
    comm_error(comm, "listen for peers: %s", strerror(errno));
    rc = ncclSystemError;
    goto out;
  }
  llen = sizeof local;
  getsockname(comm->listen_fd, (struct sockaddr *)&local, &llen);
  rc = send_hello(comm, fd, HELLO_BOOT, deadline, &local, llen);
  if (rc != ncclSuccess) goto out;
  struct boot_reply rep;
  rc = io_all(comm, fd, &rep, sizeof rep, 0, deadline, "wait for bootstrap root");
  if (rc != ncclSuccess) goto out;
  if (rep.magic != HELLO_MAGIC || rep.status != 0) {
    rep.message[sizeof rep.message - 1] = 0;
    comm_error(comm, "bootstrap root %s refused this rank: %s", root,
               rep.magic == HELLO_MAGIC ? rep.message : "bad reply");
    rc = ncclInvalidUsage;
    goto out;
  }
  struct table_entry *table = calloc((size_t)comm->nranks, sizeof *table);
  if (!table) {
    comm_error(comm, "out of memory");
    rc = ncclSystemError;
    goto out;
  }
  rc = io_all(comm, fd, table, sizeof *table * (size_t)comm->nranks, 0, deadline,
              "read address table");
  for (int i = 0; rc == ncclSuccess && i < comm->nranks; i++) {
    if (table[i].addrlen == 0 || table[i].addrlen > sizeof table[i].addr) {
      comm_error(comm, "bootstrap root sent a bad address for rank %d", i);
      rc = ncclInternalError;
      break;
    }
    comm->addrlens[i] = table[i].addrlen;
    memcpy(&comm->addrs[i], &table[i].addr, table[i].addrlen);
  }
  free(table);
out:
  close(fd);
  return rc;
}

ncclResult_t bootstrap(struct ncclComm *comm) {
  int n = comm->nranks;
  if (n == 1) return ncclSuccess;
  int64_t deadline = now_ms() + (int64_t)comm->timeout_s * 1000;
  ncclResult_t rc;
  if (comm->rank == 0) {
    char root[128];
    fmt_addr((struct sockaddr *)&comm->root_addr, comm->root_len, root, sizeof root);
    int root_fd = listen_on(&comm->root_addr, comm->root_len, 1);
    if (root_fd < 0) {
      comm_error(comm, "cannot listen on %s (MASTER_ADDR/MASTER_PORT): %s%s", root,
                 strerror(errno),
                 errno == EADDRINUSE ? "; another process holds MASTER_PORT, pick a free one" : "");
      return ncclSystemError;
    }
    struct sockaddr_storage local = comm->root_addr;
    set_port(&local, 0);
    comm->listen_fd = listen_on(&local, comm->root_len, 0);
    if (comm->listen_fd < 0) {
      comm_error(comm, "listen for peers: %s", strerror(errno));
      close(root_fd);
      return ncclSystemError;
    }
    socklen_t llen = sizeof comm->addrs[0];
    getsockname(comm->listen_fd, (struct sockaddr *)&comm->addrs[0], &llen);
    comm->addrlens[0] = llen;
    rc = root_gather(comm, root_fd, deadline);
    close(root_fd);
  } else {
    rc = join_root(comm, deadline);
  }
  if (rc != ncclSuccess) return rc;

  int next = (comm->rank + 1) % n, prev = (comm->rank + n - 1) % n;
  comm->next_fd = connect_deadline(&comm->addrs[next], comm->addrlens[next], deadline);
  if (comm->next_fd < 0) {
    char a[128];
    fmt_addr((struct sockaddr *)&comm->addrs[next], comm->addrlens[next], a, sizeof a);
    comm_error(comm, "connect ring to rank %d at %s: %s", next, a, strerror(errno));
    return ncclSystemError;
  }
  rc = send_hello(comm, comm->next_fd, CONN_RING, deadline, NULL, 0);
  if (rc != ncclSuccess) return rc;
  comm->prev_fd = accept_from(comm, prev, CONN_RING, deadline, &rc);
  return comm->prev_fd < 0 ? rc : ncclSuccess;
}

ncclResult_t peer_connect(struct ncclComm *comm, const int *peers, int npeers) {
  ncclResult_t rc = ncclSuccess;
  int64_t deadline = now_ms() + (int64_t)comm->timeout_s * 1000;
  /* The lower rank dials. Dialing never waits for the other side (the
   * listener's backlog completes the handshake), so dial first, then accept. */
  for (int i = 0; i < npeers; i++) {
    int p = peers[i];
    if (p <= comm->rank || comm->peer_fds[p] >= 0) continue;
    int fd = connect_deadline(&comm->addrs[p], comm->addrlens[p], deadline);
    if (fd < 0) {
      comm_error(comm, "connect to rank %d: %s", p, strerror(errno));
      return ncclSystemError;
    }
    comm->peer_fds[p] = fd;
    rc = send_hello(comm, fd, CONN_P2P, deadline, NULL, 0);
    if (rc != ncclSuccess) return rc;
  }
  for (int i = 0; i < npeers; i++) {
    int p = peers[i];
    if (p >= comm->rank || comm->peer_fds[p] >= 0) continue;
    /* No deadline: the peer may legitimately reach its send much later. */
    if (accept_from(comm, p, CONN_P2P, -1, &rc) < 0) return rc;
  }
  return ncclSuccess;
}

void comm_close_sockets(struct ncclComm *comm, int clean) {
  /* A clean exit tells the ring neighbours so that one waiting for a peer
   * connection does not mistake it for a crash. Best effort: never blocks. */
  uint64_t bye = GOODBYE_MAGIC;
  if (clean && comm->next_fd >= 0) (void)!send(comm->next_fd, &bye, sizeof bye, MSG_NOSIGNAL);
  if (clean && comm->prev_fd >= 0) (void)!send(comm->prev_fd, &bye, sizeof bye, MSG_NOSIGNAL);
  if (comm->listen_fd >= 0) close(comm->listen_fd);
  if (comm->next_fd >= 0) close(comm->next_fd);
  if (comm->prev_fd >= 0) close(comm->prev_fd);
  comm->listen_fd = comm->next_fd = comm->prev_fd = -1;
  if (comm->peer_fds) {
    for (int i = 0; i < comm->nranks; i++)
      if (comm->peer_fds[i] >= 0) close(comm->peer_fds[i]);
  }
}

static char link_path[4096];
static int link_path_set;
static double link_speed = 1;
static int64_t link_read_ms;

/* The share of full speed this host's transfers keep now, from link.speed. */
static double current_link_speed(void) {
  if (!link_path_set) {
    link_path_set = 1;
    const char *d = getenv("GPUCTL_SIM_KERNEL_DIR");
    if (d && *d) snprintf(link_path, sizeof link_path, "%s/link.speed", d);
  }
  if (!link_path[0]) return 1;
  int64_t now = now_ms();
  if (link_read_ms && now - link_read_ms < 100) return link_speed;
  link_read_ms = now;
  double v = 1;
  FILE *f = fopen(link_path, "re");
  if (f) {
    if (fscanf(f, "%lf", &v) != 1 || !(v > 0)) v = 1;
    fclose(f);
  }
  if (v < 0.05) v = 0.05;
  if (v > 1) v = 1;
  link_speed = v;
  return v;
}

/* base_bps is the rate transfer batches reach at full speed, the rate a
 * slowed link is a share of: a slowly decaying maximum, since a batch that
 * waited on a late peer shows a lower rate than the link's. */
static double base_bps;

/* Paces a transfer batch of bytes begun at started to speed times the rate
 * it would have had: a target from the bytes, not a stretch of the time it
 * took, so waiting on a peer that is itself slowed does not compound. */
static void throttle_link(size_t bytes, struct timespec started) {
  struct timespec end;
  clock_gettime(CLOCK_MONOTONIC, &end);
  double took = (double)(end.tv_sec - started.tv_sec) + (double)(end.tv_nsec - started.tv_nsec) / 1e9;
  double sp = current_link_speed();
  if (sp >= 1) {
    if (took > 0 && bytes >= 4096) {
      double bps = (double)bytes / took;
      base_bps = bps > 0.99 * base_bps ? bps : 0.99 * base_bps;
    }
    return;
  }
  /* The simulated link's rate: what batches reach at full speed, at most a
   * nominal 1 GB/s, since on loopback the wire is never the bottleneck a
   * degraded link makes it. */
  double rate = base_bps > 0 && base_bps < 1e9 ? base_bps : 1e9;
  double extra = (double)bytes / (rate * sp) - took;
  if (extra <= 0) return;
  if (extra > 1) extra = 1;
  struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

static int blocked_by_earlier(const struct xfer *x, int i) {
  for (int j = 0; j < i; j++)
    if (!x[j].fin && x[j].fd == x[i].fd && x[j].is_send == x[i].is_send) return 1;
  return 0;
}

ncclResult_t run_xfers(struct ncclComm *comm, struct xfer *x, int n) {
  struct pollfd stack_pfd[8];
  struct pollfd *pfd = n <= 8 ? stack_pfd : malloc(sizeof *pfd * (size_t)n);
  ncclResult_t rc = ncclSuccess;
  struct timespec started;
  clock_gettime(CLOCK_MONOTONIC, &started);
  if (!pfd) {
    comm_error(comm, "out of memory");
    return ncclSystemError;
  }
  for (;;) {
    int pending = 0, progress = 0, np = 0;
    for (int i = 0; i < n; i++) {
      struct xfer *t = &x[i];
      if (t->fin) continue;
      pending = 1;
      if (blocked_by_earlier(x, i)) continue;
      while (t->done < t->len) {
        ssize_t r = t->is_send ? send(t->fd, t->buf + t->done, t->len - t->done, MSG_NOSIGNAL)
                               : recv(t->fd, t->buf + t->done, t->len - t->done, 0);
        if (r > 0) {
          t->done += (size_t)r;
          progress = 1;
          continue;
        }
        if (r == 0) {
          comm_error(comm, "rank %d closed its connection (did it exit?)", t->peer);
          rc = ncclRemoteError;
          goto out;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        comm_error(comm, "%s rank %d: %s", t->is_send ? "send to" : "receive from", t->peer,
                   strerror(errno));
        rc = (errno == ECONNRESET || errno == EPIPE) ? ncclRemoteError : ncclSystemError;
        goto out;
      }
      if (t->done == t->len) {
        t->fin = 1;
        progress = 1;
        if (t->on_done && (rc = t->on_done(comm, t)) != ncclSuccess) goto out;
        continue;
      }
      short ev = t->is_send ? POLLOUT : POLLIN;
      int k;
      for (k = 0; k < np && pfd[k].fd != t->fd; k++);
      if (k == np) pfd[np++] = (struct pollfd){.fd = t->fd, .events = 0};
      pfd[k].events |= ev;
    }
    if (!pending) break;
    if (progress) continue; /* a finished transfer may have unblocked a later one */
    if (poll(pfd, (nfds_t)np, -1) < 0 && errno != EINTR) {
      comm_error(comm, "poll: %s", strerror(errno));
      rc = ncclSystemError;
      goto out;
    }
  }
out:
  if (pfd != stack_pfd) free(pfd);
  if (rc == ncclSuccess) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += x[i].len;
    throttle_link(bytes, started);
  }
  return rc;
}
