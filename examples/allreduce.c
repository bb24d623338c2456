/*
 * allreduce: the ranks of a job sum a float vector, as data-parallel
 * training sums its gradients after every step.
 *
 *   mpirun -np 4 ./examples/allreduce           time, algbw and busbw per size
 *   mpirun -np 4 ./examples/allreduce --check   a few sizes, every result verified
 *   (as root: mpirun --allow-run-as-root --oversubscribe ...; srun --mpi=pmix works too)
 *
 * Options: --algo ring|rd|auto (default auto), --switch BYTES (largest size
 * that auto sends by recursive doubling, default 64 KiB), --iters N (timed
 * iterations per size; default scales with the size), --corrupt (rank 1
 * adds 1 to one element it contributes: the verification must say so).
 *
 * Two algorithms, as in NCCL and MPI libraries:
 *   - ring (large vectors): a reduce-scatter then an allgather, 2(n-1)
 *     steps each moving 1/n of the vector to the next rank, so every link
 *     carries 2(n-1)/n of the vector in all: bandwidth-optimal.
 *   - recursive doubling (small vectors): log2(n) steps, each exchanging
 *     the whole vector with the rank whose number differs in one bit:
 *     latency-optimal. A rank beyond the largest power of two first hands
 *     its vector to a partner below it and gets the sum back at the end.
 * The switch is at 64 KiB: below it the 2(n-1) dependent steps of the ring
 * cost more than recursive doubling's extra bytes. Measured with --algo
 * on 4 ranks over xshm (2 cores): 64 KiB took 266 us by recursive
 * doubling and 729 us by the ring, 256 KiB about the same both ways
 * (1234 and 1162 us); --switch moves it for other machines.
 *
 * Every step is an xport_write_imm into the receiving rank's registered
 * buffer: the data lands where the receiver reduces it, with no copy out
 * of a receive buffer, and the immediate value (which consumes one receive
 * posted there) tells the receiver which step of which call has landed.
 * Send/recv would work too, but would need one posted receive buffer per
 * chunk in flight and, for the allgather, a copy into place.
 *
 * The result is out of place (src stays as it was), as MPI_Allreduce with
 * distinct buffers. Rank r's element i is a small integer drawn from (r, i
 * and the call's number), so that every sum is exact in float and every
 * rank checks its result bit for bit against the serial sum.
 */
#include <xport.h>

#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define AR_MAX_RANKS 256
#define AR_MAX_BYTES (16u << 20)
#define AR_RD_MAX (1u << 20)  /* recursive doubling is allowed up to here */
#define AR_WATCHDOG_S 60

/* What a write with immediate data says it finished: kind, step, call. */
enum ar_kind { AR_RS = 1, AR_AG, AR_RD, AR_PRE, AR_POST, AR_KINDS };
enum ar_algo { AR_AUTO, AR_RING, AR_RDOUBLING };

/* The one message: where the peer may write in this rank's memory. */
struct ar_keys {
  uint32_t len[2];
  unsigned char key[2][XPORT_RKEY_MAX_SIZE];
};

struct ar_peer;
struct ar_slot {
  struct ar_peer *peer;
  int owed;
  unsigned char buf[sizeof(struct ar_keys)];
};

struct ar_peer {
  int rank;
  xport_conn_t *conn;           /* NULL: no step of either algorithm talks to it */
  xport_rkey_t *result_key;     /* the peer's result buffer */
  xport_rkey_t *inbox_key;      /* the peer's inbox */
  struct ar_slot *slots;        /* receives kept posted */
  int nslots;
  int owed;                     /* slots whose receive is to be posted again */
  int keys_in;
};

struct ar {
  xport_ctx_t *ctx;
  xport_job_t *job;
  int me, n, pof2, log2n;
  struct ar_peer *peers;
  float *src, *result, *inbox;
  xport_mr_t *src_mr, *result_mr, *inbox_mr;
  size_t rd_off;                /* the recursive-doubling area of the inbox */
  size_t inbox_bytes;
  struct ar_keys keys;          /* this rank's, sent to every peer */
  /* Sender's rank + 1 per (call mod 4, kind, step): a peer may run one
   * call ahead of this rank, never two (see ar_ring, ar_rd). */
  uint16_t arrived[4][AR_KINDS][AR_MAX_RANKS];
  long writes_out, sends_out;
  unsigned seq;                 /* the number of the call under way */
  size_t switch_bytes;
};

static int ar_me = -1;

/* One line, written at once: the ranks share the launcher's stderr. */
static void ar_fail(const char *what, int rc, const xport_completion_t *c)
{
  fprintf(stderr, "allreduce: rank %d: %s: %s%s%s%s%s%s\n", ar_me, what, xport_strerror(rc),
          c && c->detail ? " (" : "", c && c->detail ? c->detail : "", c && c->detail ? ")" : "",
          c && c->hint ? "; hint: " : "", c && c->hint ? c->hint : "");
  exit(1);
}

static void ar_watchdog(int sig)
{
  static const char msg[] = "allreduce: watchdog: no progress for 60 s, giving up\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  (void)sig;
  _exit(2);
}

static double ar_now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Rank r's element i in call seq: a small integer, so sums are exact. */
static float ar_value(int r, size_t i, unsigned seq)
{
  return (float)((int)(((unsigned)r * 7u + (unsigned)i * 13u + seq * 5u) % 19u) - 9);
}

/* A receive pushed back with EAGAIN is owed, and posted again at the next
 * poll: every write with immediate data needs one, or it stalls its sender. */
static void ar_post_recv(struct ar_slot *s)
{
  int rc = xport_recv(s->peer->conn, s->buf, sizeof s->buf, NULL, s);
  if (rc == -XPORT_EAGAIN) {
    s->owed = 1;
    s->peer->owed++;
  } else if (rc) {
    ar_fail("post a receive", rc, NULL);
  }
}

static void ar_pay_owed(struct ar *ar)
{
  for (int r = 0; r < ar->n; r++) {
    struct ar_peer *p = &ar->peers[r];
    for (int k = 0; p->owed > 0 && k < p->nslots; k++) {
      if (!p->slots[k].owed)
        continue;
      p->slots[k].owed = 0;
      p->owed--;
      ar_post_recv(&p->slots[k]);
    }
  }
}

static void ar_on_imm(struct ar *ar, const struct ar_slot *s, uint32_t imm)
{
  unsigned seq = imm >> 24, kind = (imm >> 16) & 0xff, step = imm & 0xffff;
  if (kind == 0 || kind >= AR_KINDS || step >= AR_MAX_RANKS || ((seq - ar->seq) & 0xff) > 1) {
    fprintf(stderr, "allreduce: rank %d: unexpected immediate 0x%08x from rank %d\n", ar->me,
            (unsigned)imm, s->peer->rank);
    exit(1);
  }
  uint16_t *a = &ar->arrived[seq % 4][kind][step];
  if (*a) {
    fprintf(stderr, "allreduce: rank %d: immediate 0x%08x twice (rank %d, then rank %d)\n",
            ar->me, (unsigned)imm, *a - 1, s->peer->rank);
    exit(1);
  }
  *a = (uint16_t)(s->peer->rank + 1);
}

static void ar_on_keys(struct ar_peer *p, const unsigned char *buf, size_t len)
{
  struct ar_keys k;
  int rc;
  if (len != sizeof k) {
    fprintf(stderr, "allreduce: rank %d: a message of %zu bytes from rank %d, not its keys\n",
            ar_me, len, p->rank);
    exit(1);
  }
  memcpy(&k, buf, sizeof k);
  if (k.len[0] > XPORT_RKEY_MAX_SIZE || k.len[1] > XPORT_RKEY_MAX_SIZE || p->keys_in) {
    fprintf(stderr, "allreduce: rank %d: malformed keys from rank %d\n", ar_me, p->rank);
    exit(1);
  }
  if ((rc = xport_rkey_unpack(p->conn, k.key[0], k.len[0], &p->result_key)) ||
      (rc = xport_rkey_unpack(p->conn, k.key[1], k.len[1], &p->inbox_key)))
    ar_fail("unpack a peer's key", rc, NULL);
  p->keys_in = 1;
}

static const char *ar_op_name(xport_op_t op)
{
  switch (op) {
  case XPORT_OP_SEND: return "send";
  case XPORT_OP_RECV: return "receive";
  case XPORT_OP_WRITE: return "write";
  case XPORT_OP_REMOTE_WRITE_IMM: return "a peer's write";
  case XPORT_OP_DISCONNECT: return "disconnect";
  default: return "operation";
  }
}

static void ar_complete(struct ar *ar, const xport_completion_t *c)
{
  if (c->op == XPORT_OP_DISCONNECT) {
    char what[64];
    snprintf(what, sizeof what, "rank %d went away", xport_job_peer(ar->job, c->conn));
    ar_fail(what, c->status ? c->status : -XPORT_ECONNRESET, c);
  }
  if (c->status) {
    char what[64];
    snprintf(what, sizeof what, "%s with rank %d", ar_op_name(c->op),
             xport_job_peer(ar->job, c->conn));
    ar_fail(what, c->status, c);
  }
  struct ar_slot *s = c->user_ctx;
  switch (c->op) {
  case XPORT_OP_WRITE: ar->writes_out--; break;
  case XPORT_OP_SEND: ar->sends_out--; break;
  case XPORT_OP_REMOTE_WRITE_IMM:
    ar_on_imm(ar, s, c->imm);
    ar_post_recv(s);
    break;
  case XPORT_OP_RECV:
    ar_on_keys(s->peer, s->buf, c->len);
    ar_post_recv(s);
    break;
  default:
    fprintf(stderr, "allreduce: rank %d: unexpected completion (op %d)\n", ar->me, (int)c->op);
    exit(1);
  }
}

/* One round of progress. Spinning keeps the latency of small steps low;
 * the yield lets another rank run where ranks outnumber cores. */
static void ar_progress(struct ar *ar)
{
  xport_completion_t c[16];
  ar_pay_owed(ar);
  int got = xport_poll(ar->ctx, c, 16);
  if (got < 0)
    ar_fail("poll", got, NULL);
  if (got == 0)
    sched_yield();
  for (int i = 0; i < got; i++)
    ar_complete(ar, &c[i]);
}

static uint32_t ar_imm(const struct ar *ar, enum ar_kind kind, int step)
{
  return (ar->seq & 0xffu) << 24 | (uint32_t)kind << 16 | (uint32_t)step;
}

/* Writes len bytes at buf into the peer's region at off, telling it which
 * step this is. A full queue (EAGAIN) is waited out by making progress. */
static void ar_put(struct ar *ar, struct ar_peer *p, const float *buf, size_t len,
                   xport_mr_t *mr, const xport_rkey_t *key, size_t off, enum ar_kind kind,
                   int step)
{
  int rc;
  while ((rc = xport_write_imm(p->conn, buf, len, mr, key, off, ar_imm(ar, kind, step),
                               NULL)) == -XPORT_EAGAIN)
    ar_progress(ar);
  if (rc) {
    char what[64];
    snprintf(what, sizeof what, "write to rank %d", p->rank);
    ar_fail(what, rc, NULL);
  }
  ar->writes_out++;
}

/* Waits until rank from has finished step of kind in this call. */
static void ar_await(struct ar *ar, enum ar_kind kind, int step, int from)
{
  uint16_t *a = &ar->arrived[ar->seq % 4][kind][step];
  while (!*a)
    ar_progress(ar);
  if (*a != from + 1) {
    fprintf(stderr, "allreduce: rank %d: step %d of kind %d came from rank %d, not %d\n", ar->me,
            step, (int)kind, *a - 1, from);
    exit(1);
  }
  *a = 0;
}

/* A source buffer is the application's again only once its write completed. */
static void ar_drain(struct ar *ar)
{
  while (ar->writes_out > 0 || ar->sends_out > 0)
    ar_progress(ar);
}

/* Chunk c of n over count elements: [lo, hi). */
static size_t ar_chunk_lo(size_t count, int n, int c)
{
  return count * (size_t)c / (size_t)n;
}

/*
 * Ring: in reduce-scatter step s this rank writes chunk me-s into the next
 * rank's inbox (its own element at s = 0, the partial sum it made at s-1
 * later) and adds its own elements to chunk me-s-1 from the previous rank;
 * after n-1 steps it holds the whole sum of chunk me+1. The allgather then
 * passes finished chunks on, written straight into the next rank's result.
 *
 * Reusing the inbox from one call to the next is safe without further
 * handshake: the previous rank writes chunk slot c of call k+1 only after
 * finishing call k, which took the whole sum of every chunk, and so this
 * rank's reduce-scatter of call k (which consumed the slots) was done.
 */
static void ar_ring(struct ar *ar, size_t count)
{
  int n = ar->n, me = ar->me;
  struct ar_peer *next = &ar->peers[(me + 1) % n];
  int prev = (me + n - 1) % n;
  for (int s = 0; s < n - 1; s++) {
    int cs = ((me - s) % n + n) % n, cr = ((me - s - 1) % n + n) % n;
    size_t lo = ar_chunk_lo(count, n, cs), hi = ar_chunk_lo(count, n, cs + 1);
    const float *from = s == 0 ? ar->src : ar->result;
    ar_put(ar, next, from + lo, (hi - lo) * sizeof(float), s == 0 ? ar->src_mr : ar->result_mr,
           next->inbox_key, lo * sizeof(float), AR_RS, s);
    ar_await(ar, AR_RS, s, prev);
    lo = ar_chunk_lo(count, n, cr);
    hi = ar_chunk_lo(count, n, cr + 1);
    for (size_t i = lo; i < hi; i++)
      ar->result[i] = ar->inbox[i] + ar->src[i];
  }
  for (int s = 0; s < n - 1; s++) {
    int cs = ((me + 1 - s) % n + n) % n;
    size_t lo = ar_chunk_lo(count, n, cs), hi = ar_chunk_lo(count, n, cs + 1);
    ar_put(ar, next, ar->result + lo, (hi - lo) * sizeof(float), ar->result_mr,
           next->result_key, lo * sizeof(float), AR_AG, s);
    ar_await(ar, AR_AG, s, prev);
  }
  /* The chunks this rank read from result while sending may be written by
   * the previous rank in the next call only after this one's reduce-scatter
   * of it: this rank's writes must have let go of them by then. */
  ar_drain(ar);
}

/* The recursive-doubling area: a slot per step and one for the extra
 * rank's vector, twice (by the call's parity): a partner may start call
 * k+1 and write before this rank has read what it wrote in call k. */
static size_t ar_rd_slot(const struct ar *ar, int step)
{
  size_t per_call = (size_t)(ar->log2n + 1) * AR_RD_MAX;
  return ar->rd_off + (ar->seq & 1) * per_call + (size_t)step * AR_RD_MAX;
}

static void ar_add_inbox(struct ar *ar, size_t off, size_t count)
{
  const float *in = (const float *)((const char *)ar->inbox + off);
  for (size_t i = 0; i < count; i++)
    ar->result[i] += in[i];
}

/*
 * Recursive doubling: log2(pof2) exchanges of the whole vector, with the
 * partner whose rank differs in bit k. Ranks from pof2 up (n not a power of
 * two) first hand their vector to rank me - pof2, which adds it in and, at
 * the end, writes the sum straight into their result.
 */
static void ar_rd(struct ar *ar, size_t count)
{
  size_t bytes = count * sizeof(float);
  int me = ar->me, extra = ar->n - ar->pof2;
  if (me >= ar->pof2) {
    struct ar_peer *p = &ar->peers[me - ar->pof2];
    ar_put(ar, p, ar->src, bytes, ar->src_mr, p->inbox_key, ar_rd_slot(ar, ar->log2n), AR_PRE, 0);
    ar_await(ar, AR_POST, 0, p->rank);
    ar_drain(ar);
    return;
  }
  memcpy(ar->result, ar->src, bytes);
  if (me < extra) {
    ar_await(ar, AR_PRE, 0, me + ar->pof2);
    ar_add_inbox(ar, ar_rd_slot(ar, ar->log2n), count);
  }
  for (int k = 0; k < ar->log2n; k++) {
    struct ar_peer *p = &ar->peers[me ^ (1 << k)];
    ar_put(ar, p, ar->result, bytes, ar->result_mr, p->inbox_key, ar_rd_slot(ar, k), AR_RD, k);
    ar_await(ar, AR_RD, k, p->rank);
    ar_drain(ar); /* result is the write's source until it completes */
    ar_add_inbox(ar, ar_rd_slot(ar, k), count);
  }
  if (me < extra) {
    struct ar_peer *p = &ar->peers[me + ar->pof2];
    ar_put(ar, p, ar->result, bytes, ar->result_mr, p->result_key, 0, AR_POST, 0);
  }
  ar_drain(ar);
}

static enum ar_algo ar_pick(const struct ar *ar, size_t count, enum ar_algo want)
{
  if (want == AR_AUTO)
    want = count * sizeof(float) <= ar->switch_bytes ? AR_RDOUBLING : AR_RING;
  /* The ring needs a non-empty chunk per rank; recursive doubling's slots
   * are AR_RD_MAX bytes. */
  if (want == AR_RING && count < (size_t)ar->n)
    want = AR_RDOUBLING;
  if (want == AR_RDOUBLING && count * sizeof(float) > AR_RD_MAX)
    want = AR_RING;
  return want;
}

/* result = the sum over ranks of src (count floats), on every rank. */
static enum ar_algo ar_allreduce(struct ar *ar, size_t count, enum ar_algo want)
{
  enum ar_algo algo = ar_pick(ar, count, want);
  if (ar->n == 1)
    memcpy(ar->result, ar->src, count * sizeof(float));
  else if (algo == AR_RING)
    ar_ring(ar, count);
  else
    ar_rd(ar, count);
  ar->seq++;
  return algo;
}

/* ---- setup: connections, regions, keys --------------------------------- */

/* Whether some step of either algorithm has me and r talk. */
static int ar_talks_to(const struct ar *ar, int r)
{
  int me = ar->me, n = ar->n;
  if (r == me)
    return 0;
  if (r == (me + 1) % n || r == (me + n - 1) % n)
    return 1;
  if (me >= ar->pof2 || r >= ar->pof2)
    return r == me - ar->pof2 || r == me + ar->pof2;
  int d = me ^ r;
  return (d & (d - 1)) == 0;
}

static void *ar_alloc(size_t len)
{
  void *p = NULL;
  if (posix_memalign(&p, 4096, len)) {
    fprintf(stderr, "allreduce: rank %d: out of memory (%zu bytes)\n", ar_me, len);
    exit(1);
  }
  return p;
}

static void ar_register(struct ar *ar)
{
  int rc;
  ar->rd_off = AR_MAX_BYTES;
  ar->inbox_bytes = ar->rd_off + 2 * (size_t)(ar->log2n + 1) * AR_RD_MAX;
  ar->src = ar_alloc(AR_MAX_BYTES);
  ar->result = ar_alloc(AR_MAX_BYTES);
  ar->inbox = ar_alloc(ar->inbox_bytes);
  /* Touched once here, so that first-touch page faults stay out of the
   * timings. */
  memset(ar->src, 0, AR_MAX_BYTES);
  memset(ar->result, 0, AR_MAX_BYTES);
  memset(ar->inbox, 0, ar->inbox_bytes);
  if ((rc = xport_mr_reg(ar->ctx, ar->src, AR_MAX_BYTES, XPORT_ACCESS_LOCAL, &ar->src_mr)) ||
      (rc = xport_mr_reg(ar->ctx, ar->result, AR_MAX_BYTES,
                         XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE, &ar->result_mr)) ||
      (rc = xport_mr_reg(ar->ctx, ar->inbox, ar->inbox_bytes,
                         XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE, &ar->inbox_mr)))
    ar_fail("register memory", rc, NULL);
  if ((rc = xport_rkey_pack(ar->result_mr, 0, AR_MAX_BYTES, ar->keys.key[0],
                            sizeof ar->keys.key[0])) < 0)
    ar_fail("pack a key", rc, NULL);
  ar->keys.len[0] = (uint32_t)rc;
  if ((rc = xport_rkey_pack(ar->inbox_mr, 0, ar->inbox_bytes, ar->keys.key[1],
                            sizeof ar->keys.key[1])) < 0)
    ar_fail("pack a key", rc, NULL);
  ar->keys.len[1] = (uint32_t)rc;
}

/* Connects to every rank a step talks to and posts its receives: the
 * first takes the peer's keys, the rest the immediates of its writes. */
static void ar_connect(struct ar *ar)
{
  int rc;
  for (int r = 0; r < ar->n; r++) {
    struct ar_peer *p = &ar->peers[r];
    p->rank = r;
    if (!ar_talks_to(ar, r))
      continue;
    if ((rc = xport_job_conn(ar->job, r, &p->conn)))
      ar_fail("connect to a rank", rc, NULL);
    xport_caps_t caps;
    if ((rc = xport_conn_query(p->conn, &caps)))
      ar_fail("query a connection", rc, NULL);
    /* A peer can be one call ahead: 2(n-1) ring steps per call, twice. */
    p->nslots = 4 * ar->n + 4;
    if ((size_t)p->nslots > caps.rx_depth)
      p->nslots = (int)caps.rx_depth;
    if (caps.max_msg_size < AR_MAX_BYTES) {
      fprintf(stderr, "allreduce: rank %d: %s carries at most %zu bytes per write\n", ar->me,
              caps.provider, caps.max_msg_size);
      exit(1);
    }
    if (!(p->slots = calloc((size_t)p->nslots, sizeof *p->slots)))
      ar_fail("allocate receives", -XPORT_ENOMEM, NULL);
    for (int k = 0; k < p->nslots; k++) {
      p->slots[k].peer = p;
      ar_post_recv(&p->slots[k]);
    }
  }
}

static void ar_exchange_keys(struct ar *ar)
{
  int rc;
  if ((rc = xport_job_barrier(ar->job))) /* every receive for the keys is posted */
    ar_fail("barrier", rc, NULL);
  for (int r = 0; r < ar->n; r++) {
    struct ar_peer *p = &ar->peers[r];
    if (!p->conn)
      continue;
    while ((rc = xport_send(p->conn, &ar->keys, sizeof ar->keys, NULL, NULL)) == -XPORT_EAGAIN)
      ar_progress(ar);
    if (rc)
      ar_fail("send the keys", rc, NULL);
    ar->sends_out++;
  }
  for (int r = 0; r < ar->n; r++)
    while (ar->peers[r].conn && !ar->peers[r].keys_in)
      ar_progress(ar);
  ar_drain(ar);
}

static void ar_open(struct ar *ar)
{
  int rc;
  if ((rc = xport_ctx_create(NULL, &ar->ctx)))
    ar_fail("create a context", rc, NULL);
  if ((rc = xport_job_init(ar->ctx, &ar->job)))
    ar_fail("join the job", rc, NULL);
  ar->me = ar_me = xport_job_rank(ar->job);
  ar->n = xport_job_size(ar->job);
  if (ar->me < 0 || ar->n < 1)
    ar_fail("rank or size", ar->me < 0 ? ar->me : ar->n, NULL);
  if (ar->n > AR_MAX_RANKS) {
    fprintf(stderr, "allreduce: %d ranks; this example handles at most %d\n", ar->n, AR_MAX_RANKS);
    exit(1);
  }
  for (ar->pof2 = 1, ar->log2n = 0; ar->pof2 * 2 <= ar->n; ar->pof2 *= 2)
    ar->log2n++;
  if (!(ar->peers = calloc((size_t)ar->n, sizeof *ar->peers)))
    ar_fail("allocate", -XPORT_ENOMEM, NULL);
  ar_register(ar);
  ar_connect(ar);
  ar_exchange_keys(ar);
}

static void ar_close(struct ar *ar)
{
  int rc;
  /* Keys before the job closes their connections, regions before the
   * context goes: each after the last operation that used it. */
  for (int r = 0; r < ar->n; r++) {
    xport_rkey_release(ar->peers[r].result_key);
    xport_rkey_release(ar->peers[r].inbox_key);
  }
  if ((rc = xport_job_fini(ar->job)))
    ar_fail("leave the job", rc, NULL);
  xport_mr_dereg(ar->src_mr);
  xport_mr_dereg(ar->result_mr);
  xport_mr_dereg(ar->inbox_mr);
  if ((rc = xport_ctx_destroy(ar->ctx)))
    ar_fail("destroy the context", rc, NULL);
  /* The receive slots were xport's until the context went. */
  for (int r = 0; r < ar->n; r++)
    free(ar->peers[r].slots);
  free(ar->peers);
  free(ar->src);
  free(ar->result);
  free(ar->inbox);
}

/* ---- data and verification ----------------------------------------------- */

struct ar_opts {
  int check, corrupt, iters;
  enum ar_algo algo;
  size_t switch_bytes;
};

static void ar_fill(struct ar *ar, size_t count, int corrupt)
{
  for (size_t i = 0; i < count; i++)
    ar->src[i] = ar_value(ar->me, i, ar->seq);
  /* One wrong contribution: every rank's sum is then off at one element. */
  if (corrupt && ar->me == (ar->n > 1 ? 1 : 0))
    ar->src[count / 2] += 1.0f;
  memset(ar->result, 0xff, count * sizeof(float)); /* NaNs: a stale result cannot pass */
}

/* Compares the result of call seq bit for bit with the serial sum; returns
 * the number of wrong elements, after saying where the first is. */
static long ar_verify(const struct ar *ar, size_t count, unsigned seq, const char *algo)
{
  static int said; /* the first wrong element of a rank is enough to read */
  long bad = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0.0f;
    for (int r = 0; r < ar->n; r++)
      want += ar_value(r, i, seq);
    if (memcmp(&want, &ar->result[i], sizeof want) == 0)
      continue;
    if (bad++ == 0 && !said++)
      fprintf(stderr,
              "allreduce: rank %d: mismatch at element %zu of %zu (%s, call %u): %g, want %g\n",
              ar->me, i, count, algo, seq, (double)ar->result[i], (double)want);
  }
  return bad;
}

static const char *ar_algo_name(enum ar_algo a)
{
  return a == AR_RING ? "ring" : a == AR_RDOUBLING ? "rd" : "auto";
}

/* One verified call: fresh data, poisoned result, every element checked. */
static long ar_checked_call(struct ar *ar, size_t count, enum ar_algo want, int corrupt)
{
  unsigned seq = ar->seq;
  ar_fill(ar, count, corrupt);
  enum ar_algo got = ar_allreduce(ar, count, want);
  return ar_verify(ar, count, seq, ar_algo_name(got));
}

/* The sum over ranks of a few numbers, by the allreduce itself. */
static void ar_sum_small(struct ar *ar, float *v, size_t k)
{
  memcpy(ar->src, v, k * sizeof *v);
  ar_allreduce(ar, k, AR_RDOUBLING);
  memcpy(v, ar->result, k * sizeof *v);
}

/* Names the transports of this rank's connections, e.g. "xshm", or
 * "xshm, tcp" for ranks on two nodes. */
static void ar_transports(const struct ar *ar, char *buf, size_t len)
{
  xport_caps_t seen[AR_MAX_RANKS];
  int k = 0;
  snprintf(buf, len, "%s", ar->n == 1 ? "no transport (one rank)" : "");
  for (int r = 0; r < ar->n; r++) {
    if (!ar->peers[r].conn || xport_conn_query(ar->peers[r].conn, &seen[k]))
      continue;
    int dup = 0;
    for (int j = 0; j < k; j++)
      dup |= !strcmp(seen[j].provider, seen[k].provider);
    if (dup)
      continue;
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s", used ? ", " : "", seen[k++].provider);
  }
}

/* ---- the two modes ----------------------------------------------------------- */

/* A few sizes (some not a multiple of the rank count), each by both
 * algorithms, three calls each; exit 0 only if every rank verified all. */
static int ar_run_check(struct ar *ar, const struct ar_opts *o)
{
  static const size_t sizes[] = {8, 1024, 4096 + 12, 65536, 262144 + 4, 1u << 20};
  static const enum ar_algo algos[] = {AR_RING, AR_RDOUBLING};
  const int nsizes = (int)(sizeof sizes / sizeof sizes[0]), iters = 3;
  long bad = 0, calls = 0;
  for (int z = 0; z < nsizes; z++) {
    alarm(AR_WATCHDOG_S);
    for (int a = 0; a < 2; a++)
      for (int it = 0; it < iters; it++, calls++)
        bad += ar_checked_call(ar, sizes[z] / sizeof(float), algos[a], o->corrupt);
  }
  float total = (float)bad;
  ar_sum_small(ar, &total, 1);
  if (ar->me == 0) {
    char tr[128];
    ar_transports(ar, tr, sizeof tr);
    if (total == 0.0f)
      printf("allreduce: ok: %d ranks over %s: %ld calls (%d sizes from %zu B to %zu KiB, ring "
             "and recursive doubling, %d each) verified bit for bit on every rank\n",
             ar->n, tr, calls, nsizes, sizes[0], sizes[nsizes - 1] >> 10, iters);
    else
      printf("allreduce: FAILED: %.0f wrong elements over all ranks\n", (double)total);
  }
  return bad == 0 && total == 0.0f ? 0 : 1;
}

static int ar_iters_for(size_t bytes, const struct ar_opts *o)
{
  if (o->iters > 0)
    return o->iters;
  size_t k = (64u << 20) / bytes;
  return k < 5 ? 5 : k > 200 ? 200 : (int)k;
}

/* One row: avg time over the ranks, and nccl-tests' algbw and busbw. */
static long ar_bench_size(struct ar *ar, size_t bytes, const struct ar_opts *o)
{
  size_t count = bytes / sizeof(float);
  int iters = ar_iters_for(bytes, o), rc;
  enum ar_algo algo = ar_pick(ar, count, o->algo);
  alarm(AR_WATCHDOG_S);
  ar_fill(ar, count, 0);
  for (int w = 0; w < 2; w++)
    ar_allreduce(ar, count, algo);
  if ((rc = xport_job_barrier(ar->job)))
    ar_fail("barrier", rc, NULL);
  double t0 = ar_now_us();
  for (int it = 0; it < iters; it++) {
    if (it % 64 == 0)
      alarm(AR_WATCHDOG_S); /* the watchdog is for a stall, not a long run */
    ar_allreduce(ar, count, algo);
  }
  double us = (ar_now_us() - t0) / iters;
  long bad = ar_checked_call(ar, count, algo, o->corrupt);
  float v[2] = {(float)us, (float)bad};
  ar_sum_small(ar, v, 2);
  if (ar->me == 0) {
    double avg = v[0] / ar->n, algbw = bytes / avg / 1e3;
    printf("%12zu %10zu %5s %6d %11.2f %11.3f %11.3f  %s\n", bytes, count, ar_algo_name(algo),
           iters, avg, algbw, algbw * 2.0 * (ar->n - 1) / ar->n, v[1] == 0.0f ? "ok" : "WRONG");
    fflush(stdout);
  }
  return bad + (long)v[1];
}

static int ar_run_bench(struct ar *ar, const struct ar_opts *o)
{
  char tr[128];
  ar_transports(ar, tr, sizeof tr);
  if (ar->me == 0) {
    printf("# allreduce: %d ranks over %s, float sum, out of place; ring above %zu B, "
           "recursive doubling at and below (--algo %s)\n",
           ar->n, tr, ar->switch_bytes, ar_algo_name(o->algo));
    printf("# time: average over iterations and ranks; algbw = size / time, "
           "busbw = algbw * 2(n-1)/n\n");
    printf("#%11s %10s %5s %6s %11s %11s %11s  %s\n", "size(B)", "count", "algo", "iters",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
    fflush(stdout); /* a launcher's pipe: each row as it comes */
  }
  long bad = 0;
  for (size_t bytes = 8; bytes <= AR_MAX_BYTES; bytes = bytes < 16 ? 16 : bytes * 4)
    bad += ar_bench_size(ar, bytes, o);
  if (ar->me == 0)
    printf(bad ? "allreduce: FAILED: a result was wrong (see above)\n"
               : "allreduce: ok: every size verified bit for bit on every rank\n");
  return bad ? 1 : 0;
}

static void ar_usage(void)
{
  fprintf(stderr, "usage: allreduce [--check] [--algo ring|rd|auto] [--switch BYTES] "
                  "[--iters N] [--corrupt]\n");
  exit(2);
}

static void ar_parse(int argc, char **argv, struct ar_opts *o)
{
  *o = (struct ar_opts){.algo = AR_AUTO, .switch_bytes = 64u << 10};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--check"))
      o->check = 1;
    else if (!strcmp(a, "--corrupt"))
      o->corrupt = 1;
    else if (!strcmp(a, "--algo") && v) {
      o->algo = !strcmp(v, "ring") ? AR_RING : !strcmp(v, "rd") ? AR_RDOUBLING : AR_AUTO;
      if (o->algo == AR_AUTO && strcmp(v, "auto"))
        ar_usage();
      i++;
    } else if (!strcmp(a, "--switch") && v) {
      o->switch_bytes = strtoul(v, NULL, 0);
      if (o->switch_bytes > AR_RD_MAX)
        o->switch_bytes = AR_RD_MAX;
      i++;
    } else if (!strcmp(a, "--iters") && v) {
      o->iters = atoi(v);
      if (o->iters < 1)
        ar_usage();
      i++;
    } else {
      ar_usage();
    }
  }
}

int main(int argc, char **argv)
{
  struct ar_opts o;
  struct ar ar = {0};
  ar_parse(argc, argv, &o);
  signal(SIGALRM, ar_watchdog);
  alarm(AR_WATCHDOG_S); /* wire-up included: a rank that never comes is a hang */
  ar.switch_bytes = o.switch_bytes;
  ar_open(&ar);
  int rc = o.check ? ar_run_check(&ar, &o) : ar_run_bench(&ar, &o);
  alarm(AR_WATCHDOG_S);
  ar_close(&ar);
  return rc;
}
