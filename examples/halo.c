/*
 * halo: the nearest-neighbour exchange of a stencil code. The ranks of a
 * job form a px x py grid; each owns an N x N tile of a 2-D field with a
 * ring of ghost cells around it and runs Jacobi sweeps of the 5-point
 * stencil, exchanging its four edges with its neighbours every iteration.
 *
 *   mpirun -np 4 ./examples/halo            time per iteration (tile 512, 200 iterations)
 *   mpirun -np 4 ./examples/halo --check    a small grid, verified bit for bit
 *   (as root: mpirun --allow-run-as-root --oversubscribe ...; srun --mpi=pmix works too)
 *
 * Options: --n N (tile side), --iters T, --corrupt (rank 0 starts from one
 * wrong cell: the verification must say so).
 *
 * Each edge goes by xport_write_imm straight into the neighbour's
 * registered ghost buffer; the immediate value says which side and which
 * iteration, and consumes one receive kept posted there. Ghost buffers
 * are double-buffered by the iteration's parity: a neighbour writes those
 * of iteration t+2 only after this rank has sent its edges of t+1, which
 * it does after using those of t. While the edges travel, the rank updates
 * the cells that need no ghost; then it waits for the ghosts and updates
 * the tile's border.
 *
 * Verification: every rank also runs the whole grid serially, with the
 * same function per cell (so the same floating-point operations in the
 * same order), and compares its tile bit for bit. Rank 0 collects every
 * rank's time and verdict.
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

#define HALO_WATCHDOG_S 60
#define HALO_SLOTS 8 /* a neighbour is at most one iteration (two edges) ahead */

enum halo_side { HALO_N, HALO_S, HALO_W, HALO_E, HALO_SIDES };
enum halo_type { HALO_KEY = 1, HALO_REPORT };

/* The only messages: a ghost buffer's key, and a rank's report to rank 0. */
struct halo_msg {
  uint32_t type, len;
  union {
    unsigned char key[XPORT_RKEY_MAX_SIZE];
    struct {
      double us;
      int64_t bad;
    } report;
  } u;
};

struct halo_peer;
struct halo_slot {
  struct halo_peer *peer;
  int owed;
  struct halo_msg msg;
};

struct halo_peer {
  int rank;
  xport_conn_t *conn;
  xport_rkey_t *ghost_key;       /* the neighbour's ghost buffer */
  struct halo_slot slots[HALO_SLOTS];
  int owed, keys_in;
};

struct halo {
  xport_ctx_t *ctx;
  xport_job_t *job;
  int me, n, px, py, cx, cy, tile, iters;
  size_t stride;                 /* tile + 2: a row with its two ghost cells */
  double *u, *v;                 /* the tile and its next iterate, ghosts included */
  double *ghost, *edge;          /* [parity][side][tile]: landed, and to send */
  xport_mr_t *ghost_mr, *edge_mr;
  struct halo_peer *peers;       /* by rank */
  struct halo_peer *nb[HALO_SIDES];
  long arrived[2][HALO_SIDES];   /* iteration + 1 whose ghost landed there */
  long writes_out[2], sends_out;
  int reports_in;
  double max_us, min_us;
  long bad_total;
};

static int halo_me = -1;

/* One line, written at once: the ranks share the launcher's stderr. */
static void halo_fail(const char *what, int rc, const xport_completion_t *c)
{
  fprintf(stderr, "halo: rank %d: %s: %s%s%s%s%s%s\n", halo_me, what, xport_strerror(rc),
          c && c->detail ? " (" : "", c && c->detail ? c->detail : "", c && c->detail ? ")" : "",
          c && c->hint ? "; hint: " : "", c && c->hint ? c->hint : "");
  exit(1);
}

static void halo_watchdog(int sig)
{
  static const char msg[] = "halo: watchdog: no progress for 60 s, giving up\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  (void)sig;
  _exit(2);
}

static double halo_now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- the stencil, shared by the ranks and the serial reference ---------- */

/* Integer starting values; the division by 4 then makes them fractional,
 * and only the identical order of operations keeps runs comparable. */
static double halo_initial(long gy, long gx)
{
  return (double)((gy * 37 + gx * 101) % 97);
}

/* Rows y0..y1-1, columns x0..x1-1 of a field with one ghost ring, rows
 * stride apart. No multiply feeds an add, so no compiler can fuse one. */
static void halo_sweep(const double *u, double *v, size_t stride, size_t y0, size_t y1, size_t x0,
                       size_t x1)
{
  for (size_t y = y0; y < y1; y++)
    for (size_t x = x0; x < x1; x++) {
      size_t k = y * stride + x;
      v[k] = ((u[k - stride] + u[k + stride]) + (u[k - 1] + u[k + 1])) * 0.25;
    }
}

/* ---- progress ------------------------------------------------------------ */

static void halo_post_recv(struct halo_slot *s)
{
  int rc = xport_recv(s->peer->conn, &s->msg, sizeof s->msg, NULL, s);
  if (rc == -XPORT_EAGAIN) { /* owed: posted again at the next poll */
    s->owed = 1;
    s->peer->owed++;
  } else if (rc) {
    halo_fail("post a receive", rc, NULL);
  }
}

static void halo_pay_owed(struct halo *h)
{
  for (int r = 0; r < h->n; r++) {
    struct halo_peer *p = &h->peers[r];
    for (int k = 0; p->owed > 0 && k < HALO_SLOTS; k++) {
      if (!p->slots[k].owed)
        continue;
      p->slots[k].owed = 0;
      p->owed--;
      halo_post_recv(&p->slots[k]);
    }
  }
}

/* imm: the iteration << 2 | the side of the receiver it lands on. */
static void halo_on_imm(struct halo *h, const struct halo_slot *s, uint32_t imm)
{
  int side = imm & 3;
  long it = imm >> 2;
  long *a = &h->arrived[it & 1][side];
  if (h->nb[side] != s->peer || it >= h->iters || *a) {
    fprintf(stderr, "halo: rank %d: unexpected edge (side %d, iteration %ld) from rank %d\n",
            h->me, side, it, s->peer->rank);
    exit(1);
  }
  *a = it + 1;
}

static void halo_on_msg(struct halo *h, struct halo_slot *s, size_t len)
{
  const struct halo_msg *m = &s->msg;
  int rc;
  if (len == sizeof *m && m->type == HALO_KEY && m->len <= sizeof m->u.key && !s->peer->keys_in) {
    if ((rc = xport_rkey_unpack(s->peer->conn, m->u.key, m->len, &s->peer->ghost_key)))
      halo_fail("unpack a neighbour's key", rc, NULL);
    s->peer->keys_in = 1;
  } else if (len == sizeof *m && m->type == HALO_REPORT && h->me == 0) {
    h->reports_in++;
    h->bad_total += (long)m->u.report.bad;
    if (m->u.report.us > h->max_us)
      h->max_us = m->u.report.us;
    if (m->u.report.us < h->min_us)
      h->min_us = m->u.report.us;
  } else {
    fprintf(stderr, "halo: rank %d: a malformed message (%zu bytes) from rank %d\n", h->me, len,
            s->peer->rank);
    exit(1);
  }
}

static void halo_complete(struct halo *h, const xport_completion_t *c)
{
  char what[64];
  if (c->op == XPORT_OP_DISCONNECT) {
    snprintf(what, sizeof what, "rank %d went away", xport_job_peer(h->job, c->conn));
    halo_fail(what, c->status ? c->status : -XPORT_ECONNRESET, c);
  }
  if (c->status) {
    static const char *const names[] = {"operation", "send", "receive", "disconnect", "write",
                                        "read", "a neighbour's write", "atomic"};
    snprintf(what, sizeof what, "%s with rank %d",
             c->op >= 0 && c->op <= XPORT_OP_ATOMIC ? names[c->op] : names[0],
             xport_job_peer(h->job, c->conn));
    halo_fail(what, c->status, c);
  }
  struct halo_slot *s = c->user_ctx;
  switch (c->op) {
  case XPORT_OP_WRITE: h->writes_out[(uintptr_t)c->user_ctx & 1]--; break;
  case XPORT_OP_SEND: h->sends_out--; break;
  case XPORT_OP_REMOTE_WRITE_IMM:
    halo_on_imm(h, s, c->imm);
    halo_post_recv(s);
    break;
  case XPORT_OP_RECV:
    halo_on_msg(h, s, c->len);
    halo_post_recv(s);
    break;
  default:
    fprintf(stderr, "halo: rank %d: unexpected completion (op %d)\n", h->me, (int)c->op);
    exit(1);
  }
}

/* Spins for latency; the yield lets another rank run where ranks
 * outnumber cores. */
static void halo_progress(struct halo *h)
{
  xport_completion_t c[16];
  halo_pay_owed(h);
  int got = xport_poll(h->ctx, c, 16);
  if (got < 0)
    halo_fail("poll", got, NULL);
  if (got == 0)
    sched_yield();
  for (int i = 0; i < got; i++)
    halo_complete(h, &c[i]);
}

static void halo_send(struct halo *h, struct halo_peer *p, const struct halo_msg *m)
{
  int rc;
  while ((rc = xport_send(p->conn, m, sizeof *m, NULL, NULL)) == -XPORT_EAGAIN)
    halo_progress(h);
  if (rc)
    halo_fail("send", rc, NULL);
  h->sends_out++;
}

/* ---- one iteration ------------------------------------------------------- */

static double *halo_slot_of(double *base, const struct halo *h, int par, int side)
{
  return base + ((size_t)par * HALO_SIDES + (size_t)side) * (size_t)h->tile;
}

/* Copies the tile's edge on side into out (interior rows and columns are
 * 1..tile; the ghost ring is row/column 0 and tile+1). */
static void halo_pack(const struct halo *h, int side, double *out)
{
  size_t t = (size_t)h->tile, st = h->stride;
  for (size_t i = 1; i <= t; i++) {
    size_t k = side == HALO_N ? st + i : side == HALO_S ? t * st + i
             : side == HALO_W ? i * st + 1 : i * st + t;
    out[i - 1] = h->u[k];
  }
}

static void halo_unpack(struct halo *h, int side, const double *in)
{
  size_t t = (size_t)h->tile, st = h->stride;
  for (size_t i = 1; i <= t; i++) {
    size_t k = side == HALO_N ? i : side == HALO_S ? (t + 1) * st + i
             : side == HALO_W ? i * st : i * st + t + 1;
    h->u[k] = in[i - 1];
  }
}

/* Sends this rank's edges of iteration it, each into the ghost buffer of
 * the neighbour's opposite side. */
static void halo_send_edges(struct halo *h, long it)
{
  int par = (int)(it & 1), rc;
  /* edge[par] was the source of iteration it-2's writes. */
  while (h->writes_out[par] > 0)
    halo_progress(h);
  for (int s = 0; s < HALO_SIDES; s++) {
    struct halo_peer *p = h->nb[s];
    if (!p)
      continue;
    double *e = halo_slot_of(h->edge, h, par, s);
    halo_pack(h, s, e);
    size_t off = (size_t)(halo_slot_of(h->ghost, h, par, s ^ 1) - h->ghost) * sizeof(double);
    uint32_t imm = (uint32_t)it << 2 | (uint32_t)(s ^ 1);
    while ((rc = xport_write_imm(p->conn, e, (size_t)h->tile * sizeof(double), h->edge_mr,
                                 p->ghost_key, off, imm, (void *)(uintptr_t)par)) ==
           -XPORT_EAGAIN)
      halo_progress(h);
    if (rc)
      halo_fail("write an edge", rc, NULL);
    h->writes_out[par]++;
  }
}

static void halo_recv_ghosts(struct halo *h, long it)
{
  int par = (int)(it & 1);
  for (int s = 0; s < HALO_SIDES; s++) {
    if (!h->nb[s])
      continue;
    while (h->arrived[par][s] != it + 1)
      halo_progress(h);
    h->arrived[par][s] = 0;
    halo_unpack(h, s, halo_slot_of(h->ghost, h, par, s));
  }
}

/* One Jacobi iteration: the cells that need no ghost while the edges
 * travel, then the border once the neighbours' edges have landed. */
static void halo_iterate(struct halo *h, long it)
{
  size_t t = (size_t)h->tile, st = h->stride;
  halo_send_edges(h, it);
  halo_sweep(h->u, h->v, st, 2, t, 2, t);
  halo_recv_ghosts(h, it);
  halo_sweep(h->u, h->v, st, 1, 2, 1, t + 1);
  halo_sweep(h->u, h->v, st, t, t + 1, 1, t + 1);
  halo_sweep(h->u, h->v, st, 2, t, 1, 2);
  halo_sweep(h->u, h->v, st, 2, t, t, t + 1);
  double *w = h->u;
  h->u = h->v;
  h->v = w;
}

/* ---- setup ------------------------------------------------------------------- */

static void *halo_calloc(size_t n, size_t size)
{
  void *p = calloc(n, size);
  if (!p) {
    fprintf(stderr, "halo: rank %d: out of memory\n", halo_me);
    exit(1);
  }
  return p;
}

/* The most square px x py = n. */
static void halo_grid(struct halo *h)
{
  h->px = 1;
  for (int d = 1; d * d <= h->n; d++)
    if (h->n % d == 0)
      h->px = d;
  h->py = h->n / h->px;
  h->cx = h->me % h->px;
  h->cy = h->me / h->px;
}

static void halo_register(struct halo *h)
{
  size_t cells = h->stride * h->stride, ghosts = 2 * HALO_SIDES * (size_t)h->tile;
  int rc;
  h->u = halo_calloc(cells, sizeof(double));
  h->v = halo_calloc(cells, sizeof(double));
  h->ghost = halo_calloc(ghosts, sizeof(double));
  h->edge = halo_calloc(ghosts, sizeof(double));
  if ((rc = xport_mr_reg(h->ctx, h->ghost, ghosts * sizeof(double),
                         XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE, &h->ghost_mr)) ||
      (rc = xport_mr_reg(h->ctx, h->edge, ghosts * sizeof(double), XPORT_ACCESS_LOCAL,
                         &h->edge_mr)))
    halo_fail("register memory", rc, NULL);
}

static void halo_connect_peer(struct halo *h, int r)
{
  struct halo_peer *p = &h->peers[r];
  int rc;
  if (p->conn)
    return;
  if ((rc = xport_job_conn(h->job, r, &p->conn)))
    halo_fail("connect to a rank", rc, NULL);
  for (int k = 0; k < HALO_SLOTS; k++) {
    p->slots[k].peer = p;
    halo_post_recv(&p->slots[k]);
  }
}

/* Neighbours, and rank 0 (which collects the reports) with every rank. */
static void halo_connect(struct halo *h)
{
  int nbr[HALO_SIDES] = {h->cy > 0 ? h->me - h->px : -1, h->cy < h->py - 1 ? h->me + h->px : -1,
                         h->cx > 0 ? h->me - 1 : -1, h->cx < h->px - 1 ? h->me + 1 : -1};
  for (int r = 0; r < h->n; r++)
    h->peers[r].rank = r;
  for (int s = 0; s < HALO_SIDES; s++)
    if (nbr[s] >= 0) {
      halo_connect_peer(h, nbr[s]);
      h->nb[s] = &h->peers[nbr[s]];
    }
  if (h->me != 0)
    halo_connect_peer(h, 0);
  for (int r = 1; h->me == 0 && r < h->n; r++)
    halo_connect_peer(h, r);
}

static void halo_exchange_keys(struct halo *h)
{
  struct halo_msg m = {.type = HALO_KEY};
  int rc = xport_rkey_pack(h->ghost_mr, 0, 2 * HALO_SIDES * (size_t)h->tile * sizeof(double),
                           m.u.key, sizeof m.u.key);
  if (rc < 0)
    halo_fail("pack a key", rc, NULL);
  m.len = (uint32_t)rc;
  if ((rc = xport_job_barrier(h->job))) /* every receive for the keys is posted */
    halo_fail("barrier", rc, NULL);
  for (int s = 0; s < HALO_SIDES; s++)
    if (h->nb[s])
      halo_send(h, h->nb[s], &m);
  for (int s = 0; s < HALO_SIDES; s++)
    while (h->nb[s] && !h->nb[s]->keys_in)
      halo_progress(h);
  while (h->sends_out > 0) /* m is the sends' buffer */
    halo_progress(h);
}

static void halo_init_tile(struct halo *h, int corrupt)
{
  for (int y = 1; y <= h->tile; y++)
    for (int x = 1; x <= h->tile; x++)
      h->u[(size_t)y * h->stride + (size_t)x] =
          halo_initial((long)h->cy * h->tile + y - 1, (long)h->cx * h->tile + x - 1);
  if (corrupt && h->me == 0)
    h->u[h->stride + 1] += 1.0;
}

static void halo_open(struct halo *h)
{
  int rc;
  if ((rc = xport_ctx_create(NULL, &h->ctx)))
    halo_fail("create a context", rc, NULL);
  if ((rc = xport_job_init(h->ctx, &h->job)))
    halo_fail("join the job", rc, NULL);
  h->me = halo_me = xport_job_rank(h->job);
  h->n = xport_job_size(h->job);
  if (h->me < 0 || h->n < 1)
    halo_fail("rank or size", h->me < 0 ? h->me : h->n, NULL);
  h->stride = (size_t)h->tile + 2;
  h->peers = halo_calloc((size_t)h->n, sizeof *h->peers);
  halo_grid(h);
  halo_register(h);
  halo_connect(h);
  halo_exchange_keys(h);
}

static void halo_close(struct halo *h)
{
  int rc;
  for (int r = 0; r < h->n; r++) /* keys before the job closes their connections */
    xport_rkey_release(h->peers[r].ghost_key);
  if ((rc = xport_job_fini(h->job)))
    halo_fail("leave the job", rc, NULL);
  xport_mr_dereg(h->ghost_mr);
  xport_mr_dereg(h->edge_mr);
  if ((rc = xport_ctx_destroy(h->ctx)))
    halo_fail("destroy the context", rc, NULL);
  free(h->peers); /* the receive slots were xport's until the context went */
  free(h->u);
  free(h->v);
  free(h->ghost);
  free(h->edge);
}

/* ---- verification and report -------------------------------------------------- */

/* Runs the whole grid serially and compares this rank's tile bit for bit;
 * returns the number of cells that differ. *us: the serial run's time. */
static long halo_verify(const struct halo *h, double *us)
{
  size_t gx = (size_t)h->px * h->tile, gy = (size_t)h->py * h->tile, gs = gx + 2;
  double *a = halo_calloc((gy + 2) * gs, sizeof(double));
  double *b = halo_calloc((gy + 2) * gs, sizeof(double));
  for (size_t y = 1; y <= gy; y++)
    for (size_t x = 1; x <= gx; x++)
      a[y * gs + x] = halo_initial((long)y - 1, (long)x - 1);
  double t0 = halo_now_us();
  for (int it = 0; it < h->iters; it++) {
    halo_sweep(a, b, gs, 1, gy + 1, 1, gx + 1);
    double *w = a;
    a = b;
    b = w;
  }
  *us = halo_now_us() - t0;
  long bad = 0;
  for (int y = 1; y <= h->tile; y++)
    for (int x = 1; x <= h->tile; x++) {
      size_t gk = ((size_t)h->cy * h->tile + y) * gs + (size_t)h->cx * h->tile + x;
      const double *mine = &h->u[(size_t)y * h->stride + (size_t)x];
      if (memcmp(mine, &a[gk], sizeof *mine) && bad++ == 0)
        fprintf(stderr, "halo: rank %d: cell (%d, %d) of its tile is %.17g, the serial run %.17g\n",
                h->me, y - 1, x - 1, *mine, a[gk]);
    }
  free(a);
  free(b);
  return bad;
}

/* Every rank's time and verdict to rank 0. */
static void halo_report(struct halo *h, double us, long bad)
{
  if (h->me != 0) {
    struct halo_msg m = {.type = HALO_REPORT};
    m.u.report.us = us;
    m.u.report.bad = bad;
    halo_send(h, &h->peers[0], &m);
    while (h->sends_out > 0)
      halo_progress(h);
    return;
  }
  h->max_us = h->min_us = us;
  h->bad_total = bad;
  while (h->reports_in < h->n - 1)
    halo_progress(h);
}

/* The transport to a neighbour, e.g. "xshm". */
static void halo_transport(const struct halo *h, char *buf, size_t len)
{
  xport_caps_t caps;
  snprintf(buf, len, "no transport (one rank)");
  for (int s = 0; s < HALO_SIDES; s++)
    if (h->nb[s] && xport_conn_query(h->nb[s]->conn, &caps) == 0)
      snprintf(buf, len, "%s", caps.provider);
}

/* ---- main ------------------------------------------------------------------------ */

struct halo_opts {
  int check, corrupt, tile, iters;
};

static void halo_usage(void)
{
  fprintf(stderr, "usage: halo [--check] [--n TILE] [--iters T] [--corrupt]\n");
  exit(2);
}

static void halo_parse(int argc, char **argv, struct halo_opts *o)
{
  *o = (struct halo_opts){0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--check"))
      o->check = 1;
    else if (!strcmp(a, "--corrupt"))
      o->corrupt = 1;
    else if (!strcmp(a, "--n") && v && (o->tile = atoi(argv[++i])) >= 2)
      ;
    else if (!strcmp(a, "--iters") && v && (o->iters = atoi(argv[++i])) >= 1 &&
             o->iters < (1 << 30))
      ;
    else
      halo_usage();
  }
  if (!o->tile)
    o->tile = o->check ? 13 : 512; /* 13: no power of two hides an indexing slip */
  if (!o->iters)
    o->iters = o->check ? 25 : 200;
}

int main(int argc, char **argv)
{
  struct halo_opts o;
  struct halo h = {0};
  halo_parse(argc, argv, &o);
  signal(SIGALRM, halo_watchdog);
  alarm(HALO_WATCHDOG_S);
  h.tile = o.tile;
  h.iters = o.iters;
  halo_open(&h);
  halo_init_tile(&h, o.corrupt);
  char tr[sizeof(((xport_caps_t *)0)->provider) + 32];
  halo_transport(&h, tr, sizeof tr);
  if (h.me == 0 && !o.check) { /* a long run says it has started */
    printf("halo: %d ranks (%d x %d) over %s, tile %d x %d, %d iterations: running\n", h.n, h.px,
           h.py, tr, h.tile, h.tile, h.iters);
    fflush(stdout);
  }
  int rc = xport_job_barrier(h.job);
  if (rc)
    halo_fail("barrier", rc, NULL);
  double t0 = halo_now_us();
  for (long it = 0; it < h.iters; it++) {
    if (it % 64 == 0)
      alarm(HALO_WATCHDOG_S); /* the watchdog is for a stall, not a long run */
    halo_iterate(&h, it);
  }
  double us = (halo_now_us() - t0) / h.iters, serial_us;
  while (h.writes_out[0] > 0 || h.writes_out[1] > 0)
    halo_progress(&h);
  alarm(HALO_WATCHDOG_S);
  long bad = halo_verify(&h, &serial_us);
  halo_report(&h, us, bad);
  if (h.me == 0) {
    printf("halo: %s: %d ranks (%d x %d) over %s, tile %d x %d (grid %d x %d), %d iterations: "
           "%.1f us per iteration (slowest rank; fastest %.1f), the stencil alone %.1f us "
           "(the serial run / ranks); %s\n",
           h.bad_total ? "FAILED" : "ok", h.n, h.px, h.py, tr, h.tile, h.tile, h.py * h.tile,
           h.px * h.tile, h.iters, h.max_us, h.min_us, serial_us / h.iters / h.n,
           h.bad_total ? "tiles differ from the serial run (see above)"
                       : "every tile equal bit for bit to the serial run");
    bad += h.bad_total;
  }
  halo_close(&h);
  return bad ? 1 : 0;
}
