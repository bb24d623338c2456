/* Remote atomics on every provider present: a counter that several
 * processes fetch-and-add at once, a spinlock made of compare-and-swap,
 * the exact values of a fixed sequence, refusals before anything is
 * posted, keys the target does not honour (revoked, forged), a target
 * that sleeps with its progress thread on, a target killed with atomics
 * outstanding, and the queue depth.
 *
 * Forked clients and targets step through pipes where a process must stop
 * calling xport at a known point; no process opens a context before it
 * forks (verbs does not survive a fork). */
#include "harness.h"
/* The service channel's endpoint (struct msg_conn), where a test plays
 * a peer that breaks its rules. */
#include "../src/transport/msg.h"
#include "../src/transport/xshm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 20000
/* Where atomics are emulated, at most this many are outstanding per
 * connection (XPORT__SVC_DEPTH in src/xport_int.h); beyond, EAGAIN. */
#define EMU_DEPTH 8
/* What a result slot holds until xport writes it. */
#define UNTOUCHED 0xa5a5a5a5a5a5a5a5ull
#define CANARY0 0x0123456789abcdefull
#define CANARY1 0xfedcba9876543210ull

/* ---- completions: the ones not waited for are kept for later waits ---- */
static void expect_ok(xport_ctx_t *ctx, xport_op_t op)
{
  xport_completion_t c = xt_wait_op(ctx, op, T_MS);
  XT_CHECK(c.status == 0, "op %d failed on %s: %s (%s)", op, xt_config(),
           xport_strerror(c.status), c.detail ? c.detail : "");
}

/* Waits for the atomic whose result slot (and user_ctx) is res; it must
 * succeed. Returns the fetched value. */
static uint64_t atom_ok(xport_ctx_t *ctx, xport_conn_t *conn, uint64_t *res, const char *what)
{
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_ATOMIC, T_MS);
  XT_CHECK(c.user_ctx == res, "%s on %s: completion for another operation", what, xt_config());
  XT_CHECK(c.status == 0, "%s on %s: %s (%s)", what, xt_config(), xport_strerror(c.status),
           c.detail ? c.detail : "");
  XT_CHECK(c.len == 8 && c.conn == conn, "%s on %s: len %zu, conn %p", what, xt_config(), c.len,
           (void *)c.conn);
  return *res;
}

static void msg_send(xport_ctx_t *ctx, xport_conn_t *conn, const void *m, size_t len)
{
  XT_OK(xport_send(conn, m, len, NULL, NULL));
  expect_ok(ctx, XPORT_OP_SEND);
}

static size_t msg_recv(xport_ctx_t *ctx, xport_conn_t *conn, void *m, size_t len)
{
  XT_OK(xport_recv(conn, m, len, NULL, NULL));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "receive on %s: %s", xt_config(), xport_strerror(c.status));
  return c.len;
}

static int pack_key(xport_mr_t *mr, size_t off, size_t len, uint8_t *key)
{
  int n = xport_rkey_pack(mr, off, len, key, XPORT_RKEY_MAX_SIZE);
  XT_CHECK(n > 0 && n <= XPORT_RKEY_MAX_SIZE, "pack: %s", xport_strerror(n));
  return n;
}

static void send_key(xport_ctx_t *ctx, xport_conn_t *conn, xport_mr_t *mr, size_t off,
                     size_t len)
{
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  int n = pack_key(mr, off, len, key);
  msg_send(ctx, conn, key, (size_t)n);
}

/* Receives a packed key; raw (may be NULL) gets its bytes. */
static xport_rkey_t *import_key(xport_ctx_t *ctx, xport_conn_t *conn, uint8_t *raw, size_t *len)
{
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  xport_rkey_t *rk;
  size_t n = msg_recv(ctx, conn, key, sizeof key);
  XT_OK(xport_rkey_unpack(conn, key, n, &rk));
  if (raw) {
    memcpy(raw, key, n);
    *len = n;
  }
  return rk;
}

static uint32_t key_access(const uint8_t *k)
{
  return (uint32_t)k[12] | (uint32_t)k[13] << 8 | (uint32_t)k[14] << 16 |
         (uint32_t)k[15] << 24;
}

/* How conn's transport carries atomics (over shm beside tcp: natively,
 * where the context's fabric emulates them). */
static int emulated(xport_conn_t *conn)
{
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  XT_CHECK(caps.atomics != XPORT_SUPPORT_NONE, "%s offers no atomics", xt_config());
  return caps.atomics == XPORT_SUPPORT_EMULATED;
}

/* A few polls, with short waits in between: nothing may complete. */
static void expect_quiet(xport_ctx_t *ctx, const char *what)
{
  for (int i = 0; i < 5; i++) {
    xport_completion_t c;
    int n = xport_poll(ctx, &c, 1);
    XT_CHECK(n == 0, "%s on %s: a completion came (poll %d; op %d, status %s)", what,
             xt_config(), n, n == 1 ? (int)c.op : 0, n == 1 ? xport_strerror(c.status) : "");
    int w = xport_wait(ctx, 2);
    XT_CHECK(w == 0 || w == -XPORT_ETIMEDOUT, "xport_wait: %s", xport_strerror(w));
  }
}

/* ---- pipes between the test process and the processes it forks -------- */
/* ---- several client processes against one target --------------------- */
#define NCLIENTS 4
#define MW 8 /* words in the target's region */

struct multi {
  unsigned access;
  uint64_t init[MW]; /* the region at the start */
  uint64_t want[MW]; /* and what it must hold at the end */
};

/* Serves until nsend sends and nrecv receives have completed, all well;
 * disconnect events (clients leaving) are fine. */
static void serve(xport_ctx_t *ctx, int nsend, int nrecv)
{
  while (nsend > 0 || nrecv > 0) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS * 3) == 0, "target starved: %d sends, %d receives to go",
             nsend, nrecv);
    if (c.op == XPORT_OP_DISCONNECT)
      continue;
    XT_CHECK(c.status == 0, "target: op %d: %s", c.op, xport_strerror(c.status));
    if (c.op == XPORT_OP_SEND)
      nsend--;
    else if (c.op == XPORT_OP_RECV)
      nrecv--;
    else
      XT_CHECK(0, "target: op %d", c.op);
  }
}

/* Accepts every client, then sends each the key at once, so that they all
 * start together; serves until each says it is done; then the test's own
 * connection, which reads the region back; then checks the region. */
static void multi_target(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct multi *m = arg;
  static uint64_t words[MW] __attribute__((aligned(64)));
  static char done[NCLIENTS + 1][8];
  xport_conn_t *conn[NCLIENTS + 1];
  xport_mr_t *mr;
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  memcpy(words, m->init, sizeof words);
  XT_OK(xport_mr_reg(ctx, words, sizeof words, m->access, &mr));
  int n = pack_key(mr, 0, sizeof words, key);
  for (int i = 0; i < NCLIENTS; i++)
    XT_OK(xport_accept(lst, T_MS, &conn[i]));
  for (int i = 0; i < NCLIENTS; i++) {
    XT_OK(xport_recv(conn[i], done[i], sizeof done[i], NULL, NULL));
    XT_OK(xport_send(conn[i], key, (size_t)n, NULL, NULL));
  }
  /* Polls all the while: atomics move only while the target is in xport. */
  serve(ctx, NCLIENTS, NCLIENTS);
  XT_OK(xport_accept(lst, T_MS, &conn[NCLIENTS]));
  XT_OK(xport_recv(conn[NCLIENTS], done[NCLIENTS], sizeof done[NCLIENTS], NULL, NULL));
  XT_OK(xport_send(conn[NCLIENTS], key, (size_t)n, NULL, NULL));
  serve(ctx, 1, 1);
  for (int i = 0; i < MW; i++)
    XT_CHECK(__atomic_load_n(&words[i], __ATOMIC_SEQ_CST) == m->want[i],
             "target's word %d on %s: %llu, expected %llu", i, xt_config(),
             (unsigned long long)words[i], (unsigned long long)m->want[i]);
  for (int i = 0; i <= NCLIENTS; i++)
    xport_conn_close(conn[i]);
  XT_OK(xport_mr_dereg(mr));
}

typedef void (*client_fn)(xport_ctx_t *ctx, xport_conn_t *conn, xport_rkey_t *rk, int id,
                          uint64_t *out, size_t nout);

/* In a forked client: a context and connection of its own, the work, then
 * its values down the pipe. */
static void client_main(const char *addr, int id, int fd, client_fn fn, size_t nout)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  uint64_t *out = calloc(nout, sizeof *out);
  XT_CHECK(out != NULL, "calloc");
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  fn(ctx, conn, rk, id, out, nout);
  msg_send(ctx, conn, "done", 5);
  xport_rkey_release(rk);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  size_t len = nout * sizeof *out;
  XT_CHECK(write(fd, out, len) == (ssize_t)len, "client %d: pipe write", id);
  close(fd);
  free(out);
}

/* Reads len bytes from fd, which the client closes when done (or dies). */
static size_t read_all(int fd, void *buf, size_t len)
{
  size_t got = 0;
  while (got < len) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, T_MS * 3) != 1)
      break;
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  return got;
}

/* Forks NCLIENTS clients against the target at addr; all[i * nout + k] is
 * client i's value k. Each must exit 0. */
static void run_clients(const char *addr, client_fn fn, size_t nout, uint64_t *all,
                        int delivery_complete)
{
  int fds[NCLIENTS][2];
  pid_t pid[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    XT_CHECK(pipe(fds[i]) == 0, "pipe");
    pid[i] = xt_fork();
    if (pid[i] == 0) {
      for (int j = 0; j <= i; j++)
        close(fds[j][0]);
      if (delivery_complete)
        setenv("XPORT_DELIVERY_COMPLETE", "1", 1);
      client_main(addr, i, fds[i][1], fn, nout);
      exit(0); /* not _exit: let LeakSanitizer check the client too */
    }
    close(fds[i][1]);
  }
  for (int i = 0; i < NCLIENTS; i++) {
    size_t got = read_all(fds[i][0], all + (size_t)i * nout, nout * sizeof *all);
    close(fds[i][0]);
    int st = xt_reap(pid[i]);
    XT_CHECK(st == 0, "client %d on %s exited with %d", i, xt_config(), st);
    XT_CHECK(got == nout * sizeof *all, "client %d on %s reported %zu of %zu bytes", i,
             xt_config(), got, nout * sizeof *all);
  }
}

/* The test's own connection: reads the region back, says done. */
static void final_read(const char *addr, uint64_t *words)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  XT_OK(xport_read(conn, words, MW * sizeof *words, NULL, rk, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  msg_send(ctx, conn, "done", 5);
  xport_rkey_release(rk);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
}

/* Every value in vals[0..n) once: exactly {0, ..., n-1}. */
static void check_permutation(const uint64_t *vals, size_t n, const char *what)
{
  unsigned char *seen = calloc(n, 1);
  XT_CHECK(seen != NULL, "calloc");
  for (size_t i = 0; i < n; i++) {
    XT_CHECK(vals[i] < n, "%s on %s: value %llu (client %zu, #%zu) is out of [0, %zu)", what,
             xt_config(), (unsigned long long)vals[i], i / (n / NCLIENTS), i % (n / NCLIENTS),
             n);
    XT_CHECK(!seen[vals[i]]++, "%s on %s: value %llu seen twice (a lost update)", what,
             xt_config(), (unsigned long long)vals[i]);
  }
  free(seen);
}

/* ---- 1. a shared counter ----------------------------------------------- */
#define COUNT_M 500
#define WINDOW 4

static void counter_client(xport_ctx_t *ctx, xport_conn_t *conn, xport_rkey_t *rk, int id,
                           uint64_t *out, size_t nout)
{
  unsigned char seen[COUNT_M] = {0};
  size_t posted = 0, done = 0;
  XT_CHECK(nout == COUNT_M, "nout");
  while (done < nout) {
    while (posted < nout && posted - done < WINDOW) {
      out[posted] = UNTOUCHED;
      int rc = xport_fetch_add(conn, &out[posted], 1, rk, 0, &out[posted]);
      if (rc == -XPORT_EAGAIN)
        break;
      XT_CHECK(rc == 0, "client %d: fetch_add %zu: %s", id, posted, xport_strerror(rc));
      posted++;
    }
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_ATOMIC, T_MS);
    size_t k = (size_t)((uint64_t *)c.user_ctx - out);
    XT_CHECK(k < posted && !seen[k]++, "client %d: completion %zu unknown or repeated", id, k);
    XT_CHECK(c.status == 0 && c.len == 8 && c.conn == conn, "client %d: fetch_add %zu: %s (%s)",
             id, k, xport_strerror(c.status), c.detail ? c.detail : "");
    XT_CHECK(out[k] != UNTOUCHED, "client %d: fetch_add %zu completed, result not written", id,
             k);
    done++;
  }
}

START_TEST(counter_many_procs)
{
  char addr[128];
  static uint64_t all[NCLIENTS * COUNT_M];
  uint64_t words[MW];
  struct multi m = {.access = XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ};
  for (int i = 1; i < MW; i++)
    m.init[i] = m.want[i] = CANARY0 + (uint64_t)i;
  m.want[0] = NCLIENTS * COUNT_M;
  pid_t pid = xt_spawn_server(multi_target, &m, addr, sizeof addr);
  run_clients(addr, counter_client, COUNT_M, all, 0);
  check_permutation(all, NCLIENTS * COUNT_M, "counter");
  final_read(addr, words);
  XT_CHECK(words[0] == NCLIENTS * COUNT_M, "counter on %s: %llu after %d fetch-adds",
           xt_config(), (unsigned long long)words[0], NCLIENTS * COUNT_M);
  for (int i = 1; i < MW; i++)
    XT_CHECK(words[i] == m.init[i], "counter on %s: word %d next to it changed", xt_config(), i);
  XT_CHECK(xt_reap(pid) == 0, "target failed on %s", xt_config());
}
END_TEST

/* ---- 2. a spinlock of compare-and-swap over a plain record ------------- */
#define SPIN_K 50
#define LOCK_OFF 0
#define REC_OFF 8 /* four words, a == b == c == d */

static void spin_client(xport_ctx_t *ctx, xport_conn_t *conn, xport_rkey_t *rk, int id,
                        uint64_t *out, size_t nout)
{
  xport_caps_t caps;
  uint64_t me = (uint64_t)id + 1, res, rec[4];
  XT_OK(xport_conn_query(conn, &caps));
  /* A write's completion must mean it is in the target's memory before
   * the lock goes: atomics are not ordered with the rest. */
  XT_CHECK(caps.delivery_complete, "client %d on %s: delivery-complete is off", id,
           xt_config());
  for (size_t k = 0; k < nout; k++) {
    for (;;) { /* acquire */
      res = UNTOUCHED;
      XT_OK(xport_cswap(conn, &res, 0, me, rk, LOCK_OFF, &res));
      uint64_t old = atom_ok(ctx, conn, &res, "acquire");
      if (old == 0)
        break;
      XT_CHECK(old <= NCLIENTS && old != me, "client %d on %s: lock word %llu while acquiring",
               id, xt_config(), (unsigned long long)old);
    }
    XT_OK(xport_read(conn, rec, sizeof rec, NULL, rk, REC_OFF, NULL));
    expect_ok(ctx, XPORT_OP_READ);
    XT_CHECK(rec[0] == rec[1] && rec[1] == rec[2] && rec[2] == rec[3],
             "client %d on %s, round %zu: record %llu %llu %llu %llu under the lock", id,
             xt_config(), k, (unsigned long long)rec[0], (unsigned long long)rec[1],
             (unsigned long long)rec[2], (unsigned long long)rec[3]);
    out[k] = rec[0];
    for (int i = 0; i < 4; i++)
      rec[i]++;
    XT_OK(xport_write(conn, rec, sizeof rec, NULL, rk, REC_OFF, NULL));
    expect_ok(ctx, XPORT_OP_WRITE);
    res = UNTOUCHED; /* release */
    XT_OK(xport_cswap(conn, &res, me, 0, rk, LOCK_OFF, &res));
    uint64_t old = atom_ok(ctx, conn, &res, "release");
    XT_CHECK(old == me, "client %d on %s: lock word %llu when releasing, expected %llu", id,
             xt_config(), (unsigned long long)old, (unsigned long long)me);
  }
}

START_TEST(cswap_spinlock)
{
  char addr[128];
  static uint64_t all[NCLIENTS * SPIN_K];
  uint64_t words[MW];
  struct multi m = {.access = XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ |
                              XPORT_ACCESS_REMOTE_WRITE};
  for (int i = 5; i < MW; i++)
    m.init[i] = m.want[i] = CANARY1 + (uint64_t)i;
  for (int i = 1; i <= 4; i++)
    m.want[i] = NCLIENTS * SPIN_K;
  pid_t pid = xt_spawn_server(multi_target, &m, addr, sizeof addr);
  run_clients(addr, spin_client, SPIN_K, all, 1);
  /* Each round saw the count the one before it left: mutual exclusion. */
  check_permutation(all, NCLIENTS * SPIN_K, "record under the lock");
  final_read(addr, words);
  XT_CHECK(words[0] == 0, "spinlock on %s: lock word %llu at the end", xt_config(),
           (unsigned long long)words[0]);
  for (int i = 1; i <= 4; i++)
    XT_CHECK(words[i] == NCLIENTS * SPIN_K, "spinlock on %s: field %d is %llu, expected %d",
             xt_config(), i - 1, (unsigned long long)words[i], NCLIENTS * SPIN_K);
  for (int i = 5; i < MW; i++)
    XT_CHECK(words[i] == m.init[i], "spinlock on %s: word %d after the record changed",
             xt_config(), i);
  XT_CHECK(xt_reap(pid) == 0, "target failed on %s", xt_config());
}
END_TEST

/* ---- 3. exact values --------------------------------------------------- */

/* Exports three words, the middle one the target of the operations; the
 * others are canaries. Serves until the client is done, then checks. */
static int seq_target(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static uint64_t w[3] __attribute__((aligned(64))) = {CANARY0, 100, CANARY1};
  xport_mr_t *mr;
  char done[8];
  XT_OK(xport_mr_reg(ctx, w, sizeof w, XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ,
                     &mr));
  XT_OK(xport_recv(conn, done, sizeof done, NULL, NULL));
  send_key(ctx, conn, mr, 0, sizeof w);
  serve(ctx, 0, 1);
  XT_CHECK(w[1] == 999, "target's word on %s: %llu, expected 999", xt_config(),
           (unsigned long long)w[1]);
  XT_CHECK(w[0] == CANARY0 && w[2] == CANARY1, "target's canaries on %s: %llx %llx",
           xt_config(), (unsigned long long)w[0], (unsigned long long)w[2]);
  XT_OK(xport_mr_dereg(mr));
  return 0;
}

static int seq_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  uint64_t res, w[3];
  res = UNTOUCHED;
  XT_OK(xport_fetch_add(conn, &res, 5, rk, 8, &res));
  XT_CHECK(atom_ok(ctx, conn, &res, "fetch_add +5") == 100,
           "fetch_add +5 on 100 on %s fetched %llu", xt_config(), (unsigned long long)res);
  XT_OK(xport_atomic_add(conn, 7, rk, 8, &res));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_ATOMIC, T_MS);
  XT_CHECK(c.status == 0 && c.len == 8 && c.user_ctx == &res && c.conn == conn,
           "atomic_add +7 on %s: %s", xt_config(), xport_strerror(c.status));
  res = UNTOUCHED;
  XT_OK(xport_cswap(conn, &res, 112, 1000, rk, 8, &res));
  XT_CHECK(atom_ok(ctx, conn, &res, "cswap 112 -> 1000") == 112,
           "cswap 112 -> 1000 on %s fetched %llu (the add of 7 did not land as 7)", xt_config(),
           (unsigned long long)res);
  res = UNTOUCHED;
  XT_OK(xport_cswap(conn, &res, 5, 9, rk, 8, &res));
  XT_CHECK(atom_ok(ctx, conn, &res, "cswap 5 -> 9") == 1000,
           "cswap 5 -> 9 (no swap) on %s fetched %llu", xt_config(), (unsigned long long)res);
  res = UNTOUCHED;
  XT_OK(xport_fetch_add(conn, &res, UINT64_MAX, rk, 8, &res));
  XT_CHECK(atom_ok(ctx, conn, &res, "fetch_add -1") == 1000,
           "fetch_add -1 on %s fetched %llu (a failed compare swapped?)", xt_config(),
           (unsigned long long)res);
  memset(w, 0, sizeof w);
  XT_OK(xport_read(conn, w, sizeof w, NULL, rk, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  XT_CHECK(w[1] == 999, "the word on %s after the sequence: %llu, expected 999", xt_config(),
           (unsigned long long)w[1]);
  XT_CHECK(w[0] == CANARY0 && w[2] == CANARY1, "the words next to it on %s: %llx %llx",
           xt_config(), (unsigned long long)w[0], (unsigned long long)w[2]);
  msg_send(ctx, conn, "done", 5);
  xport_rkey_release(rk);
  return 0;
}

START_TEST(exact_sequence)
{
  xt_pair(seq_target, seq_client, NULL);
}
END_TEST

/* ---- 4. refused before anything is posted ------------------------------ */
#define REF_WORDS 16 /* the atomic region; its key covers all of it */

/* Two connections from the client: the first gets three keys (the atomic
 * region, a read-write region, the atomic region from byte 4), the second
 * is there for a key used on the wrong connection. */
static void refuse_target(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  static uint64_t at[REF_WORDS] __attribute__((aligned(64)));
  static uint64_t rw[8] __attribute__((aligned(64)));
  xport_conn_t *conn[2];
  xport_mr_t *mat, *mrw;
  char done[8];
  for (int i = 0; i < REF_WORDS; i++)
    at[i] = CANARY0 + (uint64_t)i;
  for (int i = 0; i < 8; i++)
    rw[i] = CANARY1 + (uint64_t)i;
  XT_OK(xport_mr_reg(ctx, at, sizeof at, XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ,
                     &mat));
  XT_OK(xport_mr_reg(ctx, rw, sizeof rw, XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE,
                     &mrw));
  XT_OK(xport_accept(lst, T_MS, &conn[0]));
  XT_OK(xport_accept(lst, T_MS, &conn[1]));
  XT_OK(xport_recv(conn[0], done, sizeof done, NULL, NULL));
  send_key(ctx, conn[0], mat, 0, sizeof at);
  send_key(ctx, conn[0], mrw, 0, sizeof rw);
  send_key(ctx, conn[0], mat, 4, 64);
  serve(ctx, 0, 1);
  /* Only the one good fetch-add, on the last word, changed anything. */
  for (int i = 0; i < REF_WORDS; i++)
    XT_CHECK(at[i] == CANARY0 + (uint64_t)i + (i == REF_WORDS - 1),
             "target's word %d on %s: %llx", i, xt_config(), (unsigned long long)at[i]);
  for (int i = 0; i < 8; i++)
    XT_CHECK(rw[i] == CANARY1 + (uint64_t)i, "target's read-write word %d on %s changed", i,
             xt_config());
  xport_conn_close(conn[0]);
  xport_conn_close(conn[1]);
  XT_OK(xport_mr_dereg(mat));
  XT_OK(xport_mr_dereg(mrw));
}

/* Each of the three operations, with (conn, result, rkey, offset) as given:
 * must return want, post nothing, and leave the result slot alone. */
static void refused3(xport_ctx_t *ctx, xport_conn_t *conn, uint64_t *res,
                     const xport_rkey_t *rk, size_t off, int want, const char *what)
{
  for (int op = 0; op < 3; op++) {
    static const char *names[] = {"fetch_add", "cswap", "atomic_add"};
    uint64_t before = res ? *res : 0;
    int rc = op == 0   ? xport_fetch_add(conn, res, 1, rk, off, res)
             : op == 1 ? xport_cswap(conn, res, CANARY0, 1, rk, off, res)
                       : xport_atomic_add(conn, 1, rk, off, res);
    XT_CHECK(rc == want, "%s, %s on %s: %s, expected %s", names[op], what, xt_config(),
             xport_strerror(rc), xport_strerror(want));
    if (res)
      XT_CHECK(*res == before, "%s, %s on %s: a refused post wrote its result", names[op], what,
               xt_config());
    expect_quiet(ctx, what);
  }
}

static void refuse_client_test(void)
{
  char addr[128];
  uint8_t raw[XPORT_RKEY_MAX_SIZE], rawodd[XPORT_RKEY_MAX_SIZE];
  size_t klen, oddlen;
  uint64_t res = UNTOUCHED, w[REF_WORDS];
  pid_t pid = xt_spawn_server(refuse_target, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn, *other;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_connect(ctx, addr, T_MS, &other));
  xport_rkey_t *at = import_key(ctx, conn, raw, &klen);
  xport_rkey_t *rw = import_key(ctx, conn, NULL, NULL);
  xport_rkey_t *odd = import_key(ctx, conn, rawodd, &oddlen);
  XT_CHECK(key_access(raw) & XPORT_ACCESS_REMOTE_ATOMIC, "the aligned key lacks the atomic right");
  XT_CHECK(!(key_access(rawodd) & XPORT_ACCESS_REMOTE_ATOMIC),
           "a key for a range at byte 4 carries the atomic right");
  const size_t end = REF_WORDS * 8;

  refused3(ctx, conn, &res, at, 4, -XPORT_EINVAL, "offset 4");
  refused3(ctx, conn, &res, at, 1, -XPORT_EINVAL, "offset 1");
  refused3(ctx, conn, &res, at, end - 4, -XPORT_EINVAL, "offset end - 4");
  refused3(ctx, conn, &res, at, end, -XPORT_ERANGE, "offset at the end of the range");
  refused3(ctx, conn, &res, at, end + 8, -XPORT_ERANGE, "offset past the end of the range");
  refused3(ctx, conn, &res, at, SIZE_MAX - 7, -XPORT_ERANGE, "huge offset");
  refused3(ctx, conn, &res, rw, 0, -XPORT_EACCES, "read-write key without the atomic right");
  refused3(ctx, conn, &res, odd, 0, -XPORT_EACCES, "key for a range starting at byte 4");
  refused3(ctx, conn, &res, odd, 8, -XPORT_EACCES, "key for a range starting at byte 4, +8");
  refused3(ctx, conn, &res, NULL, 0, -XPORT_EINVAL, "NULL key");
  refused3(ctx, NULL, &res, at, 0, -XPORT_EINVAL, "NULL connection");
  refused3(ctx, other, &res, at, 0, -XPORT_EINVAL, "key unpacked on another connection");
  XT_CHECK(xport_fetch_add(conn, NULL, 1, at, 0, NULL) == -XPORT_EINVAL, "fetch_add, NULL result");
  XT_CHECK(xport_cswap(conn, NULL, 0, 1, at, 0, NULL) == -XPORT_EINVAL, "cswap, NULL result");
  expect_quiet(ctx, "NULL result");
  XT_CHECK(res == UNTOUCHED, "a refused post wrote its result");

  /* Nothing landed: the words are as the target set them. */
  XT_OK(xport_read(conn, w, sizeof w, NULL, at, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  for (int i = 0; i < REF_WORDS; i++)
    XT_CHECK(w[i] == CANARY0 + (uint64_t)i, "word %d on %s changed: %llx", i, xt_config(),
             (unsigned long long)w[i]);
  /* The key at byte 4 still reads (it lost the atomic right only). */
  uint64_t o;
  XT_OK(xport_read(conn, &o, sizeof o, NULL, odd, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  uint64_t want_o;
  memcpy(&want_o, (char *)w + 4, sizeof want_o);
  XT_CHECK(o == want_o, "read through the key at byte 4 on %s", xt_config());
  /* And the last word of the range is fine for an atomic. */
  XT_OK(xport_fetch_add(conn, &res, 1, at, end - 8, &res));
  XT_CHECK(atom_ok(ctx, conn, &res, "fetch_add on the last word") ==
               CANARY0 + REF_WORDS - 1,
           "fetch_add on the last word on %s fetched %llx", xt_config(), (unsigned long long)res);
  expect_quiet(ctx, "after the last fetch_add");
  msg_send(ctx, conn, "done", 5);
  xport_rkey_release(at);
  xport_rkey_release(rw);
  xport_rkey_release(odd);
  XT_OK(xport_conn_close(conn));
  XT_OK(xport_conn_close(other));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid) == 0, "target failed on %s", xt_config());
}

START_TEST(refused_before_posting)
{
  refuse_client_test();
}
END_TEST

/* ---- 5, 6. keys the target does not honour: revoked, widened ----------- */
enum { KEY_REVOKED = 1, KEY_WIDENED = 2 };
#define BAD_START 0x5eed0000ull

struct report {
  uint64_t word, canary0, canary1;
};

/* The client connects twice, the second time from a context of its own
 * (on shm a refused operation ends every connection of its endpoint to
 * the target): the key goes over the first, the verdict over the second. */
static void badkey_target(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  int kind = *(int *)arg;
  static uint64_t w[3] __attribute__((aligned(64))) = {CANARY0, BAD_START, CANARY1};
  xport_conn_t *victim, *ctl;
  xport_mr_t *mr;
  char ask[8];
  XT_OK(xport_accept(lst, T_MS, &victim));
  XT_OK(xport_accept(lst, T_MS, &ctl));
  XT_OK(xport_recv(ctl, ask, sizeof ask, NULL, NULL));
  XT_OK(xport_mr_reg(ctx, w, sizeof w,
                     kind == KEY_REVOKED ? XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ
                                         : XPORT_ACCESS_REMOTE_READ,
                     &mr));
  send_key(ctx, victim, mr, 0, sizeof w);
  if (kind == KEY_REVOKED) {
    XT_OK(xport_mr_dereg(mr)); /* the memory stays, the key is void */
    mr = NULL;
    msg_send(ctx, victim, "revoked", 8);
  }
  /* Serve (the refused atomic needs the target in xport) until the
   * client asks for the verdict; whatever the victim gets is fine. */
  for (;;) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS * 3) == 0, "target starved on %s", xt_config());
    if (c.conn == ctl && c.op == XPORT_OP_RECV) {
      XT_CHECK(c.status == 0, "ctl: %s", xport_strerror(c.status));
      break;
    }
    XT_CHECK(c.conn == victim, "target: op %d on the test's connection: %s", c.op,
             xport_strerror(c.status));
  }
  struct report r = {__atomic_load_n(&w[1], __ATOMIC_SEQ_CST), w[0], w[2]};
  XT_OK(xport_send(ctl, &r, sizeof r, NULL, NULL));
  /* Until the client leaves, so the verdict is not lost in a close. */
  for (int sent = 0, gone = 0; !sent || !gone;) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS * 3) == 0, "target: the client does not leave");
    if (c.conn != ctl)
      continue;
    if (c.op == XPORT_OP_SEND) {
      XT_CHECK(c.status == 0, "verdict: %s", xport_strerror(c.status));
      sent = 1;
    } else if (c.op == XPORT_OP_DISCONNECT) {
      gone = 1;
    }
  }
  xport_conn_close(victim);
  xport_conn_close(ctl);
  xport_mr_dereg(mr);
  XT_CHECK(r.word == BAD_START && r.canary0 == CANARY0 && r.canary1 == CANARY1,
           "a refused atomic changed the target's memory on %s: %llx", xt_config(),
           (unsigned long long)r.word);
}

/* add: the refused operation is an xport_atomic_add (shm answers none:
 * an add that does not wait for its answer must still learn of it). */
static void bad_key(int kind, int add)
{
  const char *name = kind == KEY_REVOKED ? (add ? "revoked_key_add" : "revoked_key")
                                         : (add ? "forged_key_widened_add" : "forged_key_widened");
  char addr[128], msg[16];
  uint8_t raw[XPORT_RKEY_MAX_SIZE];
  size_t klen;
  /* Where a refused operation never completes (shm), xport's deadline
   * ends it: keep it short here. */
  setenv("XPORT_RMA_TIMEOUT", "1500", 1);
  pid_t pid = xt_spawn_server(badkey_target, &kind, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx(), *octx = xt_ctx();
  xport_conn_t *victim, *ctl;
  XT_OK(xport_connect(ctx, addr, T_MS, &victim));
  XT_OK(xport_connect(octx, addr, T_MS, &ctl));
  xport_rkey_t *rk = import_key(ctx, victim, raw, &klen);
  klen = xt_key_part(victim, raw, klen);
  if (kind == KEY_REVOKED) {
    msg_recv(ctx, victim, msg, sizeof msg);
    XT_CHECK(!strcmp(msg, "revoked"), "protocol");
  } else {
    /* The access field, the u32 at byte 12, widened to the atomic right,
     * the checksum made good: the initiator cannot tell. */
    XT_CHECK(key_access(raw) == XPORT_ACCESS_REMOTE_READ, "packed access %x",
             key_access(raw));
    raw[12] |= XPORT_ACCESS_REMOTE_ATOMIC;
    xt_key_reseal(raw, klen);
    xport_rkey_release(rk);
    XT_OK(xport_rkey_unpack(victim, raw, klen, &rk));
  }
  uint64_t res = UNTOUCHED;
  int rc = add ? xport_atomic_add(victim, 1, rk, 8, &res) : xport_fetch_add(victim, &res, 1, rk, 8, &res);
  XT_CHECK(rc == 0, "%s on %s: the post: %s", name, xt_config(), xport_strerror(rc));
  int status = 1, event = 1;
  while (status == 1) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS * 3) == 0, "%s on %s: the fetch_add hangs", name,
             xt_config());
    if (c.op == XPORT_OP_DISCONNECT) {
      XT_CHECK(event == 1, "%s on %s: a second disconnect event", name, xt_config());
      event = c.status;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_ATOMIC && c.user_ctx == &res, "%s on %s: op %d", name,
             xt_config(), c.op);
    status = c.status;
  }
  XT_CHECK(status != 0, "%s on %s: the refused atomic succeeded (fetched %llx)", name, xt_config(),
           (unsigned long long)res);
  XT_CHECK(res == UNTOUCHED, "%s on %s: a failed fetch_add wrote its result", name,
           xt_config());
  if (kind == KEY_REVOKED)
    XT_CHECK(status == -XPORT_EACCES || status == -XPORT_ECONNRESET,
             "revoked_key on %s: %s, expected EACCES or ECONNRESET", xt_config(),
             xport_strerror(status));
  if (status == -XPORT_ECONNRESET && event == 1) { /* the connection's end: it must come */
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_DISCONNECT,
             "%s on %s: ECONNRESET, but no disconnect event", name, xt_config());
    event = c.status;
  } else if (event == 1) { /* for the record only */
    xport_completion_t c;
    if (xt_next(ctx, &c, 500) == 0 && c.op == XPORT_OP_DISCONNECT)
      event = c.status;
  }
  printf("%s on %s: the atomic failed with %s; %s%s\n", name, xt_config(), xport_strerror(status),
         event == 1 ? "the connection stays" : "disconnect event: ",
         event == 1 ? "" : xport_strerror(event));
  struct report r;
  XT_OK(xport_recv(ctl, &r, sizeof r, NULL, NULL));
  XT_OK(xport_send(ctl, "verdict", 8, NULL, NULL));
  for (int got = 0; got < 2; got++) {
    xport_completion_t c;
    XT_CHECK(xt_next(octx, &c, T_MS * 3) == 0, "the test's own connection stalled");
    XT_CHECK(c.status == 0, "the test's own connection: %s", xport_strerror(c.status));
  }
  XT_CHECK(r.word == BAD_START && r.canary0 == CANARY0 && r.canary1 == CANARY1,
           "%s on %s: the target's word is %llx, was %llx", name, xt_config(),
           (unsigned long long)r.word, BAD_START);
  xport_rkey_release(rk);
  xport_conn_close(victim);
  XT_OK(xport_conn_close(ctl));
  xport_ctx_destroy(ctx);
  xport_ctx_destroy(octx);
  XT_CHECK(xt_reap(pid) == 0, "target failed on %s", xt_config());
}

START_TEST(revoked_key)
{
  bad_key(KEY_REVOKED, 0);
}
END_TEST

START_TEST(forged_key_widened)
{
  bad_key(KEY_WIDENED, 0);
}
END_TEST

START_TEST(revoked_key_add)
{
  bad_key(KEY_REVOKED, 1);
}
END_TEST

START_TEST(forged_key_widened_add)
{
  bad_key(KEY_WIDENED, 1);
}
END_TEST

/* ---- 7. a target asleep, with its progress thread on ------------------- */
#define SLEEPY_N 20

/* A context of its own with the thread (the harness's stays idle); tells
 * the test when it stops calling xport, and sleeps until woken. */
static void sleepy_target(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  static uint64_t w[2] __attribute__((aligned(64))) = {1000, CANARY0};
  xport_ctx_attr_t attr = {.progress_thread = XPORT_ON};
  xport_ctx_t *pctx;
  xport_listener_t *plst;
  xport_conn_t *conn, *pconn;
  xport_mr_t *mr;
  char addr[128];
  xport_caps_t caps;
  XT_OK(xport_ctx_create(&attr, &pctx));
  XT_OK(xport_ctx_query(pctx, &caps));
  XT_CHECK(caps.progress_thread, "no progress thread on %s", xt_config());
  XT_OK(xport_listen(pctx, xt_listen_addr(), &plst));
  XT_OK(xport_listener_addr(plst, addr, sizeof addr));
  XT_OK(xport_accept(lst, T_MS, &conn));
  msg_send(ctx, conn, addr, strlen(addr) + 1);
  XT_OK(xport_accept(plst, T_MS, &pconn));
  XT_OK(xport_mr_reg(pctx, w, sizeof w, XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ,
                     &mr));
  send_key(pctx, pconn, mr, 0, sizeof w);
  /* From here on no xport call until woken. */
  xt_step_put(st->s2c[1], 'S');
  xt_step_get(st->c2s[0], T_MS * 3);
  XT_CHECK(__atomic_load_n(&w[0], __ATOMIC_SEQ_CST) == 1000 + SLEEPY_N && w[1] == CANARY0,
           "target's words on %s: %llu %llx", xt_config(), (unsigned long long)w[0],
           (unsigned long long)w[1]);
  xport_conn_close(conn);
  xport_conn_close(pconn);
  XT_OK(xport_mr_dereg(mr));
  xport_listener_close(plst);
  xport_ctx_destroy(pctx);
}

START_TEST(target_asleep_progress_thread)
{
  char addr[128], paddr[128];
  struct xt_steps st;
  xt_steps_open(&st);
  pid_t pid = xt_spawn_server(sleepy_target, &st, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn, *pconn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  msg_recv(ctx, conn, paddr, sizeof paddr);
  XT_OK(xport_connect(ctx, paddr, T_MS, &pconn));
  xport_rkey_t *rk = import_key(ctx, pconn, NULL, NULL);
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'S', "protocol");
  for (uint64_t i = 0; i < SLEEPY_N; i++) {
    uint64_t res = UNTOUCHED;
    XT_OK(xport_fetch_add(pconn, &res, 1, rk, 0, &res));
    XT_CHECK(atom_ok(ctx, pconn, &res, "fetch_add to a sleeping target") == 1000 + i,
             "fetch_add %llu to a sleeping target on %s fetched %llu", (unsigned long long)i,
             xt_config(), (unsigned long long)res);
  }
  uint64_t w[2];
  XT_OK(xport_read(pconn, w, sizeof w, NULL, rk, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  XT_CHECK(w[0] == 1000 + SLEEPY_N && w[1] == CANARY0, "words on %s: %llu %llx", xt_config(),
           (unsigned long long)w[0], (unsigned long long)w[1]);
  xt_step_put(st.c2s[1], 'W');
  xport_rkey_release(rk);
  xport_conn_close(pconn);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid) == 0, "target failed on %s", xt_config());
  xt_steps_close(&st);
}
END_TEST

/* ---- a peer that breaks the service channel's rules (emulated atomics) -- */

#define SVC_FORGED_STATUS (-4000) /* in errno range, but no code of xport's */

/* Sends raw bytes on conn's service channel, as a peer that breaks its
 * rules would (no completion: injected). */
static void svc_inject(xport_conn_t *conn, const void *buf, size_t len)
{
  if (!strcmp(xt_transport(), "xshm")) {
    /* xshm's atomics go in its control ring: the answer goes in there,
     * as the library would put it. */
    struct xshm_conn *c = xc(conn);
    struct xshm_cring *r = &c->seg->ctl[c->side];
    const uint8_t *b = buf;
    struct xshm_ctl m = {.type = XSHM_C_ANSWER, .token = b[8]};
    memcpy(&m.status, b + 4, 4);
    (void)len;
    r->slot[c->ctl_tail % XSHM_CSLOTS] = m;
    __atomic_store_n(&r->tail, ++c->ctl_tail, __ATOMIC_RELEASE);
    return;
  }
  XT_CHECK(mconn(conn)->svc != NULL, "no service channel on %s", xt_config());
  ssize_t ret;
  while ((ret = fi_inject(mconn(conn)->svc, buf, len, 0)) == -FI_EAGAIN)
    usleep(1000);
  XT_CHECK(ret == 0, "fi_inject on the service channel: %zd", ret);
}

/* The target: exports a word, and answers the client's first atomic
 * itself, with a status that is no code of xport's, before xport does;
 * then serves until the client says it is done. */
static int svc_rogue_target(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  static uint64_t w[2] __attribute__((aligned(64))) = {100, CANARY0};
  xport_mr_t *mr;
  char done[8];
  XT_OK(xport_mr_reg(ctx, w, sizeof w, XPORT_ACCESS_REMOTE_ATOMIC, &mr));
  send_key(ctx, conn, mr, 0, sizeof w);
  xt_step_put(st->s2c[1], 'K');
  if (emulated(conn)) {
    /* Outside xport until the client's atomic is out: its real answer
     * can only come after this one. */
    XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'A', "protocol");
    uint8_t ans[24] = {0};
    int32_t status = SVC_FORGED_STATUS;
    memcpy(ans, "XATA", 4);
    for (int i = 0; i < 4; i++)
      ans[4 + i] = (uint8_t)((uint32_t)status >> (8 * i));
    ans[8] = 1; /* the connection's first atomic */
    svc_inject(conn, ans, sizeof ans);
  }
  XT_CHECK(msg_recv(ctx, conn, done, sizeof done) == 5 && !memcmp(done, "done", 5),
           "target: the client's word");
  XT_CHECK(w[0] == 101 && w[1] == CANARY0, "target on %s: words %llu %llx", xt_config(),
           (unsigned long long)w[0], (unsigned long long)w[1]);
  XT_OK(xport_mr_dereg(mr));
  return 0;
}

static int svc_rogue_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  XT_CHECK(xt_step_get(st->s2c[0], T_MS) == 'K', "protocol");
  if (!emulated(conn))
    printf("NOTE: %s carries atomics natively: no service channel to break\n", xt_config());
  {
    uint64_t res = UNTOUCHED;
    XT_OK(xport_fetch_add(conn, &res, 1, rk, 0, &res));
    xt_step_put(st->c2s[1], 'A');
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_ATOMIC, T_MS);
    XT_CHECK(c.user_ctx == &res, "a completion for another operation");
    if (emulated(conn)) {
      XT_CHECK(c.status == -XPORT_EPROTO, "on %s an answer with status %d completed the "
               "atomic with %d (%s), not EPROTO", xt_config(), SVC_FORGED_STATUS, c.status,
               xport_strerror(c.status));
      XT_CHECK(res == UNTOUCHED, "a failed atomic wrote its result");
    } else {
      XT_CHECK(c.status == 0 && res == 100, "fetch_add on %s: %s, fetched %llu", xt_config(),
               xport_strerror(c.status), (unsigned long long)res);
    }
  }
  msg_send(ctx, conn, "done", 5);
  xport_rkey_release(rk);
  return 0;
}

START_TEST(svc_answer_status_unknown_is_eproto)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(svc_rogue_target, svc_rogue_client, &st);
  xt_steps_close(&st);
}
END_TEST

/* ---- 8. the target killed with atomics outstanding --------------------- */

/* Exports a word, says it stopped calling xport, and waits to be killed. */
static int doomed_target(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  static uint64_t w[2] __attribute__((aligned(64))) = {0, CANARY0};
  xport_mr_t *mr;
  XT_OK(xport_mr_reg(ctx, w, sizeof w, XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ,
                     &mr));
  send_key(ctx, conn, mr, 0, sizeof w);
  xt_step_put(st->s2c[1], 'S');
  for (;;)
    pause();
  return 0;
}

START_TEST(target_killed)
{
  char addr[128];
  struct xt_steps st;
  uint64_t res[EMU_DEPTH];
  xt_steps_open(&st);
  pid_t pid = xt_spawn_pair_server(doomed_target, &st, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'S', "protocol");
  int posted = 0;
  for (; posted < EMU_DEPTH; posted++) {
    res[posted] = UNTOUCHED;
    int rc = posted % 2 ? xport_cswap(conn, &res[posted], 0, 7, rk, 0, &res[posted])
                        : xport_fetch_add(conn, &res[posted], 1, rk, 0, &res[posted]);
    if (rc == -XPORT_EAGAIN)
      break;
    XT_CHECK(rc == 0, "post %d on %s: %s", posted, xt_config(), xport_strerror(rc));
  }
  XT_CHECK(posted > 0, "nothing posted");
  kill(pid, SIGKILL);
  XT_CHECK(xt_reap(pid) == 128 + SIGKILL, "target did not die by SIGKILL");
  int seen[EMU_DEPTH] = {0}, done = 0, events = 0, done_at_event = -1;
  while (done < posted || !events) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "hang on %s: %d of %d atomics done, %d events",
             xt_config(), done, posted, events);
    XT_CHECK(c.conn == conn, "completion for another connection");
    if (c.op == XPORT_OP_DISCONNECT) {
      XT_CHECK(c.status == -XPORT_ECONNRESET, "disconnect on %s: %s", xt_config(),
               xport_strerror(c.status));
      events++;
      done_at_event = done;
      continue;
    }
    XT_CHECK(c.op == XPORT_OP_ATOMIC, "op %d", c.op);
    int i = (int)((uint64_t *)c.user_ctx - res);
    XT_CHECK(i >= 0 && i < posted && !seen[i]++, "completion %d unknown or repeated", i);
    done++;
    XT_CHECK(c.status == -XPORT_ECONNRESET, "atomic %d to a dead target on %s: %s [%s]", i,
             xt_config(), xport_strerror(c.status), c.detail ? c.detail : "");
    XT_CHECK(res[i] == UNTOUCHED, "atomic %d on %s failed, yet wrote its result", i,
             xt_config());
  }
  XT_CHECK(events == 1, "%d disconnect events", events);
  /* xport(7): a lost connection's operations end before its event. */
  XT_CHECK(done_at_event == posted, "on %s the disconnect event came after %d of %d atomics",
           xt_config(), done_at_event, posted);
  xport_completion_t extra;
  XT_CHECK(xt_next(ctx, &extra, 300) == -XPORT_ETIMEDOUT, "extra completion: op %d", extra.op);
  printf("target_killed on %s: %d atomics failed with ECONNRESET; the disconnect event came "
         "after %d of them\n", xt_config(), posted, done_at_event);
  XT_CHECK(xport_fetch_add(conn, &res[0], 1, rk, 0, NULL) == -XPORT_ENOTCONN,
           "a post after the disconnect event on %s", xt_config());
  xport_rkey_release(rk);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  xt_steps_close(&st);
}
END_TEST

/* ---- 9. the queue depth ------------------------------------------------ */

/* Exports a word, stops calling xport until the test has filled the
 * queue, then serves until the client is done. */
static int depth_target(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  static uint64_t w[2] __attribute__((aligned(64))) = {0, CANARY0};
  xport_mr_t *mr;
  uint64_t n;
  XT_OK(xport_mr_reg(ctx, w, sizeof w, XPORT_ACCESS_REMOTE_ATOMIC | XPORT_ACCESS_REMOTE_READ,
                     &mr));
  XT_OK(xport_recv(conn, &n, sizeof n, NULL, NULL));
  send_key(ctx, conn, mr, 0, sizeof w);
  xt_step_put(st->s2c[1], 'S');
  XT_CHECK(xt_step_get(st->c2s[0], T_MS * 3) == 'W', "protocol");
  serve(ctx, 0, 1);
  XT_CHECK(w[0] == n && w[1] == CANARY0, "target's words on %s: %llu (expected %llu) %llx",
           xt_config(), (unsigned long long)w[0], (unsigned long long)n,
           (unsigned long long)w[1]);
  XT_OK(xport_mr_dereg(mr));
  return 0;
}

static int depth_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  struct xt_steps *st = arg;
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  int emu = emulated(conn);
  size_t cap = emu ? EMU_DEPTH : caps.tx_depth;
  uint64_t *res = malloc((cap + 1) * sizeof *res);
  unsigned char *seen = calloc(cap + 1, 1);
  XT_CHECK(res && seen, "malloc");
  xport_rkey_t *rk = import_key(ctx, conn, NULL, NULL);
  XT_CHECK(xt_step_get(st->s2c[0], T_MS) == 'S', "protocol");
  size_t posted = 0;
  int rc;
  for (;;) {
    res[posted] = UNTOUCHED;
    rc = xport_fetch_add(conn, &res[posted], 1, rk, 0, &res[posted]);
    if (rc)
      break;
    XT_CHECK(++posted <= cap, "more than %zu fetch-adds accepted on %s (%s)", cap, xt_config(),
             emu ? "emulated" : "tx_depth");
  }
  XT_CHECK(rc == -XPORT_EAGAIN, "fetch_add %zu on %s: %s", posted, xt_config(),
           xport_strerror(rc));
  XT_CHECK(res[posted] == UNTOUCHED, "a refused post wrote its result");
  if (emu)
    XT_CHECK(posted == EMU_DEPTH, "EAGAIN after %zu emulated fetch-adds on %s, expected %d",
             posted, xt_config(), EMU_DEPTH);
  XT_CHECK(posted > 0, "no fetch_add accepted on %s", xt_config());
  printf("depth on %s: EAGAIN after %zu outstanding fetch-adds (%s; tx_depth %zu)\n",
         xt_config(), posted, emu ? "emulated" : "native", caps.tx_depth);
  /* Still full: nothing can have completed while the target is away. */
  rc = xport_fetch_add(conn, &res[posted], 1, rk, 0, &res[posted]);
  XT_CHECK(rc == -XPORT_EAGAIN, "fetch_add on a full queue on %s: %s", xt_config(),
           xport_strerror(rc));
  xt_step_put(st->c2s[1], 'W');
  for (size_t done = 0; done < posted; done++) {
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_ATOMIC, T_MS);
    size_t k = (size_t)((uint64_t *)c.user_ctx - res);
    XT_CHECK(k < posted && !seen[k]++, "completion %zu unknown or repeated", k);
    XT_CHECK(c.status == 0 && c.len == 8, "fetch_add %zu on %s: %s (%s)", k, xt_config(),
             xport_strerror(c.status), c.detail ? c.detail : "");
  }
  memset(seen, 0, cap + 1);
  for (size_t k = 0; k < posted; k++) {
    XT_CHECK(res[k] < posted, "fetch_add %zu on %s fetched %llu of %zu", k, xt_config(),
             (unsigned long long)res[k], posted);
    XT_CHECK(!seen[res[k]]++, "fetch_add %zu on %s fetched %llu twice", k, xt_config(),
             (unsigned long long)res[k]);
  }
  /* Room again. */
  XT_OK(xport_fetch_add(conn, &res[0], 1, rk, 0, &res[0]));
  XT_CHECK(atom_ok(ctx, conn, &res[0], "fetch_add after the drain") == posted,
           "fetch_add after the drain on %s fetched %llu, expected %zu", xt_config(),
           (unsigned long long)res[0], posted);
  uint64_t w[2], n = posted + 1;
  XT_OK(xport_read(conn, w, sizeof w, NULL, rk, 0, NULL));
  expect_ok(ctx, XPORT_OP_READ);
  XT_CHECK(w[0] == n && w[1] == CANARY0, "words on %s: %llu %llx", xt_config(),
           (unsigned long long)w[0], (unsigned long long)w[1]);
  msg_send(ctx, conn, &n, sizeof n);
  xport_rkey_release(rk);
  free(res);
  free(seen);
  return 0;
}

START_TEST(depth)
{
  struct xt_steps st;
  xt_steps_open(&st);
  xt_pair(depth_target, depth_client, &st);
  xt_steps_close(&st);
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("atomic");
  TCase *core = tcase_create("Core");
  tcase_set_timeout(core, 180); /* the Soft-RoCE guest is slow */
  tcase_add_test(core, counter_many_procs);
  tcase_add_test(core, cswap_spinlock);
  tcase_add_test(core, exact_sequence);
  tcase_add_test(core, target_asleep_progress_thread);
  tcase_add_test(core, depth);
  suite_add_tcase(s, core);
  TCase *err = tcase_create("Errors");
  tcase_set_timeout(err, 60);
  tcase_add_test(err, refused_before_posting);
  tcase_add_test(err, revoked_key);
  tcase_add_test(err, forged_key_widened);
  tcase_add_test(err, revoked_key_add);
  tcase_add_test(err, forged_key_widened_add);
  tcase_add_test(err, target_killed);
  tcase_add_test(err, svc_answer_status_unknown_is_eproto);
  suite_add_tcase(s, err);
  return s;
}

int main(void)
{
  return xt_main("check_atomic", make_suite, 1);
}
