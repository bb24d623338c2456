/* The progress thread and the lifecycle around it, on every provider
 * present: no lost wakeups, no application held hostage by connect or
 * accept, per-completion detail text, and closing listeners, connections
 * and contexts while traffic flows. `make check-tsan` runs this suite (and
 * the others) under ThreadSanitizer with XPORT_PROGRESS_THREAD=1. */
#include "harness.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* XT_SLOW: under ThreadSanitizer eight pairs of contexts shaking hands at
 * once over tcp;ofi_rxm took 25 to 40 s here. */
#define T_MS (20000 * XT_SLOW)
#define ROUNDS 2000
#define LISTEN_ROUNDS 8
#define WROUNDS 5 /* destroy_while_peer_writes */

static xport_ctx_t *thread_ctx(void)
{
  xport_ctx_attr_t attr = {.progress_thread = XPORT_ON};
  return xt_ctx_with(&attr);
}

static void expect_ok(xport_ctx_t *ctx, xport_op_t op)
{
  xport_completion_t c;
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "no completion (op %d) within %d ms on %s", op, T_MS,
           xt_config());
  XT_CHECK(c.op == op && c.status == 0, "op %d status %s, expected op %d to succeed", c.op,
           xport_strerror(c.status), op);
}

/* ---- lost wakeups -------------------------------------------------------- */

/* A wait that never returns is the failure: the watchdog names the round
 * instead of letting the test hang until Check's timeout. */
static volatile sig_atomic_t cur_round = -1;

static void watchdog(int sig)
{
  char msg[128];
  (void)sig;
  int n = snprintf(msg, sizeof msg,
                   "watchdog: round %d: xport_wait(ctx, -1) never woke for a queued "
                   "completion (lost wakeup)\n",
                   (int)cur_round);
  if (write(2, msg, (size_t)n) < 0)
    _exit(3);
  _exit(2);
}

static int echo_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  char buf[64];
  for (int i = 0; i < ROUNDS; i++) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    expect_ok(ctx, XPORT_OP_RECV);
    XT_OK(xport_send(conn, buf, sizeof buf, NULL, NULL));
    expect_ok(ctx, XPORT_OP_SEND);
  }
  /* The client closes first; wait for its goodbye before closing. */
  xport_completion_t c;
  while (xt_next(ctx, &c, T_MS) == 0 && c.op != XPORT_OP_DISCONNECT)
    ;
  return 0;
}

/* Ping-pong in which every wait is xport_wait(ctx, -1): with the progress
 * thread reading the CQ, the reply may be on the done list when the waiter
 * decides to sleep. */
START_TEST(wait_never_misses_progress_thread_work)
{
  char addr[128];
  /* A peer check would cap every wait (RDM): make it far longer than the
   * watchdog, so that a lost wakeup shows as what it is. */
  setenv("XPORT_PEER_TIMEOUT", "3600000", 1);
  pid_t pid = xt_spawn_pair_server(echo_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = thread_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  signal(SIGALRM, watchdog);
  alarm(200); /* generous: the rounds take a few seconds even under TSan */
  char out[64], in[64];
  for (int i = 0; i < ROUNDS; i++) {
    cur_round = i;
    memset(out, 'a' + i % 26, sizeof out);
    XT_OK(xport_recv(conn, in, sizeof in, NULL, NULL));
    XT_OK(xport_send(conn, out, sizeof out, NULL, NULL));
    for (int got = 0; got < 2;) {
      xport_completion_t c[4];
      int n = xport_poll(ctx, c, 4);
      XT_CHECK(n >= 0, "xport_poll: %s", xport_strerror(n));
      for (int k = 0; k < n; k++) {
        XT_CHECK(c[k].status == 0, "round %d: op %d: %s", i, c[k].op,
                 xport_strerror(c[k].status));
        got++;
      }
      if (!n) {
        int w = xport_wait(ctx, -1);
        XT_CHECK(w == 0, "xport_wait: %s", xport_strerror(w));
      }
    }
    XT_CHECK(!memcmp(in, out, sizeof in), "round %d: echo differs", i);
  }
  alarm(0);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid) == 0, "server failed");
}
END_TEST

/* ---- connect and accept do not hold the progress thread off ------------- */

/* The target exports a region over a second listener, then sits in a long
 * xport_accept there. The initiator connects again only once its read has
 * completed: accept returns only if the progress thread served the read
 * while the application was inside accept. */
static void hostage_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_ctx_t *pctx = thread_ctx();
  xport_listener_t *plst;
  xport_conn_t *conn, *pconn, *late;
  xport_mr_t *mr;
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  char addr[128];
  static char region[1 << 16];

  XT_OK(xport_listen(pctx, xt_listen_addr(), &plst));
  XT_OK(xport_listener_addr(plst, addr, sizeof addr));
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_OK(xport_send(conn, addr, strlen(addr) + 1, NULL, NULL));
  expect_ok(ctx, XPORT_OP_SEND);
  XT_OK(xport_accept(plst, T_MS, &pconn));
  xt_fill(region, sizeof region, 7);
  XT_OK(xport_mr_reg(pctx, region, sizeof region, XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ,
                     &mr));
  int n = xport_rkey_pack(mr, 0, sizeof region, key, sizeof key);
  XT_CHECK(n > 0, "pack: %s", xport_strerror(n));
  XT_OK(xport_send(pconn, key, (size_t)n, NULL, NULL));
  expect_ok(pctx, XPORT_OP_SEND);
  /* Long enough that the initiator's read gives up first if it stalls. */
  int rc = xport_accept(plst, 3 * T_MS, &late);
  XT_CHECK(rc == 0, "the second connection never came (%s): the read stalled while this "
                    "process sat in xport_accept", xport_strerror(rc));
  XT_OK(xport_conn_close(late));
  XT_OK(xport_conn_close(pconn));
  XT_OK(xport_conn_close(conn));
  XT_OK(xport_mr_dereg(mr));
  XT_OK(xport_listener_close(plst));
  xport_ctx_destroy(pctx);
}

START_TEST(accept_does_not_hold_progress_hostage)
{
  char addr[128], paddr[128];
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  static char buf[1 << 12];
  pid_t pid = xt_spawn_server(hostage_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn, *pconn, *late;
  xport_rkey_t *rk;
  xport_completion_t c;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_recv(conn, paddr, sizeof paddr, NULL, NULL));
  expect_ok(ctx, XPORT_OP_RECV);
  XT_OK(xport_connect(ctx, paddr, T_MS, &pconn));
  XT_OK(xport_recv(pconn, key, sizeof key, NULL, NULL));
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.status == 0, "no key");
  XT_OK(xport_rkey_unpack(pconn, key, c.len, &rk));
  XT_OK(xport_read(pconn, buf, sizeof buf, NULL, rk, 4096, NULL));
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0,
           "on %s: a 4 KiB read got no completion within %d ms while the target sat in "
           "xport_accept with its progress thread on", xt_config(), T_MS);
  XT_CHECK(c.op == XPORT_OP_READ && c.status == 0, "read: %s", xport_strerror(c.status));
  char want[sizeof buf];
  static char whole[1 << 16];
  xt_fill(whole, sizeof whole, 7);
  memcpy(want, whole + 4096, sizeof want);
  XT_CHECK(!memcmp(buf, want, sizeof buf), "read bytes differ");
  /* Only now may the target's accept return. */
  XT_OK(xport_connect(ctx, paddr, T_MS, &late));
  xport_rkey_release(rk);
  XT_CHECK(xt_reap(pid) == 0, "target failed");
  xport_conn_close(late);
  xport_conn_close(pconn);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}
END_TEST

/* ---- detail text belongs to its completion ------------------------------ */

static int done_pipe[2];

static int big_sender(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  char big[512], go[8];
  memset(big, 'x', sizeof big);
  XT_OK(xport_recv(conn, go, sizeof go, NULL, NULL));
  expect_ok(ctx, XPORT_OP_RECV);
  XT_OK(xport_send(conn, big, sizeof big, NULL, NULL));
  expect_ok(ctx, XPORT_OP_SEND);
  /* The client says it is done through a pipe: after a truncation some
   * providers carry nothing more on the connection (rxm). */
  struct pollfd p = {.fd = done_pipe[0], .events = POLLIN};
  XT_CHECK(poll(&p, 1, T_MS) == 1, "the client never finished");
  return 0;
}

/* The failure is read by the progress thread, not by xport_poll: its
 * provider text still comes with it, and stays while the thread runs. */
static int truncated_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  char small[16];
  xport_completion_t c;
  XT_OK(xport_recv(conn, small, sizeof small, NULL, NULL));
  XT_OK(xport_send(conn, "go", 3, NULL, NULL));
  expect_ok(ctx, XPORT_OP_SEND);
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "no truncated receive");
  XT_CHECK(c.op == XPORT_OP_RECV && c.status == -XPORT_ETRUNC, "op %d status %s", c.op,
           xport_strerror(c.status));
  if (!c.detail) {
    printf("NOTE: %s gives no detail text for a truncated receive\n", xt_config());
  } else {
    char copy[256];
    snprintf(copy, sizeof copy, "%s", c.detail);
    XT_CHECK(copy[0], "empty detail text");
    /* Let the thread run a while (it reads the CQ every few ms). */
    (void)xport_wait(ctx, 30);
    XT_CHECK(!strcmp(copy, c.detail), "detail changed under the progress thread");
  }
  XT_CHECK(write(done_pipe[1], "", 1) == 1, "pipe");
  return 0;
}

START_TEST(detail_belongs_to_its_completion)
{
  setenv("XPORT_PROGRESS_THREAD", "1", 1);
  XT_CHECK(pipe(done_pipe) == 0, "pipe");
  xt_pair(big_sender, truncated_client, NULL);
}
END_TEST

/* ---- closing a listener, then waiting ----------------------------------- */

/* Programs close their listener once every peer has connected, and wait
 * for completions after that. */
static int listener_closing_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  xport_listener_t *lst;
  char out[32], in[32];
  /* Each round closes one more listener: a freed endpoint left where
   * xport_wait looks (rxm) crashes it sooner or later. */
  for (int r = 0; r < LISTEN_ROUNDS; r++) {
    XT_OK(xport_listen(ctx, xt_listen_addr(), &lst));
    XT_OK(xport_listener_close(lst));
    snprintf(out, sizeof out, "after listener %d", r);
    XT_OK(xport_recv(conn, in, sizeof in, NULL, NULL));
    XT_OK(xport_send(conn, out, sizeof out, NULL, NULL));
    for (int got = 0; got < 2;) {
      xport_completion_t c;
      XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "round %d: no completion", r);
      XT_CHECK(c.status == 0, "round %d: %s", r, xport_strerror(c.status));
      got++;
    }
    XT_CHECK(!strcmp(in, out), "echo '%s'", in);
  }
  return 0;
}

static int echo_once(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  char buf[32];
  for (int r = 0; r < LISTEN_ROUNDS; r++) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    expect_ok(ctx, XPORT_OP_RECV);
    XT_OK(xport_send(conn, buf, sizeof buf, NULL, NULL));
    expect_ok(ctx, XPORT_OP_SEND);
  }
  xport_completion_t c;
  while (xt_next(ctx, &c, T_MS) == 0 && c.op != XPORT_OP_DISCONNECT)
    ;
  return 0;
}

START_TEST(wait_after_listener_close)
{
  xt_pair(echo_once, listener_closing_client, NULL);
}
END_TEST

/* ---- destroying a context while a peer writes into it ------------------ */

#define WREGION (1 << 20)
#define WCHUNK (1 << 16)

/* Exports a region, waits until the client writes, and returns: the
 * harness then closes the listener and destroys the context under the
 * client's stream of writes. The process must exit cleanly. */
static void written_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  static char region[WREGION];
  xport_conn_t *conn;
  xport_mr_t *mr;
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  char go[8];
  XT_OK(xport_accept(lst, 3 * T_MS, &conn)); /* the rounds before its own come first */
  XT_OK(xport_mr_reg(ctx, region, sizeof region, XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE,
                     &mr));
  int n = xport_rkey_pack(mr, 0, sizeof region, key, sizeof key);
  XT_CHECK(n > 0, "pack: %s", xport_strerror(n));
  XT_OK(xport_recv(conn, go, sizeof go, NULL, NULL));
  XT_OK(xport_send(conn, key, (size_t)n, NULL, NULL));
  for (int i = 0; i < 2; i++) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.status == 0, "key exchange");
  }
  /* The client has written for a while; the region stays registered until
   * xport_ctx_destroy takes it down with the rest. */
}

START_TEST(destroy_while_peer_writes)
{
  char addrs[WROUNDS][128];
  pid_t pids[WROUNDS];
  /* Every server is forked before this process opens a context
   * (xport(7), FORK). */
  for (int round = 0; round < WROUNDS; round++)
    pids[round] = xt_spawn_server(written_server, NULL, addrs[round], sizeof addrs[round]);
  for (int round = 0; round < WROUNDS; round++) {
    char *addr = addrs[round];
    static char buf[WCHUNK];
    uint8_t key[XPORT_RKEY_MAX_SIZE];
    pid_t pid = pids[round];
    xport_ctx_t *ctx = xt_ctx();
    xport_conn_t *conn;
    xport_rkey_t *rk;
    xport_completion_t c;
    XT_OK(xport_connect(ctx, addr, T_MS, &conn));
    XT_OK(xport_recv(conn, key, sizeof key, NULL, NULL));
    /* A few writes are on their way before the server hears "go". */
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.status == 0 && c.op == XPORT_OP_RECV, "no key");
    XT_OK(xport_rkey_unpack(conn, key, c.len, &rk));
    int out = 0, gone = 0;
    for (int i = 0; i < 8; i++)
      if (xport_write(conn, buf, sizeof buf, NULL, rk, (uint64_t)(i % 16) * WCHUNK, NULL) == 0)
        out++;
    XT_OK(xport_send(conn, "go", 3, NULL, NULL));
    out++;
    /* Keep writing until the server's context is gone. */
    for (int i = 8; !gone;) {
      if (out < 16 && xport_write(conn, buf, sizeof buf, NULL, rk,
                                  (uint64_t)(i % 16) * WCHUNK, NULL) == 0) {
        out++;
        i++;
      }
      int n = xport_poll(ctx, &c, 1);
      XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
      if (n == 1 && c.op == XPORT_OP_DISCONNECT)
        gone = 1;
      else if (n == 1 && c.status)
        gone = 1; /* the connection went down under the writes */
      else if (n == 1)
        out--;
      else if (out >= 16)
        xport_wait(ctx, 10);
    }
    int st = xt_reap(pid);
    XT_CHECK(st == 0, "round %d on %s: the server's xport_ctx_destroy under a peer's writes "
                      "ended with %d", round, xt_config(), st);
    xport_rkey_release(rk);
    xport_conn_close(conn);
    xport_ctx_destroy(ctx);
  }
}
END_TEST

/* ---- a closed connection's handle ---------------------------------------- */

static int await_goodbye(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)conn;
  (void)arg;
  xport_completion_t c;
  while (xt_next(ctx, &c, T_MS) == 0 && c.op != XPORT_OP_DISCONNECT)
    ;
  return 0;
}

/* xport_conn_close(3): after close the handle may only be compared, with
 * the conn of the completions still to come, which name it; xport frees it
 * once the last of them is polled (under ASan: no use after that). */
static int close_with_receives(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static char bufs[3][64];
  for (int i = 0; i < 3; i++)
    XT_OK(xport_recv(conn, bufs[i], sizeof bufs[i], NULL, &bufs[i]));
  XT_OK(xport_conn_close(conn));
  int seen = 0;
  for (int i = 0; i < 3; i++) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "receive %d of a closed connection never completed",
             i);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == -XPORT_ECANCELED, "op %d status %s", c.op,
             xport_strerror(c.status));
    XT_CHECK(c.conn == conn, "the completion names another connection");
    seen |= 1 << (int)((char(*)[64])c.user_ctx - bufs);
  }
  XT_CHECK(seen == 7, "receives completed %x, not once each", seen);
  xport_completion_t c;
  XT_CHECK(xport_poll(ctx, &c, 1) == 0, "a fourth completion (op %d) for a closed connection",
           c.op);
  return XT_CLOSED;
}

START_TEST(closed_handle_named_by_its_completions)
{
  xt_pair(await_goodbye, close_with_receives, NULL);
}
END_TEST

/* ---- a context per thread (xport(7), THREADS) ------------------------------
 * The documented model: each thread owns a context and its connections,
 * and no two threads share one. Eight threads on each side, each pair with
 * its own contexts and connection, echo messages of mixed sizes; every
 * byte is checked. Under ThreadSanitizer (make check-tsan) it shows that
 * contexts share nothing unlocked. */

#define CPT_THREADS 8
#define CPT_ROUNDS 150
#define CPT_MAX 9000

struct cpt_side {
  int index;
  int fd;              /* server: where it writes its address; client: unused */
  const char *listen;  /* server: where it listens (xt_listen_addr, read once) */
  char addr[128];      /* client: its server thread's listener */
  const char *failed;  /* NULL, or what went wrong */
  char why[160];
};

static size_t cpt_len(int index, int k)
{
  /* Mixed sizes, some past the eager size and the inject size. */
  static const size_t lens[] = {1, 8, 64, 200, 1024, 4000, CPT_MAX};
  return lens[(size_t)(index + k) % (sizeof lens / sizeof lens[0])];
}

/* The next completion on ctx (its own thread's), waiting at most T_MS. */
static int cpt_next(xport_ctx_t *ctx, xport_completion_t *c)
{
  for (int waited = 0; waited < T_MS; waited += 100) {
    int n = xport_poll(ctx, c, 1);
    if (n != 0)
      return n < 0 ? n : 0;
    int w = xport_wait(ctx, 100);
    if (w < 0 && w != -XPORT_ETIMEDOUT)
      return w;
  }
  return -XPORT_ETIMEDOUT;
}

#define CPT_FAIL(S, ...)                                                                    \
  do {                                                                                     \
    snprintf((S)->why, sizeof (S)->why, __VA_ARGS__);                                      \
    (S)->failed = (S)->why;                                                                \
    goto out;                                                                              \
  } while (0)

static void *cpt_server(void *arg)
{
  struct cpt_side *S = arg;
  xport_ctx_t *ctx = NULL;
  xport_listener_t *lst = NULL;
  xport_conn_t *conn = NULL;
  xport_completion_t c;
  char *rbuf = malloc(CPT_MAX), *sbuf = malloc(CPT_MAX);
  char a[128];
  int rc;
  if (!rbuf || !sbuf)
    CPT_FAIL(S, "malloc");
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_listen(ctx, S->listen, &lst)) ||
      (rc = xport_listener_addr(lst, a, sizeof a)))
    CPT_FAIL(S, "server %d: set-up: %s", S->index, xport_strerror(rc));
  char line[160];
  int n = snprintf(line, sizeof line, "%d %s\n", S->index, a);
  if (write(S->fd, line, (size_t)n) != n)
    CPT_FAIL(S, "server %d: address to the test", S->index);
  if ((rc = xport_accept(lst, T_MS, &conn)))
    CPT_FAIL(S, "server %d: accept: %s", S->index, xport_strerror(rc));
  for (int k = 0; k < CPT_ROUNDS; k++) {
    if ((rc = xport_recv(conn, rbuf, CPT_MAX, NULL, NULL)) || (rc = cpt_next(ctx, &c)))
      CPT_FAIL(S, "server %d: receive %d: %s", S->index, k, xport_strerror(rc));
    if (c.op != XPORT_OP_RECV || c.status)
      CPT_FAIL(S, "server %d: receive %d ended op %d, %s", S->index, k, c.op,
               xport_strerror(c.status));
    memcpy(sbuf, rbuf, c.len);
    if ((rc = xport_send(conn, sbuf, c.len, NULL, NULL)) || (rc = cpt_next(ctx, &c)))
      CPT_FAIL(S, "server %d: echo %d: %s", S->index, k, xport_strerror(rc));
    if (c.op != XPORT_OP_SEND || c.status)
      CPT_FAIL(S, "server %d: echo %d ended op %d, %s", S->index, k, c.op,
               xport_strerror(c.status));
  }
  /* The client closes first: its goodbye, or the end of its context. */
  while ((rc = cpt_next(ctx, &c)) == 0 && c.op != XPORT_OP_DISCONNECT)
    ;
out:
  xport_conn_close(conn);
  xport_listener_close(lst);
  xport_ctx_destroy(ctx);
  free(rbuf);
  free(sbuf);
  return NULL;
}

static void *cpt_client(void *arg)
{
  struct cpt_side *S = arg;
  xport_ctx_t *ctx = NULL;
  xport_conn_t *conn = NULL;
  xport_completion_t c;
  char *rbuf = malloc(CPT_MAX), *sbuf = malloc(CPT_MAX);
  int rc;
  if (!rbuf || !sbuf)
    CPT_FAIL(S, "malloc");
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_connect(ctx, S->addr, T_MS, &conn)))
    CPT_FAIL(S, "client %d: set-up: %s", S->index, xport_strerror(rc));
  for (int k = 0; k < CPT_ROUNDS; k++) {
    size_t len = cpt_len(S->index, k);
    unsigned seed = (unsigned)(S->index * 100000 + k);
    xt_fill(sbuf, len, seed);
    memset(rbuf, 0, len);
    if ((rc = xport_recv(conn, rbuf, CPT_MAX, NULL, NULL)) ||
        (rc = xport_send(conn, sbuf, len, NULL, NULL)))
      CPT_FAIL(S, "client %d: post %d: %s", S->index, k, xport_strerror(rc));
    for (int got = 0; got < 2; got++) {
      if ((rc = cpt_next(ctx, &c)))
        CPT_FAIL(S, "client %d: round %d: %s", S->index, k, xport_strerror(rc));
      if (c.status || (c.op != XPORT_OP_SEND && c.op != XPORT_OP_RECV))
        CPT_FAIL(S, "client %d: round %d ended op %d, %s", S->index, k, c.op,
                 xport_strerror(c.status));
      if (c.op == XPORT_OP_RECV && (c.len != len || xt_verify(rbuf, len, seed) != len))
        CPT_FAIL(S, "client %d: round %d: echo of %zu bytes came back as %zu, bad at %zu",
                 S->index, k, len, c.len, xt_verify(rbuf, c.len < len ? c.len : len, seed));
    }
  }
out:
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  free(rbuf);
  free(sbuf);
  return NULL;
}

START_TEST(context_per_thread)
{
  int p[2];
  XT_CHECK(pipe(p) == 0, "pipe");
  pid_t pid = xt_fork();
  if (pid == 0) {
    close(p[0]);
    pthread_t t[CPT_THREADS];
    struct cpt_side S[CPT_THREADS];
    /* The harness's address lives in one buffer: read it before the
     * threads start. */
    const char *listen = xt_listen_addr();
    for (int i = 0; i < CPT_THREADS; i++) {
      S[i] = (struct cpt_side){.index = i, .fd = p[1], .listen = listen};
      XT_CHECK(pthread_create(&t[i], NULL, cpt_server, &S[i]) == 0, "pthread_create");
    }
    int bad = 0;
    for (int i = 0; i < CPT_THREADS; i++) {
      pthread_join(t[i], NULL);
      if (S[i].failed) {
        fprintf(stderr, "%s\n", S[i].failed);
        bad = 1;
      }
    }
    _exit(bad);
  }
  close(p[1]);
  struct cpt_side S[CPT_THREADS];
  memset(S, 0, sizeof S);
  /* The servers' addresses, one line each, in the order they listened. */
  FILE *f = fdopen(p[0], "r");
  XT_CHECK(f, "fdopen");
  for (int got = 0; got < CPT_THREADS; got++) {
    char line[200], a[128];
    int i;
    XT_CHECK(fgets(line, sizeof line, f) && sscanf(line, "%d %127s", &i, a) == 2 && i >= 0 &&
                 i < CPT_THREADS,
             "server thread %d of %d on %s sent no address", got, CPT_THREADS, xt_config());
    S[i].index = i;
    snprintf(S[i].addr, sizeof S[i].addr, "%s", a);
  }
  fclose(f);
  pthread_t t[CPT_THREADS];
  for (int i = 0; i < CPT_THREADS; i++)
    XT_CHECK(pthread_create(&t[i], NULL, cpt_client, &S[i]) == 0, "pthread_create");
  for (int i = 0; i < CPT_THREADS; i++)
    pthread_join(t[i], NULL);
  int status = xt_reap(pid);
  for (int i = 0; i < CPT_THREADS; i++)
    XT_CHECK(!S[i].failed, "%s on %s", S[i].failed, xt_config());
  XT_CHECK(status == 0, "a server thread failed on %s (status %d)", xt_config(), status);
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("thread");
  TCase *tc = tcase_create("Progress");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, wait_never_misses_progress_thread_work);
  tcase_add_test(tc, accept_does_not_hold_progress_hostage);
  tcase_add_test(tc, detail_belongs_to_its_completion);
  suite_add_tcase(s, tc);
  TCase *life = tcase_create("Lifecycle");
  tcase_set_timeout(life, 120);
  tcase_add_test(life, wait_after_listener_close);
  tcase_add_test(life, destroy_while_peer_writes);
  tcase_add_test(life, closed_handle_named_by_its_completions);
  suite_add_tcase(s, life);
  TCase *cpt = tcase_create("Contexts");
  tcase_set_timeout(cpt, 300);
  tcase_add_test(cpt, context_per_thread);
  suite_add_tcase(s, cpt);
  return s;
}

int main(void)
{
  return xt_main("check_thread", make_suite, 1);
}
