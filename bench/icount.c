/* A single-threaded ping-pong, through xport's public API or through raw
 * libfabric, for counting instructions with callgrind (bench/icount.sh):
 * both ends live in this one process and take turns, so that a round trip
 * costs the same work every time and no end spins waiting for the other.
 *
 *   bench/icount xport|xport-unsignaled|raw ROUNDS [SIZE]
 *   bench/icount raw-rate MESSAGES [SIZE]   (timed: libfabric's own message rate)
 *   bench/icount raw-lat ROUNDS [SIZE]      (timed: its ping-pong's latency spread)
 *
 * The provider is XPORT_PROVIDER's (shm by default; the raw side takes
 * the provider xport's context chose, so both run over the same one).
 * Each round: A sends SIZE bytes, B's receive completes, B sends them
 * back, A's receive completes; every receive is posted again. A
 * benchmark: it checks the bytes once and asserts nothing else. */
#include <xport.h>

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

static void die(const char *what, int rc)
{
  fprintf(stderr, "icount: %s: %d (%s)\n", what, rc, rc < 0 ? fi_strerror(-rc) : "");
  exit(1);
}

/* Only A's side is counted, and only inside the library's calls:
 * collection is switched on around each call (callgrind's toggle, off
 * at start). A poll that finds nothing is waiting, not work: those are
 * counted apart (empty) so that icount.sh can take them out at the cost
 * of an empty poll, which "empty" mode measures. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_TOGGLE_COLLECT do {} while (0) /* no valgrind headers: counts nothing */
#endif
static void toggle(void)
{
  CALLGRIND_TOGGLE_COLLECT;
}
#define COUNTED(expr) (toggle(), (expr))
#define COUNTED_END toggle()

static long empty_polls;

/* The peer says on this pipe that its reply is out, and the counted side
 * reads it (uncounted) before it polls: then a poll rarely finds nothing,
 * and the count does not hang on how the two processes were scheduled. */
static int replied[2];

static void say_replied(void)
{
  if (write(replied[1], "r", 1) != 1)
    die("pipe write", 0);
}

static void await_reply(void)
{
  char r;
  if (read(replied[0], &r, 1) != 1)
    die("pipe read", 0);
}

static int next_counted(xport_ctx_t *ctx, xport_completion_t *c)
{
  for (;;) {
    int n = COUNTED(xport_poll(ctx, c, 1));
    COUNTED_END;
    if (n < 0 || (n > 0 && c->status))
      die("xport completion", n < 0 ? n : c->status);
    if (n)
      return n;
    empty_polls++;
  }
}

/* xport-unsignaled: sends go with XPORT_SEND_UNSIGNALED, as fi_pingpong's
 * fi_inject has no completion (at most inject_size bytes: the buffer is
 * free when the call returns, xport_send_flags(3)). */
static unsigned send_flags;

static int serve_xport(xport_ctx_t *ctx, xport_listener_t *lst, long rounds, size_t size)
{
  xport_conn_t *b;
  xport_completion_t c;
  int rc;
  if ((rc = xport_accept(lst, 20000, &b)))
    die("xport_accept", rc);
  char *rb = calloc(1, size);
  xport_mr_t *mb;
  if ((rc = xport_mr_reg(ctx, rb, size, XPORT_ACCESS_LOCAL, &mb)) ||
      (rc = xport_recv(b, rb, size, mb, NULL)))
    die("server post", rc);
  for (long i = 0; i < rounds;) {
    int n;
    while ((n = xport_poll(ctx, &c, 1)) == 0)
      ;
    if (n < 0 || c.status)
      die("server completion", n < 0 ? n : c.status);
    if (c.op != XPORT_OP_RECV)
      continue;
    if ((rc = xport_recv(b, rb, size, mb, NULL)) ||
        (rc = xport_send_flags(b, rb, size, mb, send_flags, NULL)))
      die("server post", rc);
    say_replied();
    i++;
  }
  /* The client's last word, then its goodbye. */
  while (xport_poll(ctx, &c, 1) == 0 || c.op != XPORT_OP_DISCONNECT)
    ;
  xport_conn_close(b);
  return 0;
}

static void run_xport(long rounds, size_t size, int empty_only)
{
  int p[2];
  char addr[128];
  if (pipe(p) || pipe(replied))
    die("pipe", 0);
  pid_t pid = fork(); /* before any context: see xport(7), FORK */
  if (pid == 0) {
    xport_ctx_t *ctx;
    xport_listener_t *lst;
    int rc;
    if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_listen(ctx, "127.0.0.1:0", &lst)) ||
        (rc = xport_listener_addr(lst, addr, sizeof addr)))
      die("server", rc);
    if (write(p[1], addr, sizeof addr) != (ssize_t)sizeof addr)
      die("pipe write", 0);
    serve_xport(ctx, lst, empty_only ? 0 : rounds, size);
    xport_ctx_destroy(ctx);
    _exit(0);
  }
  if (read(p[0], addr, sizeof addr) != (ssize_t)sizeof addr)
    die("pipe read", 0);
  xport_ctx_t *ctx;
  xport_conn_t *a;
  int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_connect(ctx, addr, 20000, &a)))
    die("xport_connect", rc);
  char *sa = calloc(1, size), *ra = calloc(1, size);
  xport_mr_t *ma, *mra;
  if ((rc = xport_mr_reg(ctx, sa, size, XPORT_ACCESS_LOCAL, &ma)) ||
      (rc = xport_mr_reg(ctx, ra, size, XPORT_ACCESS_LOCAL, &mra)))
    die("xport_mr_reg", rc);
  memset(sa, 0x5a, size);
  xport_completion_t c;
  if (empty_only) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < rounds; i++) {
      int n = COUNTED(xport_poll(ctx, &c, 1));
      COUNTED_END;
      if (n)
        die("a completion in empty mode", n);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* The time too, for a run outside valgrind (a clock, so noisy). */
    printf("empty_poll_ns %.1f\n",
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)rounds);
  } else {
    if ((rc = xport_recv(a, ra, size, mra, NULL)))
      die("xport_recv", rc);
    for (long i = 0; i < rounds; i++) {
      rc = COUNTED(xport_send_flags(a, sa, size, ma, send_flags, NULL));
      COUNTED_END;
      if (rc)
        die("xport_send", rc);
      await_reply();
      /* The send's completion (none unsignaled) and the reply. */
      for (int got = send_flags ? 1 : 0; got < 2;) {
        next_counted(ctx, &c);
        got += c.op == XPORT_OP_RECV || c.op == XPORT_OP_SEND;
      }
      rc = COUNTED(xport_recv(a, ra, size, mra, NULL));
      COUNTED_END;
      if (rc)
        die("xport_recv", rc);
    }
    if (memcmp(ra, sa, size))
      die("bytes differ", 0);
  }
  xport_conn_close(a);
  xport_ctx_destroy(ctx);
  waitpid(pid, NULL, 0);
  free(sa);
  free(ra);
}

/* ---- raw libfabric ------------------------------------------------------ */

struct end {
  struct fid_fabric *fab;
  struct fid_domain *dom;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  struct fid_mr *mr;
  char *buf;
  fi_addr_t peer;
  size_t inject;
  struct fi_context2 rx, tx;
  struct fi_info *fi;
};

/* The provider xport would choose here, opened the way fi_pingpong
 * opens it. */
static void end_open(struct end *e, size_t size)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_ctx_query(ctx, &caps)))
    die("xport_ctx_create", rc);
  xport_ctx_destroy(ctx);
  struct fi_info *hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  /* xport's own shared memory (xshm) is weighed against libfabric's. */
  const char *prov = strcmp(caps.provider, "xshm") ? caps.provider : "shm";
  hints->fabric_attr->prov_name = strdup(prov);
  if ((rc = fi_getinfo(FI_VERSION(1, 17), strcmp(prov, "shm") ? "127.0.0.1" : NULL,
                       NULL, 0, hints, &e->fi)))
    die("fi_getinfo", rc);
  fi_freeinfo(hints);
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_TAGGED, .size = 1024};
  struct fi_av_attr ava = {.type = FI_AV_UNSPEC};
  if ((rc = fi_fabric(e->fi->fabric_attr, &e->fab, NULL)) ||
      (rc = fi_domain(e->fab, e->fi, &e->dom, NULL)) ||
      (rc = fi_cq_open(e->dom, &cqa, &e->cq, NULL)) ||
      (rc = fi_av_open(e->dom, &ava, &e->av, NULL)) ||
      (rc = fi_endpoint(e->dom, e->fi, &e->ep, NULL)) ||
      (rc = fi_ep_bind(e->ep, &e->av->fid, 0)) ||
      (rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(e->ep)))
    die("raw endpoint", rc);
  e->buf = calloc(1, size);
  if ((rc = fi_mr_reg(e->dom, e->buf, size, FI_SEND | FI_RECV, 0, 0, 0, &e->mr, NULL)))
    die("fi_mr_reg", rc);
  e->inject = e->fi->tx_attr->inject_size;
}

static void end_close(struct end *e)
{
  fi_close(&e->ep->fid);
  fi_close(&e->mr->fid);
  fi_close(&e->av->fid);
  fi_close(&e->cq->fid);
  fi_close(&e->dom->fid);
  fi_close(&e->fab->fid);
  fi_freeinfo(e->fi);
  free(e->buf);
}

/* Swaps endpoint names over the pipes and puts the peer in the AV. */
static void end_meet(struct end *e, int wfd, int rfd)
{
  char name[256], peer[256];
  size_t len = sizeof name;
  int rc = fi_getname(&e->ep->fid, name, &len);
  if (rc)
    die("fi_getname", rc);
  if (write(wfd, name, sizeof name) != (ssize_t)sizeof name ||
      read(rfd, peer, sizeof peer) != (ssize_t)sizeof peer)
    die("pipe", 0);
  if (fi_av_insert(e->av, peer, 1, &e->peer, 0, NULL) != 1)
    die("fi_av_insert", 0);
}

/* An endpoint with SIZE bytes of registered buffer, and its peer met. */
static void end_start(struct end *e, size_t size, int wfd, int rfd)
{
  end_open(e, size);
  end_meet(e, wfd, rfd);
}

/* The peer process's end: once the counted side says so on fd. */
static __attribute__((noreturn)) void peer_exit(struct end *e, int fd)
{
  char done;
  if (read(fd, &done, 1) != 1)
    die("pipe", 0);
  end_close(e);
  _exit(0);
}

/* The pipes both ends meet over (c2s: counted side to peer), and the
 * peer process: 0 in the child. */
static pid_t fork_peer(int c2s[2], int s2c[2])
{
  if (pipe(c2s) || pipe(s2c))
    die("pipe", 0);
  pid_t pid = fork();
  if (pid < 0)
    die("fork", 0);
  return pid;
}

/* The counted side's end: tells the peer on fd (peer_exit), waits for it. */
static void end_finish(struct end *e, int fd, pid_t pid)
{
  if (write(fd, "d", 1) != 1)
    die("pipe", 0);
  waitpid(pid, NULL, 0);
  end_close(e);
}

/* 1 once an entry was read, 0 if none was there. */
static int raw_poll(struct end *e)
{
  struct fi_cq_tagged_entry ent;
  ssize_t n = fi_cq_read(e->cq, &ent, 1);
  if (n == -FI_EAGAIN)
    return 0;
  if (n != 1)
    die("fi_cq_read", (int)n);
  return 1;
}

/* Small messages go by fi_tinject, without a send completion, as
 * fi_pingpong sends them; larger ones by fi_tsend, whose completion is
 * read. 1 when a completion will come. */
static int raw_send(struct end *e, size_t size)
{
  ssize_t rc;
  if (size <= e->inject) {
    while ((rc = fi_tinject(e->ep, e->buf, size, e->peer, 1)) == -FI_EAGAIN)
      ;
  } else {
    while ((rc = fi_tsend(e->ep, e->buf, size, fi_mr_desc(e->mr), e->peer, 1, &e->tx)) ==
           -FI_EAGAIN)
      ;
  }
  if (rc)
    die("raw send", (int)rc);
  return size > e->inject;
}

static void raw_recv(struct end *e, size_t size)
{
  ssize_t rc = fi_trecv(e->ep, e->buf, size, fi_mr_desc(e->mr), FI_ADDR_UNSPEC, 1, 0, &e->rx);
  if (rc)
    die("fi_trecv", (int)rc);
}

static void run_raw(long rounds, size_t size, int empty_only)
{
  int c2s[2], s2c[2];
  if (pipe(replied))
    die("pipe", 0);
  pid_t pid = fork_peer(c2s, s2c);
  if (pid == 0) {
    struct end b = {0};
    end_start(&b, size, s2c[1], c2s[0]);
    raw_recv(&b, size);
    for (long i = 0; i < (empty_only ? 0 : rounds); i++) {
      while (!raw_poll(&b))
        ;
      raw_recv(&b, size);
      int wait = raw_send(&b, size);
      say_replied();
      if (wait)
        while (!raw_poll(&b))
          ;
    }
    peer_exit(&b, c2s[0]);
  }
  struct end a = {0};
  end_start(&a, size, c2s[1], s2c[0]);
  memset(a.buf, 0x5a, size);
  if (empty_only) {
    for (long i = 0; i < rounds; i++) {
      int n = COUNTED(raw_poll(&a));
      COUNTED_END;
      if (n)
        die("a completion in empty mode", n);
    }
  } else {
    raw_recv(&a, size);
    for (long i = 0; i < rounds; i++) {
      int want = COUNTED(raw_send(&a, size)) + 1;
      COUNTED_END;
      await_reply();
      for (int got = 0; got < want;) {
        int n = COUNTED(raw_poll(&a));
        COUNTED_END;
        got += n;
        empty_polls += !n;
      }
      COUNTED(raw_recv(&a, size));
      COUNTED_END;
    }
  }
  end_finish(&a, c2s[1], pid);
}

/* raw-rate: libfabric's own message rate, timed rather than counted (the
 * figure to put beside xport_perf -t send_bw and ucx_perftest tag_bw):
 * ROUNDS messages of SIZE bytes by fi_tinject, as fast as the peer's
 * RATE_WIN posted receives take them; the peer acknowledges the last. */
#define RATE_WIN 64
static void run_raw_rate(long n, size_t size)
{
  int c2s[2], s2c[2];
  pid_t pid = fork_peer(c2s, s2c);
  if (pid == 0) {
    struct end b = {0};
    static struct fi_context2 rx[RATE_WIN];
    end_start(&b, size * RATE_WIN, s2c[1], c2s[0]);
    for (int i = 0; i < RATE_WIN; i++)
      if (fi_trecv(b.ep, b.buf + i * size, size, fi_mr_desc(b.mr), FI_ADDR_UNSPEC, 1, 0, &rx[i]))
        die("fi_trecv", 0);
    for (long got = 0; got < n;) {
      struct fi_cq_tagged_entry ents[16];
      ssize_t k = fi_cq_read(b.cq, ents, 16);
      if (k == -FI_EAGAIN)
        continue;
      if (k < 0)
        die("fi_cq_read", (int)k);
      for (ssize_t j = 0; j < k; j++, got++) {
        size_t i = (size_t)((struct fi_context2 *)ents[j].op_context - rx);
        if (got + RATE_WIN < n &&
            fi_trecv(b.ep, b.buf + i * size, size, fi_mr_desc(b.mr), FI_ADDR_UNSPEC, 1, 0, &rx[i]))
          die("fi_trecv", 0);
      }
    }
    while (fi_tinject(b.ep, "k", 1, b.peer, 2) == -FI_EAGAIN)
      raw_poll(&b);
    peer_exit(&b, c2s[0]);
  }
  struct end a = {0};
  end_start(&a, size, c2s[1], s2c[0]);
  char ack[8];
  if (fi_trecv(a.ep, ack, sizeof ack, NULL, FI_ADDR_UNSPEC, 2, 0, &a.rx))
    die("fi_trecv", 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    ssize_t rc;
    while ((rc = fi_tinject(a.ep, a.buf, size, a.peer, 1)) == -FI_EAGAIN)
      raw_poll(&a); /* progress: shm frees its queue's room as the peer takes */
    if (rc)
      die("fi_tinject", (int)rc);
  }
  while (!raw_poll(&a))
    ;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("raw libfabric message rate, %zu B by fi_tinject: %.0f msg/s (%ld in %.3f s)\n", size,
         (double)n / s, n, s);
  end_finish(&a, c2s[1], pid);
}

/* raw-lat: libfabric's own ping-pong, timed per round trip (fi_pingpong
 * reports only a mean): min, median, mean and 99th percentile of the
 * one-way latency, the figures xport_perf -t send_lat prints. */
static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double now_us(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void run_raw_lat(long n, size_t size)
{
  int c2s[2], s2c[2];
  pid_t pid = fork_peer(c2s, s2c);
  if (pid == 0) {
    struct end b = {0};
    end_start(&b, size, s2c[1], c2s[0]);
    raw_recv(&b, size);
    for (long i = 0; i < n; i++) {
      while (!raw_poll(&b))
        ;
      raw_recv(&b, size);
      if (raw_send(&b, size))
        while (!raw_poll(&b))
          ;
    }
    peer_exit(&b, c2s[0]);
  }
  struct end a = {0};
  end_start(&a, size, c2s[1], s2c[0]);
  double *lat = calloc((size_t)n, sizeof *lat);
  if (!lat)
    die("calloc", 0);
  raw_recv(&a, size);
  double t = now_us();
  for (long i = 0; i < n; i++) {
    int want = raw_send(&a, size) + 1;
    for (int got = 0; got < want;)
      got += raw_poll(&a);
    raw_recv(&a, size);
    double t1 = now_us();
    lat[i] = (t1 - t) / 2;
    t = t1;
  }
  double sum = 0;
  for (long i = 0; i < n; i++)
    sum += lat[i];
  qsort(lat, (size_t)n, sizeof *lat, cmp_double);
  printf("raw libfabric ping-pong, %zu B, one-way us: min %.3f median %.3f mean %.3f p99 %.3f\n",
         size, lat[0], lat[n / 2], sum / (double)n, lat[n * 99 / 100]);
  free(lat);
  end_finish(&a, c2s[1], pid);
}

int main(int argc, char **argv)
{
  if (argc < 3 || (strcmp(argv[1], "xport") && strcmp(argv[1], "xport-unsignaled") &&
                    strcmp(argv[1], "raw") && strcmp(argv[1], "raw-rate") &&
                    strcmp(argv[1], "raw-lat"))) {
    fprintf(stderr, "usage: %s xport|xport-unsignaled|raw|raw-rate|raw-lat ROUNDS [SIZE] [empty]\n",
            argv[0]);
    return 2;
  }
  long rounds = atol(argv[2]);
  size_t size = argc > 3 ? (size_t)atol(argv[3]) : 64;
  if (!strncmp(argv[1], "raw-", 4)) {
    setenv("XPORT_PROVIDER", "shm", 0);
    if (argv[1][4] == 'r')
      run_raw_rate(rounds, size);
    else
      run_raw_lat(rounds, size);
    return 0;
  }
  int empty_only = argc > 4 && !strcmp(argv[4], "empty");
  setenv("XPORT_PROVIDER", "shm", 0);
  if (!strncmp(argv[1], "xport", 5)) {
    send_flags = argv[1][5] ? XPORT_SEND_UNSIGNALED : 0;
    run_xport(rounds, size, empty_only);
  }
  else
    run_raw(rounds, size, empty_only);
  printf("rounds %ld empty_polls %ld\n", rounds, empty_polls);
  return 0;
}
