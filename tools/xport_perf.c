/* xport_perf: a perftest-style benchmark that uses only the public API.
 *
 *   xport_perf [-b HOST:PORT] [--persistent]      serve (default port 18515)
 *   xport_perf [options] HOST:PORT                drive a test against a server
 *   xport_perf --loopback [options]               both, as two processes
 *
 * The client sends its options at connect time and the server follows
 * them; the client measures and prints. Latency is one-way (half of a
 * round trip), except in the atomic tests (fadd_lat, cswap_lat): an atomic
 * is a round trip, reported whole. Bandwidth is in MB/s (10^6 bytes);
 * fadd_bw's rate is in operations per second. */
#include <xport.h>

#include <getopt.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PORT "18515"
#define MAGIC 0x78706572u /* "xper" */
#define MAX_ALL ((size_t)8 << 20)
#define WINDOW_BYTES ((size_t)64 << 20) /* cap on buffers a window holds */

enum test {
  SEND_LAT, SEND_BW, WRITE_LAT, WRITE_BW, READ_LAT, READ_BW, WRITE_IMM_LAT,
  FADD_LAT, CSWAP_LAT, FADD_BW, NTESTS
};
static const char *const test_name[NTESTS] = {"send_lat", "send_bw",  "write_lat",    "write_bw",
                                              "read_lat", "read_bw",  "write_imm_lat",
                                              "fadd_lat", "cswap_lat", "fadd_bw"};
static int is_lat(int t)
{
  return t == SEND_LAT || t == WRITE_LAT || t == READ_LAT || t == WRITE_IMM_LAT || t == FADD_LAT ||
         t == CSWAP_LAT;
}
/* 64-bit remote atomics on one counter in the server's RMA area: their
 * size is the word's, their latency a whole round trip. */
static int is_atomic(int t) { return t == FADD_LAT || t == CSWAP_LAT || t == FADD_BW; }
#define ATOMIC_SIZE 8
#define EXIT_UNSUPPORTED 2 /* the provider cannot run the test (no atomics) */

/* What the client tells the server; both sides then run the same plan. */
struct plan {
  uint32_t magic, test, check, all;
  uint64_t size, iters, warmup, window;
  uint32_t unsig, pad; /* --unsignaled */
};

struct side {
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  xport_mr_t *mr;
  char *buf;       /* window slots of size_max each, then the RMA target */
  size_t slot, nslots;
  xport_rkey_t *peer;
  char ctl[256];   /* control messages, outside the measured buffers */
  int server;
  struct plan p;
  const char *provider;
  char transport[32];   /* what the connection runs on (xport_conn_query) */
  int json, csv, quiet;
  int sleep; /* --sleep: block in xport_wait between polls */
  xport_job_t *job; /* run as a job: the connection is the job's */
  /* Consumed receives that came while next_op waited for something else
   * (the peer's write_imm can overtake our own write's completion, which
   * waits for the target with delivery-complete on): kept for the next
   * next_op that wants them. */
  xport_completion_t early[16];
  unsigned early_n;
  size_t inject; /* caps.inject_size */
};

/* --unsignaled: a send of at most inject_size bytes needs no completion
 * (xport_send_flags(3): its buffer is free at once); in a stream, every
 * half window's send is signaled and vouches for those before it. */
static int quiet_send(const struct side *s, size_t size)
{
  return s->p.unsig && size <= s->inject;
}

static void die(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "xport_perf: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void ok(int rc, const char *what)
{
  if (rc < 0)
    die("%s: %s", what, xport_strerror(rc));
}

static double now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void fill(char *b, size_t len, uint64_t seed)
{
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b[i] = (char)(x >> 56);
  }
}

static int same(const char *b, size_t len, uint64_t seed)
{
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    if (b[i] != (char)(x >> 56))
      return 0;
  }
  return 1;
}

static int consumes_recv(xport_op_t op)
{
  return op == XPORT_OP_RECV || op == XPORT_OP_REMOTE_WRITE_IMM;
}

/* Polls once: 1 with a completion of op in *c; others (already
 * accounted for by the caller's protocol) are passed over, but for
 * consumed receives, which the protocol waits for later (struct side,
 * early). */
static int poll_op(struct side *s, xport_op_t op, xport_completion_t *c)
{
  for (unsigned k = 0; k < s->early_n; k++) {
    if (s->early[k].op != op)
      continue;
    *c = s->early[k];
    /* close the gap, keeping the order */
    memmove(&s->early[k], &s->early[k + 1], (s->early_n - k - 1) * sizeof *c);
    s->early_n--;
    return 1;
  }
  int n = xport_poll(s->ctx, c, 1);
  ok(n, "xport_poll");
  if (!n)
    return 0;
  if (c->status)
    die("%s failed: %s%s%s", c->op == XPORT_OP_DISCONNECT ? "connection" : "operation",
        xport_strerror(c->status), c->hint ? ": " : "", c->hint ? c->hint : "");
  if (c->op == op)
    return 1;
  if (consumes_recv(c->op)) {
    if (s->early_n == sizeof s->early / sizeof s->early[0])
      die("more than %u receives completed early", s->early_n);
    s->early[s->early_n++] = *c;
  }
  return 0;
}

/* Polls until a completion of op arrives. */
static xport_completion_t next_op(struct side *s, xport_op_t op)
{
  xport_completion_t c;
  while (!poll_op(s, op, &c))
    if (s->sleep)
      xport_wait(s->ctx, 1000);
  return c;
}

/* A post found the queue full: a completion of op frees it, or, with
 * none outstanding (the provider finished them, shm's queue to the peer
 * is still full), only progress does. 1 with a completion in *c. */
static int after_eagain(struct side *s, xport_op_t op, uint64_t outstanding,
                        xport_completion_t *c)
{
  if (outstanding) {
    *c = next_op(s, op);
    return 1;
  }
  poll_op(s, op, c); /* none of op can come: this only drives progress */
  return 0;
}

static void ctl_send(struct side *s, const void *m, size_t len)
{
  memcpy(s->ctl, m, len);
  ok(xport_send(s->conn, s->ctl, len, NULL, NULL), "send");
  next_op(s, XPORT_OP_SEND);
}

static size_t ctl_recv(struct side *s, void *m, size_t len)
{
  ok(xport_recv(s->conn, s->ctl, sizeof s->ctl, NULL, NULL), "recv");
  xport_completion_t c = next_op(s, XPORT_OP_RECV);
  memcpy(m, s->ctl, c.len < len ? c.len : len);
  return c.len;
}

/* Streaming tests: a slot per operation in flight only where --check
 * needs each message's bytes apart; otherwise one buffer for all of them,
 * as ucx_perftest and perftest's ib_send_bw use, so that a window of
 * large messages measures the transport, not a working set past the
 * caches (64 MiB at 1 MiB: a third of the bandwidth on shm). */
static char *slot(struct side *s, uint64_t i)
{
  return s->p.check ? s->buf + (i % s->nslots) * s->slot : s->buf;
}
/* Ping-pong tests send from one slot and receive into another, as
 * fi_pingpong does: the peer only ever reads the sending slot, which
 * stays clean in both caches, and only the local copy writes the
 * receiving one. (Alternating two slots had each side send from the slot
 * it had just received into: on shm every large message then moved its
 * lines between the cores' caches twice, 2x fi_pingpong's time at 32 KiB.) */
static char *pp_tx(struct side *s) { return s->buf; }
static char *pp_rx(struct side *s) { return s->buf + s->slot; }
static char *target(struct side *s) { return s->buf + s->nslots * s->slot; } /* RMA area */
static size_t target_off(struct side *s) { return s->nslots * s->slot; }

/* Registers the buffers and swaps remote keys with the peer. */
static void setup(struct side *s, size_t size_max)
{
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  s->slot = size_max;
  s->nslots = s->p.window;
  if (s->nslots * s->slot > WINDOW_BYTES)
    s->nslots = WINDOW_BYTES / s->slot;
  if (s->nslots < 2) /* ping-pong sends from one slot and receives into the next */
    s->nslots = 2;
  size_t total = (s->nslots + 1) * s->slot;
  s->buf = aligned_alloc(4096, (total + 4095) / 4096 * 4096);
  if (!s->buf)
    die("out of memory for %zu bytes", total);
  memset(s->buf, 0, total); /* the atomic tests' counter starts at 0 */
  unsigned access = XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE;
  if (s->server && is_atomic((int)s->p.test)) {
    /* The key carries the atomic right only if the packed range starts
     * 8-byte aligned (xport_rkey_pack(3)): it starts at buf, page-aligned,
     * and the counter's offset (slots of 8 bytes) is a multiple of 8. */
    if ((uintptr_t)s->buf % 8 || target_off(s) % 8)
      die("the atomic counter is not 8-byte aligned");
    access |= XPORT_ACCESS_REMOTE_ATOMIC;
  }
  ok(xport_mr_reg(s->ctx, s->buf, total, access, &s->mr), "xport_mr_reg");
  int n = xport_rkey_pack(s->mr, 0, total, key, sizeof key);
  ok(n, "xport_rkey_pack");
  uint8_t peer[XPORT_RKEY_MAX_SIZE];
  size_t plen;
  if (s->server) {
    plen = ctl_recv(s, peer, sizeof peer);
    ctl_send(s, key, (size_t)n);
  } else {
    ctl_send(s, key, (size_t)n);
    plen = ctl_recv(s, peer, sizeof peer);
  }
  ok(xport_rkey_unpack(s->conn, peer, plen, &s->peer), "xport_rkey_unpack");
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

struct result {
  double *lat; /* one-way, per iteration (atomics: the whole round trip) */
  uint64_t n;
  double elapsed_us;
  int check_ok;
  uint64_t mismatches; /* those the atomic tests counted (and named, the first few) */
};

/* An atomic test's failed check: says what, for the first few. */
static void mismatch(struct side *s, int test, struct result *r, const char *fmt, ...)
{
  r->check_ok = 0;
  if (r->mismatches++ >= 5)
    return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "xport_perf: %s%s --check: ", s->server ? "server: " : "", test_name[test]);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* The client's side of the atomic tests, on the 8-byte counter at the
 * start of the server's RMA area (zeroed by setup): fetch-adds of 1, or
 * swaps of i for i + 1 in round i, which all happen when every round
 * sees the one before it. The server only drives progress meanwhile
 * (emulated atomics are applied inside its xport_poll). */
static void run_atomics(struct side *s, int test, uint64_t total, struct result *r)
{
  int check = (int)s->p.check;
  size_t off = target_off(s);
  xport_completion_t c;
  if (test == FADD_LAT || test == CSWAP_LAT) {
    uint64_t *res = (uint64_t *)(void *)slot(s, 0);
    for (uint64_t i = 0; i < total; i++) {
      if (check)
        *res = UINT64_MAX; /* a result never written shows */
      double t = now_us();
      if (test == FADD_LAT)
        ok(xport_fetch_add(s->conn, res, 1, s->peer, off, NULL), "xport_fetch_add");
      else
        ok(xport_cswap(s->conn, res, i, i + 1, s->peer, off, NULL), "xport_cswap");
      c = next_op(s, XPORT_OP_ATOMIC);
      if (i >= s->p.warmup)
        r->lat[r->n++] = now_us() - t; /* an atomic is a round trip: not halved */
      if (check && c.len != ATOMIC_SIZE)
        mismatch(s, test, r, "operation %llu completed with length %zu, not %d",
                 (unsigned long long)i, c.len, ATOMIC_SIZE);
      if (check && *res != i)
        mismatch(s, test, r, "operation %llu %s %llu, expected %llu%s", (unsigned long long)i,
                 test == FADD_LAT ? "fetched" : "found", (unsigned long long)*res,
                 (unsigned long long)i, test == CSWAP_LAT ? " (the swap did not happen)" : "");
    }
  } else {
    /* A window of fetch-adds, each with a result word of its own: the
     * slots go back to a free list as their operations complete, in
     * whatever order that is. */
    uint64_t win = s->p.window < s->nslots ? s->p.window : s->nslots;
    uint64_t posted = 0, done = 0, nfree = win;
    uint64_t *freel = malloc(win * sizeof *freel);
    unsigned char *seen = check ? calloc(total / 8 + 1, 1) : NULL;
    double t0 = 0;
    if (!freel || (check && !seen))
      die("out of memory");
    for (uint64_t k = 0; k < win; k++)
      freel[k] = win - 1 - k;
    while (done < total) {
      if (posted == s->p.warmup && !t0)
        t0 = now_us();
      if (posted < total && nfree) {
        uint64_t k = freel[nfree - 1];
        uint64_t *res = (uint64_t *)(void *)slot(s, k);
        if (check)
          *res = UINT64_MAX;
        int rc = xport_fetch_add(s->conn, res, 1, s->peer, off, (void *)(uintptr_t)k);
        if (rc != -XPORT_EAGAIN) {
          ok(rc, "xport_fetch_add");
          nfree--;
          posted++;
          continue;
        }
      }
      if (!after_eagain(s, XPORT_OP_ATOMIC, posted - done, &c))
        continue;
      uint64_t k = (uintptr_t)c.user_ctx;
      uint64_t v = *(uint64_t *)(void *)slot(s, k);
      if (check) {
        if (c.len != ATOMIC_SIZE)
          mismatch(s, test, r, "an operation completed with length %zu, not %d", c.len,
                   ATOMIC_SIZE);
        if (v >= total)
          mismatch(s, test, r, "fetched %llu, outside 0..%llu", (unsigned long long)v,
                   (unsigned long long)(total - 1));
        else if (seen[v / 8] & (1u << (v % 8)))
          mismatch(s, test, r, "fetched %llu twice", (unsigned long long)v);
        else
          seen[v / 8] |= (unsigned char)(1u << (v % 8));
      }
      freel[nfree++] = k;
      done++;
    }
    r->elapsed_us = now_us() - t0;
    r->n = s->p.iters;
    if (check) {
      /* every add landed: the counter holds their number */
      uint64_t *b = (uint64_t *)(void *)slot(s, 0);
      *b = UINT64_MAX;
      ok(xport_read(s->conn, b, ATOMIC_SIZE, s->mr, s->peer, off, NULL), "xport_read");
      next_op(s, XPORT_OP_READ);
      if (*b != total)
        mismatch(s, test, r, "the counter reads %llu after the run, expected %llu",
                 (unsigned long long)*b, (unsigned long long)total);
    }
    free(seen);
    free(freel);
  }
  if (r->mismatches > 5)
    fprintf(stderr, "xport_perf: %s --check: %llu mismatches in all\n", test_name[test],
            (unsigned long long)r->mismatches);
}

/* Waits until the last byte of the RMA area holds mark, driving progress. */
static void poll_mark(struct side *s, size_t size, char mark)
{
  volatile char *last = target(s) + size - 1;
  xport_completion_t c;
  while (*last != mark) {
    int n = xport_poll(s->ctx, &c, 1);
    ok(n, "xport_poll");
    if (n && c.status)
      die("operation failed: %s", xport_strerror(c.status));
  }
}

static char mark_of(uint64_t i) { return (char)(i % 255 + 1); }

/* Waits for the peer's write of round i: its consumed receive (with
 * immediate data, then posts the next one when more rounds follow) or
 * its last byte; checks the bytes when asked. */
static void await_write(struct side *s, int imm, uint64_t i, int more, size_t size,
                        struct result *r)
{
  if (imm) {
    xport_completion_t c = next_op(s, XPORT_OP_REMOTE_WRITE_IMM);
    if (s->p.check && c.imm != (uint32_t)i)
      r->check_ok = 0;
    if (more)
      ok(xport_recv(s->conn, s->ctl, sizeof s->ctl, NULL, NULL), "recv");
  } else {
    poll_mark(s, size, mark_of(i));
  }
  if (s->p.check && !same(target(s), size - 1, i))
    r->check_ok = 0;
}

/* One (test, size) run; the client fills r. */
static void run(struct side *s, int test, size_t size, struct result *r)
{
  uint64_t total = s->p.warmup + s->p.iters, done = 0, posted = 0;
  int check = (int)s->p.check, cli = !s->server;
  uint64_t win = s->nslots;
  double t0 = 0;
  xport_completion_t c;
  r->check_ok = 1;
  r->n = 0;
  r->mismatches = 0;

  switch (test) {
  case SEND_LAT:
    if (s->server)
      ok(xport_recv(s->conn, pp_rx(s), size, s->mr, NULL), "recv");
    double t_round = now_us(); /* one clock read per round: the next one's start */
    for (uint64_t i = 0; i < total; i++) {
      char *b = pp_tx(s);
      if (cli) {
        ok(xport_recv(s->conn, pp_rx(s), size, s->mr, NULL), "recv");
        if (check)
          fill(b, size, i);
        if (quiet_send(s, size)) {
          ok(xport_send_flags(s->conn, b, size, s->mr, XPORT_SEND_UNSIGNALED, NULL), "send");
        } else {
          ok(xport_send(s->conn, b, size, s->mr, NULL), "send");
          next_op(s, XPORT_OP_SEND);
        }
        c = next_op(s, XPORT_OP_RECV);
        if (check && (c.len != size || !same(pp_rx(s), size, i + 1000000)))
          r->check_ok = 0;
        double t1 = now_us();
        if (i >= s->p.warmup)
          r->lat[r->n++] = (t1 - t_round) / 2;
        t_round = t1;
      } else {
        c = next_op(s, XPORT_OP_RECV);
        if (check && (c.len != size || !same(pp_rx(s), size, i)))
          r->check_ok = 0;
        if (i + 1 < total)
          ok(xport_recv(s->conn, pp_rx(s), size, s->mr, NULL), "recv");
        if (check)
          fill(b, size, i + 1000000);
        if (quiet_send(s, size)) {
          ok(xport_send_flags(s->conn, b, size, s->mr, XPORT_SEND_UNSIGNALED, NULL), "send");
        } else {
          ok(xport_send(s->conn, b, size, s->mr, NULL), "send");
          next_op(s, XPORT_OP_SEND);
        }
      }
    }
    break;

  case SEND_BW:
    if (s->server) {
      for (posted = 0; posted < total && posted < win; posted++)
        ok(xport_recv(s->conn, slot(s, posted), size, s->mr, (void *)(uintptr_t)posted), "recv");
      /* Completions in batches, as a streaming receiver takes them (and
       * as ucx_perftest and libfabric's own tests do). */
      xport_completion_t cs[16];
      for (done = 0; done < total;) {
        int n = 0;
        if (s->early_n)
          n = poll_op(s, XPORT_OP_RECV, &cs[0]);
        else if ((n = xport_poll(s->ctx, cs, 16)) == 0 && s->sleep)
          xport_wait(s->ctx, 1000);
        ok(n, "xport_poll");
        for (int j = 0; j < n; j++) {
          c = cs[j];
          if (c.status)
            die("operation failed: %s", xport_strerror(c.status));
          if (c.op != XPORT_OP_RECV)
            continue;
          uint64_t i = (uintptr_t)c.user_ctx;
          if (check && (c.len != size || !same(slot(s, i), size, i)))
            r->check_ok = 0;
          if (posted < total) {
            ok(xport_recv(s->conn, slot(s, posted), size, s->mr, (void *)(uintptr_t)posted),
               "recv");
            posted++;
          }
          done++;
        }
      }
      ctl_send(s, "ok", 3);
    } else {
      char ack[4];
      ok(xport_recv(s->conn, ack, sizeof ack, NULL, NULL), "recv");
      for (; done < total;) {
        if (posted == s->p.warmup && !t0)
          t0 = now_us();
        if (posted < total && posted - done < win) {
          if (check)
            fill(slot(s, posted), size, posted);
          /* Unsignaled: small ones are done when posted; of larger ones
           * every half window's is signaled, and the last, and each says
           * how far the stream got. */
          uint64_t every = win / 2 ? win / 2 : 1;
          int quiet = s->p.unsig &&
                      (size <= s->inject || ((posted + 1) % every && posted + 1 < total));
          int rc = quiet ? xport_send_flags(s->conn, slot(s, posted), size, s->mr,
                                            XPORT_SEND_UNSIGNALED, NULL)
                         : xport_send(s->conn, slot(s, posted), size, s->mr,
                                      (void *)(uintptr_t)(posted + 1));
          if (rc != -XPORT_EAGAIN) {
            ok(rc, "send");
            posted++;
            if (quiet && size <= s->inject)
              done = posted;
            continue;
          }
        }
        if (after_eagain(s, XPORT_OP_SEND, posted - done, &c))
          done = s->p.unsig ? (uintptr_t)c.user_ctx : done + 1;
      }
      next_op(s, XPORT_OP_RECV); /* everything arrived */
      r->elapsed_us = now_us() - t0;
      r->n = s->p.iters;
    }
    break;

  case WRITE_LAT:
  case WRITE_IMM_LAT: {
    /* Each side writes into the other's area; the last byte changes every
     * iteration, and the target watches it (or, with immediate data,
     * waits for the consumed receive). The client starts each round. */
    int imm = test == WRITE_IMM_LAT;
    char *b = slot(s, 0);
    if (imm)
      ok(xport_recv(s->conn, s->ctl, sizeof s->ctl, NULL, NULL), "recv");
    for (uint64_t i = 0; i < total; i++) {
      double t = now_us();
      if (!cli)
        await_write(s, imm, i, i + 1 < total, size, r);
      if (check)
        fill(b, size, i);
      b[size - 1] = mark_of(i);
      if (imm)
        ok(xport_write_imm(s->conn, b, size, s->mr, s->peer, target_off(s), (uint32_t)i, NULL),
           "write_imm");
      else
        ok(xport_write(s->conn, b, size, s->mr, s->peer, target_off(s), NULL), "write");
      next_op(s, XPORT_OP_WRITE);
      if (cli) {
        await_write(s, imm, i, i + 1 < total, size, r);
        if (i >= s->p.warmup)
          r->lat[r->n++] = (now_us() - t) / 2;
      }
    }
    break;
  }

  case READ_LAT:
  case READ_BW:
  case WRITE_BW:
  case FADD_LAT:
  case CSWAP_LAT:
  case FADD_BW:
    if (s->server) {
      /* The target only drives progress until the client is done. */
      char m[8];
      if (test == READ_LAT || test == READ_BW) {
        fill(target(s), size, 77);
        ctl_send(s, "go", 3);
      }
      ctl_recv(s, m, sizeof m);
      /* Writes apply in order: the area holds the last one's bytes. */
      if (test == WRITE_BW && check && !same(target(s), size, total - 1))
        r->check_ok = 0;
      /* Every add of 1, and every swap of i for i + 1, happened once. */
      if (is_atomic(test) && check) {
        uint64_t v = __atomic_load_n((uint64_t *)(void *)target(s), __ATOMIC_SEQ_CST);
        if (v != total)
          mismatch(s, test, r, "the counter holds %llu after the run, expected %llu",
                   (unsigned long long)v, (unsigned long long)total);
      }
      ctl_send(s, r->check_ok ? "ok" : "bad", r->check_ok ? 3 : 4);
      break;
    }
    if (test == READ_LAT || test == READ_BW) {
      char m[4];
      ctl_recv(s, m, sizeof m);
    }
    if (is_atomic(test)) {
      run_atomics(s, test, total, r);
    } else if (test == READ_LAT) {
      for (uint64_t i = 0; i < total; i++) {
        char *b = pp_rx(s);
        double t = now_us();
        ok(xport_read(s->conn, b, size, s->mr, s->peer, target_off(s), NULL), "read");
        next_op(s, XPORT_OP_READ);
        if (i >= s->p.warmup)
          r->lat[r->n++] = (now_us() - t) / 2;
        if (check && !same(b, size, 77))
          r->check_ok = 0;
      }
    } else {
      for (; done < total;) {
        if (posted == s->p.warmup && !t0)
          t0 = now_us();
        if (posted < total && posted - done < win) {
          char *b = slot(s, posted);
          void *u = (void *)(uintptr_t)posted;
          int rc;
          if (test == WRITE_BW) {
            if (check)
              fill(b, size, posted);
            rc = xport_write(s->conn, b, size, s->mr, s->peer, target_off(s), u);
          } else {
            rc = xport_read(s->conn, b, size, s->mr, s->peer, target_off(s), u);
          }
          if (rc != -XPORT_EAGAIN) {
            ok(rc, "post");
            posted++;
            continue;
          }
        }
        if (!after_eagain(s, test == WRITE_BW ? XPORT_OP_WRITE : XPORT_OP_READ, posted - done, &c))
          continue;
        if (test == READ_BW && check && !same(slot(s, (uintptr_t)c.user_ctx), size, 77))
          r->check_ok = 0;
        done++;
      }
      r->elapsed_us = now_us() - t0;
      r->n = s->p.iters;
    }
    {
      /* A message after the writes arrives after them (xport(7)). */
      char m[8] = "";
      ctl_send(s, "done", 5);
      ctl_recv(s, m, sizeof m);
      if (strcmp(m, "ok") && is_atomic(test))
        mismatch(s, test, r, "the server found its counter wrong");
      else if (strcmp(m, "ok"))
        r->check_ok = 0;
    }
    break;
  }
}

static void report(struct side *s, int test, size_t size, struct result *r, int first)
{
  const char *chk = s->p.check ? (r->check_ok ? "ok" : "FAILED") : "off";
  if (first && !s->json && !s->csv && strcmp(s->transport, s->provider))
    printf("# the connection runs over %s, beside %s (XPORT_SHM)\n", s->transport, s->provider);
  if (first && is_atomic(test) && !s->json && !s->csv)
    printf(is_lat(test) ? "# %s: an atomic is a round trip: the latencies are whole round trips, "
                          "not halves\n"
                        : "# %s: 64-bit fetch-adds: the rate is in operations per second\n",
           test_name[test]);
  if (is_lat(test)) {
    qsort(r->lat, r->n, sizeof *r->lat, cmp_double);
    double sum = 0;
    for (uint64_t i = 0; i < r->n; i++)
      sum += r->lat[i];
    double mn = r->lat[0], med = r->lat[r->n / 2], mean = sum / (double)r->n,
           p99 = r->lat[(uint64_t)((double)(r->n - 1) * 0.99)], mx = r->lat[r->n - 1];
    if (s->json)
      printf("{\"test\":\"%s\",\"provider\":\"%s\",\"transport\":\"%s\",\"size\":%zu,\"iters\":%llu,\"lat_us_min\":%.3f,"
             "\"lat_us_median\":%.3f,\"lat_us_mean\":%.3f,\"lat_us_p99\":%.3f,"
             "\"lat_us_max\":%.3f,%s\"check\":\"%s\"}\n",
             test_name[test], s->provider, s->transport, size, (unsigned long long)r->n, mn, med, mean, p99,
             mx, is_atomic(test) ? "\"lat_round_trip\":true," : "", chk);
    else if (s->csv)
      printf("%s%s,%s,%zu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,,,%s\n",
             first ? "test,provider,size,iters,lat_us_min,lat_us_median,lat_us_mean,lat_us_p99,"
                     "lat_us_max,bw_MBps,msg_rate,check\n" : "",
             test_name[test], s->provider, size, (unsigned long long)r->n, mn, med, mean, p99,
             mx, chk);
    else
      printf("%s%-14s %10zu %9llu %9.2f %9.2f %9.2f %9.2f %9.2f %10s %12s %6s\n",
             first ? "test            size(B)     iters   min(us)   med(us)  mean(us)   p99(us)"
                     "   max(us)    bw(MB/s)     msg/s  check\n" : "",
             test_name[test], size, (unsigned long long)r->n, mn, med, mean, p99, mx, "", "", chk);
  } else {
    double bw = (double)size * (double)r->n / r->elapsed_us; /* bytes/us = MB/s */
    double rate = (double)r->n / r->elapsed_us * 1e6;
    double mops = (double)r->n / r->elapsed_us; /* operations/us = Mops/s */
    if (s->json && is_atomic(test))
      printf("{\"test\":\"%s\",\"provider\":\"%s\",\"transport\":\"%s\",\"size\":%zu,\"iters\":%llu,\"bw_MBps\":%.6g,"
             "\"msg_rate\":%.0f,\"mops\":%.6g,\"check\":\"%s\"}\n",
             test_name[test], s->provider, s->transport, size, (unsigned long long)r->n, bw, rate, mops,
             chk);
    else if (s->json)
      printf("{\"test\":\"%s\",\"provider\":\"%s\",\"transport\":\"%s\",\"size\":%zu,\"iters\":%llu,\"bw_MBps\":%.6g,"
             "\"msg_rate\":%.0f,\"check\":\"%s\"}\n",
             test_name[test], s->provider, s->transport, size, (unsigned long long)r->n, bw, rate, chk);
    else if (s->csv)
      printf("%s%s,%s,%zu,%llu,,,,,,%.2f,%.0f,%s\n",
             first ? "test,provider,size,iters,lat_us_min,lat_us_median,lat_us_mean,lat_us_p99,"
                     "lat_us_max,bw_MBps,msg_rate,check\n" : "",
             test_name[test], s->provider, size, (unsigned long long)r->n, bw, rate, chk);
    else if (is_atomic(test))
      printf("%s%-14s %10zu %9llu %9s %9s %9s %9s %9s %10.3f %12.0f %6s\n",
             first ? "test            size(B)     iters   min(us)   med(us)  mean(us)   p99(us)"
                     "   max(us)      Mops/s     ops/s  check\n" : "",
             test_name[test], size, (unsigned long long)r->n, "", "", "", "", "", mops, rate, chk);
    else
      printf("%s%-14s %10zu %9llu %9s %9s %9s %9s %9s %10.2f %12.0f %6s\n",
             first ? "test            size(B)     iters   min(us)   med(us)  mean(us)   p99(us)"
                     "   max(us)    bw(MB/s)     msg/s  check\n" : "",
             test_name[test], size, (unsigned long long)r->n, "", "", "", "", "", bw, rate, chk);
  }
  fflush(stdout);
}

/* Runs the whole plan over one connection; returns nonzero on a failed check. */
static int session(struct side *s)
{
  size_t sizes[32], nsizes = 0;
  if (s->p.all)
    for (size_t z = 1; z <= MAX_ALL; z <<= 1)
      sizes[nsizes++] = z;
  else
    sizes[nsizes++] = s->p.size;
  xport_caps_t caps;
  /* The connection's transport: shm for a peer on this node where the
   * context opened it beside its fabric (XPORT_SHM). */
  ok(xport_conn_query(s->conn, &caps), "xport_conn_query");
  snprintf(s->transport, sizeof s->transport, "%s", caps.provider);
  s->inject = caps.inject_size;
  setup(s, sizes[nsizes - 1]);
  struct result r = {.lat = calloc(s->p.iters + 1, sizeof(double))};
  int bad = 0;
  double start = now_us(), last_note = start;
  for (size_t k = 0; k < nsizes; k++) {
    size_t size = sizes[k];
    run(s, (int)s->p.test, size, &r);
    if (!s->server) {
      report(s, (int)s->p.test, size, &r, k == 0);
      bad |= s->p.check && !r.check_ok;
      double t = now_us();
      if (t - start > 3e6 && t - last_note > 2e6 && !s->quiet) {
        fprintf(stderr, "xport_perf: %s: %zu of %zu sizes done, %.0f s\n",
                test_name[s->p.test], k + 1, nsizes, (t - start) / 1e6);
        last_note = t;
      }
    } else {
      bad |= s->p.check && !r.check_ok;
    }
  }
  free(r.lat);
  xport_rkey_release(s->peer);
  /* Say goodbye before closing, so that neither side's close cancels
   * the other's last message. */
  char m[8];
  if (s->server) {
    ctl_recv(s, m, sizeof m);
    ctl_send(s, "bye", 4);
  } else {
    ctl_send(s, "fin", 4);
    ctl_recv(s, m, sizeof m);
  }
  if (!s->job)
    xport_conn_close(s->conn);
  xport_mr_dereg(s->mr);
  free(s->buf);
  return bad;
}

static xport_ctx_t *open_ctx(const char *provider, int sleep)
{
  /* Spinning needs no wait fd, and on tcp it costs a microsecond. */
  xport_ctx_attr_t attr = {.provider = provider, .wait_fd = sleep ? XPORT_ON : XPORT_OFF};
  xport_ctx_t *ctx;
  ok(xport_ctx_create(&attr, &ctx), "xport_ctx_create");
  return ctx;
}

static int serve(struct side *s, const char *bind, int persistent, int ready_fd)
{
  xport_listener_t *lst;
  char addr[128];
  int bad = 0;
  s->server = 1;
  s->ctx = open_ctx(s->provider, s->sleep);
  ok(xport_listen(s->ctx, bind, &lst), "xport_listen");
  ok(xport_listener_addr(lst, addr, sizeof addr), "xport_listener_addr");
  if (ready_fd >= 0) {
    if (write(ready_fd, addr, strlen(addr) + 1) < 0)
      die("pipe");
    close(ready_fd);
  } else if (!s->quiet) {
    fprintf(stderr, "xport_perf: listening on %s\n", addr);
  }
  do {
    ok(xport_accept(lst, -1, &s->conn), "xport_accept");
    struct plan p;
    if (ctl_recv(s, &p, sizeof p) != sizeof p || p.magic != MAGIC || p.test >= NTESTS ||
        (is_atomic((int)p.test) && (p.size != ATOMIC_SIZE || p.all)))
      die("the client sent no valid plan");
    s->p = p;
    bad |= session(s);
  } while (persistent);
  xport_listener_close(lst);
  xport_ctx_destroy(s->ctx);
  return bad;
}

static int drive(struct side *s, const char *addr)
{
  xport_caps_t caps;
  s->ctx = open_ctx(s->provider, s->sleep);
  xport_ctx_query(s->ctx, &caps);
  static char prov[32];
  snprintf(prov, sizeof prov, "%s", caps.provider);
  s->provider = prov;
  if (is_atomic((int)s->p.test) && caps.atomics == XPORT_SUPPORT_NONE) {
    fprintf(stderr, "xport_perf: %s: provider %s has no remote atomics (xport_info: atomics none)\n",
            test_name[s->p.test], prov);
    xport_ctx_destroy(s->ctx);
    return EXIT_UNSUPPORTED;
  }
  ok(xport_connect(s->ctx, addr, 10000, &s->conn), "xport_connect");
  s->p.magic = MAGIC;
  ctl_send(s, &s->p, sizeof s->p);
  int bad = session(s);
  xport_ctx_destroy(s->ctx);
  return bad ? 1 : 0;
}

/* Started by a launcher (mpirun -np 2, srun --mpi=pmix -n 2) with no
 * address: rank 0 serves, rank 1 drives, over the job's connection. */
static int as_job(struct side *s)
{
  xport_caps_t caps;
  static char prov[32];
  s->ctx = open_ctx(s->provider, s->sleep);
  ok(xport_job_init(s->ctx, &s->job), "xport_job_init");
  if (xport_job_size(s->job) != 2)
    die("run as a job of 2 ranks (mpirun -np 2), not %d", xport_job_size(s->job));
  int rank = xport_job_rank(s->job);
  xport_ctx_query(s->ctx, &caps);
  snprintf(prov, sizeof prov, "%s", caps.provider);
  s->provider = prov;
  if (is_atomic((int)s->p.test) && caps.atomics == XPORT_SUPPORT_NONE) {
    if (rank == 1)
      fprintf(stderr, "xport_perf: %s: provider %s has no remote atomics\n",
              test_name[s->p.test], prov);
    xport_job_fini(s->job);
    xport_ctx_destroy(s->ctx);
    return EXIT_UNSUPPORTED;
  }
  ok(xport_job_conn(s->job, !rank, &s->conn), "xport_job_conn");
  s->server = rank == 0;
  s->quiet |= s->server;
  if (s->server) {
    struct plan p;
    if (ctl_recv(s, &p, sizeof p) != sizeof p || p.magic != MAGIC || p.test >= NTESTS)
      die("the client rank sent no valid plan");
    s->p = p;
  } else {
    s->p.magic = MAGIC;
    ctl_send(s, &s->p, sizeof s->p);
  }
  int bad = session(s);
  ok(xport_job_fini(s->job), "xport_job_fini");
  xport_ctx_destroy(s->ctx);
  return bad ? 1 : 0;
}

static void usage(FILE *f)
{
  fprintf(f,
          "usage: xport_perf [-b HOST:PORT] [--persistent]   serve (default 0.0.0.0:%s)\n"
          "       xport_perf [options] HOST:PORT              run against a server\n"
          "       xport_perf --loopback [options]             both, as two processes\n"
          "       mpirun -np 2 xport_perf [options]           both, as the ranks of a job\n"
          "options:\n"
          "  -t TEST      send_lat (default), send_bw, write_lat, write_bw, read_lat,\n"
          "               read_bw, write_imm_lat; 64-bit remote atomics on one counter:\n"
          "               fadd_lat, cswap_lat (latency: the whole round trip, not half),\n"
          "               fadd_bw (operations per second); exit 2 without atomics\n"
          "  -s SIZE      message size in bytes (default 8 for latency, 65536 for bandwidth;\n"
          "               atomics: 8 only)\n"
          "  -a           every power of two from 1 B to 8 MiB (atomics: 8 B only)\n"
          "  -n ITERS     measured iterations (default 1000)\n"
          "  -w WINDOW    operations in flight in bandwidth tests (default 64)\n"
          "  --warmup N   unmeasured iterations first (default 100)\n"
          "  -p PROVIDER  as XPORT_PROVIDER\n"
          "  --check      verify every byte (atomics: every result, and the counter);\n"
          "               exit 1 on a mismatch\n"
          "  --sleep      sleep in xport_wait between polls instead of spinning\n"
          "  --unsignaled send_lat, send_bw: sends without completions where the rule of\n"
          "               xport_send_flags(3) allows (at most inject_size bytes; in\n"
          "               send_bw every half window's larger send is signaled)\n"
          "  --json       one JSON object per line;  --csv  CSV with a header\n",
          DEFAULT_PORT);
}

int main(int argc, char **argv)
{
  static const struct option opts[] = {
      {"loopback", no_argument, NULL, 'L'}, {"persistent", no_argument, NULL, 'P'},
      {"warmup", required_argument, NULL, 'W'}, {"check", no_argument, NULL, 'C'},
      {"json", no_argument, NULL, 'J'},       {"csv", no_argument, NULL, 'V'},
      {"sleep", no_argument, NULL, 'S'},      {"help", no_argument, NULL, 'h'},
      {"unsignaled", no_argument, NULL, 'U'},
      {NULL, 0, NULL, 0}};
  struct side s = {0};
  const char *bind = NULL;
  int loopback = 0, persistent = 0, ch, size_set = 0;
  s.p.test = SEND_LAT;
  s.p.iters = 1000;
  s.p.warmup = 100;
  s.p.window = 64;
  while ((ch = getopt_long(argc, argv, "b:t:s:an:w:p:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'b': bind = optarg; break;
    case 't':
      for (s.p.test = 0; s.p.test < NTESTS && strcmp(test_name[s.p.test], optarg); s.p.test++)
        ;
      if (s.p.test == NTESTS)
        die("unknown test %s (xport_perf --help lists the tests)", optarg);
      break;
    case 's': s.p.size = strtoull(optarg, NULL, 0); size_set = 1; break;
    case 'a': s.p.all = 1; break;
    case 'n': s.p.iters = strtoull(optarg, NULL, 0); break;
    case 'w': s.p.window = strtoull(optarg, NULL, 0); break;
    case 'W': s.p.warmup = strtoull(optarg, NULL, 0); break;
    case 'p': s.provider = optarg; break;
    case 'C': s.p.check = 1; break;
    case 'J': s.json = 1; break;
    case 'V': s.csv = 1; break;
    case 'L': loopback = 1; break;
    case 'S': s.sleep = 1; break;
    case 'U': s.p.unsig = 1; break;
    case 'P': persistent = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (is_atomic((int)s.p.test)) {
    /* one 64-bit word: -a has the one size */
    if (size_set && s.p.size != ATOMIC_SIZE)
      die("%s works on 8-byte words: -s %llu does not apply", test_name[s.p.test],
          (unsigned long long)s.p.size);
    s.p.size = ATOMIC_SIZE;
    s.p.all = 0;
  } else if (!size_set) {
    s.p.size = is_lat((int)s.p.test) ? 8 : 65536;
  }
  if (!s.p.all && (s.p.size == 0 || s.p.size > ((size_t)1 << 30)))
    die("size must be 1 B to 1 GiB");
  if (!s.p.iters || !s.p.window)
    die("iterations and window must be positive");

  if (loopback) {
    int p[2];
    if (pipe(p))
      die("pipe");
    fflush(NULL);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
      /* The server half ends with the client half, however that ends:
       * a client killed before it connected must not leave a server
       * waiting in xport_accept for ever. */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(1);
      close(p[0]);
      s.quiet = 1;
      _exit(serve(&s, bind ? bind : "127.0.0.1:0", 0, p[1]) ? 1 : 0);
    }
    close(p[1]);
    char addr[128] = "";
    if (read(p[0], addr, sizeof addr - 1) <= 0)
      die("the server side did not start");
    close(p[0]);
    int bad = drive(&s, addr);
    int st = 0;
    if (bad == EXIT_UNSUPPORTED) {
      /* never connected: the server still waits in xport_accept */
      kill(pid, SIGTERM);
      waitpid(pid, &st, 0);
      return EXIT_UNSUPPORTED;
    }
    waitpid(pid, &st, 0);
    return bad || !WIFEXITED(st) || WEXITSTATUS(st) ? 1 : 0;
  }
  if (optind < argc)
    return drive(&s, argv[optind]);
  if (!bind && !persistent && getenv("PMIX_RANK"))
    return as_job(&s);
  return serve(&s, bind ? bind : "0.0.0.0:" DEFAULT_PORT, persistent, -1) ? 1 : 0;
}
