/*
 * kvstore: a key-value cache whose GET is one RDMA read.
 *
 *   ./examples/kvstore [-c CLIENTS] [-n OPS] [--check]
 *
 * A server process keeps an open-addressing hash table in registered
 * memory and exports it once to every client (xport_rkey_pack, sent in a
 * message). Clients GET a key in two ways, side by side:
 *
 *   by read     xport_read of the key's bucket: the server's application
 *               takes no part (its xport does, on tcp and shm: xport(7),
 *               Target progress);
 *   by request  a message the server answers from its table.
 *
 * The server receives every client's requests through one shared pool of
 * receives (xport_recv_shared), two per client, rather than a window per
 * connection; each completion names the connection it came on.
 *
 * PUT and DELETE are requests the server applies. Where the connection has
 * remote atomics (caps.atomics), half the PUTs are lock-free instead: the
 * client takes the bucket by compare-and-swap on its version, writes it with
 * xport_write, and releases it with a second compare-and-swap.
 *
 * A bucket is a seqlock: its version is odd while someone changes it and
 * grows by 2 with every change. It is stored at both ends of the bucket and
 * the bucket carries a checksum, because a one-sided read copies the bytes
 * in no promised order while the owner may be writing them: a read is
 * consistent only if both versions are equal and even and the checksum
 * holds; otherwise it is retried (counted as torn or locked).
 *
 * The load generator forks the server and CLIENTS clients, each doing OPS
 * operations, 80% GETs (by read in the first half, by request in the
 * second), 15% PUTs, 5% DELETEs, on 256 keys. Values name their writer, key
 * and sequence number. At the end it checks that every GET returned exactly
 * the value the key held at the version it saw, that every write acknowledged
 * was applied once, and that the final table equals a serial replay of the
 * log of updates (the server's, in order, and the clients' compare-and-swap
 * updates, ordered by bucket version).
 */
#include <xport.h>

#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KV_BUCKETS 1024u /* a power of two; 256 keys keep it a quarter full */
#define KV_KEYS 256u
#define KV_MAX_CLIENTS 64
#define KV_POOL 2         /* shared receives per client: a client has one request out */
#define KV_REPLIES 4      /* reply buffers per client: a send's completion may lag */
#define KV_RETRIES 1000000 /* reads of a bucket that stays locked or torn: give up */

/* ---- the table ---------------------------------------------------------- */

struct kv_value {
  uint32_t writer; /* client id */
  uint32_t how;    /* KV_PUT or KV_CAS_PUT */
  uint64_t key;
  uint64_t seq; /* the writer's write number */
};

/* 64 bytes, one cache line. ver is the lock word (the only one atomics
 * touch, 8-byte aligned as they require); ver2 and sum let a reader tell a
 * torn copy. key is never reset once set, so a key's bucket never moves and
 * an empty bucket (key 0) ends every probe: DELETE clears present only. */
struct kv_bucket {
  uint64_t ver;
  uint64_t key;
  uint64_t present;
  struct kv_value val;
  uint64_t sum;
  uint64_t ver2;
};

enum { KV_HELLO = 1, KV_GET, KV_PUT, KV_DEL, KV_BYE, KV_CAS_PUT };

struct kv_req {
  uint32_t op;
  uint32_t client;
  uint64_t key;
  struct kv_value val;
};

struct kv_rep {
  int32_t status; /* 0, or -XPORT_ENOENT for a key absent */
  uint32_t rkey_len;
  uint64_t ver;
  uint64_t present;
  struct kv_value val;
  /* Only in the answer to KV_HELLO: the key, and whether the server
   * registered the table for atomics (its context's caps.atomics, which
   * may differ from the client's connection's). */
  uint64_t atomic_right;
  uint8_t rkey[XPORT_RKEY_MAX_SIZE];
};
#define KV_REP_SHORT offsetof(struct kv_rep, atomic_right)

/* An update applied to a bucket, and what a GET saw: the same record. */
struct kv_entry {
  uint64_t key;
  uint64_t ver;
  uint64_t present;
  struct kv_value val;
};

static uint64_t kv_sum(const struct kv_bucket *b)
{
  uint64_t w[7] = {b->ver2, b->key, b->present, b->val.writer | (uint64_t)b->val.how << 32,
                   b->val.key, b->val.seq, 0x6b7673746f7265};
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the words */
  for (int i = 0; i < 7; i++)
    for (int j = 0; j < 8; j++)
      h = (h ^ ((w[i] >> (8 * j)) & 0xff)) * 0x100000001b3ull;
  return h;
}

static unsigned kv_slot(uint64_t key, unsigned probe)
{
  return ((unsigned)((key * 0x9e3779b97f4a7c15ull) >> 40) + probe) & (KV_BUCKETS - 1);
}

/* ---- results shared with the load generator ------------------------------
 * One anonymous shared mapping made before the fork; each process writes
 * its own part, the parent reads it all once every child has exited. */

struct kv_client_out {
  char provider[32];
  int atomics;
  uint64_t nwrites, nlog, nobs, nlat[2], gets[2];
  double secs[2];
  uint64_t torn, locked, cas_retries, cas_puts, req_puts, dels;
};

struct kv_shared {
  unsigned nclients;
  uint64_t ops;
  uint64_t slog_n, deferred;
  struct kv_bucket table[KV_BUCKETS]; /* the server's, at the end */
  struct kv_client_out out[KV_MAX_CLIENTS];
};

static struct kv_shared *kv_sh;
static size_t kv_sh_len;

/* Per-client arrays follow the header, each ops long. */
static uint64_t *kv_written(unsigned c) /* key of each write, by seq */
{
  return (uint64_t *)(kv_sh + 1) + (size_t)c * kv_sh->ops;
}
static struct kv_entry *kv_base_entries(void)
{
  return (struct kv_entry *)((uint64_t *)(kv_sh + 1) + (size_t)kv_sh->nclients * kv_sh->ops);
}
static struct kv_entry *kv_cas_log(unsigned c)
{
  return kv_base_entries() + (size_t)c * kv_sh->ops;
}
static struct kv_entry *kv_obs(unsigned c) /* what each GET saw */
{
  return kv_base_entries() + (size_t)(kv_sh->nclients + c) * kv_sh->ops;
}
static struct kv_entry *kv_server_log(void)
{
  return kv_base_entries() + (size_t)2 * kv_sh->nclients * kv_sh->ops;
}
static uint64_t *kv_lat(unsigned c, int mode) /* GET latencies, ns */
{
  uint64_t *base = (uint64_t *)(kv_server_log() + (size_t)kv_sh->nclients * kv_sh->ops);
  return base + ((size_t)c * 2 + (size_t)mode) * kv_sh->ops;
}

static int kv_map_shared(unsigned nclients, uint64_t ops)
{
  size_t per = (size_t)nclients * ops;
  kv_sh_len = sizeof *kv_sh + per * (sizeof(uint64_t) * 3 + sizeof(struct kv_entry) * 3);
  void *p = mmap(NULL, kv_sh_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return -1;
  kv_sh = p;
  kv_sh->nclients = nclients;
  kv_sh->ops = ops;
  return 0;
}

/* ---- common ------------------------------------------------------------- */

static const char *kv_who = "kvstore";
static char kv_at[80] = "127.0.0.1:0"; /* where the server listens (-H HOST) */

static void kv_die(const char *what, int rc)
{
  fprintf(stderr, "kvstore: %s: %s: %s\n", kv_who, what, xport_strerror(rc));
  exit(1);
}

static void kv_bad(const char *what)
{
  fprintf(stderr, "kvstore: %s: %s\n", kv_who, what);
  exit(1);
}

static uint64_t kv_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Every process spins on its completion queue (tcp and shm move data only
 * while the target polls), but yields now and then: on a machine with
 * fewer cores than processes a pure spin would starve the peer it waits
 * for. */
static int kv_poll(xport_ctx_t *ctx, xport_completion_t *c, int max, unsigned *idle)
{
  int n = xport_poll(ctx, c, max);
  if (n < 0)
    kv_die("xport_poll", n);
  if (n == 0 && ++*idle % 64 == 0)
    sched_yield();
  if (n > 0)
    *idle = 0;
  return n;
}

static void kv_check_completion(const xport_completion_t *c)
{
  if (c->op == XPORT_OP_DISCONNECT)
    kv_die("the peer went away", c->status ? c->status : -XPORT_ECONNRESET);
  if (c->status)
    kv_die(c->hint ? c->hint : "completion", c->status);
}

/* ---- server --------------------------------------------------------------- */

struct kv_peer {
  xport_conn_t *conn;
  struct kv_rep rep[KV_REPLIES];
  int rep_busy[KV_REPLIES];
  int pending; /* pool slot of its request waiting for a locked bucket, or -1 */
  int bye;
  int64_t client; /* what its hello said; -1 before */
};

struct kv_server {
  xport_ctx_t *ctx;
  xport_mr_t *mr;
  struct kv_bucket *table;
  struct kv_peer peer[KV_MAX_CLIENTS];
  struct kv_req req[KV_MAX_CLIENTS * KV_POOL]; /* the shared pool's receives */
  unsigned npeers, byes;
  uint8_t rkey[XPORT_RKEY_MAX_SIZE];
  int rkey_len, atomic_right;
};

/* A send's context names its peer and reply slot; a receive's, its slot in
 * the pool (its completion names the connection). */
#define KV_CTX(peer, kind, slot) ((void *)(uintptr_t)((peer) << 8 | (kind) << 4 | (slot)))
#define KV_RCTX(slot) KV_CTX(slot, KV_K_RECV, 0)
enum { KV_K_RECV = 1, KV_K_SEND = 2 };

/* Finds key's bucket, or the empty one it would take. Returns -1 when a
 * bucket on the way is locked by a client's compare-and-swap PUT: that
 * client may be claiming it for this very key, so the caller waits. */
static int kv_server_find(const struct kv_bucket *t, uint64_t key)
{
  for (unsigned p = 0; p < KV_BUCKETS; p++) {
    const struct kv_bucket *b = &t[kv_slot(key, p)];
    uint64_t ver = __atomic_load_n(&b->ver, __ATOMIC_ACQUIRE);
    if (ver & 1)
      return -1;
    if (b->key == key || b->key == 0)
      return (int)kv_slot(key, p);
  }
  kv_bad("the table is full");
  return -1;
}

/* The server's own update, consistent with the clients' lock-free PUTs:
 * it takes the same lock word (even to odd) with the CPU's atomics. A
 * client's compare-and-swap is applied only inside the server's xport calls
 * (xport_fetch_add(3), Progress: on every provider, without the progress
 * thread, which this server does not start), and this runs outside them, in
 * the same thread, so the two never interleave; a bucket a client holds is
 * odd, and kv_server_find made the caller wait for it. */
static void kv_server_update(struct kv_server *s, int slot, const struct kv_req *rq,
                             struct kv_entry *logged)
{
  struct kv_bucket *b = &s->table[slot];
  uint64_t v = b->ver;
  if (!__atomic_compare_exchange_n(&b->ver, &v, v + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    kv_bad("a bucket changed under the server");
  /* Odd before any byte of the body: every body store is a release store,
   * which no earlier store passes (one release fence would say it once, but
   * ThreadSanitizer cannot follow fences and gcc refuses them under it). */
  struct kv_bucket nb = {.key = rq->key, .present = rq->op == KV_PUT, .ver2 = v + 2};
  if (rq->op == KV_PUT)
    nb.val = rq->val;
  nb.sum = kv_sum(&nb);
  __atomic_store_n(&b->key, nb.key, __ATOMIC_RELEASE);
  __atomic_store_n(&b->present, nb.present, __ATOMIC_RELEASE);
  __atomic_store_n(&b->val.writer, nb.val.writer, __ATOMIC_RELEASE);
  __atomic_store_n(&b->val.how, nb.val.how, __ATOMIC_RELEASE);
  __atomic_store_n(&b->val.key, nb.val.key, __ATOMIC_RELEASE);
  __atomic_store_n(&b->val.seq, nb.val.seq, __ATOMIC_RELEASE);
  __atomic_store_n(&b->ver2, nb.ver2, __ATOMIC_RELEASE);
  __atomic_store_n(&b->sum, nb.sum, __ATOMIC_RELEASE);
  __atomic_store_n(&b->ver, v + 2, __ATOMIC_RELEASE);
  *logged = (struct kv_entry){rq->key, v + 2, b->present, b->val};
}

/* Applies one request; 0 when it must wait for a locked bucket. */
static int kv_server_apply(struct kv_server *s, const struct kv_req *rq, struct kv_rep *rep)
{
  memset(rep, 0, KV_REP_SHORT);
  int slot = kv_server_find(s->table, rq->key);
  if (slot < 0)
    return 0;
  struct kv_bucket *b = &s->table[slot];
  int absent = b->key != rq->key || !b->present;
  if (rq->op == KV_PUT || (rq->op == KV_DEL && !absent)) {
    kv_server_update(s, slot, rq, &kv_server_log()[kv_sh->slog_n++]);
    absent = 0;
  }
  rep->status = absent ? -XPORT_ENOENT : 0;
  rep->ver = b->key == rq->key ? b->ver : 0;
  rep->present = b->key == rq->key && b->present;
  rep->val = b->val;
  return 1;
}

static struct kv_rep *kv_server_reply_buf(struct kv_peer *p, int *slot)
{
  for (int i = 0; i < KV_REPLIES; i++)
    if (!p->rep_busy[i]) {
      *slot = i;
      return &p->rep[i];
    }
  return NULL;
}

/* Serves the request of peer i in pool slot r; 0 when it must wait. */
static int kv_server_serve(struct kv_server *s, unsigned i, int r)
{
  struct kv_peer *p = &s->peer[i];
  const struct kv_req *rq = &s->req[r];
  int slot, rc;
  struct kv_rep *rep = kv_server_reply_buf(p, &slot);
  size_t len = KV_REP_SHORT;
  if (!rep)
    return 0; /* every reply buffer still xport's: poll first */
  if (rq->op != KV_HELLO && (int64_t)rq->client != p->client)
    kv_bad("a request in another client's name");
  if (rq->op == KV_HELLO) {
    if (p->client >= 0 || rq->client >= kv_sh->nclients)
      kv_bad("a second hello, or one from no client of ours");
    p->client = rq->client;
    memset(rep, 0, sizeof *rep);
    memcpy(rep->rkey, s->rkey, (size_t)s->rkey_len);
    rep->rkey_len = (uint32_t)s->rkey_len;
    rep->atomic_right = (uint64_t)s->atomic_right;
    len = sizeof *rep;
  } else if (rq->op == KV_BYE) {
    memset(rep, 0, KV_REP_SHORT);
    p->bye = 1;
    s->byes++;
  } else if (rq->op == KV_GET || rq->op == KV_PUT || rq->op == KV_DEL) {
    if (!kv_server_apply(s, rq, rep))
      return 0;
  } else {
    kv_bad("unknown request");
  }
  /* The request's receive goes back to the pool before the reply goes:
   * the client sends its next request only after this reply. */
  if ((rc = xport_recv_shared(s->ctx, &s->req[r], sizeof s->req[r], NULL, KV_RCTX((unsigned)r))))
    kv_die("xport_recv_shared", rc);
  if ((rc = xport_send(p->conn, rep, len, NULL, KV_CTX(i, KV_K_SEND, (unsigned)slot))))
    kv_die("xport_send", rc);
  p->rep_busy[slot] = 1;
  return 1;
}

/* A client that said goodbye closes its end: its disconnect is expected
 * (the pool's receives it held go back to the pool unseen); anything
 * else fails. */
static int kv_server_after_bye(const struct kv_server *s, const xport_completion_t *c)
{
  for (unsigned i = 0; i < s->npeers; i++)
    if (s->peer[i].conn == c->conn)
      return s->peer[i].bye && (c->op == XPORT_OP_DISCONNECT || c->status == -XPORT_ECONNRESET);
  return 0;
}

static void kv_server_completion(struct kv_server *s, const xport_completion_t *c)
{
  if ((c->op == XPORT_OP_DISCONNECT || c->status) && kv_server_after_bye(s, c))
    return;
  kv_check_completion(c);
  uintptr_t u = (uintptr_t)c->user_ctx;
  unsigned i = (unsigned)(u >> 8), kind = (u >> 4) & 0xf, slot = u & 0xf;
  if (kind == KV_K_SEND) {
    s->peer[i].rep_busy[slot] = 0;
    return;
  }
  slot = i; /* a receive: its pool slot, and the peer its connection is */
  for (i = 0; i < s->npeers && s->peer[i].conn != c->conn; i++)
    ;
  if (i == s->npeers)
    kv_bad("a request on a connection the server does not know");
  if (c->len != sizeof(struct kv_req)) {
    kv_bad("a request of the wrong size");
  } else if (s->peer[i].pending >= 0 || !kv_server_serve(s, i, (int)slot)) {
    if (s->peer[i].pending >= 0)
      kv_bad("a client sent a request before its answer");
    s->peer[i].pending = (int)slot;
    kv_sh->deferred++;
  }
}

static void kv_server_accept(struct kv_server *s, xport_listener_t *lst)
{
  int rc;
  /* The pool's receives, before any client's first message (its HELLO):
   * every connection accepted draws from them. */
  for (unsigned r = 0; r < s->npeers * KV_POOL; r++)
    if ((rc = xport_recv_shared(s->ctx, &s->req[r], sizeof s->req[r], NULL, KV_RCTX(r))))
      kv_die("xport_recv_shared", rc);
  for (unsigned i = 0; i < s->npeers; i++) {
    struct kv_peer *p = &s->peer[i];
    p->pending = -1;
    p->client = -1;
    if ((rc = xport_accept(lst, 30000, &p->conn)))
      kv_die("xport_accept", rc);
  }
}

static void kv_server_loop(struct kv_server *s)
{
  xport_completion_t comp[16];
  unsigned idle = 0;
  int busy_replies = 1;
  while (s->byes < s->npeers || busy_replies) {
    int n = kv_poll(s->ctx, comp, 16, &idle);
    for (int k = 0; k < n; k++)
      kv_server_completion(s, &comp[k]);
    busy_replies = 0;
    for (unsigned i = 0; i < s->npeers; i++) {
      struct kv_peer *p = &s->peer[i];
      if (p->pending >= 0 && kv_server_serve(s, i, p->pending))
        p->pending = -1;
      for (int r = 0; r < KV_REPLIES; r++)
        busy_replies |= p->rep_busy[r];
    }
  }
}

static void kv_server(int addr_pipe, unsigned nclients)
{
  struct kv_server s = {.npeers = nclients};
  xport_listener_t *lst;
  xport_caps_t caps;
  char addr[128] = "";
  int rc;
  kv_who = "server";
  /* Page-aligned, so that the packed range starts 8-byte aligned and the
   * key carries the atomic right (xport_rkey_pack(3)). */
  s.table = mmap(NULL, sizeof kv_sh->table, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (s.table == MAP_FAILED)
    kv_bad("out of memory");
  for (unsigned b = 0; b < KV_BUCKETS; b++)
    s.table[b].sum = kv_sum(&s.table[b]);
  if ((rc = xport_ctx_create(NULL, &s.ctx)) || (rc = xport_ctx_query(s.ctx, &caps)))
    kv_die("xport_ctx_create", rc);
  unsigned access = XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE;
  /* With the progress thread, peers' atomics would be applied while the
   * server updates buckets itself: no compare-and-swap PUTs then. */
  s.atomic_right = caps.atomics != XPORT_SUPPORT_NONE && !caps.progress_thread;
  if (s.atomic_right)
    access |= XPORT_ACCESS_REMOTE_ATOMIC;
  if ((rc = xport_mr_reg(s.ctx, s.table, sizeof kv_sh->table, access, &s.mr)))
    kv_die("xport_mr_reg", rc);
  /* One key for every client: packed once, the same bytes to each. */
  if ((s.rkey_len = xport_rkey_pack(s.mr, 0, sizeof kv_sh->table, s.rkey, sizeof s.rkey)) < 0)
    kv_die("xport_rkey_pack", s.rkey_len);
  if ((rc = xport_listen(s.ctx, kv_at, &lst)) || (rc = xport_listener_addr(lst, addr, sizeof addr)))
    kv_die("xport_listen", rc);
  for (unsigned i = 0; i < nclients; i++) /* one copy per client; atomic: < PIPE_BUF */
    if (write(addr_pipe, addr, sizeof addr) != (ssize_t)sizeof addr)
      kv_bad("cannot hand the address to the clients");
  kv_server_accept(&s, lst);
  kv_server_loop(&s);
  memcpy(kv_sh->table, s.table, sizeof kv_sh->table);
  for (unsigned i = 0; i < nclients; i++)
    if ((rc = xport_conn_close(s.peer[i].conn)))
      kv_die("xport_conn_close", rc);
  if ((rc = xport_listener_close(lst)) || (rc = xport_mr_dereg(s.mr)) || (rc = xport_ctx_destroy(s.ctx)))
    kv_die("teardown", rc);
  munmap(s.table, sizeof kv_sh->table);
}

/* ---- client --------------------------------------------------------------- */

struct kv_client {
  unsigned id;
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  xport_rkey_t *rkey;
  xport_mr_t *mr; /* the local side of reads, writes and atomics below */
  struct {
    struct kv_bucket bucket;
    uint64_t result;
    struct kv_req req;
    struct kv_rep rep;
  } *buf;
  int atomics;
  uint64_t rng;
  struct kv_client_out *out;
};

static uint64_t kv_rand(struct kv_client *cl)
{
  cl->rng ^= cl->rng << 13; /* xorshift64: reproducible per client */
  cl->rng ^= cl->rng >> 7;
  cl->rng ^= cl->rng << 17;
  return cl->rng;
}

/* Waits for n completions of the client's own posts (it has nothing else
 * out), failing on any error. */
static void kv_client_wait(struct kv_client *cl, int n)
{
  xport_completion_t c[2];
  unsigned idle = 0;
  while (n > 0) {
    int got = kv_poll(cl->ctx, c, n, &idle);
    for (int k = 0; k < got; k++)
      kv_check_completion(&c[k]);
    n -= got;
  }
}

static void kv_client_request(struct kv_client *cl, uint32_t op, uint64_t key, const struct kv_value *v)
{
  int rc;
  cl->buf->req = (struct kv_req){.op = op, .client = cl->id, .key = key};
  if (v)
    cl->buf->req.val = *v;
  /* The receive first: the answer must never find none posted. */
  if ((rc = xport_recv(cl->conn, &cl->buf->rep, sizeof cl->buf->rep, cl->mr, NULL)) ||
      (rc = xport_send(cl->conn, &cl->buf->req, sizeof cl->buf->req, cl->mr, NULL)))
    kv_die("request", rc);
  kv_client_wait(cl, 2);
}

/* Reads bucket slot until the copy is consistent (see the top). */
static const struct kv_bucket *kv_client_read(struct kv_client *cl, unsigned slot)
{
  struct kv_bucket *b = &cl->buf->bucket;
  for (int tries = 0; tries < KV_RETRIES; tries++) {
    int rc = xport_read(cl->conn, b, sizeof *b, cl->mr, cl->rkey, slot * sizeof *b, NULL);
    if (rc)
      kv_die("xport_read", rc);
    kv_client_wait(cl, 1);
    if (b->ver & 1)
      cl->out->locked++;
    else if (b->ver != b->ver2 || b->sum != kv_sum(b))
      cl->out->torn++;
    else
      return b;
  }
  kv_bad("a bucket stayed locked or torn");
  return NULL;
}

/* Probes from key's home bucket; returns the slot holding key, or the empty
 * one where the probe ends, with its consistent copy in *seen. */
static unsigned kv_client_probe(struct kv_client *cl, uint64_t key, const struct kv_bucket **seen)
{
  for (unsigned p = 0; p < KV_BUCKETS; p++) {
    const struct kv_bucket *b = kv_client_read(cl, kv_slot(key, p));
    if (b->key == key || b->key == 0) {
      *seen = b;
      return kv_slot(key, p);
    }
  }
  kv_bad("the table is full");
  return 0;
}

static void kv_client_get_by_read(struct kv_client *cl, uint64_t key, struct kv_entry *obs)
{
  const struct kv_bucket *b;
  kv_client_probe(cl, key, &b);
  if (b->key == key)
    *obs = (struct kv_entry){key, b->ver, b->present, b->val};
  else
    *obs = (struct kv_entry){.key = key}; /* never written yet: version 0 */
}

static void kv_client_get_by_request(struct kv_client *cl, uint64_t key, struct kv_entry *obs)
{
  kv_client_request(cl, KV_GET, key, NULL);
  const struct kv_rep *r = &cl->buf->rep;
  *obs = (struct kv_entry){key, r->ver, r->present, r->val};
}

static uint64_t kv_client_cas(struct kv_client *cl, unsigned slot, uint64_t compare, uint64_t swap)
{
  int rc = xport_cswap(cl->conn, &cl->buf->result, compare, swap, cl->rkey, slot * sizeof(struct kv_bucket),
                       NULL);
  if (rc)
    kv_die("xport_cswap", rc);
  kv_client_wait(cl, 1);
  return cl->buf->result;
}

/* The lock-free PUT. Each step waits for the one before: an atomic is
 * ordered with nothing else on its connection (xport_fetch_add(3)), so the
 * body's write is followed by a read, whose completion says the write has
 * landed, before the atomic that releases the bucket. */
static void kv_client_cas_put(struct kv_client *cl, const struct kv_value *v)
{
  for (;;) {
    const struct kv_bucket *b;
    unsigned slot = kv_client_probe(cl, v->key, &b);
    uint64_t ver = b->ver;
    if (kv_client_cas(cl, slot, ver, ver + 1) != ver) {
      cl->out->cas_retries++; /* someone changed it since our read: again */
      continue;
    }
    /* Ours, and unchanged since the read that chose it (any change would
     * have moved the version). The body carries the version it will have. */
    struct kv_bucket *nb = &cl->buf->bucket;
    *nb = (struct kv_bucket){.key = v->key, .present = 1, .val = *v, .ver2 = ver + 2};
    nb->sum = kv_sum(nb);
    size_t off = slot * sizeof *nb + offsetof(struct kv_bucket, key);
    int rc = xport_write(cl->conn, &nb->key, sizeof *nb - offsetof(struct kv_bucket, key), cl->mr,
                         cl->rkey, off, NULL);
    if (rc)
      kv_die("xport_write", rc);
    kv_client_wait(cl, 1);
    if ((rc = xport_read(cl->conn, nb, sizeof *nb, cl->mr, cl->rkey, slot * sizeof *nb, NULL)))
      kv_die("xport_read", rc);
    kv_client_wait(cl, 1);
    if (nb->ver != ver + 1 || nb->key != v->key || nb->val.seq != v->seq || nb->ver2 != ver + 2)
      kv_bad("a locked bucket changed under its holder");
    if (kv_client_cas(cl, slot, ver + 1, ver + 2) != ver + 1)
      kv_bad("a locked bucket's version moved");
    kv_cas_log(cl->id)[cl->out->nlog++] = (struct kv_entry){v->key, ver + 2, 1, *v};
    cl->out->cas_puts++;
    return;
  }
}

static void kv_client_put(struct kv_client *cl, uint64_t key)
{
  uint64_t seq = cl->out->nwrites++;
  struct kv_value v = {.writer = cl->id, .key = key, .seq = seq};
  kv_written(cl->id)[seq] = key;
  v.how = cl->atomics && (kv_rand(cl) & 1) ? KV_CAS_PUT : KV_PUT;
  if (v.how == KV_CAS_PUT) {
    kv_client_cas_put(cl, &v);
    return;
  }
  kv_client_request(cl, KV_PUT, key, &v);
  if (cl->buf->rep.status)
    kv_die("PUT", cl->buf->rep.status);
  cl->out->req_puts++;
}

static void kv_client_op(struct kv_client *cl, int mode)
{
  uint64_t key = 1 + kv_rand(cl) % KV_KEYS, r = kv_rand(cl) % 100;
  if (r < 80) {
    uint64_t t0 = kv_now_ns();
    struct kv_entry *obs = &kv_obs(cl->id)[cl->out->nobs++];
    if (mode == 0)
      kv_client_get_by_read(cl, key, obs);
    else
      kv_client_get_by_request(cl, key, obs);
    kv_lat(cl->id, mode)[cl->out->nlat[mode]++] = kv_now_ns() - t0;
    cl->out->gets[mode]++;
  } else if (r < 95) {
    kv_client_put(cl, key);
  } else {
    kv_client_request(cl, KV_DEL, key, NULL);
    cl->out->dels++;
  }
}

static void kv_client_connect(struct kv_client *cl, const char *addr)
{
  xport_caps_t caps;
  int rc;
  if ((rc = xport_ctx_create(NULL, &cl->ctx)) || (rc = xport_connect(cl->ctx, addr, 30000, &cl->conn)) ||
      (rc = xport_conn_query(cl->conn, &caps)))
    kv_die("connect", rc);
  cl->atomics = caps.atomics != XPORT_SUPPORT_NONE;
  snprintf(cl->out->provider, sizeof cl->out->provider, "%s", caps.provider);
  cl->out->atomics = caps.atomics;
  cl->buf = mmap(NULL, sizeof *cl->buf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (cl->buf == MAP_FAILED)
    kv_bad("out of memory");
  if ((rc = xport_mr_reg(cl->ctx, cl->buf, sizeof *cl->buf, XPORT_ACCESS_LOCAL, &cl->mr)))
    kv_die("xport_mr_reg", rc);
  kv_client_request(cl, KV_HELLO, 0, NULL);
  cl->atomics &= cl->buf->rep.atomic_right != 0;
  if ((rc = xport_rkey_unpack(cl->conn, cl->buf->rep.rkey, cl->buf->rep.rkey_len, &cl->rkey)))
    kv_die("xport_rkey_unpack", rc);
}

static void kv_client(unsigned id, int addr_pipe, uint64_t ops)
{
  struct kv_client cl = {.id = id, .rng = 0x9e3779b97f4a7c15ull * (id + 1), .out = &kv_sh->out[id]};
  char addr[128], who[32];
  int rc;
  snprintf(who, sizeof who, "client %u", id);
  kv_who = who;
  if (read(addr_pipe, addr, sizeof addr) != (ssize_t)sizeof addr)
    kv_bad("the server did not start");
  kv_client_connect(&cl, addr);
  for (int mode = 0; mode < 2; mode++) { /* GET by read, then by request */
    uint64_t t0 = kv_now_ns();
    for (uint64_t i = 0; i < ops / 2 + (mode ? ops % 2 : 0); i++)
      kv_client_op(&cl, mode);
    cl.out->secs[mode] = (double)(kv_now_ns() - t0) / 1e9;
  }
  kv_client_request(&cl, KV_BYE, 0, NULL);
  if ((rc = xport_rkey_release(cl.rkey)) || (rc = xport_conn_close(cl.conn)) ||
      (rc = xport_mr_dereg(cl.mr)) || (rc = xport_ctx_destroy(cl.ctx)))
    kv_die("teardown", rc);
  munmap(cl.buf, sizeof *cl.buf);
}

/* ---- the load generator: processes -------------------------------------- */

static pid_t kv_pids[KV_MAX_CLIENTS + 1];
static unsigned kv_npids;

static void kv_kill_all(void)
{
  for (unsigned i = 0; i < kv_npids; i++)
    if (kv_pids[i] > 0 && kill(kv_pids[i], SIGKILL) == 0)
      waitpid(kv_pids[i], NULL, 0);
}

static void kv_watchdog(int sig) /* async-signal-safe calls only */
{
  (void)sig;
  (void)!write(2, "kvstore: watchdog: no end in sight, killing everything\n", 55);
  for (unsigned i = 0; i < kv_npids; i++)
    if (kv_pids[i] > 0)
      kill(kv_pids[i], SIGKILL);
  _exit(1);
}

/* Forks the server and the clients before any context exists (contexts do
 * not cross fork: xport(7)). */
static void kv_spawn(unsigned nclients, uint64_t ops, unsigned watchdog_s)
{
  int fds[2];
  if (pipe(fds))
    kv_bad("pipe");
  for (unsigned i = 0; i <= nclients; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      kv_kill_all();
      kv_bad("fork");
    }
    if (pid == 0) {
      kv_npids = 0; /* a child has no children of its own to kill */
      alarm(watchdog_s);
      if (i == 0)
        close(fds[0]), kv_server(fds[1], nclients);
      else
        close(fds[1]), kv_client(i - 1, fds[0], ops);
      fflush(stdout);
      _exit(0);
    }
    kv_pids[kv_npids++] = pid;
  }
  close(fds[0]);
  close(fds[1]);
}

/* Reaps every child; on the first failure kills the rest. */
static int kv_reap(void)
{
  int failed = 0;
  for (unsigned left = kv_npids; left > 0; left--) {
    int st;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0)
      return 0;
    const char *who = pid == kv_pids[0] ? "server" : "client";
    for (unsigned i = 0; i < kv_npids; i++)
      if (kv_pids[i] == pid)
        kv_pids[i] = 0; /* reaped: never to be killed */
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      if (!failed)
        fprintf(stderr, "kvstore: the %s process failed (%s %d)\n", who, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      failed = 1;
      kv_kill_all();
    }
  }
  return !failed;
}

/* ---- the load generator: verification ---------------------------------- */

static int kv_cmp_entry(const void *a, const void *b)
{
  const struct kv_entry *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->ver < y->ver ? -1 : x->ver > y->ver;
}

static int kv_cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int kv_same(const struct kv_entry *a, uint64_t present, const struct kv_value *v)
{
  return a->present == present && (!present || !memcmp(&a->val, v, sizeof *v));
}

/* The merged log: the server's updates and every client's compare-and-swap
 * PUTs, sorted by key, then version: the order each bucket went through. */
static struct kv_entry *kv_merge_log(size_t *n)
{
  size_t total = kv_sh->slog_n;
  for (unsigned c = 0; c < kv_sh->nclients; c++)
    total += kv_sh->out[c].nlog;
  struct kv_entry *log = malloc((total + 1) * sizeof *log);
  if (!log)
    kv_bad("out of memory");
  memcpy(log, kv_server_log(), kv_sh->slog_n * sizeof *log);
  size_t k = kv_sh->slog_n;
  for (unsigned c = 0; c < kv_sh->nclients; c++) {
    memcpy(log + k, kv_cas_log(c), kv_sh->out[c].nlog * sizeof *log);
    k += kv_sh->out[c].nlog;
  }
  qsort(log, total, sizeof *log, kv_cmp_entry);
  *n = total;
  return log;
}

/* Each key's versions run 2, 4, 6, ... with no gap (no update lost, none
 * applied twice), and every value written was applied exactly once and is
 * one its writer wrote for that key. */
static int kv_check_log(const struct kv_entry *log, size_t n)
{
  uint64_t applied = 0, written = 0;
  for (size_t i = 0; i < n; i++) {
    const struct kv_entry *e = &log[i];
    uint64_t want = i > 0 && log[i - 1].key == e->key ? log[i - 1].ver + 2 : 2;
    if (e->ver != want) {
      fprintf(stderr, "kvstore: key %llu: version %llu follows %llu\n", (unsigned long long)e->key,
              (unsigned long long)e->ver, (unsigned long long)want - 2);
      return 0;
    }
    if (!e->present)
      continue;
    const struct kv_value *v = &e->val;
    if (v->writer >= kv_sh->nclients || v->key != e->key || v->seq >= kv_sh->out[v->writer].nwrites ||
        kv_written(v->writer)[v->seq] != e->key) {
      fprintf(stderr, "kvstore: key %llu holds a value nobody wrote for it\n", (unsigned long long)e->key);
      return 0;
    }
    applied++;
  }
  for (unsigned c = 0; c < kv_sh->nclients; c++)
    written += kv_sh->out[c].nwrites;
  if (applied != written) { /* with the checks above: each applied once */
    fprintf(stderr, "kvstore: %llu writes acknowledged, %llu applied\n", (unsigned long long)written,
            (unsigned long long)applied);
    return 0;
  }
  return 1;
}

/* Replays the log serially (the last update of each key wins) and compares
 * the result with the server's final table, bucket by bucket. */
static int kv_check_table(const struct kv_entry *log, size_t n)
{
  size_t keys = 0, buckets = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + 1 < n && log[i + 1].key == log[i].key)
      continue; /* not the key's last update */
    keys++;
    const struct kv_entry *last = &log[i];
    int found = 0;
    for (unsigned p = 0; p < KV_BUCKETS && !found; p++) {
      const struct kv_bucket *b = &kv_sh->table[kv_slot(last->key, p)];
      if (b->key == last->key)
        found = b->ver == last->ver && b->ver2 == b->ver && b->sum == kv_sum(b) &&
                kv_same(last, b->present, &b->val);
      if (b->key == last->key || b->key == 0)
        break;
    }
    if (!found) {
      fprintf(stderr, "kvstore: key %llu: the table differs from the replay\n", (unsigned long long)last->key);
      return 0;
    }
  }
  for (unsigned b = 0; b < KV_BUCKETS; b++)
    buckets += kv_sh->table[b].key != 0;
  if (buckets != keys) {
    fprintf(stderr, "kvstore: %zu buckets used, %zu keys in the log\n", buckets, keys);
    return 0;
  }
  return 1;
}

/* Every GET saw exactly what the log says its key held at that version. */
static int kv_check_gets(const struct kv_entry *log, size_t n, uint64_t *checked)
{
  for (unsigned c = 0; c < kv_sh->nclients; c++)
    for (uint64_t i = 0; i < kv_sh->out[c].nobs; i++) {
      const struct kv_entry *o = &kv_obs(c)[i];
      const struct kv_entry *e = o->ver ? bsearch(o, log, n, sizeof *log, kv_cmp_entry) : NULL;
      if (o->ver ? !e || !kv_same(e, o->present, &o->val) : o->present) {
        fprintf(stderr, "kvstore: client %u: a GET of key %llu saw version %llu with a value never there\n", c,
                (unsigned long long)o->key, (unsigned long long)o->ver);
        return 0;
      }
      ++*checked;
    }
  return 1;
}

/* ---- the load generator: the report ------------------------------------ */

struct kv_stats {
  uint64_t n;
  double rate, p50, p99, p999; /* GETs a second; microseconds */
};

static struct kv_stats kv_stats(int mode)
{
  struct kv_stats st = {0};
  uint64_t total = 0;
  for (unsigned c = 0; c < kv_sh->nclients; c++) {
    total += kv_sh->out[c].nlat[mode];
    if (kv_sh->out[c].secs[mode] > 0)
      st.rate += (double)kv_sh->out[c].gets[mode] / kv_sh->out[c].secs[mode];
  }
  uint64_t *all = malloc((total + 1) * sizeof *all), k = 0;
  if (!all)
    kv_bad("out of memory");
  for (unsigned c = 0; c < kv_sh->nclients; c++)
    for (uint64_t i = 0; i < kv_sh->out[c].nlat[mode]; i++)
      all[k++] = kv_lat(c, mode)[i];
  qsort(all, total, sizeof *all, kv_cmp_u64);
  st.n = total;
  if (total) {
    st.p50 = (double)all[(total - 1) * 50 / 100] / 1e3;
    st.p99 = (double)all[(total - 1) * 99 / 100] / 1e3;
    st.p999 = (double)all[(total - 1) * 999 / 1000] / 1e3;
  }
  free(all);
  return st;
}

static void kv_report(void)
{
  static const char *const atom[] = {"none", "emulated", "native"};
  uint64_t torn = 0, locked = 0, retries = 0, cas = 0, req = 0, dels = 0;
  for (unsigned c = 0; c < kv_sh->nclients; c++) {
    const struct kv_client_out *o = &kv_sh->out[c];
    torn += o->torn, locked += o->locked, retries += o->cas_retries;
    cas += o->cas_puts, req += o->req_puts, dels += o->dels;
  }
  printf("kvstore: over %s (atomics %s), %u buckets, %u keys, %u clients x %llu ops\n", kv_sh->out[0].provider,
         atom[kv_sh->out[0].atomics % 3], KV_BUCKETS, KV_KEYS, kv_sh->nclients, (unsigned long long)kv_sh->ops);
  static const char *const name[] = {"GET by read   ", "GET by request"};
  for (int m = 0; m < 2; m++) {
    struct kv_stats st = kv_stats(m);
    printf("kvstore: %s %8llu GETs %9.0f GETs/s  p50 %7.1f us  p99 %7.1f us  p999 %7.1f us\n", name[m],
           (unsigned long long)st.n, st.rate, st.p50, st.p99, st.p999);
  }
  printf("kvstore: reads retried: %llu torn, %llu locked; PUTs: %llu by request, %llu by compare-and-swap "
         "(%llu lost races); %llu DELETEs; %llu requests waited for a locked bucket\n",
         (unsigned long long)torn, (unsigned long long)locked, (unsigned long long)req, (unsigned long long)cas,
         (unsigned long long)retries, (unsigned long long)dels, (unsigned long long)kv_sh->deferred);
}

static int kv_verify(void)
{
  size_t n;
  uint64_t checked = 0;
  struct kv_entry *log = kv_merge_log(&n);
  int ok = kv_check_log(log, n) && kv_check_table(log, n) && kv_check_gets(log, n, &checked);
  if (ok) {
    struct kv_stats r = kv_stats(0), q = kv_stats(1);
    printf("kvstore: ok (%llu GETs each saw the value its key held at that version; the table equals the "
           "serial replay of %zu updates; p50 by read %.1f us, by request %.1f us)\n",
           (unsigned long long)checked, n, r.p50, q.p50);
  }
  free(log);
  return ok;
}

static void kv_usage(void)
{
  fprintf(stderr, "usage: kvstore [-c CLIENTS (1-%d)] [-n OPS per client] [-H HOST] [--check]\n",
          KV_MAX_CLIENTS);
  exit(2);
}

int main(int argc, char **argv)
{
  unsigned nclients = 3;
  unsigned long long ops = 20000;
  int check = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check"))
      check = 1, nclients = 2, ops = 2000;
    else if (!strcmp(argv[i], "-c") && i + 1 < argc)
      nclients = (unsigned)strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "-n") && i + 1 < argc)
      ops = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "-H") && i + 1 < argc) /* an RDMA NIC's address, for verbs */
      snprintf(kv_at, sizeof kv_at, strchr(argv[i + 1], ':') ? "[%s]:0" : "%s:0", argv[i + 1]), i++;
    else
      kv_usage();
  }
  if (nclients < 1 || nclients > KV_MAX_CLIENTS || ops < 2 || ops > 100000000)
    kv_usage();
  if (kv_map_shared(nclients, ops))
    kv_bad("cannot map the shared results");
  unsigned watchdog_s = 60 + (unsigned)(ops * nclients / 1000);
  signal(SIGALRM, kv_watchdog);
  alarm(watchdog_s);
  kv_spawn(nclients, ops, watchdog_s);
  int ok = kv_reap();
  alarm(0);
  if (ok) {
    if (!check)
      kv_report();
    ok = kv_verify();
  }
  munmap(kv_sh, kv_sh_len);
  return ok ? 0 : 1;
}
