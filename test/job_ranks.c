/*
 * One rank of a job test (test/jobs.sh runs it under mpirun and srun).
 * Every rank connects to every other through the job layer, asking in an
 * order that makes pairs ask each other at once; then each pair exchanges
 * verified messages, one-sided writes and reads (keys sent in the
 * messages). JOB_DIE_RANK=r: rank r kills itself once connected, and the
 * others must see their operations to it fail, not hang.
 * Prints "job_ranks: rank R of N: ok (...)" or why not, exit 0 on success.
 */
#include <xport.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SZ 4096
#define DEADLINE_MS 60000

static int me = -1;

#define FAIL(...)                                                            \
  do {                                                                       \
    fprintf(stderr, "job_ranks: rank %d: FAIL: ", me);                       \
    fprintf(stderr, __VA_ARGS__);                                            \
    fprintf(stderr, "\n");                                                   \
    exit(1);                                                                 \
  } while (0)

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static uint8_t pat(int from, int to, int kind, size_t i)
{
  return (uint8_t)(from * 31 + to * 7 + kind * 101 + i * 13 + (i >> 8));
}

struct msg {
  int32_t from, to;
  uint32_t keylen;
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  uint8_t data[SZ];
};

/* Each operation's user_ctx is its flag here: done[kind][peer]. A phase
 * waits for its own kinds; completions of later ones (a fast peer's next
 * message) only set their flags early. */
enum { K_IN, K_DONE_IN, K_OUT, K_WRITE, K_DONE_OUT, K_READ, K_COUNT };
static int *done[K_COUNT];
#define FLAG(k, p) ((void *)&done[k][p])

static void collect(xport_ctx_t *ctx, xport_job_t *job, int n, unsigned kinds, const char *what)
{
  long end = now_ms() + DEADLINE_MS;
  for (;;) {
    int missing = 0;
    for (int k = 0; k < K_COUNT; k++)
      for (int p = 0; (kinds >> k & 1) && p < n; p++)
        missing += p != me && !done[k][p];
    if (!missing)
      return;
    xport_completion_t c[16];
    int got = xport_poll(ctx, c, 16);
    if (got < 0)
      FAIL("poll: %s", xport_strerror(got));
    for (int i = 0; i < got; i++) {
      if (c[i].op == XPORT_OP_DISCONNECT || c[i].status)
        FAIL("%s: op %d from rank %d: %s", what, (int)c[i].op, xport_job_peer(job, c[i].conn),
             xport_strerror(c[i].status));
      if (getenv("JOB_DEBUG"))
        fprintf(stderr, "rank %d %s: op %d peer %d len %zu\n", me, what, (int)c[i].op,
                xport_job_peer(job, c[i].conn), c[i].len);
      *(int *)c[i].user_ctx = 1;
    }
    if (!got && now_ms() > end)
      FAIL("%s: %d completions missing after %d ms", what, missing, DEADLINE_MS);
    if (!got)
      xport_wait(ctx, 10);
  }
}

/* Rank `dead` is gone: an operation to it must fail, or its connection
 * report the disconnect, within the deadline. */
static void see_death(xport_ctx_t *ctx, xport_job_t *job, xport_conn_t *conn, int dead)
{
  static char buf[64];
  int rc = xport_recv(conn, buf, sizeof buf, NULL, NULL);
  if (rc && rc != -XPORT_ENOTCONN && rc != -XPORT_ECONNRESET)
    FAIL("recv from the dead rank: %s", xport_strerror(rc));
  long end = now_ms() + DEADLINE_MS;
  for (;;) {
    xport_completion_t c[8];
    int got = xport_poll(ctx, c, 8);
    for (int i = 0; i < got; i++)
      if (c[i].conn == conn && (c[i].op == XPORT_OP_DISCONNECT || c[i].status)) {
        printf("job_ranks: rank %d: rank %d died: %s\n", me, dead,
               xport_strerror(c[i].status ? c[i].status : -XPORT_ECONNRESET));
        fflush(stdout);
        return;
      }
    if (now_ms() > end)
      FAIL("rank %d was killed, and its connection says nothing after %d ms", dead,
           DEADLINE_MS);
    xport_wait(ctx, 10);
  }
  (void)job;
}

/* xport_job_conn, asked again on a timeout where a busy rank makes one
 * expected (JOB_BUSY_RANK without JOB_MARKS: XPORT_JOB_TIMEOUT is short
 * then, for every job of the run, and the machine's load alone can
 * exceed it). */
static int job_conn_again(xport_job_t *job, int p, xport_conn_t **conn_p)
{
  const char *busy = getenv("JOB_BUSY_RANK");
  long end = now_ms() + DEADLINE_MS;
  int rc;
  while ((rc = xport_job_conn(job, p, conn_p)) == -XPORT_ETIMEDOUT && busy &&
         !getenv("JOB_MARKS") && now_ms() < end)
    ;
  return rc;
}

int main(void)
{
  xport_ctx_t *ctx;
  xport_job_t *job;
  xport_caps_t caps;
  int rc = xport_ctx_create(NULL, &ctx);
  if (rc)
    FAIL("ctx_create: %s", xport_strerror(rc));
  if ((rc = xport_job_init(ctx, &job)))
    FAIL("job_init: %s", xport_strerror(rc));
  xport_ctx_query(ctx, &caps);
  /* The job's key (xport_job_init(3)): contexts of no key of their own
   * take one from the launcher where the job has more than one rank; a
   * key file's stays. */
  xport_auth_t want = getenv("XPORT_AUTH_KEY_FILE") ? XPORT_AUTH_FILE
                      : xport_job_size(job) > 1    ? XPORT_AUTH_JOB
                                                   : XPORT_AUTH_OFF;
  if (caps.auth != want)
    FAIL("the context's key came from %d, not %d (xport_caps_t.auth)", (int)caps.auth, (int)want);
  me = xport_job_rank(job);
  xport_job_t *again_job = (xport_job_t *)0x1;
  if ((rc = xport_job_init(ctx, &again_job)) != -XPORT_EBUSY || again_job != (xport_job_t *)0x1)
    FAIL("a second xport_job_init in a live job: %s, not EBUSY", xport_strerror(rc));
  if (xport_job_size(job) > 1 && (rc = xport_ctx_destroy(ctx)) != -XPORT_EBUSY)
    FAIL("xport_ctx_destroy under a live job: %s, not EBUSY", xport_strerror(rc));
  int n = xport_job_size(job);
  const char *die = getenv("JOB_DIE_RANK");
  int dead = die ? atoi(die) : -1;
  char host[64] = "";
  gethostname(host, sizeof host);

  xport_conn_t **conns = calloc((size_t)n, sizeof *conns);
  for (int k = 0; k < K_COUNT; k++)
    done[k] = calloc((size_t)n, sizeof *done[k]);
  /* JOB_BUSY_RANK=b: rank b stays outside xport while its peers ask it.
   * Without JOB_MARKS it sleeps 3 s, past a short XPORT_JOB_TIMEOUT: the
   * first tries time out and asking again connects. Every rank asks again
   * on a timeout then, not only b's peers: a rank waiting on b is itself
   * late to answer the others, by however much the machine's load adds.
   * With JOB_MARKS=dir (and the progress thread on) b stays out until
   * each peer has left a mark there saying it connected to b, or 60 s:
   * nothing but b's progress thread can accept them, and no clock
   * decides the outcome (the peers ask once, with a long timeout). */
  const char *busy_s = getenv("JOB_BUSY_RANK"), *marks = getenv("JOB_MARKS");
  int busy = busy_s ? atoi(busy_s) : -1;
  if (busy == me && !marks)
    sleep(3);
  for (long end = now_ms() + DEADLINE_MS; busy == me && marks && now_ms() < end;) {
    int seen = 0;
    for (int p = 0; p < n; p++) {
      char path[512];
      snprintf(path, sizeof path, "%s/%d", marks, p);
      seen += p != me && access(path, F_OK) == 0;
    }
    if (seen == n - 1)
      break;
    usleep(10 * 1000);
  }
  /* Rank r asks r+1 first, then r-1, ...: neighbours ask each other at once. */
  for (int k = 1; k < n; k++) {
    int p = (me + (k % 2 ? (k + 1) / 2 : n - k / 2)) % n;
    if (p == me || conns[p])
      continue;
    if ((rc = job_conn_again(job, p, &conns[p])))
      FAIL("job_conn(%d)%s: %s", p, p == busy ? " (the busy rank)" : "", xport_strerror(rc));
    if (xport_job_peer(job, conns[p]) != p)
      FAIL("job_peer of the connection to %d says %d", p, xport_job_peer(job, conns[p]));
    if (p == busy && marks) {
      char path[512];
      snprintf(path, sizeof path, "%s/%d", marks, me);
      FILE *f = fopen(path, "w");
      if (!f)
        FAIL("cannot leave a mark in %s", marks);
      fclose(f);
    }
  }
  for (int p = 0; p < n; p++) {
    xport_conn_t *again;
    if (p != me && (xport_job_conn(job, p, &again) || again != conns[p]))
      FAIL("a second job_conn(%d) gave another connection", p);
  }
  /* Which transport each peer's connection runs on (jobs.sh checks that
   * peers of this node come over shm where XPORT_SHM lets them). */
  char over[512] = "";
  for (int p = 0, off = 0; p < n && off < (int)sizeof over - 48; p++) {
    xport_caps_t cc;
    if (p == me)
      continue;
    if ((rc = xport_conn_query(conns[p], &cc)))
      FAIL("conn_query(%d): %s", p, xport_strerror(rc));
    off += snprintf(over + off, sizeof over - (size_t)off, " %d=%s", p, cc.provider);
  }
  if (n > 1 && (rc = xport_conn_close(conns[(me + 1) % n])) != -XPORT_EPERM)
    FAIL("xport_conn_close of a job's connection: %s, not EPERM", xport_strerror(rc));
  if (xport_job_conn(job, me, &conns[0]) != -XPORT_EINVAL || xport_job_conn(job, n, &conns[0]) !=
      -XPORT_EINVAL)
    FAIL("job_conn to itself or past the size did not fail with EINVAL");

  size_t nmsg = (size_t)n;
  struct msg *out = calloc(nmsg, sizeof *out), *in = calloc(nmsg, sizeof *in);
  int32_t *done_in = calloc(nmsg, sizeof *done_in), *done_out = calloc(nmsg, sizeof *done_out);
  uint8_t *region = calloc(nmsg, SZ), *rd = calloc(nmsg, SZ), *wr = calloc(nmsg, SZ);
  xport_mr_t *rmr, *imr, *omr, *rdmr, *wrmr;
  if ((rc = xport_mr_reg(ctx, region, nmsg * SZ,
                         XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE,
                         &rmr)) ||
      (rc = xport_mr_reg(ctx, in, nmsg * sizeof *in, XPORT_ACCESS_LOCAL, &imr)) ||
      (rc = xport_mr_reg(ctx, out, nmsg * sizeof *out, XPORT_ACCESS_LOCAL, &omr)) ||
      (rc = xport_mr_reg(ctx, rd, nmsg * SZ, XPORT_ACCESS_LOCAL, &rdmr)) ||
      (rc = xport_mr_reg(ctx, wr, nmsg * SZ, XPORT_ACCESS_LOCAL, &wrmr)))
    FAIL("mr_reg: %s", xport_strerror(rc));

  /* Messages: each peer gets its bytes and a key to its slot here. */
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    if ((rc = xport_recv(conns[p], &in[p], sizeof in[p], imr, FLAG(K_IN, p))) ||
        (rc = xport_recv(conns[p], &done_in[p], sizeof done_in[p], NULL, FLAG(K_DONE_IN, p))))
      FAIL("recv: %s", xport_strerror(rc));
  }
  xport_job_barrier(job); /* every receive is posted before any send */
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    out[p].from = me;
    out[p].to = p;
    for (size_t i = 0; i < SZ; i++)
      out[p].data[i] = pat(me, p, 0, i);
    rc = xport_rkey_pack(rmr, (size_t)p * SZ, SZ, out[p].key, sizeof out[p].key);
    if (rc < 0)
      FAIL("rkey_pack: %s", xport_strerror(rc));
    out[p].keylen = (uint32_t)rc;
    if ((rc = xport_send(conns[p], &out[p], sizeof out[p], omr, FLAG(K_OUT, p))))
      FAIL("send: %s", xport_strerror(rc));
  }
  collect(ctx, job, n, 1u << K_IN | 1u << K_OUT, "messages");
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    if (in[p].from != p || in[p].to != me)
      FAIL("the message from rank %d says it is from %d to %d", p, in[p].from, in[p].to);
    for (size_t i = 0; i < SZ; i++)
      if (in[p].data[i] != pat(p, me, 0, i))
        FAIL("byte %zu of the message from rank %d is wrong", i, p);
  }

  if (dead >= 0 && dead < n) {
    if (me == dead) {
      printf("job_ranks: rank %d: killing itself\n", me);
      fflush(stdout);
      raise(SIGKILL);
    }
    see_death(ctx, job, conns[dead], dead);
    /* No collective now: the launcher ends the job it lost a rank of
     * (or, with recovery on, lets the survivors end on their own). */
    printf("job_ranks: rank %d of %d: ok (saw rank %d die)\n", me, n, dead);
    fflush(stdout);
    if (!getenv("JOB_SURVIVORS_EXIT"))
      pause();
    xport_ctx_destroy(ctx);
    _exit(0);
  }

  /* One-sided: write my bytes into my slot at each peer, then read them back. */
  xport_rkey_t **keys = calloc(nmsg, sizeof *keys);
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    if ((rc = xport_rkey_unpack(conns[p], in[p].key, in[p].keylen, &keys[p])))
      FAIL("rkey_unpack from %d: %s", p, xport_strerror(rc));
    for (size_t i = 0; i < SZ; i++)
      wr[(size_t)p * SZ + i] = pat(me, p, 1, i);
    if ((rc = xport_write(conns[p], wr + (size_t)p * SZ, SZ, wrmr, keys[p], 0, FLAG(K_WRITE, p))))
      FAIL("write to %d: %s", p, xport_strerror(rc));
  }
  collect(ctx, job, n, 1u << K_WRITE, "writes");
  /* A write is visible at its target once a later message is seen there. */
  for (int p = 0; p < n; p++) {
    done_out[p] = me;
    if (p != me && (rc = xport_send(conns[p], &done_out[p], sizeof done_out[p], NULL, FLAG(K_DONE_OUT, p))))
      FAIL("send: %s", xport_strerror(rc));
  }
  collect(ctx, job, n, 1u << K_DONE_IN | 1u << K_DONE_OUT, "messages after the writes");
  for (int p = 0; p < n; p++) {
    if (p != me && done_in[p] != p)
      FAIL("the second message from rank %d says %d", p, done_in[p]);
    for (size_t i = 0; p != me && i < SZ; i++)
      if (region[(size_t)p * SZ + i] != pat(p, me, 1, i))
        FAIL("byte %zu that rank %d wrote here is wrong", i, p);
  }
  if ((rc = xport_job_barrier(job)))
    FAIL("barrier: %s", xport_strerror(rc));
  for (int p = 0; p < n; p++)
    if (p != me && (rc = xport_read(conns[p], rd + (size_t)p * SZ, SZ, rdmr, keys[p], 0, FLAG(K_READ, p))))
      FAIL("read from %d: %s", p, xport_strerror(rc));
  collect(ctx, job, n, 1u << K_READ, "reads");
  for (int p = 0; p < n; p++)
    for (size_t i = 0; p != me && i < SZ; i++)
      if (rd[(size_t)p * SZ + i] != pat(me, p, 1, i))
        FAIL("byte %zu read back from rank %d is wrong", i, p);

  for (int p = 0; p < n; p++)
    if (keys[p])
      xport_rkey_release(keys[p]);
  if ((rc = xport_job_fini(job)))
    FAIL("job_fini: %s", xport_strerror(rc));
  /* A second job on the same context: new connections, a token each way. */
  if ((rc = xport_job_init(ctx, &job)))
    FAIL("job_init again after fini: %s", xport_strerror(rc));
  if (xport_job_rank(job) != me || xport_job_size(job) != n)
    FAIL("the second job says rank %d of %d", xport_job_rank(job), xport_job_size(job));
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    xport_conn_t *c2;
    if ((rc = job_conn_again(job, p, &c2)))
      FAIL("second job: job_conn(%d): %s", p, xport_strerror(rc));
    done_in[p] = -1;
    for (int k = 0; k < K_COUNT; k++)
      done[k][p] = 0;
    if ((rc = xport_recv(c2, &done_in[p], sizeof done_in[p], NULL, FLAG(K_DONE_IN, p))))
      FAIL("second job: recv: %s", xport_strerror(rc));
  }
  if ((rc = xport_job_barrier(job)))
    FAIL("second job: barrier: %s", xport_strerror(rc));
  for (int p = 0; p < n; p++) {
    xport_conn_t *c2;
    done_out[p] = 1000 + me;
    if (p == me)
      continue;
    if ((rc = xport_job_conn(job, p, &c2)))
      FAIL("second job: job_conn(%d) after the barrier: %s", p, xport_strerror(rc));
    if ((rc = xport_send(c2, &done_out[p], sizeof done_out[p], NULL, FLAG(K_DONE_OUT, p))))
      FAIL("second job: send to %d: %s", p, xport_strerror(rc));
  }
  collect(ctx, job, n, 1u << K_DONE_IN | 1u << K_DONE_OUT, "second job's messages");
  for (int p = 0; p < n; p++)
    if (p != me && done_in[p] != 1000 + p)
      FAIL("second job: rank %d's message says %d", p, done_in[p]);
  if ((rc = xport_job_fini(job)))
    FAIL("second job: job_fini: %s", xport_strerror(rc));
  printf("job_ranks: rank %d of %d on %s (%s): ok: %d peers, messages, writes and reads "
         "verified, then a second job; over:%s\n", me, n, caps.provider, host, n - 1, over);
  fflush(stdout);

  xport_mr_dereg(rmr);
  xport_mr_dereg(imr);
  xport_mr_dereg(omr);
  xport_mr_dereg(rdmr);
  xport_mr_dereg(wrmr);
  xport_ctx_destroy(ctx);
  free(keys);
  free(conns);
  free(in);
  free(out);
  for (int k = 0; k < K_COUNT; k++)
    free(done[k]);
  free(done_in);
  free(done_out);
  free(region);
  free(rd);
  free(wr);
  return 0;
}
