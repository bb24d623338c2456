/* Lifecycles outside the happy path, run on every provider present: an
 * operation's completion means the provider is done with its buffer (a
 * close with a large send or read in flight), liveness checks that busy
 * traffic does not starve, one-sided deadlines that do not fail a target
 * that is merely busy, and queue depths that say what xport enforces.
 *
 * The two processes step in order through pipes: the server stops calling
 * xport at a chosen point, so that what the provider still owns is still
 * unfinished when the client looks. */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 20000
/* 16 MiB, or the most one message may carry where that is less (the
 * verbs device in the guest). */
static size_t big_len(void)
{
  size_t big = (size_t)16 << 20, max = xt_caps()->max_msg_size;
  return max && max < big ? max : big;
}
#define BIG big_len()

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}


/* Waits for the other process's step while polling ctx (which must stay
 * quiet: any completion fails the test). */
static char step_get_polling(xport_ctx_t *ctx, int fd)
{
  long end = now_ms() + T_MS;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    xport_completion_t c;
    int n = xport_poll(ctx, &c, 1);
    XT_CHECK(n == 0, "unexpected completion: op %d status %s (a second completion?)", c.op,
             n > 0 ? xport_strerror(c.status) : xport_strerror(n));
    if (poll(&p, 1, 1) == 1) {
      char what = 0;
      XT_CHECK(read(fd, &what, 1) == 1, "pipe read");
      return what;
    }
    XT_CHECK(now_ms() < end, "the other process never took its step");
  }
}

static void expect(xport_ctx_t *ctx, xport_completion_t *c, xport_op_t op, int status)
{
  XT_CHECK(xt_next(ctx, c, T_MS) == 0, "no completion of op %d on %s", op, xt_config());
  XT_CHECK(c->op == op, "op %d, expected %d (status %s)", c->op, op, xport_strerror(c->status));
  XT_CHECK(c->status == status, "op %d: status %s, expected %s", op, xport_strerror(c->status),
           xport_strerror(status));
}

/* After the user's close, the operation completes exactly once, with
 * ECANCELED (or 0 where the provider finished it), and only when the
 * provider has let go of the buffer. Waits a
 * little for it; returns 'R' if it came at once, 'W' if it came later
 * (after the server was told to move on). */
static char closed_op_completes(xport_ctx_t *ctx, xport_op_t op, struct xt_steps *st)
{
  xport_completion_t c;
  char path = 'R';
  if (xt_next(ctx, &c, 1000) != 0) {
    /* Still the provider's: the server may now let it finish. */
    path = 'W';
    xt_step_put(st->c2s[1], 'W');
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "the closed connection's operation never ended");
  } else {
    xt_step_put(st->c2s[1], 'R');
  }
  XT_CHECK(c.op == op && (c.status == -XPORT_ECANCELED || c.status == 0),
           "op %d status %s, expected %d ECANCELED", c.op, xport_strerror(c.status), op);
  return path;
}

/* ---- 1. a 16 MiB send, closed at once -------------------------------- */

static int big_recv_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  char *buf = calloc(1, BIG);
  XT_CHECK(buf != NULL, "calloc");
  XT_OK(xport_recv(conn, buf, BIG, NULL, NULL));
  XT_OK(xport_send(conn, "go", 3, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  /* Not inside xport until the client has its completion (or has waited
   * for it): whatever the provider still has to copy is copied later. */
  xt_step_get(st->c2s[0], T_MS);
  int got_recv = 0, gone = 0;
  while (!got_recv || !gone) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: recv %d, disconnect %d", got_recv, gone);
    if (c.op == XPORT_OP_DISCONNECT) {
      gone = 1;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_RECV, "server: op %d", c.op);
    got_recv = 1;
    /* The goodbye follows the sender's operations (xport_conn_close(3)). */
    XT_CHECK(!(gone && c.status == 0), "the message arrived after the disconnect event");
    if (c.status == 0) {
      /* Delivered: every byte must be the original, never the refill. */
      XT_CHECK(c.len == BIG, "received %zu bytes", c.len);
      size_t bad = xt_verify(buf, BIG, 1);
      XT_CHECK(bad == BIG, "byte %zu of the message is not what was sent: the sender's "
               "buffer was refilled while the provider still owned it", bad);
    }
  }
  free(buf);
  return 0;
}

static int big_send_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  char go[4];
  char *buf = malloc(BIG);
  XT_CHECK(buf != NULL, "malloc");
  XT_OK(xport_recv(conn, go, sizeof go, NULL, NULL));
  expect(ctx, &c, XPORT_OP_RECV, 0);
  xt_fill(buf, BIG, 1);
  XT_OK(xport_send(conn, buf, BIG, NULL, NULL));
  XT_OK(xport_conn_close(conn));
  closed_op_completes(ctx, XPORT_OP_SEND, st);
  xt_fill(buf, BIG, 2); /* the buffer is the application's again */
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a second completion: op %d", c.op);
  free(buf);
  return XT_CLOSED;
}

START_TEST(close_with_big_send_in_flight)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(big_recv_server, big_send_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 1. a 16 MiB read, closed at once -------------------------------- */

static void send_key(xport_ctx_t *ctx, xport_conn_t *conn, xport_mr_t *mr, size_t len)
{
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  xport_completion_t c;
  int n = xport_rkey_pack(mr, 0, len, key, sizeof key);
  XT_CHECK(n > 0, "pack: %s", xport_strerror(n));
  XT_OK(xport_send(conn, key, (size_t)n, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
}

static xport_rkey_t *get_key(xport_ctx_t *ctx, xport_conn_t *conn)
{
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  xport_completion_t c;
  xport_rkey_t *rk;
  XT_OK(xport_recv(conn, key, sizeof key, NULL, NULL));
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_OK(xport_rkey_unpack(conn, key, c.len, &rk));
  return rk;
}

static int read_target_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  xport_mr_t *mr;
  char *reg = malloc(BIG);
  XT_CHECK(reg != NULL, "malloc");
  xt_fill(reg, BIG, 3);
  XT_OK(xport_mr_reg(ctx, reg, BIG, XPORT_ACCESS_REMOTE_READ, &mr));
  send_key(ctx, conn, mr, BIG);
  xt_step_get(st->c2s[0], T_MS);
  /* The disconnect comes after the read on the wire: once it is here,
   * the read has been served, or never will be. */
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  xt_step_put(st->s2c[1], 'D');
  /* Still progressing (tcp moves nothing otherwise) until the client has
   * its completion and has checked its buffer. */
  step_get_polling(ctx, st->c2s[0]);
  XT_OK(xport_conn_close(conn));
  XT_OK(xport_mr_dereg(mr));
  free(reg);
  return XT_CLOSED;
}

static int big_read_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  char *buf = calloc(1, BIG);
  XT_CHECK(buf != NULL, "calloc");
  xport_rkey_t *rk = get_key(ctx, conn);
  XT_OK(xport_read(conn, buf, BIG, NULL, rk, 0, NULL));
  XT_OK(xport_conn_close(conn));
  closed_op_completes(ctx, XPORT_OP_READ, st);
  xt_fill(buf, BIG, 9); /* the buffer is the application's again */
  XT_CHECK(step_get_polling(ctx, st->s2c[0]) == 'D', "server step");
  size_t bad = xt_verify(buf, BIG, 9);
  XT_CHECK(bad == BIG, "byte %zu was written after the read completed", bad);
  xt_step_put(st->c2s[1], 'V');
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a second completion: op %d", c.op);
  xport_rkey_release(rk);
  free(buf);
  return XT_CLOSED;
}

START_TEST(close_with_big_read_in_flight)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(read_target_server, big_read_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 1. a close after sends completed delivers them -------------------- */

/* Messages whose sends completed before the close reach the peer before
 * its disconnect event, however many are still on their way (tcp: the
 * atomic service channel's end overtook the backed-up stream's and ended
 * the connection at the receiver, dropping what was still in flight). */
#define CS_LEN 20000
static size_t cs_count(void)
{
  size_t n = 200, rx = xt_caps()->rx_depth, tx = xt_caps()->tx_depth;
  n = rx < n ? rx : n;
  return tx < n ? tx : n; /* posted at once, none polled */
}

static int sent_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  size_t n = cs_count();
  char *bufs = malloc(n * CS_LEN);
  XT_CHECK(bufs != NULL, "malloc");
  for (size_t i = 0; i < n; i++)
    XT_OK(xport_recv(conn, bufs + i * CS_LEN, CS_LEN, NULL, bufs + i * CS_LEN));
  xt_step_put(st->s2c[1], 'P');
  for (size_t got = 0; got < n; got++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: message %zu of %zu never came", got, n);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0,
             "server: %zu of %zu messages, then op %d %s", got, n, c.op,
             xport_strerror(c.status));
    size_t k = (size_t)((char *)c.user_ctx - bufs) / CS_LEN;
    XT_CHECK(k == got && xt_verify(c.user_ctx, CS_LEN, (unsigned)k) == CS_LEN,
             "message %zu arrived as %zu or changed", got, k);
  }
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  XT_OK(xport_conn_close(conn));
  free(bufs);
  return XT_CLOSED;
}

static int sent_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  size_t n = cs_count();
  char *msgs = malloc(n * CS_LEN);
  XT_CHECK(msgs != NULL, "malloc");
  XT_CHECK(xt_step_get(st->s2c[0], T_MS) == 'P', "server step");
  for (size_t i = 0; i < n; i++) {
    xt_fill(msgs + i * CS_LEN, CS_LEN, (unsigned)i);
    XT_OK(xport_send(conn, msgs + i * CS_LEN, CS_LEN, NULL, NULL));
  }
  for (size_t i = 0; i < n; i++)
    expect(ctx, &c, XPORT_OP_SEND, 0);
  XT_OK(xport_conn_close(conn));
  free(msgs);
  return XT_CLOSED;
}

START_TEST(close_after_sends_completed_delivers)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(sent_server, sent_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 1. posts waiting behind a read end at the close ------------------ */

/* shm serves one read per peer at a time, only while the target is inside
 * xport, and pushes back everything else to that peer meanwhile: xport
 * keeps those posts in order until they fit. At the close they end at
 * once (the provider never had them), without the target's help; the
 * read ends when the provider lets go. A write that says ECANCELED
 * never lands. */
static int held_target_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  xport_mr_t *mr;
  char *reg = malloc(BIG + 4096);
  XT_CHECK(reg != NULL, "malloc");
  xt_fill(reg, BIG + 4096, 3);
  XT_OK(xport_mr_reg(ctx, reg, BIG + 4096, XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE,
                     &mr));
  static char orig[4096];
  memcpy(orig, reg + BIG, sizeof orig);
  send_key(ctx, conn, mr, BIG + 4096);
  xt_step_get(st->c2s[0], T_MS); /* not inside xport until then */
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  xt_step_put(st->s2c[1], 'D');
  char what = step_get_polling(ctx, st->c2s[0]);
  if (what == 'X')
    XT_CHECK(!memcmp(reg + BIG, orig, sizeof orig),
             "a write that completed with ECANCELED landed");
  XT_OK(xport_conn_close(conn));
  XT_OK(xport_mr_dereg(mr));
  free(reg);
  return XT_CLOSED;
}

static int held_read_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  char *buf = calloc(1, BIG);
  static char wsrc[4096], msg[100];
  XT_CHECK(buf != NULL, "calloc");
  xport_rkey_t *rk = get_key(ctx, conn);
  xt_fill(wsrc, sizeof wsrc, 7);
  XT_OK(xport_read(conn, buf, BIG, NULL, rk, 0, buf));
  XT_OK(xport_write(conn, wsrc, sizeof wsrc, NULL, rk, BIG, wsrc));
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, msg));
  XT_OK(xport_conn_close(conn));
  int status[3], seen[3] = {0}, got = 0, early = 0;
  char path = 'R';
  while (got < 3) {
    if (xt_next(ctx, &c, path == 'R' ? 1000 : T_MS) != 0) {
      XT_CHECK(path == 'R', "%d of the closed connection's 3 operations never ended", 3 - got);
      path = 'W'; /* the rest is still the provider's: let the server move */
      xt_step_put(st->c2s[1], 'W');
      continue;
    }
    int k = c.user_ctx == buf ? 0 : c.user_ctx == wsrc ? 1 : c.user_ctx == msg ? 2 : -1;
    XT_CHECK(k >= 0 && !seen[k]++, "op %d completed twice or is unknown", c.op);
    XT_CHECK(c.status == -XPORT_ECANCELED || c.status == 0, "op %d: %s, expected ECANCELED",
             c.op, xport_strerror(c.status));
    status[k] = c.status;
    got++;
    early += path == 'R' && k > 0;
  }
  if (path == 'R')
    xt_step_put(st->c2s[1], 'R');
  if (!strcmp(xt_transport(), "shm"))
    XT_CHECK(early == 2, "the posts held behind the read did not end at the close");
  xt_fill(buf, BIG, 9); /* the buffers are the application's again */
  xt_fill(wsrc, sizeof wsrc, 9);
  XT_CHECK(step_get_polling(ctx, st->s2c[0]) == 'D', "server step");
  size_t bad = xt_verify(buf, BIG, 9);
  XT_CHECK(bad == BIG, "byte %zu was written after the read completed", bad);
  xt_step_put(st->c2s[1], status[1] ? 'X' : 'V');
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a second completion: op %d", c.op);
  xport_rkey_release(rk);
  free(buf);
  return XT_CLOSED;
}

START_TEST(close_with_posts_held_behind_a_read)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(held_target_server, held_read_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 1. a dead peer's operations end; the context goes on ------------- */

static int dying_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)ctx;
  (void)conn;
  (void)arg;
  raise(SIGKILL);
  return 0;
}

static int echo_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  char buf[64];
  xport_completion_t c;
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_OK(xport_send(conn, buf, c.len, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  return 0;
}

/* The echo server of a test whose first part runs before it is asked. */
static void patient_echo(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, 3 * T_MS, &conn));
  echo_server(ctx, conn, arg);
  XT_OK(xport_conn_close(conn));
}

START_TEST(dead_peer_ops_end_and_context_goes_on)
{
  /* The server dies by SIGKILL right after accepting; a large send and a
   * receive are outstanding on the connection. shm never finishes such a
   * send: xport retires the endpoint it was posted on, which ends it. */
  char addr[128], rbuf[64];
  xport_conn_t *conn;
  xport_completion_t c;
  char *big = malloc(BIG);
  XT_CHECK(big != NULL, "malloc");
  xt_fill(big, BIG, 4);
  /* Both servers are forked before this process opens a context
   * (xport(7), FORK); the echo server waits for its turn in accept. */
  char echo_addr[128];
  pid_t echo = xt_spawn_server(patient_echo, NULL, echo_addr, sizeof echo_addr);
  pid_t pid = xt_spawn_pair_server(dying_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  int rc = xport_recv(conn, rbuf, sizeof rbuf, NULL, NULL);
  XT_CHECK(rc == 0 || rc == -XPORT_ENOTCONN, "recv: %s", xport_strerror(rc));
  int want = rc == 0;
  rc = xport_send(conn, big, BIG, NULL, NULL);
  XT_CHECK(rc == 0 || rc == -XPORT_ENOTCONN, "send: %s", xport_strerror(rc));
  want += rc == 0;
  XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "server did not die by SIGKILL");
  for (int got = 0, gone = 0; got < want || !gone;) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "%d of %d operations ended, disconnect %d", got, want,
             gone);
    if (c.op == XPORT_OP_DISCONNECT) {
      gone = 1;
      continue;
    }
    XT_CHECK(c.status != 0, "op %d succeeded towards a dead peer", c.op);
    got++;
  }
  XT_OK(xport_conn_close(conn));
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a second completion: op %d", c.op);
  /* New connections from the same context still work. */
  XT_OK(xport_connect(ctx, echo_addr, T_MS, &conn));
  char msg[32], back[64];
  xt_fill(msg, sizeof msg, 6);
  XT_OK(xport_recv(conn, back, sizeof back, NULL, NULL));
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, NULL));
  for (int i = 0; i < 2; i++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "echo: timeout");
    XT_CHECK(c.status == 0, "echo: op %d %s", c.op, xport_strerror(c.status));
  }
  XT_CHECK(xt_verify(back, sizeof msg, 6) == sizeof msg, "echo bytes differ");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(echo) == 0, "echo server failed");
  free(big);
}
END_TEST

/* ---- unsignaled sends, a signaled one behind them, and a dead peer ---- */

/* Accepts, then stays out of xport until killed: nothing it was sent is
 * taken, so a large message to it stays unfinished. */
static int stalled_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)ctx;
  (void)conn;
  (void)arg;
  for (;;)
    pause();
  return 0;
}

/* A large unsignaled send (never finished: the peer takes nothing), a
 * small one, then a signaled one; the peer is killed, before or after
 * the client's own close. Every signaled send completes exactly once, with
 * an error, since its success would vouch for the large send that failed
 * (xport_send_flags(3)), and after that failure; the large send fails
 * exactly once; the small one at most once. */
static void unsig_then_dead_peer(int close_first)
{
  char addr[128], small[256], sig[16];
  xport_conn_t *conn;
  xport_completion_t c;
  char *big = malloc(BIG);
  XT_CHECK(big != NULL, "malloc");
  xt_fill(big, BIG, 7);
  xt_fill(small, sizeof small, 8);
  xt_fill(sig, sizeof sig, 9);
  pid_t pid = xt_spawn_pair_server(stalled_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_check_transport(conn);
  XT_OK(xport_send_flags(conn, big, BIG, NULL, XPORT_SEND_UNSIGNALED, big));
  int rc = xport_send_flags(conn, small, sizeof small, NULL, XPORT_SEND_UNSIGNALED, small);
  XT_CHECK(rc == 0 || rc == -XPORT_EAGAIN, "small unsignaled send: %s", xport_strerror(rc));
  XT_OK(xport_send_flags(conn, sig, sizeof sig, NULL, 0, sig));
  /* The signaled send may not come before the large one ended. */
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "op %d (%s) came while the large "
           "unsignaled send before it was unfinished", c.op, xport_strerror(c.status));
  if (close_first)
    XT_OK(xport_conn_close(conn));
  kill(pid, SIGKILL);
  XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "server did not die by SIGKILL");
  int got_big = 0, got_small = 0, got_sig = 0, gone = close_first;
  while (!got_big || !got_sig || !gone) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "on %s: large send ended %d, signaled send %d, "
             "disconnect %d", xt_config(), got_big, got_sig, gone);
    if (c.op == XPORT_OP_DISCONNECT) {
      XT_CHECK(!close_first && !gone, "a disconnect event %s", close_first ? "after the "
               "user's close" : "twice");
      gone = 1;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_SEND && c.status != 0, "op %d %s toward a dead peer", c.op,
             xport_strerror(c.status));
    if (c.user_ctx == big) {
      XT_CHECK(!got_big++, "the large send completed twice");
    } else if (c.user_ctx == small) {
      XT_CHECK(!got_small++, "the small send completed twice");
    } else {
      XT_CHECK(c.user_ctx == sig, "a completion of no send posted");
      XT_CHECK(!got_sig++, "the signaled send completed twice");
      XT_CHECK(got_big, "on %s the signaled send (%s) came before the failure of the "
               "unsignaled send it vouches for", xt_config(), xport_strerror(c.status));
    }
  }
  if (!close_first)
    XT_OK(xport_conn_close(conn));
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a second completion: op %d", c.op);
  xport_ctx_destroy(ctx);
  xt_shm_remove_of(pid);
  free(big);
}

START_TEST(signaled_send_behind_unsignaled_dead_peer)
{
  unsig_then_dead_peer(0);
}
END_TEST

START_TEST(signaled_send_behind_unsignaled_closed_dead_peer)
{
  unsig_then_dead_peer(1);
}
END_TEST

/* ---- a peer that destroys its context, alive, with operations out ------ */

/* The server's receive ends, and the disconnect comes, while the client's
 * process lives on: nothing but the client's goodbye can tell it. */
static int told_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  char buf[64];
  xport_completion_t c;
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
  xt_step_put(st->s2c[1], 'R');
  int recv_done = 0, gone = 0;
  while (!recv_done || !gone) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server on %s: receive ended %d, disconnect %d, "
             "with the client's process alive", xt_config(), recv_done, gone);
    if (c.op == XPORT_OP_DISCONNECT) {
      XT_CHECK(c.status == -XPORT_ECONNRESET, "disconnect: %s", xport_strerror(c.status));
      gone++;
    } else {
      XT_CHECK(c.op == XPORT_OP_RECV && c.status == -XPORT_ECONNRESET, "op %d: %s", c.op,
               xport_strerror(c.status));
      recv_done++;
    }
  }
  xt_step_put(st->s2c[1], 'D');
  return 0;
}

START_TEST(destroy_with_operations_out_tells_peer)
{
  struct xt_steps st;
  xt_steps_open(&st);
  char addr[128], rbuf[4][64];
  pid_t pid = xt_spawn_pair_server(told_server, &st, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'R', "server not ready");
  for (int i = 0; i < 4; i++)
    XT_OK(xport_recv(conn, rbuf[i], sizeof rbuf[i], NULL, NULL));
  xport_ctx_destroy(ctx); /* the receives still posted */
  XT_CHECK(xt_step_get(st.s2c[0], 3 * T_MS) == 'D', "the server never heard of the end");
  XT_CHECK(xt_reap(pid) == 0, "server failed");
  xt_steps_close(&st);
}
END_TEST

/* ---- 2. closing with large messages unreceived -------------------------- */

#define MIB (1u << 20)
/* Sends two 1 MiB messages, of which the client receives one; then dies
 * (arg: 1) or waits for the client's goodbye. */
static int two_big_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  int die = *(int *)arg;
  xport_completion_t c;
  char *buf = malloc(MIB);
  XT_CHECK(buf != NULL, "malloc");
  xt_fill(buf, MIB, 8);
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  XT_OK(xport_send(conn, buf, MIB, NULL, NULL));
  XT_OK(xport_send(conn, buf, MIB, NULL, NULL));
  /* The client takes the first and closes: where one endpoint serves
   * many connections (shm, rxm) the disconnect event may come before the
   * completion of a send the peer took (xport(7), Outcomes, (1)); the
   * send still completes, with 0. */
  int got, gone = 0;
  while ((got = xt_next(ctx, &c, T_MS)) == 0 && c.op == XPORT_OP_DISCONNECT && !gone &&
         !die && caps.ep_type == XPORT_EP_RDM)
    gone = 1;
  XT_CHECK(got == 0 && c.op == XPORT_OP_SEND && c.status == 0,
           "the first message did not go on %s: %s, op %d, %s [%s]%s", xt_config(),
           xport_strerror(got), got ? 0 : c.op, got ? "-" : xport_strerror(c.status),
           got || !c.detail ? "" : c.detail, gone ? " (after the disconnect event)" : "");
  if (die)
    raise(SIGKILL);
  while (!gone) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "no goodbye from the client");
    gone = c.op == XPORT_OP_DISCONNECT;
  }
  free(buf);
  return 0;
}

/* The client closes with the second message unreceived, the peer alive
 * or dead: the close returns, nothing crashes, the context goes on. Stale
 * traffic of a closed connection is drained: on shm a drain receive that
 * such a message truncated spun in the provider for ever (the peer,
 * answering the goodbye, spinning behind it); over rxm one that took a
 * dead peer's rendezvous message crashed the process. */
static void close_unreceived(int die)
{
  char addr[128];
  xport_conn_t *conn;
  xport_completion_t c;
  char *in = calloc(1, MIB);
  XT_CHECK(in != NULL, "calloc");
  pid_t pid = xt_spawn_pair_server(two_big_server, &die, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_recv(conn, in, MIB, NULL, NULL));
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_CHECK(c.len == MIB && xt_verify(in, MIB, 8) == MIB, "the first message differs");
  if (die) {
    XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "server did not die by SIGKILL");
    expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  }
  XT_OK(xport_conn_close(conn));
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "a completion after close: op %d", c.op);
  xport_ctx_destroy(ctx);
  if (!die)
    XT_CHECK(xt_reap(pid) == 0, "server failed");
  free(in);
}

START_TEST(close_with_big_message_unreceived)
{
  close_unreceived(0);
}
END_TEST

START_TEST(close_after_dead_peer_left_big_message)
{
  close_unreceived(1);
}
END_TEST

/* ---- 4. liveness under continuous traffic ----------------------------- */

#define FLOOD_MSG 64
#define FLOOD_WIN 64
#define FLOOD_END 0xffffffffu

/* A slow receiver: its CQ always has entries waiting. */
static int flood_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static char bufs[FLOOD_WIN][FLOOD_MSG];
  static char work[256 << 10];
  xport_completion_t c;
  uint32_t expect_seq = 0;
  for (int i = 0; i < FLOOD_WIN; i++)
    XT_OK(xport_recv(conn, bufs[i], FLOOD_MSG, NULL, bufs[i]));
  for (;;) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: flood stalled at %u", expect_seq);
    XT_CHECK(c.op == XPORT_OP_RECV, "server: op %d status %s: a busy peer was dropped", c.op,
             xport_strerror(c.status));
    XT_CHECK(c.status == 0, "server: receive %u: %s", expect_seq, xport_strerror(c.status));
    uint32_t seq;
    memcpy(&seq, c.user_ctx, sizeof seq);
    if (seq == FLOOD_END)
      break;
    XT_CHECK(seq == expect_seq, "message %u arrived as %u", expect_seq, seq);
    XT_CHECK(xt_verify((char *)c.user_ctx + 4, FLOOD_MSG - 4, seq) == FLOOD_MSG - 4,
             "message %u: bytes differ", seq);
    expect_seq++;
    memset(work, (int)seq, sizeof work); /* the application's own work */
    XT_OK(xport_recv(conn, c.user_ctx, FLOOD_MSG, NULL, c.user_ctx));
  }
  XT_OK(xport_send(conn, &expect_seq, sizeof expect_seq, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  return 0;
}

static int flood_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  long *ms = arg;
  static char msgs[FLOOD_WIN][FLOOD_MSG];
  xport_completion_t comps[16];
  uint32_t seq = 0, got = 0;
  int inflight = 0, slot = 0;
  XT_OK(xport_recv(conn, &got, sizeof got, NULL, &got));
  long end = now_ms() + *ms;
  for (int done = 0; !done;) {
    int last = now_ms() >= end;
    while (inflight < FLOOD_WIN) {
      char *m = msgs[slot];
      uint32_t s = last ? FLOOD_END : seq;
      memcpy(m, &s, 4);
      xt_fill(m + 4, FLOOD_MSG - 4, s);
      int rc = xport_send(conn, m, FLOOD_MSG, NULL, m);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      inflight++;
      slot = (slot + 1) % FLOOD_WIN;
      if (last) {
        done = 1;
        break;
      }
      seq++;
    }
    int n = xport_poll(ctx, comps, 16);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    for (int i = 0; i < n; i++) {
      XT_CHECK(comps[i].op == XPORT_OP_SEND && comps[i].status == 0,
               "client: op %d status %s after %u messages: a busy peer was declared lost",
               comps[i].op, xport_strerror(comps[i].status), seq);
      inflight--;
    }
  }
  /* The count the server saw comes back; the sends still in flight end. */
  xport_completion_t c;
  for (int have = 0; !have || inflight > 0;) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "client: the end of the flood never came");
    if (c.op == XPORT_OP_SEND) {
      XT_CHECK(c.status == 0, "send: %s", xport_strerror(c.status));
      inflight--;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "client: op %d %s", c.op,
             xport_strerror(c.status));
    have = 1;
  }
  XT_CHECK(got == seq, "server saw %u messages of %u", got, seq);
  return 0;
}

START_TEST(busy_peer_stays_alive)
{
  /* Heartbeats forced, a short timeout, and a flood lasting many timeouts:
   * a peer busy with traffic is alive, and must be seen so. */
  long ms = 4 * 1500;
  setenv("XPORT_KEEPALIVE", "1", 1);
  setenv("XPORT_PEER_TIMEOUT", "1500", 1);
  setenv("XPORT_KEEPALIVE_TIMEOUT", "1500", 1);
  xt_pair(flood_server, flood_client, &ms);
}
END_TEST

/* A peer that computes outside xport, with its progress thread on, for
 * several keepalive timeouts: the thread keeps the connection alive
 * (heartbeats), and data still flows both ways afterwards. */
#define COMPUTE_KA_MS 1500
#define COMPUTE_MSG 4096
static int computing_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static char out[COMPUTE_MSG], back[COMPUTE_MSG];
  static volatile char work[64 << 10];
  xport_completion_t c;
  XT_OK(xport_recv(conn, back, sizeof back, NULL, back));
  long end = now_ms() + 4 * COMPUTE_KA_MS;
  for (unsigned i = 0; now_ms() < end; i++) /* the application's own work */
    for (size_t j = 0; j < sizeof work; j += 64)
      work[j] = (char)(i + j);
  xt_fill(out, sizeof out, 11);
  XT_OK(xport_send(conn, out, sizeof out, NULL, out));
  for (int sent = 0, got = 0; !sent || !got;) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: send %d, echo %d", sent, got);
    XT_CHECK(c.status == 0 && (c.op == XPORT_OP_SEND || c.op == XPORT_OP_RECV),
             "server on %s: op %d %s after computing with its progress thread on", xt_config(),
             c.op, xport_strerror(c.status));
    sent |= c.op == XPORT_OP_SEND;
    got |= c.op == XPORT_OP_RECV;
  }
  XT_CHECK(xt_verify(back, sizeof back, 12) == sizeof back, "server: the echo's bytes differ");
  return 0;
}

START_TEST(computing_peer_with_progress_thread_stays_alive)
{
  static char in[COMPUTE_MSG], echo[COMPUTE_MSG];
  char addr[128];
  xport_conn_t *conn;
  xport_completion_t c;
  char ka[16];
  snprintf(ka, sizeof ka, "%d", COMPUTE_KA_MS);
  setenv("XPORT_KEEPALIVE", "1", 1);
  setenv("XPORT_PEER_TIMEOUT", ka, 1);
  setenv("XPORT_KEEPALIVE_TIMEOUT", ka, 1);
  /* The server's alone: this side stays inside xport, and answers. */
  setenv("XPORT_PROGRESS_THREAD", "1", 1);
  pid_t pid = xt_spawn_pair_server(computing_server, NULL, addr, sizeof addr);
  unsetenv("XPORT_PROGRESS_THREAD");
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_check_transport(conn);
  XT_OK(xport_recv(conn, in, sizeof in, NULL, in));
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "client: the computing peer's message never came");
  XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "client on %s: op %d %s while the peer "
           "computed with its progress thread on", xt_config(), c.op,
           xport_strerror(c.status));
  XT_CHECK(c.len == sizeof in && xt_verify(in, sizeof in, 11) == sizeof in,
           "client: the message's bytes differ");
  xt_fill(echo, sizeof echo, 12);
  XT_OK(xport_send(conn, echo, sizeof echo, NULL, echo));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* A disconnect is delivered while the completion queue stays busy: one
 * connection streams messages, the other is closed by its peer, and the
 * server polls for one completion at a time. Two moments of the close:
 * while the server is outside xport (the stream fills every queue toward
 * it, the goodbye included: shm pushes it back), and, from a process of
 * its own, while the server polls, slower than the stream (what the RDM
 * checks take from the CQ keeps its done list full: the event must not
 * wait behind entries that came after it). The event must
 * come while the stream still runs: the client streams until the server
 * says it has the event, so no clock decides the outcome. An event that
 * waits for the queue to run empty never comes, and the client gives up
 * after BUSY_GIVE_UP_MS of streaming, a bound far past any load (the
 * server then sees the stream end first and says so). */
#define BUSY_GIVE_UP_MS (3 * T_MS)
static char busy_seen_word[] = "seen";
static void busy_cq_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  int polling = arg != NULL; /* the close comes while this side polls */
  /* Polling: more receives than polls between two RDM checks, so that
   * what one check takes in is not all delivered before the next. */
  static char bufs[4 * FLOOD_WIN][FLOOD_MSG];
  int nrecv = polling ? 4 * FLOOD_WIN : FLOOD_WIN;
  xport_conn_t *a, *b;
  xport_completion_t c;
  XT_OK(xport_accept(lst, T_MS, &a));
  XT_OK(xport_accept(lst, T_MS, &b));
  for (int i = 0; i < nrecv; i++)
    XT_OK(xport_recv(b, bufs[i], FLOOD_MSG, NULL, bufs[i]));
  if (polling)
    XT_OK(xport_send(b, "poll", 5, NULL, NULL)); /* the client closes a then */
  else
    usleep(1000 * 1000);
  uint32_t got = 0;
  for (int gone = 0; !gone;) {
    int n = xport_poll(ctx, &c, 1);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    if (!n) {
      xport_wait(ctx, 10);
      continue;
    }
    /* Slower than the stream: it gets ahead of the receives, so the RDM
     * checks find what waits unexpected and take the CQ in with them. */
    if (polling)
      usleep(100);
    if (c.op == XPORT_OP_DISCONNECT) {
      XT_CHECK(c.conn == a, "a disconnect of the streaming connection");
      gone = 1;
      break;
    }
    if (c.op == XPORT_OP_SEND && c.status == 0)
      continue; /* "poll" */
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "server: op %d %s", c.op,
             xport_strerror(c.status));
    uint32_t seq;
    memcpy(&seq, c.user_ctx, sizeof seq);
    XT_CHECK(seq != FLOOD_END, "the stream ended (%u messages) before the disconnect of the "
             "other connection came out of xport_poll (closed while the server %s)", got,
             polling ? "polled" : "was outside xport");
    got++;
    XT_OK(xport_recv(b, c.user_ctx, FLOOD_MSG, NULL, c.user_ctx));
  }
  XT_OK(xport_conn_close(a));
  XT_OK(xport_send(b, busy_seen_word, 5, NULL, busy_seen_word));
  /* The rest of the stream, up to its end, then the word's completion. */
  for (int ended = 0, sent = 0; !ended || !sent;) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: the stream's end never came");
    XT_CHECK(c.status == 0, "server: op %d %s", c.op, xport_strerror(c.status));
    if (c.op == XPORT_OP_SEND) {
      sent |= c.user_ctx == busy_seen_word;
      continue;
    }
    uint32_t seq;
    memcpy(&seq, c.user_ctx, sizeof seq);
    if (seq == FLOOD_END)
      ended = 1;
    else
      XT_OK(xport_recv(b, c.user_ctx, FLOOD_MSG, NULL, c.user_ctx));
  }
  XT_OK(xport_conn_close(b));
}

/* The closing side in a process of its own: connects, says so, and
 * closes when told (on a pipe, outside xport until then). */
static pid_t busy_cq_closer(const char *addr, int *tell)
{
  int up[2], go[2];
  XT_CHECK(pipe(up) == 0 && pipe(go) == 0, "pipe");
  /* xt_fork: the child goes with the test, which a failed check ends
   * before it writes to go (the child's own copy of go's write end kept
   * the read below waiting for ever). */
  pid_t pid = xt_fork();
  if (!pid) {
    xport_ctx_t *ctx = xt_ctx();
    xport_conn_t *a;
    char x;
    XT_OK(xport_connect(ctx, addr, T_MS, &a));
    XT_CHECK(write(up[1], "c", 1) == 1, "pipe");
    XT_CHECK(read(go[0], &x, 1) == 1, "pipe");
    XT_OK(xport_conn_close(a));
    xport_ctx_destroy(ctx);
    _exit(0);
  }
  char x;
  XT_CHECK(read(up[0], &x, 1) == 1, "the closing process did not connect");
  close(up[0]);
  close(up[1]);
  close(go[0]);
  *tell = go[1];
  return pid;
}

/* Messages streamed after the server polls before the close: counted, not
 * timed, so that the stream is ahead of the server whatever the load. */
#define BUSY_AHEAD 10000
static void busy_cq_client(int polling)
{
  char addr[128], seen[8] = "", go[8] = "";
  static char msgs[FLOOD_WIN][FLOOD_MSG];
  xport_completion_t comps[16];
  xport_conn_t *a = NULL, *b;
  int tell = -1;
  pid_t pid = xt_spawn_server(busy_cq_server, polling ? (void *)1 : NULL, addr, sizeof addr);
  /* The server accepts the closing connection first. */
  pid_t closer = polling ? busy_cq_closer(addr, &tell) : -1;
  xport_ctx_t *ctx = xt_ctx();
  if (!polling)
    XT_OK(xport_connect(ctx, addr, T_MS, &a));
  XT_OK(xport_connect(ctx, addr, T_MS, &b));
  if (polling)
    XT_OK(xport_recv(b, go, sizeof go, NULL, go));
  XT_OK(xport_recv(b, seen, sizeof seen, NULL, seen));
  long start = now_ms(), end = start + BUSY_GIVE_UP_MS;
  int inflight = 0, slot = 0, closed = 0, told = 0, gave_up = 0, may_close = !polling;
  int b_gone = 0;
  uint32_t seq = 0, close_at = UINT32_MAX;
  for (int done = 0; !done || inflight;) {
    if (polling && seq >= close_at)
      may_close = 1;
    if (!closed && may_close && (polling || now_ms() - start > 200)) {
      if (polling)
        XT_CHECK(write(tell, "g", 1) == 1, "pipe");
      else
        XT_OK(xport_conn_close(a));
      closed = 1;
    }
    while (!done && inflight < FLOOD_WIN) {
      char *m = msgs[slot];
      gave_up = !told && now_ms() >= end;
      uint32_t v = told || gave_up ? FLOOD_END : seq;
      memcpy(m, &v, 4);
      int rc = xport_send(b, m, FLOOD_MSG, NULL, m);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      inflight++;
      slot = (slot + 1) % FLOOD_WIN;
      seq++;
      done = v == FLOOD_END;
    }
    int n = xport_poll(ctx, comps, 16);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    for (int i = 0; i < n; i++) {
      /* The server closes the stream once it has all of it, the end
       * included: its disconnect may come before the completions of the
       * last sends (shm and rxm do not wait for the provider's), and those
       * still complete with 0, as the server took them (xport(7),
       * Outcomes). Before the end was sent, it is a failure. */
      if (comps[i].op == XPORT_OP_DISCONNECT && comps[i].conn == b && done && told &&
          !b_gone) {
        b_gone = 1;
        continue;
      }
      XT_CHECK(comps[i].status == 0 && comps[i].conn == b,
               "client: op %d on the %s connection: %s (a server failure is in its own "
               "message above)", comps[i].op, comps[i].conn == b ? "streaming" : "closed",
               xport_strerror(comps[i].status));
      if (comps[i].op == XPORT_OP_SEND)
        inflight--;
      else if (comps[i].op == XPORT_OP_RECV && comps[i].user_ctx == go)
        close_at = seq + BUSY_AHEAD;
      else if (comps[i].op == XPORT_OP_RECV)
        told = 1;
    }
  }
  XT_CHECK(!gave_up, "the server had no disconnect after %d s of streaming on %s",
           BUSY_GIVE_UP_MS / 1000, xt_config());
  while (!told) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "client: the server's word never came");
    told = c.op == XPORT_OP_RECV && c.status == 0 && c.user_ctx == seen;
  }
  XT_CHECK(!strcmp(seen, "seen"), "the server's word");
  /* The server closes first, once it has the whole stream. */
  for (xport_completion_t c = {0}; !b_gone && c.op != XPORT_OP_DISCONNECT;)
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "client: the server never closed");
  XT_OK(xport_conn_close(b));
  xport_ctx_destroy(ctx);
  if (polling) {
    int st;
    close(tell);
    XT_CHECK(waitpid(closer, &st, 0) == closer && WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "the closing process failed");
  }
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}

START_TEST(busy_cq_delivers_disconnect)
{
  busy_cq_client(0);
}
END_TEST

START_TEST(busy_cq_delivers_disconnect_while_polled)
{
  busy_cq_client(1);
}
END_TEST

/* ---- 4. a busy target is not a refusal --------------------------------- */

static int busy_target_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  xport_mr_t *mr;
  char *reg = malloc(4096), done[4];
  XT_CHECK(reg != NULL, "malloc");
  xt_fill(reg, 4096, 5);
  XT_OK(xport_mr_reg(ctx, reg, 4096, XPORT_ACCESS_REMOTE_READ, &mr));
  XT_OK(xport_recv(conn, done, sizeof done, NULL, NULL));
  send_key(ctx, conn, mr, 4096);
  /* Computing, outside xport, for many RMA deadlines. */
  xt_step_get(st->c2s[0], T_MS);
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_OK(xport_mr_dereg(mr));
  free(reg);
  return 0;
}

static int busy_target_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_completion_t c;
  char buf[4096];
  memset(buf, 0, sizeof buf);
  xport_rkey_t *rk = get_key(ctx, conn);
  XT_OK(xport_read(conn, buf, sizeof buf, NULL, rk, 0, NULL));
  /* Ten deadlines pass while the target does not call xport. */
  long end = now_ms() + 10 * 300;
  while (now_ms() < end) {
    int n = xport_poll(ctx, &c, 1);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    XT_CHECK(n == 0 || (c.op == XPORT_OP_READ && c.status == 0),
             "op %d failed with %s while the target was busy", c.op, xport_strerror(c.status));
    if (n)
      break; /* a provider that progresses by itself */
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  xt_step_put(st->c2s[1], 'W');
  if (now_ms() >= end)
    expect(ctx, &c, XPORT_OP_READ, 0);
  XT_CHECK(xt_verify(buf, sizeof buf, 5) == sizeof buf, "read bytes differ");
  XT_OK(xport_send(conn, "ok", 3, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  xport_rkey_release(rk);
  return 0;
}

START_TEST(busy_target_is_no_refusal)
{
  struct xt_steps st;
  setenv("XPORT_RMA_TIMEOUT", "300", 1);
  xt_steps_open(&st);
  xt_pair(busy_target_server, busy_target_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 4. the depths the capability record states ----------------------- */

#define SLOT 16

static int depth_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  xport_completion_t c;
  xport_caps_t caps;
  xport_mr_t *mr;
  XT_OK(xport_conn_query(conn, &caps));
  size_t regsize = caps.tx_depth * SLOT;
  char *reg = calloc(1, regsize), *bufs = calloc(caps.rx_depth + 1, SLOT);
  char *seen = calloc(caps.rx_depth, 1);
  XT_CHECK(reg && bufs && seen, "calloc");
  XT_OK(xport_mr_reg(ctx, reg, regsize, XPORT_ACCESS_REMOTE_WRITE, &mr));
  send_key(ctx, conn, mr, regsize);
  /* Receives until xport says no: exactly rx_depth of them. */
  size_t posted = 0;
  int rc;
  while ((rc = xport_recv(conn, bufs + posted * SLOT, SLOT, NULL, bufs + posted * SLOT)) == 0)
    XT_CHECK(++posted <= caps.rx_depth, "more than rx_depth (%zu) receives accepted",
             caps.rx_depth);
  XT_CHECK(rc == -XPORT_EAGAIN, "receive %zu: %s", posted, xport_strerror(rc));
  XT_CHECK(posted == caps.rx_depth, "EAGAIN after %zu receives; rx_depth says %zu", posted,
           caps.rx_depth);
  XT_OK(xport_send(conn, "go", 3, NULL, NULL));
  size_t got = 0, sent = 0;
  while (got < posted || !sent) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: %zu of %zu messages", got, posted);
    if (c.op == XPORT_OP_SEND) {
      XT_CHECK(c.status == 0, "send: %s", xport_strerror(c.status));
      sent = 1;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0 && c.len == SLOT, "server: op %d %s", c.op,
             xport_strerror(c.status));
    uint32_t seq;
    memcpy(&seq, c.user_ctx, 4);
    XT_CHECK(seq < posted && !seen[seq], "message %u twice or out of range", seq);
    XT_CHECK(xt_verify((char *)c.user_ctx + 4, SLOT - 4, seq) == SLOT - 4, "message %u", seq);
    seen[seq] = 1;
    got++;
  }
  /* The client's writes, one per slot, all landed. */
  for (size_t i = 0; i < caps.tx_depth; i++)
    XT_CHECK(xt_verify(reg + i * SLOT, SLOT, (unsigned)i + 1000) == SLOT, "write %zu", i);
  /* Closing now would end the client's sends not yet completed there. */
  char fin[8];
  XT_OK(xport_recv(conn, fin, sizeof fin, NULL, fin));
  XT_OK(xport_send(conn, "done", 5, NULL, NULL));
  for (int i = 0; i < 2; i++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: the client's last word never came");
    XT_CHECK(c.status == 0, "server: op %d: %s", c.op, xport_strerror(c.status));
  }
  XT_OK(xport_mr_dereg(mr));
  free(reg);
  free(bufs);
  free(seen);
  return 0;
}

static int depth_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  xport_completion_t comps[32];
  xport_caps_t caps;
  char go[4], done[8];
  XT_OK(xport_conn_query(conn, &caps));
  xport_rkey_t *rk = get_key(ctx, conn);
  XT_OK(xport_recv(conn, go, sizeof go, NULL, go));
  XT_OK(xport_recv(conn, done, sizeof done, NULL, done));
  char *src = malloc(caps.tx_depth * SLOT), *msgs = malloc(caps.rx_depth * SLOT);
  XT_CHECK(src && msgs, "malloc");
  /* Writes until xport says no, without polling: exactly tx_depth. */
  size_t posted = 0;
  int rc = 0;
  for (;;) {
    if (posted < caps.tx_depth)
      xt_fill(src + posted * SLOT, SLOT, (unsigned)posted + 1000);
    rc = posted < caps.tx_depth
             ? xport_write(conn, src + posted * SLOT, SLOT, NULL, rk, posted * SLOT, NULL)
             : xport_write(conn, src, SLOT, NULL, rk, 0, NULL);
    if (rc)
      break;
    XT_CHECK(++posted <= caps.tx_depth, "more than tx_depth (%zu) writes accepted",
             caps.tx_depth);
  }
  XT_CHECK(rc == -XPORT_EAGAIN, "write %zu: %s", posted, xport_strerror(rc));
  XT_CHECK(posted == caps.tx_depth, "EAGAIN after %zu writes; tx_depth says %zu", posted,
           caps.tx_depth);
  /* Everything completes once polled; then as many messages as the
   * server has receives, posted as fast as xport takes them. */
  size_t writes = 0, sends = 0, sent = 0, got_go = 0, got_done = 0;
  while (writes < posted || sends < caps.rx_depth || !got_go) {
    while (got_go && sent < caps.rx_depth) {
      char *m = msgs + sent * SLOT;
      uint32_t seq = (uint32_t)sent;
      memcpy(m, &seq, 4);
      xt_fill(m + 4, SLOT - 4, seq);
      rc = xport_send(conn, m, SLOT, NULL, NULL);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      sent++;
    }
    int n = xport_poll(ctx, comps, 32);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    if (!n)
      xport_wait(ctx, 10);
    for (int i = 0; i < n; i++) {
      XT_CHECK(comps[i].status == 0, "op %d: %s", comps[i].op, xport_strerror(comps[i].status));
      if (comps[i].op == XPORT_OP_WRITE)
        writes++;
      else if (comps[i].op == XPORT_OP_SEND)
        sends++;
      else if (comps[i].op == XPORT_OP_RECV && comps[i].user_ctx == go)
        got_go = 1;
      else if (comps[i].op == XPORT_OP_RECV && comps[i].user_ctx == done)
        got_done = 1; /* the server had all; our send completions may lag */
      else
        XT_CHECK(0, "op %d", comps[i].op);
    }
  }
  xport_completion_t c;
  if (!got_done) {
    expect(ctx, &c, XPORT_OP_RECV, 0);
    XT_CHECK(c.user_ctx == done, "the server's last word");
  }
  XT_CHECK(!strcmp(done, "done"), "the server's last word");
  XT_OK(xport_send(conn, "fin", 4, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  xport_rkey_release(rk);
  free(src);
  free(msgs);
  return 0;
}

START_TEST(depth_is_what_caps_say)
{
  xt_pair(depth_server, depth_client, NULL);
}
END_TEST

/* ---- 5. a dead or hung peer is an event, never a wait ----------------- */

/* Receives 64 KiB messages, a window of them posted, until it is killed. */
#define STREAM_MSG (64 << 10)
#define STREAM_WIN 16
static int stream_sink(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static char bufs[STREAM_WIN][STREAM_MSG];
  xport_completion_t c;
  for (int i = 0; i < STREAM_WIN; i++)
    XT_OK(xport_recv(conn, bufs[i], STREAM_MSG, NULL, bufs[i]));
  for (;;) {
    XT_CHECK(xt_next(ctx, &c, 3 * T_MS) == 0, "sink: the stream stopped before the kill");
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "sink: op %d %s", c.op,
             xport_strerror(c.status));
    XT_OK(xport_recv(conn, c.user_ctx, STREAM_MSG, NULL, c.user_ctx));
  }
  return 0;
}

START_TEST(peer_killed_mid_stream_ends_every_op)
{
  /* Large sends streaming, a window of them in flight, when the receiver
   * dies by SIGKILL: every send ends, those the receiver did not take
   * with an error, and the disconnect comes, each within a bound far past
   * any load (a send the dead peer's provider never answers must not be
   * waited for). */
  static char msgs[STREAM_WIN][STREAM_MSG];
  char addr[128];
  xport_conn_t *conn;
  xport_completion_t comps[16];
  pid_t pid = xt_spawn_pair_server(stream_sink, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  for (int i = 0; i < STREAM_WIN; i++)
    xt_fill(msgs[i], STREAM_MSG, (unsigned)i);
  int inflight = 0, slot = 0, killed = 0, gone = 0, failed = 0;
  long sent = 0, end = now_ms() + T_MS;
  while (!gone || inflight) {
    /* Killed once the stream runs: some sends are still in flight. */
    if (!killed && sent >= 200) {
      XT_CHECK(kill(pid, SIGKILL) == 0, "kill");
      killed = 1;
    }
    while (!killed && inflight < STREAM_WIN) {
      int rc = xport_send(conn, msgs[slot], STREAM_MSG, NULL, msgs[slot]);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      inflight++;
      sent++;
      slot = (slot + 1) % STREAM_WIN;
    }
    int n = xport_poll(ctx, comps, 16);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    for (int i = 0; i < n; i++) {
      if (comps[i].op == XPORT_OP_DISCONNECT) {
        XT_CHECK(killed && !gone, "a disconnect before the kill, or a second one");
        gone = 1;
        continue;
      }
      XT_CHECK(comps[i].op == XPORT_OP_SEND, "op %d", comps[i].op);
      XT_CHECK(comps[i].status == 0 || killed, "send failed before the kill: %s",
               xport_strerror(comps[i].status));
      XT_CHECK(!gone || comps[i].status != 0, "a send succeeded after the disconnect");
      failed += comps[i].status != 0;
      inflight--;
    }
    if (!n)
      xport_wait(ctx, 10);
    XT_CHECK(now_ms() < end, "on %s, %d sends of %ld never ended, disconnect %d, %d s after "
             "the start (the receiver was %s)", xt_config(), inflight, sent, gone, T_MS / 1000,
             killed ? "killed" : "never killed");
  }
  XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "the receiver did not die by SIGKILL");
  XT_OK(xport_conn_close(conn));
  XT_CHECK(xt_next(ctx, &comps[0], 300) == -XPORT_ETIMEDOUT, "a completion after the end: "
           "op %d", comps[0].op);
  xport_ctx_destroy(ctx);
}
END_TEST

/* A sender that dies inside libfabric's shm send leaves the receiver's
 * region lock taken (libfabric 1.17 takes it in the receiver's shared
 * memory for every send, and nothing records who holds it): the receiver
 * then spun in its own progress for ever (examples/wal --kill-follower
 * hung its leader in about 1 run in 30 under load). The server plays that
 * sender: it takes the lock of every region of the test process's
 * ("xport-PID-...", offset 24 of libfabric 1.17's layout, version 4 at
 * byte 0 and the owner's pid at 4; a glibc spinlock, 1 when free) as the
 * send would, sets the
 * region's signal (offset 28) as the send does before it lets go, says
 * how many, and dies by SIGKILL. The test process must see the disconnect, its
 * receive end with an error, and then talk to a second server. */
#define LOCKED_REGION_LOCK 24
#define LOCKED_REGION_VERSION 4
#define LOCKED_REGION_SIGNAL 28
#define LOCKED_REGION_PID 4
static int dies_holding_locks(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  char prefix[64], path[512], go[8];
  int n = 0, other = 0;
  /* Once the test process watches this one: it has sent a message. */
  XT_OK(xport_recv(conn, go, sizeof go, NULL, NULL));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "the go: %s", xport_strerror(c.status));
  snprintf(prefix, sizeof prefix, "xport-%ld-", (long)getppid());
  DIR *d = opendir("/dev/shm");
  XT_CHECK(d != NULL, "opendir /dev/shm");
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, prefix, strlen(prefix)) || (len > 5 && !strcmp(e->d_name + len - 5, ".lock")))
      continue;
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      continue;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
      continue;
    if (*(volatile unsigned char *)m != LOCKED_REGION_VERSION) {
      other++;
      continue;
    }
    if (*(volatile int *)((char *)m + LOCKED_REGION_PID) != (int)getppid())
      continue; /* a file left by an earlier process of that pid */
    /* As pthread_spin_lock, but for a while only: a holder of the moment
     * lets go within microseconds. */
    int *lock = (int *)((char *)m + LOCKED_REGION_LOCK), free_ = 1, tries = 0;
    while (!__atomic_compare_exchange_n(lock, &free_, 0, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED) &&
           ++tries < 1000000)
      free_ = 1;
    if (tries == 1000000)
      continue;
    /* and signalled it, as the send does before it lets go: the
     * receiver's next progress takes the lock */
    __atomic_store_n((int *)((char *)m + LOCKED_REGION_SIGNAL), 1, __ATOMIC_RELEASE);
    n++;
  }
  closedir(d);
  xt_step_put(st->s2c[1], n ? 'L' : other ? 'V' : 'N');
  raise(SIGKILL); /* inside the "send", holding them */
  return 0;
}

static int echo_once(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  char buf[256];
  xport_completion_t c;
  (void)arg;
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "echo: recv: %s", xport_strerror(c.status));
  XT_OK(xport_send(conn, buf, c.len, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "echo: send: %s", xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  return 0;
}

START_TEST(sender_killed_holding_our_lock)
{
  if (strcmp(xt_transport(), "shm")) {
    printf("SKIP: sender_killed_holding_our_lock on %s: only libfabric's shm has senders "
           "take a lock in the receiver's memory\n", xt_config());
    return;
  }
  struct xt_steps st;
  char addr[128], buf[256], back[256];
  xport_conn_t *conn, *conn2;
  xport_completion_t c;
  char addr2[128];
  xt_steps_open(&st);
  pid_t pid = xt_spawn_pair_server(dies_holding_locks, &st, addr, sizeof addr);
  pid_t pid2 = xt_spawn_pair_server(echo_once, NULL, addr2, sizeof addr2); /* forks come first */
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
  XT_OK(xport_send(conn, "go", 3, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "the go: %s", xport_strerror(c.status));
  char got = xt_step_get(st.s2c[0], T_MS);
  if (got != 'L' && got != 'V')
    kill(pid, SIGKILL); /* it never got there: reaped below, and the check says why */
  XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "the server did not die by SIGKILL");
  if (got == 'V') {
    printf("SKIP: sender_killed_holding_our_lock on %s: libfabric's shm regions are not "
           "1.17's layout here\n", xt_config());
    xport_ctx_destroy(ctx);
    kill(pid2, SIGKILL);
    xt_reap(pid2);
    xt_steps_close(&st);
    return;
  }
  XT_CHECK(got == 'L', "the server found no region of ours to lock (%c)", got);
  long t0 = now_ms();
  int gone = 0, failed = 0;
  while (!gone || !failed) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "on %s, %s within %d ms of the death (a lock "
             "left taken hangs the progress)", xt_config(), gone ? "the receive did not end" :
             "no disconnect", T_MS);
    if (c.op == XPORT_OP_DISCONNECT)
      gone = 1;
    else {
      XT_CHECK(c.op == XPORT_OP_RECV && c.user_ctx == buf && c.status != 0,
               "op %d status %s", c.op, xport_strerror(c.status));
      failed = 1;
    }
  }
  printf("sender_killed_holding_our_lock on %s: disconnect after %ld ms\n", xt_config(),
         now_ms() - t0);
  XT_OK(xport_conn_close(conn));
  /* The context goes on: a round trip with another peer, bytes compared. */
  XT_OK(xport_connect(ctx, addr2, T_MS, &conn2));
  xt_fill(buf, sizeof buf, 7);
  XT_OK(xport_recv(conn2, back, sizeof back, NULL, back));
  XT_OK(xport_send(conn2, buf, sizeof buf, NULL, buf));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "send: %s", xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0 && c.len == sizeof back && xt_verify(back, sizeof back, 7) == sizeof back,
           "the echo: %s, %zu bytes", xport_strerror(c.status), (size_t)c.len);
  XT_OK(xport_conn_close(conn2));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid2) == 0, "the echo server failed");
  xt_steps_close(&st);
}
END_TEST

/* The peer that hangs: connects to the test's listener (its connection
 * then lives on the listener's endpoint, whose close follows the peer's
 * loss), says so, and waits inside xport until it is stopped and killed. */
static pid_t hung_peer_start(int *addr_fd, int *up_fd)
{
  int a[2], up[2];
  XT_CHECK(pipe(a) == 0 && pipe(up) == 0, "pipe");
  pid_t pid = xt_fork();
  if (!pid) {
    char addr[128];
    xport_conn_t *conn;
    close(a[1]);
    ssize_t n = read(a[0], addr, sizeof addr - 1);
    XT_CHECK(n > 0, "the hung peer got no address");
    addr[n] = '\0';
    xport_ctx_t *ctx = xt_ctx();
    XT_OK(xport_connect(ctx, addr, T_MS, &conn));
    XT_CHECK(write(up[1], "c", 1) == 1, "pipe");
    for (;;)
      xport_wait(ctx, 100);
  }
  close(a[0]);
  close(up[1]);
  *addr_fd = a[1];
  *up_fd = up[0];
  return pid;
}

/* ---- deadlines (xport_conn_timeout) ----------------------------------- */

#define DL_MS 300

/* The target: exports BIG bytes, then stops itself (SIGSTOP) when told:
 * alive, its connection up, but serving nothing from then on. */
static int stopping_target(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_mr_t *mr;
  char *reg = malloc(BIG);
  XT_CHECK(reg != NULL, "malloc");
  xt_fill(reg, BIG, 3);
  XT_OK(xport_mr_reg(ctx, reg, BIG, XPORT_ACCESS_REMOTE_READ, &mr));
  send_key(ctx, conn, mr, BIG);
  step_get_polling(ctx, st->c2s[0]);
  raise(SIGSTOP);
  for (;;)
    pause(); /* killed */
  return 0;
}

/* A connection to a stopping_target, with its context and steps. */
struct hung_pair {
  struct xt_steps st;
  pid_t pid;
  xport_ctx_t *ctx;
  xport_conn_t *conn;
};

static void hung_pair_open(struct hung_pair *h)
{
  char addr[128];
  xt_steps_open(&h->st);
  h->pid = xt_spawn_pair_server(stopping_target, &h->st, addr, sizeof addr);
  h->ctx = xt_ctx();
  XT_OK(xport_connect(h->ctx, addr, T_MS, &h->conn));
}

/* Closes the connection (unless closed: hung_ops_end did) and the
 * context, and ends the target: killed (by hung_ops_end, or here),
 * whether it stopped or, where the test ended early, saw its connection
 * go. */
static void hung_pair_close(struct hung_pair *h, int closed)
{
  if (!closed)
    XT_OK(xport_conn_close(h->conn));
  xport_ctx_destroy(h->ctx);
  kill(h->pid, SIGKILL);
  xt_reap(h->pid);
  xt_shm_remove_of(h->pid);
  xt_steps_close(&h->st);
}

/* Tells the target to stop, and waits until it has. */
static void target_stop(struct xt_steps *st, pid_t pid)
{
  int ws;
  xt_step_put(st->c2s[1], 'S');
  XT_CHECK(waitpid(pid, &ws, WUNTRACED) == pid && WIFSTOPPED(ws), "the target did not stop");
}

/* The next completion, as a loop asleep on xport_ctx_fd(3) takes it
 * (poll(2) on the descriptor, xport_poll, xport_wait with 0 before each
 * sleep), within timeout_ms: 0 or -XPORT_ETIMEDOUT. fd < 0: xt_next. */
static int next_by(xport_ctx_t *ctx, int fd, xport_completion_t *c, int timeout_ms)
{
  if (fd < 0)
    return xt_next(ctx, c, timeout_ms);
  long end = now_ms() + timeout_ms;
  for (;;) {
    int n = xport_poll(ctx, c, 1);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    if (n == 1)
      return 0;
    long left = end - now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    if (xport_wait(ctx, 0) == -XPORT_ETIMEDOUT) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      poll(&p, 1, (int)left);
    }
  }
}

/* Collects the end of conn's read (rd_ctx; NULL: none posted) and send
 * (snd_ctx) to the stopped target, and its disconnect event, as fd's
 * sleeper takes them (next_by), into *read_st, *send_st and *disc_st.
 * Over rxm the provider keeps the buffers of operations to a peer that
 * never answers (xport_conn_timeout(3)): they end when the peer dies
 * (then killed), not before. Returns 1 if it closed conn, with 2 added
 * if it killed the target. */
static int hung_ops_end(const struct hung_pair *h, int fd, void *rd_ctx, void *snd_ctx,
                        int *read_st, int *send_st, int *disc_st)
{
  xport_ctx_t *ctx = h->ctx;
  xport_conn_t *conn = h->conn;
  xport_completion_t c;
  int closed = 0;
  *read_st = rd_ctx ? 1 : 0;
  *send_st = *disc_st = 1;
  while (*disc_st == 1) {
    XT_CHECK(next_by(ctx, fd, &c, T_MS) == 0,
             "on %s nothing ended within %d ms of a %d ms deadline (read %d, send %d)",
             xt_config(), T_MS, DL_MS, *read_st, *send_st);
    XT_CHECK(c.conn == conn, "a completion of another connection");
    if (c.op == XPORT_OP_READ && c.user_ctx == rd_ctx && *read_st == 1)
      *read_st = c.status;
    else if (c.op == XPORT_OP_SEND && c.user_ctx == snd_ctx && *send_st == 1)
      *send_st = c.status;
    else if (c.op == XPORT_OP_DISCONNECT)
      *disc_st = c.status;
    else
      XT_CHECK(0, "on %s op %d (%s) came twice or unasked", xt_config(), c.op,
               xport_strerror(c.status));
  }
  if (*read_st == 1 || *send_st == 1) {
    XT_OK(xport_conn_close(conn));
    closed = 1;
  }
  while (*read_st == 1 || *send_st == 1) {
    int rc = next_by(ctx, fd, &c, closed & 2 ? T_MS : 1000);
    if (rc == -XPORT_ETIMEDOUT && !(closed & 2)) {
      XT_CHECK(kill(h->pid, SIGKILL) == 0, "SIGKILL");
      closed |= 2;
      continue;
    }
    XT_CHECK(rc == 0, "on %s the operations did not end when their connection was closed and "
             "its peer killed (read %d, send %d)", xt_config(), *read_st, *send_st);
    if (c.op == XPORT_OP_READ && *read_st == 1)
      *read_st = c.status;
    else if (c.op == XPORT_OP_SEND && *send_st == 1)
      *send_st = c.status;
    else
      XT_CHECK(0, "on %s op %d (%s) came twice or unasked", xt_config(), c.op,
               xport_strerror(c.status));
  }
  XT_CHECK(*send_st == -XPORT_ETIMEDOUT, "on %s the send to the stopped peer ended with %s",
           xt_config(), xport_strerror(*send_st));
  XT_CHECK(*disc_st == -XPORT_ETIMEDOUT, "on %s the disconnect event says %s", xt_config(),
           xport_strerror(*disc_st));
  return closed;
}


/* 1 where conn's provider takes no deadline (libfabric's shm: a peer
 * that resumes copies the buffers itself), which xport_conn_timeout
 * must say; then the test ends there. */
static int no_deadline_here(xport_conn_t *conn)
{
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  if (strcmp(caps.provider, "shm"))
    return 0;
  XT_CHECK(xport_conn_timeout(conn, DL_MS) == -XPORT_ENOSYS,
           "libfabric's shm took a deadline it cannot keep");
  XT_OK(xport_conn_timeout(conn, 0));
  return 1;
}

START_TEST(deadline_ends_ops_to_a_hung_peer)
{
  /* A connection with a deadline: idle, or with operations that end, it
   * stays; once its peer stops (alive, its socket open, serving nothing),
   * its 16 MiB send ends with XPORT_ETIMEDOUT, its read with the bytes
   * (where the kernel or the NIC serves it: xshm, verbs) or
   * XPORT_ETIMEDOUT, and the disconnect event says XPORT_ETIMEDOUT. */
  struct hung_pair h;
  hung_pair_open(&h);
  xport_ctx_t *ctx = h.ctx;
  xport_conn_t *conn = h.conn;
  xport_completion_t c;
  XT_CHECK(xport_conn_timeout(NULL, DL_MS) == -XPORT_EINVAL, "a NULL connection took a deadline");
  XT_CHECK(xport_conn_timeout(conn, -1) == -XPORT_EINVAL, "a negative deadline was taken");
  xport_rkey_t *rk = get_key(ctx, conn);
  if (no_deadline_here(conn)) {
    xport_rkey_release(rk);
    hung_pair_close(&h, 0);
    return;
  }
  XT_OK(xport_conn_timeout(conn, DL_MS));
  /* Idle for three deadlines: nothing outstanding, nothing lost. */
  XT_CHECK(xt_next(ctx, &c, 3 * DL_MS) == -XPORT_ETIMEDOUT,
           "on %s an idle connection with a deadline gave op %d (%s)", xt_config(), c.op,
           xport_strerror(c.status));
  char *rd = malloc(BIG), *big = malloc(BIG);
  XT_CHECK(rd && big, "malloc");
  xport_mr_t *rmr, *bmr;
  XT_OK(xport_mr_reg(ctx, rd, BIG, XPORT_ACCESS_LOCAL, &rmr));
  XT_OK(xport_mr_reg(ctx, big, BIG, XPORT_ACCESS_LOCAL, &bmr));
  XT_OK(xport_read(conn, rd, BIG, rmr, rk, 0, NULL));
  expect(ctx, &c, XPORT_OP_READ, 0);
  XT_CHECK(xt_verify(rd, BIG, 3) == BIG, "on %s the read's bytes differ", xt_config());
  /* The target stops; what it never serves ends by the deadline. */
  target_stop(&h.st, h.pid);
  memset(rd, 0, BIG);
  xt_fill(big, BIG, 4);
  XT_OK(xport_read(conn, rd, BIG, rmr, rk, 0, rd));
  XT_OK(xport_send(conn, big, BIG, bmr, big));
  int read_st, send_st, disc_st;
  int closed = hung_ops_end(&h, -1, rd, big, &read_st, &send_st, &disc_st);
  XT_CHECK(read_st == -XPORT_ETIMEDOUT || (read_st == 0 && xt_verify(rd, BIG, 3) == BIG),
           "on %s the read from the stopped peer ended with %s", xt_config(),
           xport_strerror(read_st));
  /* The buffers are the application's again; nothing more comes. */
  xt_fill(rd, BIG, 5);
  xt_fill(big, BIG, 5);
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "on %s op %d came after the disconnect",
           xt_config(), c.op);
  XT_CHECK((closed & 1) || xport_send(conn, big, 8, bmr, NULL) == -XPORT_ENOTCONN,
           "a send on the timed-out connection was taken");
  xport_rkey_release(rk);
  XT_OK(xport_mr_dereg(rmr));
  XT_OK(xport_mr_dereg(bmr));
  hung_pair_close(&h, closed & 1);
  free(rd);
  free(big);
}
END_TEST

/* Stops h's target, then sends it BIG bytes (user_ctx: the buffer,
 * registered into *mr_p), which it never takes. */
static char *stop_and_send(struct hung_pair *h, xport_mr_t **mr_p)
{
  char *big = malloc(BIG);
  XT_CHECK(big != NULL, "malloc");
  XT_OK(xport_mr_reg(h->ctx, big, BIG, XPORT_ACCESS_LOCAL, mr_p));
  target_stop(&h->st, h->pid);
  xt_fill(big, BIG, 4);
  XT_OK(xport_send(h->conn, big, BIG, *mr_p, big));
  return big;
}

START_TEST(op_timeout_is_every_connections_deadline)
{
  /* XPORT_OP_TIMEOUT gives every new connection its deadline: a send to
   * a stopped peer ends with XPORT_ETIMEDOUT, with no call asking, for a
   * loop that sleeps on the context's descriptor (xport_ctx_fd). */
  char ms[16];
  snprintf(ms, sizeof ms, "%d", DL_MS);
  setenv("XPORT_OP_TIMEOUT", ms, 1);
  struct hung_pair h;
  hung_pair_open(&h);
  int fd;
  XT_OK(xport_ctx_fd(h.ctx, &fd));
  xport_rkey_release(get_key(h.ctx, h.conn));
  if (no_deadline_here(h.conn)) {
    hung_pair_close(&h, 0);
    return;
  }
  xport_mr_t *bmr;
  char *big = stop_and_send(&h, &bmr);
  int read_st, send_st, disc_st;
  int closed = hung_ops_end(&h, fd, NULL, big, &read_st, &send_st, &disc_st);
  XT_OK(xport_mr_dereg(bmr));
  hung_pair_close(&h, closed & 1);
  free(big);
}
END_TEST

START_TEST(fd_loop_sleeps_beside_a_hung_peer)
{
  /* A loop asleep on xport_ctx_fd(3), as its page says (poll until 0,
   * xport_wait with 0, sleep on the descriptor on XPORT_ETIMEDOUT), with
   * a send that a stopped peer never takes and no deadline: it must
   * sleep. Over rxm it spun 20,000 to 40,000 times a second: xport_wait
   * ran the peer checks after fi_trywait, and they signalled rxm's wait
   * object again. Over xshm it slept through the peer's death. Allowed:
   * the millisecond tick (1,000 a second) with room to spare. */
  struct hung_pair h;
  hung_pair_open(&h);
  int fd;
  XT_OK(xport_ctx_fd(h.ctx, &fd));
  xport_rkey_release(get_key(h.ctx, h.conn));
  xport_mr_t *bmr;
  char *big = stop_and_send(&h, &bmr);
  long end = now_ms() + 1000;
  int turns = 0, completions = 0;
  xport_completion_t c;
  while (now_ms() < end) {
    turns++;
    int n = xport_poll(h.ctx, &c, 1);
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    completions += n;
    if (n == 0 && xport_wait(h.ctx, 0) == -XPORT_ETIMEDOUT) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      long left = end - now_ms();
      poll(&p, 1, left > 0 ? (int)left : 0);
    }
  }
  XT_CHECK(completions == 0, "on %s op %d (%s) ended with the peer stopped", xt_config(), c.op,
           xport_strerror(c.status));
  XT_CHECK(turns < 3000, "on %s a loop asleep on the descriptor turned %d times in a second "
           "beside a send to a stopped peer", xt_config(), turns);
  /* The peer dies: the send ends, and its buffer is the application's. */
  kill(h.pid, SIGKILL);
  int send_st = 1;
  while (send_st == 1) {
    XT_CHECK(next_by(h.ctx, fd, &c, T_MS) == 0, "on %s the send to a killed peer never ended",
             xt_config());
    if (c.op == XPORT_OP_SEND && c.user_ctx == big)
      send_st = c.status;
  }
  XT_CHECK(send_st != 0, "on %s the send to a stopped, then killed, peer succeeded",
           xt_config());
  XT_OK(xport_mr_dereg(bmr));
  hung_pair_close(&h, 0);
  free(big);
}
END_TEST

START_TEST(fd_loop_sees_a_death_between_checks)
{
  /* Where a peer's death shows on a descriptor (tcp, verbs: the socket or
   * the CM; xshm: the connection's socket), a loop asleep on
   * xport_ctx_fd(3) sees it when it happens, not at xport's next peer
   * check, here a minute away (XPORT_PEER_TIMEOUT). */
  setenv("XPORT_PEER_TIMEOUT", "240000", 1);
  struct hung_pair h;
  hung_pair_open(&h);
  unsetenv("XPORT_PEER_TIMEOUT");
  xport_caps_t caps;
  XT_OK(xport_conn_query(h.conn, &caps));
  if (strcmp(caps.provider, "tcp") && strcmp(caps.provider, "xshm") &&
      strcmp(caps.provider, "verbs")) {
    hung_pair_close(&h, 0); /* rxm, shm: deaths are seen by the checks alone */
    return;
  }
  int fd;
  XT_OK(xport_ctx_fd(h.ctx, &fd));
  xport_rkey_release(get_key(h.ctx, h.conn));
  static char rbuf[64];
  XT_OK(xport_recv(h.conn, rbuf, sizeof rbuf, NULL, rbuf));
  kill(h.pid, SIGKILL);
  xport_completion_t c;
  int recv_st = 1, disc_st = 1;
  while (disc_st == 1) {
    XT_CHECK(next_by(h.ctx, fd, &c, T_MS) == 0,
             "on %s a loop asleep on the descriptor did not see its peer die within %d ms",
             xt_config(), T_MS);
    if (c.op == XPORT_OP_RECV && c.user_ctx == rbuf && recv_st == 1)
      recv_st = c.status;
    else if (c.op == XPORT_OP_DISCONNECT)
      disc_st = c.status;
  }
  XT_CHECK(recv_st != 1 && recv_st != 0, "on %s the receive ended with %s", xt_config(),
           recv_st == 1 ? "nothing" : xport_strerror(recv_st));
  hung_pair_close(&h, 0);
}
END_TEST

/* The healthy peer: echoes every message until one of ECHO_LAST bytes. */
#define ECHO_MSG 64
#define ECHO_LAST 8
static void echo_all(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  static char buf[ECHO_MSG];
  xport_conn_t *conn;
  xport_completion_t c;
  XT_OK(xport_accept(lst, 3 * T_MS, &conn));
  for (size_t len = 0; len != ECHO_LAST;) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    expect(ctx, &c, XPORT_OP_RECV, 0);
    len = c.len;
    XT_OK(xport_send(conn, buf, len, NULL, NULL));
    expect(ctx, &c, XPORT_OP_SEND, 0);
  }
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  XT_OK(xport_conn_close(conn));
}

/* The longest an xport_poll may take here: the call never waits on a
 * peer, so only the machine's load makes it long, never a peer's state
 * (a poll that waited on the hung peer took 250 ms and more, and 2 s
 * once heartbeats declared it dead). Not a speed bound: a loaded 2-core
 * machine meets it; an emulated guest (make check-verbs) sets its own. */
static int poll_bound_ms(void)
{
  const char *e = getenv("XPORT_TEST_POLL_BOUND_MS");
  return e && atoi(e) > 0 ? atoi(e) : 150;
}
#define POLL_BOUND_MS poll_bound_ms()
/* Heartbeats' timeout in this test: the hung peer is declared dead
 * within it, where heartbeats run. */
#define HUNG_KEEPALIVE_MS 2000

START_TEST(hung_peer_never_blocks_poll)
{
  /* A peer stops (SIGSTOP) with messages queued to it and one large send
   * it never takes, while this process polls in a loop and exchanges
   * verified messages with a healthy peer; heartbeats declare the hung
   * one dead (where they run); it is then killed and reaped. No single
   * xport_poll may take long, the healthy connection must stay up, and
   * every operation to the hung peer must end. */
  setenv("XPORT_KEEPALIVE", "1", 1);
  char ka[16];
  snprintf(ka, sizeof ka, "%d", HUNG_KEEPALIVE_MS);
  setenv("XPORT_KEEPALIVE_TIMEOUT", ka, 1);
  char echo_addr[128], addr[128], up;
  int addr_fd, up_fd;
  pid_t echo = xt_spawn_server(echo_all, NULL, echo_addr, sizeof echo_addr);
  pid_t hung = hung_peer_start(&addr_fd, &up_fd);
  xport_ctx_t *ctx = xt_ctx();
  xport_listener_t *lst;
  xport_conn_t *h, *s;
  XT_OK(xport_listen(ctx, xt_listen_addr(), &lst));
  XT_OK(xport_listener_addr(lst, addr, sizeof addr));
  XT_CHECK(write(addr_fd, addr, strlen(addr)) > 0, "pipe");
  close(addr_fd);
  XT_OK(xport_accept(lst, T_MS, &s));
  XT_CHECK(read(up_fd, &up, 1) == 1, "the hung peer did not connect");
  close(up_fd);
  xport_listener_close(lst);
  XT_OK(xport_connect(ctx, echo_addr, T_MS, &h));
  XT_CHECK(kill(hung, SIGSTOP) == 0, "SIGSTOP");
  /* Messages until xport or the provider says no (its queue toward the
   * hung peer is full then, and heartbeats to it are pushed back), and a
   * large send it never takes. */
  static char small[ECHO_MSG], big[STREAM_MSG];
  int s_out = 0;
  for (int rc = 0; rc == 0 && s_out < 4096; s_out += rc == 0)
    rc = xport_send(s, small, sizeof small, NULL, NULL);
  if (xport_send(s, big, sizeof big, NULL, NULL) == 0)
    s_out++;
  char out[ECHO_MSG], back[ECHO_MSG];
  unsigned round = 0;
  xt_fill(out, sizeof out, round);
  XT_OK(xport_recv(h, back, sizeof back, NULL, back));
  XT_OK(xport_send(h, out, sizeof out, NULL, out));
  long start = now_ms(), worst = 0, kill_at = start + 2 * HUNG_KEEPALIVE_MS;
  long end = start + 2 * HUNG_KEEPALIVE_MS + T_MS;
  int killed = 0, gone = 0, h_out = 2;
  while (!killed || !gone || s_out) {
    if (!killed && now_ms() >= kill_at) {
      XT_CHECK(kill(hung, SIGKILL) == 0, "SIGKILL");
      XT_CHECK(xt_reap(hung) == 128 + SIGKILL, "the hung peer did not die by SIGKILL");
      killed = 1;
    }
    xport_completion_t comps[16];
    struct rusage ru0, ru1;
    struct timespec c0, c1;
    getrusage(RUSAGE_THREAD, &ru0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    long t0 = now_ms();
    int n = xport_poll(ctx, comps, 16);
    long took = now_ms() - t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    getrusage(RUSAGE_THREAD, &ru1);
    /* Waiting on the peer is spinning (CPU time) or sleeping (a voluntary
     * switch); a call that did neither was only preempted by the load. */
    long cpu = (c1.tv_sec - c0.tv_sec) * 1000L + (c1.tv_nsec - c0.tv_nsec) / 1000000;
    int slept = ru1.ru_nvcsw != ru0.ru_nvcsw;
    long waited = cpu > (slept ? took : 0) ? cpu : slept ? took : 0;
    worst = waited > worst ? waited : worst;
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    for (int i = 0; i < n; i++) {
      xport_completion_t *c = &comps[i];
      if (c->conn == s) {
        if (c->op == XPORT_OP_DISCONNECT)
          gone = 1;
        else
          s_out--;
        continue;
      }
      XT_CHECK(c->status == 0, "on %s the healthy connection failed: op %d %s after %u "
               "round trips", xt_config(), c->op, xport_strerror(c->status), round);
      h_out--;
      if (c->op != XPORT_OP_RECV)
        continue;
      XT_CHECK(c->len == sizeof out && xt_verify(back, sizeof back, round) == sizeof back,
               "round trip %u: the bytes differ", round);
      xt_fill(out, sizeof out, ++round);
      XT_OK(xport_recv(h, back, sizeof back, NULL, back));
      XT_OK(xport_send(h, out, sizeof out, NULL, out));
      h_out += 2;
    }
    XT_CHECK(now_ms() < end, "on %s the hung peer's connection: disconnect %d, %d operations "
             "not ended, %d s after it was killed", xt_config(), gone, s_out, T_MS / 1000);
  }
  XT_CHECK(worst <= POLL_BOUND_MS, "on %s one xport_poll spun or slept %ld ms (bound %d ms): "
           "it waited on the hung peer", xt_config(), worst, POLL_BOUND_MS);
  XT_CHECK(round > 10, "only %u round trips with the healthy peer", round);
  while (h_out) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "the last round trip never ended");
    XT_CHECK(c.status == 0, "healthy: op %d %s", c.op, xport_strerror(c.status));
    if (c.op == XPORT_OP_RECV)
      XT_CHECK(xt_verify(back, sizeof back, round) == sizeof back, "the last round trip");
    h_out--;
  }
  xt_fill(out, ECHO_LAST, round);
  XT_OK(xport_recv(h, back, sizeof back, NULL, back));
  XT_OK(xport_send(h, out, ECHO_LAST, NULL, out));
  for (int i = 0; i < 2; i++) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "the healthy peer's last echo never came");
    XT_CHECK(c.status == 0, "healthy: op %d %s", c.op, xport_strerror(c.status));
  }
  XT_CHECK(xt_verify(back, ECHO_LAST, round) == ECHO_LAST, "the last echo");
  XT_OK(xport_conn_close(s));
  XT_OK(xport_conn_close(h));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(echo) == 0, "the healthy peer failed");
}
END_TEST

/* ---- fault injection (XPORT_FAULT) ------------------------------------ */

/* A pair whose two ends run with XPORT_FAULT set as given (NULL: unset):
 * contexts read it when they are created. */
static void fault_pair(xt_side_fn server, const char *server_faults, xt_side_fn client,
                       const char *client_faults, void *arg)
{
  char addr[128];
  xport_conn_t *conn;
  if (server_faults)
    setenv("XPORT_FAULT", server_faults, 1);
  pid_t pid = xt_spawn_pair_server(server, arg, addr, sizeof addr);
  if (client_faults)
    setenv("XPORT_FAULT", client_faults, 1);
  else
    unsetenv("XPORT_FAULT");
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_check_transport(conn);
  if (client(ctx, conn, arg) != XT_CLOSED)
    XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  unsetenv("XPORT_FAULT");
  int st = xt_reap(pid);
  XT_CHECK(st == 0, "server process on %s exited with %d", xt_config(), st);
}

#define FE_MSGS 64
#define FE_WIN 8
#define FE_MAX 8192
static size_t fe_len(int i) { return 1 + (size_t)(i * 997) % FE_MAX; }

/* Echoes FE_MSGS messages, each checked against its pattern first. */
static int fe_echo_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static char bufs[FE_WIN][FE_MAX];
  xport_completion_t c;
  int posted = 0, got = 0, echoed = 0;
  for (; posted < FE_WIN; posted++)
    XT_OK(xport_recv(conn, bufs[posted], FE_MAX, NULL, bufs[posted]));
  while (echoed < FE_MSGS) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "echo: %d of %d received, %d echoed", got, FE_MSGS,
             echoed);
    XT_CHECK(c.status == 0, "echo: op %d %s", c.op, xport_strerror(c.status));
    char *b = c.user_ctx;
    if (c.op == XPORT_OP_RECV) {
      XT_CHECK(c.len == fe_len(got) && xt_verify(b, c.len, (unsigned)got) == c.len,
               "echo: message %d arrived damaged (%zu bytes)", got, c.len);
      got++;
      XT_OK(xport_send(conn, b, c.len, NULL, b));
    } else {
      XT_CHECK(c.op == XPORT_OP_SEND, "echo: op %d", c.op);
      echoed++;
      if (posted < FE_MSGS) {
        XT_OK(xport_recv(conn, b, FE_MAX, NULL, b));
        posted++;
      }
    }
  }
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  return 0;
}

struct fe_state {
  int sent, back, eagains;
  char back_bufs[FE_MSGS][FE_MAX];
};

/* What an application does between two tries of a post the library
 * pushed back: takes the completions that came. */
static void fe_take(xport_ctx_t *ctx, struct fe_state *st, int wait)
{
  xport_completion_t comps[8];
  int n = xport_poll(ctx, comps, 8);
  XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
  if (!n && wait)
    xport_wait(ctx, 10);
  for (int i = 0; i < n; i++) {
    xport_completion_t *c = &comps[i];
    XT_CHECK(c->status == 0, "op %d: %s", c->op, xport_strerror(c->status));
    if (c->op == XPORT_OP_SEND) {
      st->sent++;
      continue;
    }
    XT_CHECK(c->op == XPORT_OP_RECV, "op %d", c->op);
    int k = (int)((char(*)[FE_MAX])c->user_ctx - st->back_bufs);
    XT_CHECK(k == st->back, "echo %d came as the %dth", k, st->back);
    XT_CHECK(c->len == fe_len(k) && xt_verify(c->user_ctx, c->len, (unsigned)k) == c->len,
             "echo %d came back damaged (%zu bytes)", k, c->len);
    st->back++;
  }
}

static int fe_retry_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static struct fe_state st;
  static char msg[FE_MAX];
  long end = now_ms() + 3 * T_MS;
  for (int i = 0; i < FE_MSGS; i++) {
    while (i - st.back >= FE_WIN) {
      fe_take(ctx, &st, 1);
      XT_CHECK(now_ms() < end, "%d of %d echoes back", st.back, FE_MSGS);
    }
    int rc;
    while ((rc = xport_recv(conn, st.back_bufs[i], FE_MAX, NULL, st.back_bufs[i])) ==
           -XPORT_EAGAIN) {
      st.eagains++;
      fe_take(ctx, &st, 0);
    }
    XT_OK(rc);
    xt_fill(msg, fe_len(i), (unsigned)i);
    /* The send's buffer is reused at once: sends up to the eager size are
     * copied, so wait for each before the next is written. */
    int sent = st.sent;
    while ((rc = xport_send(conn, msg, fe_len(i), NULL, NULL)) == -XPORT_EAGAIN) {
      st.eagains++;
      fe_take(ctx, &st, 0);
    }
    XT_OK(rc);
    while (st.sent == sent) {
      fe_take(ctx, &st, 1);
      XT_CHECK(now_ms() < end, "send %d never completed", i);
    }
  }
  while (st.back < FE_MSGS) {
    fe_take(ctx, &st, 1);
    XT_CHECK(now_ms() < end, "%d of %d echoes back", st.back, FE_MSGS);
  }
  /* Every third try pushed back: the 128th post goes at the 191st try,
   * after 63 push-backs. */
  XT_CHECK(st.eagains == (2 * FE_MSGS - 1) / 2, "%d posts pushed back, expected %d", st.eagains,
           (2 * FE_MSGS - 1) / 2);
  return 0;
}

START_TEST(eagain_injected_retry_delivers_every_byte)
{
  /* Every third post of the client is pushed back; it takes completions
   * and posts again, as an application does, and every message comes
   * back whole, in order. */
  fault_pair(fe_echo_server, NULL, fe_retry_client, "eagain:3", NULL);
}
END_TEST

#define FD_DROP 4
#define FD_PEER_RECVS 3

/* Loses its first connection with receives out, then echoes on a second. */
static void fd_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  xport_completion_t c;
  static char bufs[FD_PEER_RECVS][64];
  XT_OK(xport_accept(lst, T_MS, &conn));
  for (int i = 0; i < FD_PEER_RECVS; i++)
    XT_OK(xport_recv(conn, bufs[i], sizeof bufs[i], NULL, bufs[i]));
  xt_step_put(st->s2c[1], 'P');
  int ended[FD_PEER_RECVS] = {0};
  for (int n = 0; n < FD_PEER_RECVS; n++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: %d of %d receives ended", n, FD_PEER_RECVS);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == -XPORT_ECONNRESET,
             "server: op %d %s before every receive ended with ECONNRESET", c.op,
             xport_strerror(c.status));
    int k = (int)((char(*)[64])c.user_ctx - bufs);
    XT_CHECK(k >= 0 && k < FD_PEER_RECVS && !ended[k]++, "server: receive %d ended twice", k);
  }
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  XT_CHECK(c.conn == conn, "server: the disconnect names another connection");
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "server: op %d after the disconnect",
           c.op);
  XT_OK(xport_conn_close(conn));
  XT_OK(xport_accept(lst, T_MS, &conn));
  echo_server(ctx, conn, NULL);
  XT_OK(xport_conn_close(conn));
}

START_TEST(drop_injected_ends_every_op_once_on_both_sides)
{
  /* The client's connection is dropped after its fourth post (receives
   * that nothing answers), as if the server had died; the server, whose
   * connection really closes, loses it too. Each side's receives end once
   * with ECONNRESET, then the disconnect; the client then connects anew. */
  struct xt_steps st;
  char addr[128], bufs[FD_DROP][64];
  xport_conn_t *conn;
  xport_completion_t c;
  xt_steps_open(&st);
  unsetenv("XPORT_FAULT");
  pid_t pid = xt_spawn_server(fd_server, &st, addr, sizeof addr);
  setenv("XPORT_FAULT", "drop_conn:4", 1);
  xport_ctx_t *ctx = xt_ctx();
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_check_transport(conn);
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'P', "server step");
  for (int i = 0; i < FD_DROP; i++)
    XT_OK(xport_recv(conn, bufs[i], sizeof bufs[i], NULL, bufs[i]));
  int ended[FD_DROP] = {0};
  for (int n = 0; n < FD_DROP; n++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "%d of %d receives ended", n, FD_DROP);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == -XPORT_ECONNRESET,
             "op %d %s before every receive ended with ECONNRESET", c.op,
             xport_strerror(c.status));
    int k = (int)((char(*)[64])c.user_ctx - bufs);
    XT_CHECK(k >= 0 && k < FD_DROP && !ended[k]++, "receive %d ended twice", k);
  }
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  XT_CHECK(c.conn == conn, "the disconnect names another connection");
  XT_CHECK(xt_next(ctx, &c, 300) == -XPORT_ETIMEDOUT, "op %d after the disconnect", c.op);
  int rc = xport_send(conn, "x", 1, NULL, NULL);
  XT_CHECK(rc == -XPORT_ENOTCONN, "a post on the dropped connection: %s", xport_strerror(rc));
  XT_OK(xport_conn_close(conn));
  /* A new connection, counted afresh: two posts, fewer than the drop's. */
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_check_transport(conn);
  char msg[32], back[64];
  xt_fill(msg, sizeof msg, 7);
  XT_OK(xport_recv(conn, back, sizeof back, NULL, NULL));
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, NULL));
  for (int i = 0; i < 2; i++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "echo: timeout");
    XT_CHECK(c.status == 0, "echo: op %d %s", c.op, xport_strerror(c.status));
  }
  XT_CHECK(xt_verify(back, sizeof msg, 7) == sizeof msg, "echo bytes differ");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  unsetenv("XPORT_FAULT");
  XT_CHECK(xt_reap(pid) == 0, "server failed");
  xt_steps_close(&st);
}
END_TEST

START_TEST(nth_registration_fails_and_writes_nothing)
{
  /* The third registration fails with ENOMEM and leaves the caller's
   * pointer alone, where the context has two transports too (its second
   * half fails then, and the first is undone); a call refused for its
   * arguments is no registration; the later ones succeed and work. */
  static char bufs[5][4096];
  xport_mr_t *mrs[5], *sentinel = (xport_mr_t *)(uintptr_t)0x5eed;
  setenv("XPORT_FAULT", "mr_reg:3", 1);
  xport_ctx_t *ctx = xt_ctx();
  unsetenv("XPORT_FAULT");
  XT_CHECK(xport_mr_reg(ctx, NULL, 4096, XPORT_ACCESS_LOCAL, &mrs[0]) == -XPORT_EINVAL,
           "a NULL buffer registered");
  for (int i = 0; i < 5; i++) {
    mrs[i] = sentinel;
    int rc = xport_mr_reg(ctx, bufs[i], sizeof bufs[i],
                          XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ, &mrs[i]);
    if (i == 2) {
      XT_CHECK(rc == -XPORT_ENOMEM, "registration 3: %s, expected ENOMEM", xport_strerror(rc));
      XT_CHECK(mrs[i] == sentinel, "registration 3 failed and wrote %p", (void *)mrs[i]);
      continue;
    }
    XT_CHECK(rc == 0, "registration %d: %s", i + 1, xport_strerror(rc));
    uint8_t key[XPORT_RKEY_MAX_SIZE];
    int n = xport_rkey_pack(mrs[i], 0, sizeof bufs[i], key, sizeof key);
    XT_CHECK(n > 0, "packing registration %d: %s", i + 1, xport_strerror(n));
  }
  for (int i = 0; i < 5; i++)
    if (i != 2)
      XT_OK(xport_mr_dereg(mrs[i]));
  xport_ctx_destroy(ctx);
}
END_TEST

#define FL_MSGS 32
static int fl_sender(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  static char msgs[FL_MSGS][256];
  xport_completion_t c;
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'R', "client step");
  for (int i = 0; i < FL_MSGS; i++) {
    xt_fill(msgs[i], sizeof msgs[i], (unsigned)i + 100);
    XT_OK(xport_send_imm(conn, msgs[i], 1 + (size_t)i * 7, NULL, (uint32_t)i, NULL));
  }
  for (int i = 0; i < FL_MSGS; i++)
    expect(ctx, &c, XPORT_OP_SEND, 0);
  return 0;
}

static int fl_receiver(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  static char bufs[FL_MSGS][256];
  xport_completion_t c;
  for (int i = 0; i < FL_MSGS; i++)
    XT_OK(xport_recv(conn, bufs[i], sizeof bufs[i], NULL, bufs[i]));
  xt_step_put(st->c2s[1], 'R');
  for (int i = 0; i < FL_MSGS; i++) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "%d of %d messages", i, FL_MSGS);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "op %d %s", c.op, xport_strerror(c.status));
    XT_CHECK(c.user_ctx == bufs[i] && c.imm == (uint32_t)i && (c.flags & XPORT_COMP_IMM),
             "the %dth completion is message %u's", i, c.imm);
    XT_CHECK(c.len == 1 + (size_t)i * 7 && xt_verify(bufs[i], c.len, (unsigned)i + 100) == c.len,
             "message %d arrived damaged (%zu bytes)", i, c.len);
  }
  /* The server's close comes after everything it sent. */
  expect(ctx, &c, XPORT_OP_DISCONNECT, -XPORT_ECONNRESET);
  return 0;
}

START_TEST(delayed_completions_keep_order_and_bytes)
{
  /* Every completion the receiver's xport_poll finds is held 20 ms: the
   * messages still come in order, whole, with their immediate data, and
   * the disconnect after them. */
  struct xt_steps st;
  xt_steps_open(&st);
  fault_pair(fl_sender, NULL, fl_receiver, "delay_ms:20", &st);
  xt_steps_close(&st);
}
END_TEST

START_TEST(malformed_fault_values_refused)
{
  static const char *bad[] = {
      "bogus",      "eagain",         "eagain:",     "eagain:1",          "eagain:x",
      "mr_reg:0",   "delay_ms:60001", "eagain:3,",   ",eagain:3",         "eagain:3,eagain:4",
      "EAGAIN:3",   "eagain: 3",      "eagain:3;drop_conn:2", "drop_conn:99999999999999999999",
      "drop_conn:-1", "delay_ms:5ms",
  };
  static const char *good[] = {"eagain:2", "mr_reg:1,drop_conn:5,delay_ms:1,eagain:7", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    xport_ctx_t *ctx = (xport_ctx_t *)(uintptr_t)0x5eed;
    setenv("XPORT_FAULT", bad[i], 1);
    int rc = xport_ctx_create(NULL, &ctx);
    XT_CHECK(rc == -XPORT_EINVAL, "XPORT_FAULT=%s: %s, expected EINVAL", bad[i],
             xport_strerror(rc));
    XT_CHECK(ctx == (xport_ctx_t *)(uintptr_t)0x5eed, "XPORT_FAULT=%s: a context came back",
             bad[i]);
  }
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    xport_ctx_t *ctx = NULL;
    setenv("XPORT_FAULT", good[i], 1);
    int rc = xport_ctx_create(NULL, &ctx);
    XT_CHECK(rc == 0, "XPORT_FAULT=%s: %s", good[i], xport_strerror(rc));
    xport_ctx_destroy(ctx);
  }
  unsetenv("XPORT_FAULT");
}
END_TEST

static Suite *life_suite(void)
{
  Suite *s = suite_create("life");
  TCase *own = tcase_create("Ownership");
  tcase_set_timeout(own, 90);
  tcase_add_test(own, close_with_big_send_in_flight);
  tcase_add_test(own, close_with_big_read_in_flight);
  tcase_add_test(own, close_with_posts_held_behind_a_read);
  tcase_add_test(own, close_after_sends_completed_delivers);
  tcase_add_test(own, dead_peer_ops_end_and_context_goes_on);
  tcase_add_test(own, close_with_big_message_unreceived);
  tcase_add_test(own, destroy_with_operations_out_tells_peer);
  tcase_add_test(own, close_after_dead_peer_left_big_message);
  tcase_add_test(own, signaled_send_behind_unsignaled_dead_peer);
  tcase_add_test(own, signaled_send_behind_unsignaled_closed_dead_peer);
  suite_add_tcase(s, own);
  TCase *live = tcase_create("Liveness");
  tcase_set_timeout(live, 90);
  tcase_add_test(live, busy_peer_stays_alive);
  tcase_add_test(live, busy_cq_delivers_disconnect);
  tcase_add_test(live, busy_cq_delivers_disconnect_while_polled);
  tcase_add_test(live, busy_target_is_no_refusal);
  tcase_add_test(live, depth_is_what_caps_say);
  suite_add_tcase(s, live);
  TCase *ka = tcase_create("Keepalive");
  tcase_set_timeout(ka, 90);
  tcase_add_test(ka, computing_peer_with_progress_thread_stays_alive);
  suite_add_tcase(s, ka);
  TCase *loss = tcase_create("PeerLoss");
  tcase_set_timeout(loss, 90);
  tcase_add_test(loss, peer_killed_mid_stream_ends_every_op);
  tcase_add_test(loss, sender_killed_holding_our_lock);
  tcase_add_test(loss, hung_peer_never_blocks_poll);
  tcase_add_test(loss, deadline_ends_ops_to_a_hung_peer);
  tcase_add_test(loss, op_timeout_is_every_connections_deadline);
  tcase_add_test(loss, fd_loop_sleeps_beside_a_hung_peer);
  tcase_add_test(loss, fd_loop_sees_a_death_between_checks);
  suite_add_tcase(s, loss);
  TCase *faults = tcase_create("Faults");
  tcase_set_timeout(faults, 90);
  tcase_add_test(faults, malformed_fault_values_refused);
  tcase_add_test(faults, nth_registration_fails_and_writes_nothing);
  tcase_add_test(faults, eagain_injected_retry_delivers_every_byte);
  tcase_add_test(faults, delayed_completions_keep_order_and_bytes);
  tcase_add_test(faults, drop_injected_ends_every_op_once_on_both_sides);
  suite_add_tcase(s, faults);
  return s;
}

int main(void)
{
  return xt_main("check_life", life_suite, 1);
}
