/* xshm's own tests (xport(7), xshm), on the xshm configuration: its rings
 * wrapped many times with every byte checked, many senders into one
 * receiver, a full ring, a sender killed mid-stream, strangers on the
 * listener's socket, a hostile peer that scribbles its ring, and a
 * receiver asleep in xport_wait woken by each message. */
#define _GNU_SOURCE
#include "harness.h"
#include "../src/transport/xshm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 60000

static int on_xshm(const char *test)
{
  if (!strcmp(xt_config(), "xshm"))
    return 1;
  printf("SKIP: %s on %s: a test of xshm's own (the xshm configuration runs it)\n", test,
         xt_config());
  return 0;
}

/* The size of message i of a mixed stream: mostly through the ring (1 B
 * to 8 KiB), every 13th read from the sender (up to 72 KiB). */
static size_t mixed_size(unsigned i)
{
  return i % 13 == 0 ? XSHM_EAGER + 1 + (i * 7919u) % 65536 : 1 + (i * 2654435761u) % XSHM_EAGER;
}

#define MAXMSG (XSHM_EAGER + 1 + 65536)
#define WINDOW 32

/* Receives n messages of the mixed stream on conn, in order, every byte
 * checked; the stream's seeds start at seed. */
static void recv_stream(xport_ctx_t *ctx, xport_conn_t *conn, unsigned n, unsigned seed)
{
  static char bufs[WINDOW][MAXMSG];
  unsigned posted = 0, got = 0;
  for (; posted < WINDOW && posted < n; posted++)
    XT_OK(xport_recv(conn, bufs[posted % WINDOW], MAXMSG, NULL, bufs[posted % WINDOW]));
  while (got < n) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "message %u never came", got);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "message %u: op %d %s", got, c.op,
             xport_strerror(c.status));
    XT_CHECK(c.user_ctx == bufs[got % WINDOW], "message %u landed out of order", got);
    size_t want = mixed_size(got);
    XT_CHECK(c.len == want, "message %u: %zu bytes, expected %zu", got, c.len, want);
    XT_CHECK(xt_verify(c.user_ctx, c.len, seed + got) == c.len, "message %u's bytes", got);
    got++;
    if (posted < n) {
      XT_OK(xport_recv(conn, bufs[posted % WINDOW], MAXMSG, NULL, bufs[posted % WINDOW]));
      posted++;
    }
  }
}

/* Sends n messages of the mixed stream, at most WINDOW out at once. A
 * long send completes once the receiver has copied it, after the short
 * ones behind it (xport(7): completions may come in another order): a
 * buffer is reused only once its own send completed. */
static void send_stream(xport_ctx_t *ctx, xport_conn_t *conn, unsigned n, unsigned seed)
{
  static char bufs[WINDOW][MAXMSG];
  static int busy[WINDOW];
  unsigned sent = 0, done = 0;
  memset(busy, 0, sizeof busy);
  while (done < n) {
    while (sent < n && !busy[sent % WINDOW]) {
      unsigned slot = sent % WINDOW;
      xt_fill(bufs[slot], mixed_size(sent), seed + sent);
      int rc = xport_send(conn, bufs[slot], mixed_size(sent), NULL, &busy[slot]);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      busy[slot] = 1;
      sent++;
    }
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "send %u never completed", done);
    XT_CHECK(c.op == XPORT_OP_SEND && c.status == 0, "send %u: op %d %s", done, c.op,
             xport_strerror(c.status));
    *(int *)c.user_ctx = 0;
    done++;
  }
}

/* ---- the ring wrapped, every byte ------------------------------------------ */

/* 20,000 messages (some hundreds of laps) in make check's time;
 * XPORT_TEST_STREAM_N runs a soak of as many as asked. */
static int stream_n(void)
{
  const char *e = getenv("XPORT_TEST_STREAM_N");
  return e && atoi(e) > 0 ? atoi(e) : 20000;
}

static int stream_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  recv_stream(ctx, conn, stream_n(), 7);
  return 0;
}

static int stream_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  send_stream(ctx, conn, stream_n(), 7);
  return 0;
}

START_TEST(ring_wraps_every_byte)
{
  if (!on_xshm("ring_wraps_every_byte"))
    return;
  xt_pair(stream_server, stream_client, NULL);
}
END_TEST

/* Where cross-memory attach is denied (Yama, containers; here turned
 * off), long messages travel through the ring in pieces: the same
 * stream, every byte. */
START_TEST(pieces_without_cross_memory_attach)
{
  if (!on_xshm("pieces_without_cross_memory_attach"))
    return;
  setenv("XPORT_XSHM_CMA", "0", 1);
  xt_pair(stream_server, stream_client, NULL);
  /* Said where a user looks first: the candidate's reason (xport_info);
   * after the pair, whose processes fork before any context exists. */
  xport_ctx_attr_t a = {.provider = "xshm"};
  xport_ctx_t *ctx;
  const xport_candidate_t *cands;
  XT_OK(xport_ctx_create(&a, &ctx));
  int n = xport_ctx_candidates(ctx, &cands);
  XT_CHECK(n == 1 && strstr(cands[0].reason, "no cross-memory attach"),
           "the candidate does not say cross-memory attach is off: %s", n ? cands[0].reason : "");
  XT_OK(xport_ctx_destroy(ctx));
  unsetenv("XPORT_XSHM_CMA");
}
END_TEST

/* The kernel's refusal, not the switch: both ends another user (made by
 * the test: nobody), the listener not dumpable, so that neither may read
 * the other's memory (as Yama's ptrace_scope does). A long message still
 * arrives whole, through the ring; a read fails with XPORT_EIO; the
 * connection goes on; the client's log says why, once. */
#define DENIED_LEN (100000)
static int denied_child(int server, int pfd[2], const char *logpath)
{
  if (setgid(65534) || setuid(65534))
    return 10;
  if (server && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
    return 11;
  if (!server) {
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0)
      return 12;
    close(fd);
  }
  setenv("XPORT_LOG", "warn", 1);
  xport_ctx_attr_t a = {.provider = "xshm"};
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  xport_completion_t c;
  static char buf[DENIED_LEN];
  if (xport_ctx_create(&a, &ctx))
    return 13;
  if (server) {
    xport_listener_t *lst;
    char addr[128];
    if (xport_listen(ctx, "127.0.0.1:0", &lst) || xport_listener_addr(lst, addr, sizeof addr))
      return 14;
    if (write(pfd[1], addr, sizeof addr) != (ssize_t)sizeof addr)
      return 15;
    xport_mr_t *mr;
    uint8_t key[XPORT_RKEY_MAX_SIZE];
    if (xport_accept(lst, T_MS, &conn) ||
        xport_mr_reg(ctx, buf, sizeof buf, XPORT_ACCESS_REMOTE_READ, &mr))
      return 16;
    int klen = xport_rkey_pack(mr, 0, sizeof buf, key, sizeof key);
    xt_fill(buf, DENIED_LEN, 5);
    if (klen < 0 || xport_send(conn, buf, DENIED_LEN, NULL, NULL) ||
        xport_send(conn, key, (size_t)klen, NULL, NULL) || xport_recv(conn, buf, 8, NULL, NULL))
      return 17;
    for (int done = 0; done < 3;) { /* two sends and the client's bye */
      if (xt_next(ctx, &c, T_MS) || c.status)
        return 18;
      done++;
    }
    xport_conn_close(conn);
    xport_mr_dereg(mr);
    xport_listener_close(lst);
  } else {
    char addr[128];
    uint8_t key[XPORT_RKEY_MAX_SIZE];
    if (read(pfd[0], addr, sizeof addr) != (ssize_t)sizeof addr)
      return 20;
    if (xport_connect(ctx, addr, T_MS, &conn) || xport_recv(conn, buf, sizeof buf, NULL, NULL) ||
        xport_recv(conn, key, sizeof key, NULL, key))
      return 21;
    size_t klen = 0;
    for (int got = 0; got < 2; got++) {
      if (xt_next(ctx, &c, T_MS) || c.status || c.op != XPORT_OP_RECV)
        return 22;
      if (c.user_ctx == key)
        klen = c.len;
      else if (c.len != DENIED_LEN || xt_verify(buf, c.len, 5) != c.len)
        return 23; /* the long message, through the ring, whole */
    }
    xport_rkey_t *rk;
    if (xport_rkey_unpack(conn, key, klen, &rk) || xport_read(conn, buf, 64, NULL, rk, 0, NULL))
      return 24;
    if (xt_next(ctx, &c, T_MS) || c.op != XPORT_OP_READ || c.status != -XPORT_EIO)
      return 25; /* refused by the kernel: EIO, as xport(7) says */
    if (xport_send(conn, "bye", 4, NULL, NULL) || xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status)
      return 26; /* and the connection goes on */
    xport_rkey_release(rk);
    xport_conn_close(conn);
  }
  xport_ctx_destroy(ctx);
  return 0;
}

START_TEST(cross_memory_attach_denied_by_the_kernel)
{
  if (!on_xshm("cross_memory_attach_denied_by_the_kernel"))
    return;
  if (geteuid() != 0) {
    printf("SKIP: cross_memory_attach_denied_by_the_kernel on xshm: another user needs root\n");
    return;
  }
  char logpath[] = "/tmp/xshm-denied.XXXXXX";
  int lfd = mkstemp(logpath);
  XT_CHECK(lfd >= 0 && fchown(lfd, 65534, 65534) == 0, "the client's log file");
  close(lfd);
  int pfd[2];
  XT_CHECK(pipe(pfd) == 0, "pipe");
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    pid[i] = xt_fork();
    if (pid[i] == 0)
      _exit(denied_child(i == 0, pfd, logpath));
  }
  close(pfd[0]);
  close(pfd[1]);
  int st0 = xt_reap(pid[0]), st1 = xt_reap(pid[1]);
  FILE *f = fopen(logpath, "r");
  char line[600];
  int said = 0;
  while (f && fgets(line, sizeof line, f))
    said += !!strstr(line, "may not read the memory of its peer");
  if (f)
    fclose(f);
  unlink(logpath);
  XT_CHECK(st0 == 0 && st1 == 0, "listener step %d, client step %d (10: no user to become)", st0,
           st1);
  XT_CHECK(said == 1, "the client's log said why %d times, not once", said);
}
END_TEST

/* ---- many senders into one receiver ----------------------------------------- */

#define SENDERS 6
#define PER_SENDER 1500

/* Accepts every sender before it posts a receive: their rings fill, and
 * then all are drained at once. Each connection's messages come in order
 * and whole; none waits until another is done (fairness: every sender is
 * heard within the first quarter). */
static void fan_in_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conns[SENDERS];
  static char bufs[SENDERS][8][2048];
  unsigned got[SENDERS] = {0}, first_seen[SENDERS], total = 0;
  for (int i = 0; i < SENDERS; i++)
    XT_OK(xport_accept(lst, T_MS, &conns[i]));
  usleep(200 * 1000); /* the senders fill their rings meanwhile */
  for (int i = 0; i < SENDERS; i++) {
    first_seen[i] = UINT32_MAX;
    for (int k = 0; k < 8; k++)
      XT_OK(xport_recv(conns[i], bufs[i][k], sizeof bufs[i][k], NULL, bufs[i][k]));
  }
  while (total < SENDERS * PER_SENDER) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "after %u messages, none more", total);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0, "op %d %s", c.op, xport_strerror(c.status));
    int i = 0;
    while (i < SENDERS && c.conn != conns[i])
      i++;
    XT_CHECK(i < SENDERS, "a completion of no sender's");
    /* Each sender's first word says who and which. */
    uint32_t who, seq;
    memcpy(&who, c.user_ctx, 4);
    memcpy(&seq, (char *)c.user_ctx + 4, 4);
    XT_CHECK(seq == got[i], "sender %d: message %u came as %u", i, got[i], seq);
    XT_CHECK(c.len == 8 + (seq * 131) % 2000 &&
                 xt_verify((char *)c.user_ctx + 8, c.len - 8, who * 100000 + seq) == c.len - 8,
             "sender %d, message %u: its bytes", i, seq);
    if (first_seen[i] == UINT32_MAX)
      first_seen[i] = total;
    got[i]++;
    total++;
    if (got[i] + 7 < PER_SENDER)
      XT_OK(xport_recv(c.conn, c.user_ctx, 2048, NULL, c.user_ctx));
  }
  for (int i = 0; i < SENDERS; i++)
    XT_CHECK(first_seen[i] < SENDERS * PER_SENDER / 4,
             "sender %d was first heard after %u of %u messages", i, first_seen[i],
             SENDERS * PER_SENDER);
  for (int i = 0; i < SENDERS; i++)
    xport_conn_close(conns[i]);
}

static void fan_in_sender(const char *addr, uint32_t who)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  static char bufs[WINDOW][2048];
  unsigned sent = 0, done = 0;
  while (done < PER_SENDER) {
    while (sent < PER_SENDER && sent - done < WINDOW) {
      char *b = bufs[sent % WINDOW];
      size_t len = 8 + (sent * 131) % 2000;
      memcpy(b, &who, 4);
      memcpy(b + 4, &sent, 4);
      xt_fill(b + 8, len - 8, who * 100000 + sent);
      int rc = xport_send(conn, b, len, NULL, NULL);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_OK(rc);
      sent++;
    }
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_SEND && c.status == 0,
             "sender %u: send %u", who, done);
    done++;
  }
  /* Until the receiver has all, and closes. */
  xport_completion_t c;
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_DISCONNECT, "sender %u: no end", who);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}

START_TEST(many_senders_one_receiver)
{
  if (!on_xshm("many_senders_one_receiver"))
    return;
  char addr[128];
  pid_t kids[SENDERS];
  pid_t srv = xt_spawn_server(fan_in_server, NULL, addr, sizeof addr);
  for (int i = 0; i < SENDERS; i++) {
    kids[i] = xt_fork();
    if (kids[i] == 0) {
      fan_in_sender(addr, (uint32_t)i);
      _exit(0);
    }
  }
  for (int i = 0; i < SENDERS; i++)
    XT_CHECK(xt_reap(kids[i]) == 0, "sender %d failed", i);
  XT_CHECK(xt_reap(srv) == 0, "the receiver failed");
}
END_TEST

/* ---- a full ring: EAGAIN, then everything ------------------------------------- */

/* Past inject_size (which xport copies at once) and through the ring. */
#define FULL_MSG 6000

static void late_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  char n[4];
  XT_CHECK(read(st->c2s[0], n, 4) == 4, "the count");
  unsigned k;
  memcpy(&k, n, 4);
  static char buf[FULL_MSG];
  for (unsigned i = 0; i < k; i++) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    XT_CHECK(c.status == 0 && c.len == sizeof buf && xt_verify(buf, sizeof buf, i) == sizeof buf,
             "message %u of %u: %s", i, k, xport_strerror(c.status));
  }
  xt_step_put(st->s2c[1], 'd');
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'q', "protocol");
  xport_conn_close(conn);
}

START_TEST(full_ring_then_progress)
{
  if (!on_xshm("full_ring_then_progress"))
    return;
  struct xt_steps st;
  xt_steps_open(&st);
  char addr[128];
  pid_t srv = xt_spawn_server(late_server, &st, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  /* The receiver posts nothing: the ring fills (43 of these), the rest
   * wait in the sender's queue, and the depth ends it with EAGAIN. With
   * the progress thread, the sends the ring took complete meanwhile and
   * leave the depth to others: up to a ringful more are taken. */
  enum { RINGFUL = XSHM_RING / FULL_MSG + 1, MOST = XSHM_DEPTH + RINGFUL };
  static char bufs[MOST + 1][FULL_MSG];
  unsigned k = 0;
  int rc;
  for (;;) {
    if (k <= MOST)
      xt_fill(bufs[k], FULL_MSG, k);
    rc = k <= MOST ? xport_send(conn, bufs[k], FULL_MSG, NULL, NULL) : -XPORT_EIO;
    if (rc)
      break;
    k++;
  }
  XT_CHECK(rc == -XPORT_EAGAIN, "send %u: %s, expected EAGAIN at the depth", k,
           xport_strerror(rc));
  if (xt_caps()->progress_thread)
    XT_CHECK(k >= XSHM_DEPTH && k <= MOST, "%u sends taken, the depth is %d and a ringful %d",
             k, XSHM_DEPTH, RINGFUL);
  else
    XT_CHECK(k == XSHM_DEPTH, "%u sends taken, the depth is %d", k, XSHM_DEPTH);
  char n[4];
  memcpy(n, &k, 4);
  XT_CHECK(write(st.c2s[1], n, 4) == 4, "write");
  for (unsigned i = 0; i < k; i++) {
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
    XT_CHECK(c.status == 0, "send %u: %s", i, xport_strerror(c.status));
  }
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'd', "the receiver did not get them all");
  xt_step_put(st.c2s[1], 'q');
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(srv) == 0, "the receiver failed");
  xt_steps_close(&st);
}
END_TEST

/* ---- a sender killed mid-stream ---------------------------------------------- */

static void endless_sender(const char *addr)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  send_stream(ctx, conn, UINT32_MAX / 2, 11); /* until killed */
}

static void victim_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  pid_t *sender = arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  recv_stream(ctx, conn, 3000, 11);
  kill(*sender, SIGKILL);
  /* What it had written whole comes, in order and intact; then the
   * receives end with ECONNRESET, and the event. */
  static char bufs[WINDOW][MAXMSG];
  for (int i = 0; i < WINDOW; i++)
    XT_OK(xport_recv(conn, bufs[i], MAXMSG, NULL, bufs[i]));
  unsigned got = 3000, failed = 0, out = WINDOW;
  for (;;) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "no end after the sender died");
    if (c.op == XPORT_OP_DISCONNECT)
      break;
    XT_CHECK(c.op == XPORT_OP_RECV, "op %d", c.op);
    if (c.status) {
      XT_CHECK(c.status == -XPORT_ECONNRESET, "a receive ended with %s",
               xport_strerror(c.status));
      failed++;
      continue;
    }
    XT_CHECK(!failed, "a message after a failed receive");
    XT_CHECK(c.len == mixed_size(got) && xt_verify(c.user_ctx, c.len, 11 + got) == c.len,
             "message %u after the kill: %zu bytes, not whole", got, c.len);
    got++;
    /* Once the loss is known, a post is refused (its event follows). */
    int rc = xport_recv(conn, c.user_ctx, MAXMSG, NULL, c.user_ctx);
    XT_CHECK(rc == 0 || rc == -XPORT_ENOTCONN, "a receive after the kill: %s",
             xport_strerror(rc));
    out -= rc != 0;
  }
  XT_CHECK(failed == out, "%u receives failed, %u were out", failed, out);
  xport_conn_close(conn);
}

START_TEST(sender_killed_mid_stream)
{
  if (!on_xshm("sender_killed_mid_stream"))
    return;
  /* The sender first (a child of this process), then the receiver, which
   * kills it: the sender learns the address through a pipe. */
  int p[2];
  XT_CHECK(pipe(p) == 0, "pipe");
  static pid_t sender;
  sender = xt_fork();
  if (sender == 0) {
    char addr[128] = "";
    XT_CHECK(read(p[0], addr, sizeof addr) > 0, "the address");
    endless_sender(addr);
    _exit(0);
  }
  char addr[128];
  pid_t srv = xt_spawn_server(victim_server, &sender, addr, sizeof addr);
  XT_CHECK(write(p[1], addr, strlen(addr) + 1) > 0, "write");
  XT_CHECK(xt_reap(srv) == 0, "the receiver failed");
  int st = xt_reap(sender);
  XT_CHECK(st == 128 + SIGKILL, "the sender ended with %d, not killed", st);
  close(p[0]);
  close(p[1]);
}
END_TEST

/* A sender that writes many messages and closes at once: all it wrote
 * reaches the receives posted after its close, then the event. Those
 * receives are posted before the receiver looks at the connection again:
 * a close it has seen ends the connection with what no receive took
 * (xport(7), xshm), which a progress thread may see at any time. */
#define PARTING 250 /* within the receive depth (256) */

static void parting_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'c', "the sender never closed");
  static uint32_t got[PARTING];
  for (uint32_t i = 0; i < PARTING; i++)
    XT_OK(xport_recv(conn, &got[i], sizeof got[i], NULL, &got[i]));
  for (uint32_t i = 0; i < PARTING; i++) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "message %u never came", i);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0 && got[i] == i,
             "message %u of %d: op %d %s", i, PARTING, c.op, xport_strerror(c.status));
  }
  xport_completion_t c;
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_DISCONNECT, "no end");
  xport_conn_close(conn);
}

START_TEST(all_before_the_close)
{
  if (!on_xshm("all_before_the_close"))
    return;
  if (xt_caps()->progress_thread) {
    printf("SKIP: all_before_the_close on %s: the progress thread may see the close before "
           "the receives are posted (xport(7), xshm)\n", xt_config());
    return;
  }
  struct xt_steps st;
  xt_steps_open(&st);
  char addr[128];
  pid_t srv = xt_spawn_server(parting_server, &st, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  static uint32_t m[PARTING];
  for (uint32_t i = 0; i < PARTING; i++) {
    m[i] = i;
    XT_OK(xport_send(conn, &m[i], sizeof m[i], NULL, NULL));
  }
  for (uint32_t i = 0; i < PARTING; i++)
    XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "send %u", i);
  xport_conn_close(conn);
  xt_step_put(st.c2s[1], 'c');
  XT_CHECK(xt_reap(srv) == 0, "the receiver failed");
  xport_ctx_destroy(ctx);
  xt_steps_close(&st);
}
END_TEST

/* ---- strangers on the listener's socket, and a hostile peer -------------------- */

static int raw_connect(const char *addr)
{
  /* The listener's name: user, numeric host, port (src/transport/xshm.c). */
  const char *colon = strrchr(addr, ':');
  unsigned port = (unsigned)atoi(colon + 1);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "xport-xshm.%u.%.*s.%u",
                   (unsigned)geteuid(), (int)(colon - addr), addr, port);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  XT_CHECK(s >= 0 && !connect(s, (struct sockaddr *)&sa,
                              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)),
           "raw connect: %s", strerror(errno));
  return s;
}

static void send_fds(int s, const void *msg, size_t len, const int *fds, int nfds)
{
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(3 * sizeof(int))];
  } u;
  struct iovec v = {(void *)msg, len};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
  if (nfds) {
    memset(&u, 0, sizeof u);
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  }
  sendmsg(s, &m, MSG_NOSIGNAL);
}

/* A memfd of len bytes; sealed as xshm requires (its size fixed; a key
 * table against other writers), or not. */
static int memfd_sealed(size_t len, int seals)
{
  int fd = memfd_create("stranger", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  XT_CHECK(fd >= 0 && !ftruncate(fd, (off_t)len) && (!seals || !fcntl(fd, F_ADD_SEALS, seals)),
           "memfd");
  return fd;
}

#define SEG_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define KEY_SEALS (SEG_SEALS | F_SEAL_FUTURE_WRITE)

static int memfd_of(size_t len)
{
  return memfd_sealed(len, 0);
}

/* Accepts (strangers are refused inside its accepts) until it has an
 * honest connection, then exchanges a message on it. */
static void honest_only_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  char buf[8];
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0 && !strcmp(buf, "honest"), "the honest message: %s",
           xport_strerror(c.status));
  xport_conn_close(conn);
}

START_TEST(strangers_on_the_socket)
{
  if (!on_xshm("strangers_on_the_socket"))
    return;
  char addr[128];
  pid_t srv = xt_spawn_server(honest_only_server, NULL, addr, sizeof addr);
  struct xshm_hello h = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_HELLO,
                         .pid = (uint32_t)getpid(), .seg_size = sizeof(struct xshm_seg)};
  int socks[6];
  /* Garbage; a hello without its descriptors; with descriptors of the
   * wrong sizes; of another pid; one that never says anything. */
  socks[0] = raw_connect(addr);
  send_fds(socks[0], "garbage garbage garbage", 23, NULL, 0);
  socks[1] = raw_connect(addr);
  send_fds(socks[1], &h, sizeof h, NULL, 0);
  int small[2] = {memfd_of(4096), memfd_of(4096)};
  socks[2] = raw_connect(addr);
  send_fds(socks[2], &h, sizeof h, small, 2);
  struct xshm_hello other = h;
  other.pid = 1;
  int right[2] = {memfd_of(sizeof(struct xshm_seg)), memfd_of(XSHM_KEYS * sizeof(struct xshm_key))};
  socks[3] = raw_connect(addr);
  send_fds(socks[3], &other, sizeof other, right, 2);
  socks[4] = raw_connect(addr);
  socks[5] = raw_connect(addr);
  send_fds(socks[5], &h, sizeof h - 1, right, 2); /* truncated */
  /* Another version of xport's, with all its descriptors. */
  struct xshm_hello old = h;
  old.version = XSHM_VERSION - 1;
  int all3[3] = {memfd_sealed(sizeof(struct xshm_seg), SEG_SEALS),
                 memfd_sealed(XSHM_KEYS * sizeof(struct xshm_key), KEY_SEALS),
                 eventfd(0, EFD_CLOEXEC)};
  int s8 = raw_connect(addr);
  send_fds(s8, &old, sizeof old, all3, 3);
  /* Right sizes and a doorbell, but unsealed: a peer could shrink them
   * under the listener's mapping (SIGBUS). */
  int unsealed[3] = {memfd_of(sizeof(struct xshm_seg)),
                     memfd_of(XSHM_KEYS * sizeof(struct xshm_key)), eventfd(0, EFD_CLOEXEC)};
  int s6 = raw_connect(addr);
  send_fds(s6, &h, sizeof h, unsealed, 3);
  {
    struct pollfd pf = {.fd = s6, .events = POLLIN};
    char b[sizeof h];
    XT_CHECK(poll(&pf, 1, T_MS) == 1, "the unsealed stranger: no answer");
    ssize_t n = recv(s6, b, sizeof b, 0);
    XT_CHECK(n <= 0 || (n == (ssize_t)sizeof h && ((struct xshm_hello *)b)->kind == XSHM_H_REFUSE),
             "unsealed memory was welcomed");
    close(s6);
    for (int i = 0; i < 3; i++)
      close(unsealed[i]);
  }
  /* Sealed memory, but a pipe for a doorbell: a send that rang it would
   * block, then die of SIGPIPE. */
  {
    int pp[2];
    XT_CHECK(pipe2(pp, O_CLOEXEC) == 0, "pipe");
    int fds3[3] = {memfd_sealed(sizeof(struct xshm_seg), SEG_SEALS),
                   memfd_sealed(XSHM_KEYS * sizeof(struct xshm_key), KEY_SEALS), pp[1]};
    struct xshm_seg *g = mmap(NULL, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED, fds3[0], 0);
    XT_CHECK(g != MAP_FAILED, "mmap");
    g->magic = XSHM_MAGIC;
    g->version = XSHM_VERSION;
    int s7 = raw_connect(addr);
    send_fds(s7, &h, sizeof h, fds3, 3);
    struct pollfd pf = {.fd = s7, .events = POLLIN};
    char b[sizeof h];
    XT_CHECK(poll(&pf, 1, T_MS) == 1, "the pipe stranger: no answer");
    ssize_t n = recv(s7, b, sizeof b, 0);
    XT_CHECK(n <= 0 || (n == (ssize_t)sizeof h && ((struct xshm_hello *)b)->kind == XSHM_H_REFUSE),
             "a pipe was taken for a doorbell");
    close(s7);
    munmap(g, sizeof *g);
    close(fds3[0]);
    close(fds3[1]);
    close(pp[0]);
    close(pp[1]);
  }
  /* Each is refused, and told why: not a hello of this version with its
   * descriptors (XPORT_EPROTO); then the honest client gets in. */
  int told[6] = {socks[0], socks[1], socks[2], socks[3], socks[5], s8}; /* socks[4] is silent */
  for (int i = 0; i < 6; i++) {
    struct pollfd pf = {.fd = told[i], .events = POLLIN};
    struct xshm_hello b;
    XT_CHECK(poll(&pf, 1, T_MS) == 1, "stranger %d: no answer", i);
    ssize_t n = recv(told[i], &b, sizeof b, 0);
    XT_CHECK(n == (ssize_t)sizeof b && b.kind == XSHM_H_REFUSE && b.status == XPORT_EPROTO,
             "stranger %d: %s", i,
             n != (ssize_t)sizeof b ? "closed without a refusal" : "not refused with EPROTO");
  }
  for (int i = 0; i < 3; i++)
    close(all3[i]);
  close(s8);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_send(conn, "honest", 7, NULL, NULL));
  XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "the honest send");
  XT_CHECK(xt_reap(srv) == 0, "the listener failed");
  for (int i = 0; i < 6; i++)
    close(socks[i]);
  for (int i = 0; i < 2; i++)
    close(small[i]), close(right[i]);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}
END_TEST

/* A peer that does the handshake itself, then writes garbage where the
 * receiver reads: records of every bad kind, a wrap where none can be, a
 * control record of no type. The receiver ends that connection and goes
 * on; under AddressSanitizer (make check-sanitizers) it touches nothing
 * outside its buffers. */
static void scribbled_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  for (int round = 0; round < 5; round++) {
    xport_conn_t *conn;
    XT_OK(xport_accept(lst, T_MS, &conn));
    static char bufs[4][MAXMSG];
    for (int i = 0; i < 4; i++)
      XT_OK(xport_recv(conn, bufs[i], MAXMSG, NULL, NULL));
    int ended = 0;
    while (!ended) {
      xport_completion_t c;
      XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "round %d: the scribbled connection never ended",
               round);
      ended = c.op == XPORT_OP_DISCONNECT;
      XT_CHECK(ended || (c.op == XPORT_OP_RECV && c.status == -XPORT_ECONNRESET),
               "round %d: op %d %s", round, c.op, xport_strerror(c.status));
    }
    xport_conn_close(conn);
  }
  honest_only_server(ctx, lst, NULL);
}

START_TEST(hostile_peer_scribbles_its_ring)
{
  if (!on_xshm("hostile_peer_scribbles_its_ring"))
    return;
  char addr[128];
  pid_t srv = xt_spawn_server(scribbled_server, NULL, addr, sizeof addr);
  for (int round = 0; round < 5; round++) {
    int s = raw_connect(addr);
    int fds[3] = {memfd_sealed(sizeof(struct xshm_seg), SEG_SEALS),
                  memfd_sealed(XSHM_KEYS * sizeof(struct xshm_key), KEY_SEALS),
                  eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    struct xshm_seg *seg = mmap(NULL, sizeof *seg, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    XT_CHECK(seg != MAP_FAILED, "mmap");
    seg->magic = XSHM_MAGIC;
    seg->version = XSHM_VERSION;
    struct xshm_hello h = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_HELLO,
                           .pid = (uint32_t)getpid(), .seg_size = sizeof *seg};
    send_fds(s, &h, sizeof h, fds, 3);
    char w[sizeof h + 64];
    XT_CHECK(recv(s, w, sizeof w, 0) == (ssize_t)sizeof h &&
                 ((struct xshm_hello *)(void *)w)->kind == XSHM_H_WELCOME,
             "round %d: no welcome", round);
    /* Sealed: the peer cannot shrink its segment under the receiver. */
    XT_CHECK(ftruncate(fds[0], 0) != 0, "round %d: the segment could be shrunk", round);
    struct xshm_ring *r = &seg->ring[0];
    struct xshm_rec rec = {0};
    switch (round) {
    case 0: /* a message longer than a ring record can be */
      rec = (struct xshm_rec){.len = 1u << 30, .type = XSHM_R_MSG};
      memcpy(r->data, &rec, sizeof rec);
      break;
    case 1: /* a long message of too many pieces, then one from nowhere */
      rec = (struct xshm_rec){.len = 100000, .type = XSHM_R_RNDV, .niov = 60000};
      memcpy(r->data, &rec, sizeof rec);
      break;
    case 2: /* a wrap where a record always fits: the ring's start */
      rec = (struct xshm_rec){.type = XSHM_R_WRAP};
      memcpy(r->data, &rec, sizeof rec);
      break;
    case 3: { /* a long message whose length its scatter list contradicts */
      static char src[100000];
      uint64_t el[2] = {(uintptr_t)src, sizeof src};
      rec = (struct xshm_rec){.len = 1000, .type = XSHM_R_RNDV, .niov = 1};
      memcpy(r->data + sizeof rec, el, sizeof el);
      memcpy(r->data, &rec, sizeof rec);
      break;
    }
    default: /* random records, then a control record of no type */
      seg->ctl[0].slot[0].type = 77;
      __atomic_store_n(&seg->ctl[0].tail, 1, __ATOMIC_RELEASE);
      for (size_t i = 4095; i-- > 0;) /* the first header last: its publication */
        r->data[i] = (uint8_t)(i * 2654435761u >> 13 | (i == 4 ? 1 : 0));
      break;
    }
    /* Until the receiver has ended it. */
    char b;
    struct pollfd pf = {.fd = s, .events = POLLIN};
    XT_CHECK(poll(&pf, 1, T_MS) == 1 && recv(s, &b, 1, 0) <= 0, "round %d: not ended", round);
    munmap(seg, sizeof *seg);
    for (int i = 0; i < 3; i++)
      close(fds[i]);
    close(s);
  }
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_send(conn, "honest", 7, NULL, NULL));
  XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "the honest send");
  XT_CHECK(xt_reap(srv) == 0, "the receiver failed");
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}
END_TEST

/* Peers that connect and say nothing hold up no other: the listener's
 * handshakes run side by side, each a step per accept. */
static void patient_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)ctx, (void)arg;
  xport_conn_t *conn = NULL;
  int rc;
  /* Short accepts, as an event loop makes them: each returns in time. */
  while ((rc = xport_accept(lst, 50, &conn)) == -XPORT_ETIMEDOUT)
    ;
  XT_OK(rc);
  honest_only_server(ctx, lst, NULL); /* a second honest one too */
  xport_conn_close(conn);
}

START_TEST(silent_peers_hold_up_no_other)
{
  if (!on_xshm("silent_peers_hold_up_no_other"))
    return;
  char addr[128];
  pid_t srv = xt_spawn_server(patient_server, NULL, addr, sizeof addr);
  int silent[20];
  for (int i = 0; i < 20; i++)
    silent[i] = raw_connect(addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *a, *b;
  /* Well inside the five seconds each silent one is given. */
  XT_OK(xport_connect(ctx, addr, 3000, &a));
  XT_OK(xport_connect(ctx, addr, 3000, &b));
  XT_OK(xport_send(b, "honest", 7, NULL, NULL));
  XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "the honest send");
  XT_CHECK(xt_reap(srv) == 0, "the listener failed");
  for (int i = 0; i < 20; i++)
    close(silent[i]);
  xport_conn_close(a);
  xport_conn_close(b);
  xport_ctx_destroy(ctx);
}
END_TEST

/* A key edited to claim read and write on a region registered for
 * atomics only: the target's table refuses both (EACCES, and the
 * connection ends), and its bytes are unchanged. */
static int atomic_only_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static uint64_t words[8] __attribute__((aligned(64))) = {7, 7, 7, 7, 7, 7, 7, 7};
  xport_mr_t *mr;
  uint8_t k[XPORT_RKEY_MAX_SIZE];
  XT_OK(xport_mr_reg(ctx, words, sizeof words, XPORT_ACCESS_REMOTE_ATOMIC, &mr));
  int klen = xport_rkey_pack(mr, 0, sizeof words, k, sizeof k);
  XT_OK(klen);
  XT_OK(xport_send(conn, k, (size_t)klen, NULL, NULL));
  XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "the key");
  /* Until the client's connection ends. */
  xport_completion_t c;
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_DISCONNECT, "no end: op %d", c.op);
  for (int i = 0; i < 8; i++)
    XT_CHECK(words[i] == 7, "word %d became %llu", i, (unsigned long long)words[i]);
  XT_OK(xport_mr_dereg(mr));
  return XT_CLOSED;
}

static int atomic_only_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  uint8_t k[XPORT_RKEY_MAX_SIZE];
  XT_OK(xport_recv(conn, k, sizeof k, NULL, NULL));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "the key: %s", xport_strerror(c.status));
  size_t klen = c.len;
  uint32_t access = XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE |
                    XPORT_ACCESS_REMOTE_ATOMIC;
  for (int i = 0; i < 4; i++)
    k[12 + i] = (uint8_t)(access >> (8 * i)); /* its rights, widened */
  xt_key_reseal(k, klen);
  xport_rkey_t *rk;
  XT_OK(xport_rkey_unpack(conn, k, klen, &rk));
  static uint64_t src[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  XT_OK(xport_write(conn, src, sizeof src, NULL, rk, 0, src));
  c = xt_wait_op(ctx, XPORT_OP_WRITE, T_MS);
  XT_CHECK(c.status == -XPORT_EACCES, "a write through an edited key: %s",
           xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  XT_CHECK(c.status == -XPORT_ECONNRESET, "the connection goes on after a refused write");
  xport_rkey_release(rk);
  return 0;
}

START_TEST(atomic_only_region_refuses_read_and_write)
{
  if (!on_xshm("atomic_only_region_refuses_read_and_write"))
    return;
  xt_pair(atomic_only_server, atomic_only_client, NULL);
}
END_TEST

/* ---- a receiver asleep in xport_wait ----------------------------------------- */

#define NAPS 20

static void sleeper(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  char buf[16];
  for (int i = 0; i < NAPS; i++) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    xport_completion_t c;
    int n;
    while ((n = xport_poll(ctx, &c, 1)) == 0)
      XT_CHECK(xport_wait(ctx, T_MS) == 0, "message %d: the wait was never woken", i);
    XT_CHECK(n == 1 && c.op == XPORT_OP_RECV && c.status == 0 && buf[0] == (char)i,
             "message %d", i);
  }
  xport_conn_close(conn);
}

START_TEST(wait_woken_by_each_message)
{
  if (!on_xshm("wait_woken_by_each_message"))
    return;
  char addr[128];
  pid_t srv = xt_spawn_server(sleeper, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  for (int i = 0; i < NAPS; i++) {
    char b = (char)i;
    usleep(20 * 1000); /* the receiver is asleep by now */
    XT_OK(xport_send(conn, &b, 1, NULL, NULL));
    XT_CHECK(xt_wait_op(ctx, XPORT_OP_SEND, T_MS).status == 0, "send %d", i);
  }
  XT_CHECK(xt_reap(srv) == 0, "the sleeper failed");
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("xshm");
  TCase *t = tcase_create("Rings");
  tcase_set_timeout(t, 600);
  tcase_add_test(t, ring_wraps_every_byte);
  tcase_add_test(t, pieces_without_cross_memory_attach);
  tcase_add_test(t, cross_memory_attach_denied_by_the_kernel);
  tcase_add_test(t, many_senders_one_receiver);
  tcase_add_test(t, full_ring_then_progress);
  tcase_add_test(t, sender_killed_mid_stream);
  tcase_add_test(t, all_before_the_close);
  tcase_add_test(t, wait_woken_by_each_message);
  suite_add_tcase(s, t);
  TCase *h = tcase_create("Hostile");
  tcase_set_timeout(h, 600);
  tcase_add_test(h, strangers_on_the_socket);
  tcase_add_test(h, hostile_peer_scribbles_its_ring);
  tcase_add_test(h, silent_peers_hold_up_no_other);
  tcase_add_test(h, atomic_only_region_refuses_read_and_write);
  suite_add_tcase(s, h);
  return s;
}

int main(void)
{
  return xt_main("check_xshm", make_suite, 1);
}
