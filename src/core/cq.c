/* Completions: the request pool, polling (which also drives progress),
 * waiting without spinning, and the opt-in progress thread.
 *
 * Invariant: a request is in exactly one place: the free list, its
 * connection's outstanding list (posted), or the done list (completed
 * while xport itself was reading the CQ, not yet delivered). */
#include "xport_int.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define REQ_CHUNK 256

struct xport__req *xport__req_grow(xport_ctx_t *ctx)
{
  struct xport__req_chunk *c = calloc(1, sizeof *c + REQ_CHUNK * sizeof(struct xport__req));
  if (!c)
    return NULL;
  c->next = ctx->req_chunks;
  ctx->req_chunks = c;
  for (size_t i = 0; i < REQ_CHUNK; i++) {
    c->reqs[i].next = ctx->free_reqs;
    ctx->free_reqs = &c->reqs[i];
  }
  struct xport__req *r = ctx->free_reqs;
  ctx->free_reqs = r->next;
  r->result = NULL;
  return r;
}

/* Returns a delivered request to the pool; its connection may go with it. */
void xport__req_release(xport_ctx_t *ctx, struct xport__req *req)
{
  xport_conn_t *conn = req->conn;
  if (XPORT__UNLIKELY(req->detail)) { /* failed, and never delivered */
    free(req->detail);
    req->detail = NULL;
  }
  req->next = ctx->free_reqs;
  ctx->free_reqs = req;
  if (conn) {
    conn->nreqs--;
    if (XPORT__UNLIKELY(conn->state == XPORT__CONN_CLOSED))
      xport__conn_free_if_done(conn);
  }
}

/* The details the last xport_poll delivered: the next one ends them. */
static void details_end(xport_ctx_t *ctx)
{
  while (ctx->shown) {
    struct xport__detail *d = ctx->shown;
    ctx->shown = d->next;
    free(d);
  }
}

void xport__req_fini(xport_ctx_t *ctx)
{
  details_end(ctx);
  while (ctx->req_chunks) {
    struct xport__req_chunk *c = ctx->req_chunks;
    ctx->req_chunks = c->next;
    free(c);
  }
  ctx->free_reqs = NULL;
}

/* Copies received or read bytes out of a bounce buffer into the user's iov. */
static void scatter(const struct xport__req *req, size_t len)
{
  const char *src = req->bounce->buf;
  for (size_t i = 0; i < req->uiovcnt && len; i++) {
    size_t n = req->uiov[i].len < len ? req->uiov[i].len : len;
    memcpy(req->uiov[i].base, src, n);
    src += n;
    len -= n;
  }
}

void xport__req_free_mem(struct xport__lane *lane, struct xport__req *req)
{
  if (req->bounce) {
    xport__bounce_put(lane, req->bounce);
    req->bounce = NULL;
  }
  for (unsigned i = 0; i < req->ntmp; i++)
    fi_close(&req->tmp[i]->fid);
  req->ntmp = 0;
}

/* A fetching atomic's old value goes to the caller's result. */
static void atom_result(const struct xport__req *req)
{
  *req->result = req->bounce ? ((const uint64_t *)(const void *)req->bounce->buf)[2] : req->atom[2];
}

static inline __attribute__((always_inline)) void unlink_out(struct xport__req *req)
{
  xport_conn_t *conn = req->conn;
  XPORT__LIST_UNLINK(conn->out, req, cnext, cprev);
  conn->heard.done++;
  if (req->op == XPORT_OP_RECV)
    conn->nrx--;
  else if (req->op != XPORT__OP_SILENT)
    conn->ntx--;
}

/* ---- unsignaled sends (xport_send_flags(3)) --------------------------- */

/* Whether an unsignaled send on conn posted before seq is still the
 * provider's: on the connection's outstanding or held lists, or orphaned
 * and not yet queued for the user (a shown one counts in unsig_failing
 * until delivered). Walked only while conn has unsignaled sends out. */
static int unsig_before(const xport_conn_t *conn, uint64_t seq)
{
  const struct xport__req *lists[3] = {conn->out, conn->hq.head, conn->lane->zombies};
  for (int i = 0; i < 3; i++)
    for (const struct xport__req *r = lists[i]; r; r = i == 1 ? r->next : r->cnext)
      if ((r->unsig & XPORT__UNSIG) && r->conn == conn && r->tx_seq < seq &&
          !(r->zombie & XPORT__Z_SHOWN))
        return 1;
  return 0;
}

static void done_push(xport_ctx_t *ctx, struct xport__req *req);

/* A signaled send whose turn came: a success does not vouch for an
 * unsignaled send before it that failed, so it fails the same way. */
static void unsig_vouch(const xport_conn_t *conn, struct xport__req *r)
{
  if (!r->status && conn->unsig.fail_seq && r->tx_seq >= conn->unsig.fail_seq)
    r->status = conn->unsig.fail_status;
}

/* 1 while a signaled send on conn must wait (on ctx->sig_wait) for an
 * unsignaled send posted before it: the provider's still, or its failure
 * not yet delivered (the failure comes first). */
static int unsig_wait(const xport_conn_t *conn, const struct xport__req *r)
{
  return conn->unsig.failing || (conn->unsig.out && unsig_before(conn, r->tx_seq));
}

/* Delivers the signaled sends on conn that waited and have nothing left
 * to wait for. */
static void sig_release(xport_ctx_t *ctx, xport_conn_t *conn)
{
  for (struct xport__req **pp = &ctx->sig_wait; *pp;) {
    struct xport__req *r = *pp;
    if (r->conn != conn || unsig_wait(conn, r)) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    unsig_vouch(conn, r);
    r->unsig = 0;
    done_push(ctx, r);
  }
}

/* An unsignaled send on conn left the provider. A success ends it here;
 * a failure (status) ends it only once delivered (unsig_failed), and
 * holds the signaled sends behind it until then. */
static void unsig_left(xport_ctx_t *ctx, xport_conn_t *conn, int status)
{
  if (status) {
    conn->unsig.failing++;
    return;
  }
  XPORT__ASSERT(conn->unsig.out > 0);
  conn->unsig.out--;
  sig_release(ctx, conn);
}

/* An unsignaled send's failure is being delivered: the signaled sends
 * posted after it fail too, now that it came first. */
static __attribute__((noinline)) void unsig_failed(xport_ctx_t *ctx, struct xport__req *req)
{
  xport_conn_t *conn = req->conn;
  conn->unsig.failing--;
  conn->unsig.out--;
  if (!conn->unsig.fail_seq || req->tx_seq + 1 < conn->unsig.fail_seq) {
    conn->unsig.fail_seq = req->tx_seq + 1;
    conn->unsig.fail_status = req->status;
  }
  sig_release(ctx, conn);
}

/* Ends a request's life on the wire: library-owned memory is released,
 * received bytes are in the user's buffer, and it leaves its connection's
 * outstanding list. */
static inline __attribute__((always_inline)) void
finish(struct xport__lane *lane, struct xport__req *req, int status, size_t len)
{
  /* A user request, of a connection of this lane, counted as posted. */
  XPORT__ASSERT(req->conn && req->conn->lane == lane && lane->nposted > 0);
  /* The fetched value and the received bytes leave the bounce slot
   * before it goes back (an atomic has no user iov to scatter to). */
  if (XPORT__UNLIKELY(req->result != NULL) && !status)
    atom_result(req);
  if (XPORT__UNLIKELY(req->bounce || req->ntmp)) {
    if (req->bounce && req->uiovcnt && !status)
      scatter(req, len);
    xport__req_free_mem(lane, req);
  }
  unlink_out(req);
  lane->nposted--;
  if (XPORT__UNLIKELY(req->unsig & XPORT__UNSIG))
    unsig_left(lane->ctx, req->conn, status);
}

static void req_finish(struct xport__lane *lane, struct xport__req *req, int status, size_t len)
{
  finish(lane, req, status, len);
}

static void done_push(xport_ctx_t *ctx, struct xport__req *req)
{
  XPORT__FIFO_PUSH(ctx->done, ctx->done_tail, req, next);
  ctx->done_in++;
  /* A lost connection's operations ended after its event was queued
   * (held posts, what the provider gave back) still come before it. */
  if (XPORT__UNLIKELY(ctx->evq != NULL) && req->conn && req->conn->ev.queued)
    req->conn->ev.after = ctx->done_in;
}

void xport__done_push(xport_ctx_t *ctx, struct xport__req *req)
{
  done_push(ctx, req);
}

void xport__req_complete(xport_ctx_t *ctx, struct xport__req *req, int status)
{
  req_finish(req->conn->lane, req, status, 0);
  req->status = status;
  req->len = 0;
  req->flags = 0;
  done_push(ctx, req);
}

void xport__req_done_now(xport_ctx_t *ctx, struct xport__req *req)
{
  if (XPORT__UNLIKELY(req->bounce || req->ntmp))
    xport__req_free_mem(req->conn->lane, req);
  req->status = 0;
  req->flags = 0;
  req->conn->nreqs++;
  done_push(ctx, req);
}

/* The kernel closes a killed process's sockets (and tcp, rxm end the
 * connection) before its pidfd says it ended: asked at that moment, an
 * immediate look finds the target alive, and the hint blames the key.
 * So the first look per connection waits a little (a target that
 * refused a key, alive, costs that once). */
#define GONE_WAIT_MS 50
void xport__conn_check_gone(xport_conn_t *conn)
{
  if (conn->proc.gone || conn->proc.pidfd < 0)
    return;
  struct pollfd p = {.fd = conn->proc.pidfd, .events = POLLIN};
  int wait = conn->proc.waited ? 0 : GONE_WAIT_MS;
  conn->proc.waited = 1;
  if (poll(&p, 1, wait) > 0)
    conn->proc.gone = 1;
}

/* ---- posts the provider pushed back (xport__post_hold) ---------------- */

static ssize_t held_post(xport_conn_t *conn, struct xport__req *req)
{
  const struct xport__held *h = req->held;
  switch (h->kind) {
  case XPORT__H_SEND:
    return conn->ops->send(conn, req, (struct iovec *)h->iov, (void **)h->desc, h->cnt,
                          h->flags, h->data);
  case XPORT__H_MARK:
    return conn->ops->marker(conn, req, h->flags);
  case XPORT__H_READ:
    return conn->ops->read(conn, req, (struct iovec *)h->iov, (void **)h->desc, h->cnt,
                           h->rma.addr, h->rma.key);
  default:
    return conn->ops->write(conn, req, (struct iovec *)h->iov, (void **)h->desc, h->cnt,
                            h->rma.addr, h->rma.key, h->flags, h->data);
  }
}

/* Takes conn's oldest held request off its queue: it is outstanding
 * from now on, as xport__post_end would have left it. */
static struct xport__req *held_pop(xport_conn_t *conn)
{
  struct xport__req *req = conn->hq.head;
  XPORT__ASSERT(req && req->held);
  conn->hq.head = req->next;
  if (!conn->hq.head) {
    conn->hq.tail = NULL;
    XPORT__LIST_UNLINK(conn->ctx->holding, conn, hq.next, hq.prev);
  }
  free(req->held);
  req->held = NULL;
  XPORT__LIST_PUSH(conn->out, req, cnext, cprev);
  return req;
}

void xport__held_retry(xport_ctx_t *ctx)
{
  xport_conn_t *conn = ctx->holding;
  while (conn) {
    xport_conn_t *next = conn->hq.next; /* conn may leave the list */
    /* A peer that holds the provider's lock is passed by: a poll never
     * waits on a peer. */
    if (conn->lane->tp->may_post && !conn->lane->tp->may_post(conn)) {
      conn = next;
      continue;
    }
    /* Its lane's control messages pushed back go first, at the next
     * housekeeping. */
    while (conn->hq.head && !conn->lane->ctl_owed) {
      struct xport__req *req = conn->hq.head;
      ssize_t ret = held_post(conn, req);
      if (xport__pushed_back(ret))
        break;
      held_pop(conn);
      if (ret) {
        xport__req_complete(ctx, req, xport__err_from_fi((int)ret));
        continue;
      }
      if (XPORT__UNLIKELY(conn->lane->rma_timeout_ms) && req->posted_ms)
        req->posted_ms = xport__now_ms(), req->posted_seq = ++ctx->dl.rma_seq;
    }
    conn = next;
  }
}

void xport__held_flush(xport_conn_t *conn, int status)
{
  while (conn->hq.head)
    xport__req_complete(conn->ctx, held_pop(conn), status);
}

/* ---- reading the CQ --------------------------------------------------- */

/* fi_cq_read, or fi_cq_readfrom where completions name their sender
 * (RDM with FI_SOURCE), which control messages are checked against. */
static inline ssize_t cq_read(struct xport__lane *lane, struct fi_cq_tagged_entry *ents, size_t n,
                              fi_addr_t *srcs)
{
  if (lane->source)
    return fi_cq_readfrom(lane->cq, ents, n, srcs);
  return fi_cq_read(lane->cq, ents, n);
}

/* Gives back the pages a truncated message wrote into the sink. */
static void sink_trim(struct xport__lane *lane, size_t used)
{
  size_t page = 4096, n = used < lane->sink_len ? used : lane->sink_len;
  madvise(lane->sink, (n + page - 1) / page * page, MADV_DONTNEED);
}

/* What a successful CQ entry says of its request: bytes, immediate data,
 * and which operation it turned out to be (a receive consumed by a
 * write-with-immediate, natively or by xport's emulation). */
static inline void entry_result(struct xport__lane *lane, struct xport__req *req,
                                const struct fi_cq_data_entry *e, size_t len)
{
  /* Longer than posted: the rest went to the sink (truncation_hangs). A
   * receive consumed by a native write-with-immediate reports the write's
   * length (verbs), which is no truncation. */
  int status = 0;
  if (XPORT__UNLIKELY(len > req->len) && !(e->flags & FI_REMOTE_WRITE)) {
    status = -XPORT_ETRUNC;
    sink_trim(lane, len - req->len);
    len = req->len; /* a truncated receive reports its buffer's length */
  }
  req->status = status;
  req->len = len;
  req->flags = 0;
  req->imm = 0;
  if (XPORT__UNLIKELY(e->flags & FI_REMOTE_CQ_DATA)) {
    req->flags = XPORT_COMP_IMM;
    req->imm = (uint32_t)e->data;
    if ((e->flags & FI_REMOTE_WRITE) || req->conn->ops->is_marker(e)) {
      req->op = XPORT_OP_REMOTE_WRITE_IMM;
      req->len = 0;
    }
  }
}

/* Reads a successful CQ entry into the request. */
static inline __attribute__((always_inline)) void take_entry(struct xport__lane *lane, struct xport__req *req,
                              const struct fi_cq_data_entry *e)
{
  size_t len = req->len;
  if (req->op == XPORT_OP_RECV) {
    len = e->len;
    req->conn->heard.msg = 1; /* any message from the peer says it is alive */
  }
  finish(lane, req, 0, len); /* inline: the poll's own path */
  entry_result(lane, req, e, len);
}

void xport__req_orphan(struct xport__req *req, int status)
{
  unlink_out(req);
  req->status = status;
  req->zombie = XPORT__Z_ORPHAN;
  req->conn->orphans.n++;
  if (req->op == XPORT_OP_RECV)
    req->conn->orphans.recvs++;
  /* Reported to the user only once the provider lets go of it. */
  XPORT__LIST_PUSH(req->conn->lane->zombies, req, cnext, cprev);
}

/* The provider let go of an orphaned request (its own completion, e; an
 * error or a confirmed cancel, or its endpoint closed: e NULL): the user
 * may now see it, with what the provider did if it finished the
 * operation, else with the status it was given when orphaned. */
static void zombie_done(struct xport__lane *lane, struct xport__req *req,
                        const struct fi_cq_data_entry *e)
{
  unsigned z = req->zombie;
  /* Orphaned on this lane, and counted by its connection. */
  XPORT__ASSERT((z & XPORT__Z_ORPHAN) && req->conn && req->conn->lane == lane &&
                req->conn->orphans.n > 0);
  XPORT__LIST_UNLINK(lane->zombies, req, cnext, cprev);
  if (req->op == XPORT_OP_RECV && !(z & (XPORT__Z_SHOWN | XPORT__Z_POOL)))
    req->conn->orphans.recvs--;
  if (req->pair & XPORT__POOLED)
    e = NULL; /* a message after its connection's end: dropped, the entry goes back */
  if (e && !(z & XPORT__Z_SHOWN)) {
    size_t len = req->op == XPORT_OP_RECV ? e->len : req->len;
    if (req->bounce && req->uiovcnt)
      scatter(req, len);
    if (req->result)
      atom_result(req);
    entry_result(lane, req, e, len);
    if (req->unsig & XPORT__UNSIG)
      unsig_left(lane->ctx, req->conn, req->status);
    z |= XPORT__Z_SHOWN; /* nothing to clear below */
    done_push(lane->ctx, req);
  } else if (!(z & XPORT__Z_SHOWN) && (req->unsig & XPORT__UNSIG)) {
    unsig_left(lane->ctx, req->conn, req->status); /* queued below, failed */
  }
  xport__req_free_mem(lane, req);
  lane->nposted--;
  req->zombie = 0;
  if (!--req->conn->orphans.n)
    lane->reap = 1; /* its connection may let go of the peer now (transport/rdm.c) */
  if (z & XPORT__Z_DELIVERED) {
    req->conn = NULL; /* accounted for when the user saw it */
    xport__req_release(lane->ctx, req);
  } else if (!(z & XPORT__Z_SHOWN)) {
    req->len = 0;
    req->flags = 0;
    req->imm = 0;
    done_push(lane->ctx, req);
  } /* else on the done list already: delivered as any other */
}

void xport__zombie_show(xport_ctx_t *ctx, xport_conn_t *conn)
{
  for (struct xport__req *z = conn->lane->zombies; z; z = z->cnext)
    if (z->conn == conn && (z->pair & XPORT__POOLED) && !(z->zombie & XPORT__Z_POOL)) {
      /* The pool's: back there only once the provider lets go of the
       * buffer, and shown to nobody, so the event need not wait. */
      z->zombie |= XPORT__Z_POOL;
      conn->orphans.recvs--;
    } else if (z->conn == conn && !(z->zombie & (XPORT__Z_SHOWN | XPORT__Z_POOL))) {
      z->zombie |= XPORT__Z_SHOWN;
      if (z->op == XPORT_OP_RECV)
        conn->orphans.recvs--;
      if (z->unsig & XPORT__UNSIG)
        unsig_left(ctx, conn, z->status);
      z->len = 0;
      z->flags = 0;
      z->imm = 0;
      done_push(ctx, z);
    }
}

void xport__zombie_reclaim(struct xport__lane *lane, struct xport__rep *rep)
{
  for (struct xport__req *z = lane->zombies; z;) {
    if (z->rep == rep) {
      zombie_done(lane, z, NULL);
      z = lane->zombies;
    } else {
      z = z->cnext;
    }
  }
}

/* Entries xport handles itself: control traffic and zombies (e: the
 * entry, a successful one where status is 0). */
static void internal_entry(struct xport__lane *lane, struct xport__req *req, int status,
                           const struct fi_cq_data_entry *e, fi_addr_t src)
{
  if (req->zombie) {
    /* The provider's own verdict on the operation says more than the loss
     * of its connection, which it caused (a refused key: EACCES), unless
     * the user closed the connection (ECANCELED, xport_conn_close(3)). */
    if (status == -XPORT_EACCES && !(req->zombie & XPORT__Z_SHOWN) && req->conn &&
        !req->conn->closing)
      req->status = status;
    zombie_done(lane, req, status ? NULL : e);
  } else {
    req->on_done(lane, req, status, e, src); /* its owner's: a transport's */
  }
}

/* Entry i of what fi_cq_read returned: the CQ's format is tagged over
 * RDM and data otherwise, and fi_cq_data_entry begins every tagged one. */
static inline const struct fi_cq_data_entry *entry_at(const struct xport__lane *lane,
                                                      const struct fi_cq_tagged_entry *ents,
                                                      ssize_t i)
{
  return (const void *)((const char *)ents + (size_t)i * lane->cq_entry_size);
}

/* A completion of op with status, flags and imm as given, and nothing to
 * add (no detail, no hint). */
static inline __attribute__((always_inline)) void
fill_plain(xport_completion_t *c, const struct xport__req *req, int status, unsigned flags,
           uint32_t imm, size_t len)
{
  c->op = req->op;
  c->status = status;
  c->flags = flags;
  c->imm = imm;
  c->len = len;
  c->user_ctx = req->user_ctx;
  c->conn = req->conn;
  c->detail = NULL;
  c->hint = NULL;
}

static inline __attribute__((always_inline)) void fill_comp(xport_ctx_t *ctx, xport_completion_t *c,
                                                         struct xport__req *req)
{
  fill_plain(c, req, req->status, req->flags, req->imm, req->len);
  if (XPORT__UNLIKELY(req->status)) {
    /* Some providers give a truncated message's immediate data, others
     * not: none, alike everywhere (xport_poll(3)). */
    c->flags = 0;
    c->imm = 0;
    if (req->detail) {
      c->detail = req->detail->text;
      req->detail->next = ctx->shown;
      ctx->shown = req->detail;
      req->detail = NULL;
    }
    c->hint = xport__err_hint(req->status);
    /* Nothing was transferred that the application may count on; only a
     * truncated receive says how much of its buffer it filled. */
    if (req->status != -XPORT_ETRUNC)
      c->len = 0;
    /* A connection lost under a one-sided operation: a target that died
     * and one that refused the key end it alike on some providers (tcp,
     * rxm), so the key is blamed only where the target is not known gone
     * and the user did not close it. */
    if ((req->op == XPORT_OP_READ || req->op == XPORT_OP_WRITE || req->op == XPORT_OP_ATOMIC) &&
        (req->status == -XPORT_ECANCELED || req->status == -XPORT_ECONNRESET ||
         req->status == -XPORT_EIO) && req->conn && !req->conn->closing)
      c->hint = req->conn->proc.gone
                    ? "the target is gone (its process ended, or it stopped answering) with "
                      "the operation outstanding"
                    : "the target may have refused the remote key (revoked, forged or out "
                      "of range) and dropped the connection";
  }
}

/* The silent half of a pair (an emulated write_imm's write) is done: its
 * partner may go, with this half's error if it had none of its own. */
static void pair_done(xport_ctx_t *ctx, struct xport__req *silent)
{
  struct xport__req *p = silent->user_ctx;
  silent->user_ctx = NULL;
  if (p->pair & XPORT__PAIR_DEFER) {
    ctx->wimm_write_done(ctx, p, silent->status);
    return;
  }
  p->pair &= ~XPORT__PAIR_WAIT;
  if (silent->status && !p->pair_status)
    p->pair_status = silent->status;
  if (p->pair & XPORT__PAIR_HELD)
    done_push(ctx, p);
}

void xport__done_discard(xport_ctx_t *ctx)
{
  while (ctx->sig_wait) {
    struct xport__req *r = ctx->sig_wait;
    ctx->sig_wait = r->next;
    done_push(ctx, r);
  }
  while (ctx->done) {
    struct xport__req *r = ctx->done;
    ctx->done = r->next;
    if (!ctx->done)
      ctx->done_tail = NULL;
    ctx->done_out++;
    if (r->op == XPORT__OP_SILENT && r->user_ctx)
      pair_done(ctx, r);
    xport__req_release(ctx, r);
  }
}

/* A lent receive ended (req, pair XPORT__POOLED): 1 if the application
 * sees it (a message, or a truncated one: it took the entry), 0 where it
 * ended with its connection instead, its entry back in the pool and req
 * released. Either way its connection may take another. */
static int pool_done(xport_ctx_t *ctx, struct xport__req *req)
{
  struct xport__pent *p = req->pent;
  xport_conn_t *conn = req->conn;
  req->pair &= ~XPORT__POOLED;
  req->pent = NULL;
  XPORT__ASSERT(p && conn && conn->pool.lent > 0);
  conn->pool.lent--;
  /* A truncated message took its entry as any message does; any other
   * failure is the connection's end (closed, lost, flushed), which no
   * message reached: the entry goes back, first in line as it was. */
  int shown = !req->status || req->status == -XPORT_ETRUNC;
  if (shown) {
    ctx->pool.total--;
    if (conn->pool.took < ctx->pool.lend)
      conn->pool.took++;
    p->next = ctx->pool.spare;
    ctx->pool.spare = p;
  } else {
    xport__pool_put_back(ctx, p);
  }
  xport__pool_want(conn);
  if (!shown)
    xport__req_release(ctx, req); /* may free a closed conn: last */
  if (ctx->pool.want && ctx->pool.free)
    ctx->pool.feed(ctx);
  return shown;
}

/* Delivers a finished request into *c; returns 0 for xport's own silent
 * requests, which the application never sees, and for the user's half of
 * a pair whose other half is still out (it comes back through the done
 * list). */
static inline __attribute__((always_inline)) int
deliver_one(xport_ctx_t *ctx, struct xport__req *req, xport_completion_t *c, int may_be_zombie)
{
  int shown = req->op != XPORT__OP_SILENT;
  if (XPORT__UNLIKELY(req->unsig)) {
    if (!(req->unsig & XPORT__UNSIG)) {
      if (unsig_wait(req->conn, req)) {
        req->next = ctx->sig_wait; /* until those before it are finished */
        ctx->sig_wait = req;
        return 0;
      }
      unsig_vouch(req->conn, req);
    } else if (!req->status) {
      xport__req_release(ctx, req); /* only its failure is ever seen */
      return 0;
    } else {
      unsig_failed(ctx, req);
    }
  }
  if (XPORT__UNLIKELY(req->pair)) {
    if ((req->pair & XPORT__POOLED) && !pool_done(ctx, req))
      return 0; /* its connection ended under it: back in the pool */
    if (req->pair & XPORT__PAIR_WAIT) {
      req->pair |= XPORT__PAIR_HELD;
      return 0;
    }
    if (req->pair_status) /* the write's error is the cause of the message's */
      req->status = req->pair_status;
    req->pair = 0;
  }
  if (shown)
    fill_comp(ctx, c, req);
  else if (XPORT__UNLIKELY(req->user_ctx != NULL))
    pair_done(ctx, req);
  if (may_be_zombie && XPORT__UNLIKELY(req->zombie)) {
    /* Shown before the provider reported it (xport__zombie_show): the
     * request itself stays until it does. */
    req->zombie |= XPORT__Z_DELIVERED;
    req->conn->nreqs--;
    return shown;
  }
  xport__req_release(ctx, req);
  return shown;
}

static int deliver(xport_ctx_t *ctx, struct xport__req *req, xport_completion_t *c)
{
  return deliver_one(ctx, req, c, 1);
}

/* take_deliver's general case, apart so that its quick case saves few
 * registers. */
static __attribute__((noinline)) int take_deliver_all(struct xport__lane *lane,
                                                      struct xport__req *req,
                                                      const struct fi_cq_data_entry *e,
                                                      xport_completion_t *c)
{
  take_entry(lane, req, e);
  return deliver_one(lane->ctx, req, c, 0); /* the poll sent zombies elsewhere */
}

/* A user request's CQ entry, finished and delivered into *c in one call:
 * the poll's own path, out of line so that a poll that finds nothing
 * keeps a small frame. */
static __attribute__((noinline)) int take_deliver(struct xport__lane *lane,
                                                  struct xport__req *req,
                                                  const struct fi_cq_data_entry *e,
                                                  xport_completion_t *c)
{
  /* Most entries are a whole message or a finished send, write or read
   * with nothing of xport's to undo or wait for: they go straight to *c,
   * by what take_entry and deliver_one would do with them. */
  size_t len = req->op == XPORT_OP_RECV ? e->len : req->len;
  if (XPORT__LIKELY(!req->result && !req->bounce && !req->ntmp && !req->unsig && !req->pair &&
                    req->op != XPORT__OP_SILENT && len <= req->len &&
                    !(e->flags & FI_REMOTE_CQ_DATA))) {
    XPORT__ASSERT(req->conn && req->conn->lane == lane && lane->nposted > 0);
    if (req->op == XPORT_OP_RECV)
      req->conn->heard.msg = 1;
    unlink_out(req);
    lane->nposted--;
    fill_plain(c, req, 0, 0, 0, len);
    xport__req_release(lane->ctx, req);
    return 1;
  }
  return take_deliver_all(lane, req, e, c);
}

/* Delivers from the done list into comps[n..max); returns the new n. */
static inline int deliver_done(xport_ctx_t *ctx, xport_completion_t *comps, int n, int max)
{
  while (XPORT__UNLIKELY(ctx->done != NULL) && n < max) {
    struct xport__req *req = ctx->done;
    ctx->done = req->next;
    if (!ctx->done)
      ctx->done_tail = NULL;
    ctx->done_out++;
    n += deliver(ctx, req, &comps[n]);
  }
  return n;
}

/* Reads one error entry into its request; 1 if there was one. */
static int read_error(struct xport__lane *lane, struct xport__req **req_p)
{
  struct fi_cq_err_entry err;
  memset(&err, 0, sizeof err);
  if (fi_cq_readerr(lane->cq, &err, 0) != 1)
    return 0;
  struct xport__req *req = err.op_context;
  if (!req)
    return 1; /* an error with no request of ours behind it */
  int status = xport__err_from_fi(err.err ? err.err : FI_EIO);
  if (lane->prof && lane->prof->cq_error) {
    int mapped = lane->prof->cq_error(err.err, err.prov_errno, req->op == XPORT_OP_RECV);
    if (mapped)
      status = mapped;
  }
  /* One code per event on every provider (xport(7), OUTCOMES). A
   * cancellation the user did not ask for is the provider flushing a
   * connection that broke (tcp after FI_SHUTDOWN, rxm, verbs), and a
   * connection lost under the user's own close is a cancellation. */
  if (XPORT__UNLIKELY(status == -XPORT_ECANCELED || status == -XPORT_ENOTCONN ||
                      status == -XPORT_ECONNRESET) &&
      req->conn)
    status = req->conn->closing ? -XPORT_ECANCELED : xport__lost_status(req->conn->fail_code);
  if (XPORT__UNLIKELY(req->op >= XPORT__OP_CTL_SEND || req->zombie)) {
    struct fi_cq_data_entry e = {err.op_context, err.flags, err.len, err.buf, err.data};
    internal_entry(lane, req, status, &e, FI_ADDR_NOTAVAIL);
    return 1;
  }
  /* A truncated receive reports its buffer's length, on every provider
   * (which report the message's, or nothing). */
  size_t len = status == -XPORT_ETRUNC && req->op == XPORT_OP_RECV ? req->len : 0;
  req_finish(lane, req, status, len);
  lane->tp->op_failed(lane, req, status);
  req->status = status;
  req->len = len;
  req->flags = 0;
  req->imm = 0;
  /* The text goes with this completion: it may be delivered long after
   * other errors were read (by the progress thread, say). */
  char text[256];
  const char *t = fi_cq_strerror(lane->cq, err.prov_errno, err.err_data, text, sizeof text);
  /* A cancellation is the user's own close: the provider has no cause to
   * tell (tcp's text there is a stale errno, "No such file or directory"). */
  if (t && *t && status != -XPORT_ECANCELED) {
    size_t n = strnlen(t, sizeof text - 1);
    req->detail = malloc(sizeof *req->detail + n + 1);
    if (req->detail) {
      memcpy(req->detail->text, t, n);
      req->detail->text[n] = '\0';
    }
  }
  lane->eq_skip = XPORT__EQ_EVERY; /* errors often mean a disconnect */
  *req_p = req;
  return 1;
}

void xport__cq_drain(struct xport__lane *lane)
{
  struct fi_cq_tagged_entry ents[XPORT__CQ_BATCH];
  fi_addr_t srcs[XPORT__CQ_BATCH];
  for (;;) {
    ssize_t n = cq_read(lane, ents, XPORT__CQ_BATCH, srcs);
    if (n == -FI_EAVAIL) {
      struct xport__req *req = NULL;
      if (!read_error(lane, &req))
        break;
      if (req)
        done_push(lane->ctx, req);
      continue;
    }
    if (n <= 0)
      break;
    for (ssize_t i = 0; i < n; i++) {
      const struct fi_cq_data_entry *e = entry_at(lane, ents, i);
      struct xport__req *req = e->op_context;
      if (!req)
        continue;
      if (XPORT__UNLIKELY(req->op >= XPORT__OP_CTL_SEND || req->zombie)) {
        internal_entry(lane, req, 0, e, lane->source ? srcs[i] : FI_ADDR_NOTAVAIL);
        continue;
      }
      take_entry(lane, req, e);
      done_push(lane->ctx, req);
    }
  }
  /* A request drained here may be for a listener that accepts in the
   * background (waits of connect and accept drain, and never poll). */
  if (XPORT__UNLIKELY(lane->ctx->accept_due) && lane->ctx->auto_accept)
    lane->ctx->auto_accept(lane->ctx);
}

static void sig_clear(xport_ctx_t *ctx);

/* Disconnect events, after whatever is in comps[0, n): those whose
 * connection's ended operations, pushed to the done list before the
 * event or while it waits, have been delivered, and whose receives taken
 * back from the provider have come back (RDM: a cancelled receive's
 * entry is in the CQ, not yet read, when its connection's event is
 * queued). The queue's head decides: an event behind it waits, as events
 * come in the order they happened. */
static int deliver_events(xport_ctx_t *ctx, xport_completion_t *comps, int n, int max)
{
  while (ctx->evq && n < max && (int64_t)(ctx->evq->ev.after - ctx->done_out) <= 0 &&
         !ctx->evq->orphans.recvs) {
    xport_conn_t *conn = ctx->evq;
    xport_completion_t *c = &comps[n++];
    ctx->evq = conn->ev.next;
    if (!ctx->evq)
      ctx->evq_tail = NULL;
    conn->ev.queued = 0;
    memset(c, 0, sizeof *c);
    c->op = XPORT_OP_DISCONNECT;
    c->status = conn->ev.status;
    c->conn = conn;
    c->hint = xport__err_hint(conn->ev.status);
  }
  return n;
}

/* Connections of lane with a deadline (xport_conn_timeout) that had
 * operations outstanding and none of them end for it: lost with
 * -XPORT_ETIMEDOUT, as the transport loses a dead peer's (its operations
 * fail once the provider lets go of them). Housekeeping's, under the
 * lock. The count starts at the first look that finds operations
 * outstanding (never earlier: they may have been posted just before),
 * and again at each look that finds one ended since the last. */
static void deadlines_check(struct xport__lane *lane, long now)
{
  for (xport_conn_t *conn = lane->conns, *next; conn; conn = next) {
    next = conn->next;
    struct xport__deadline *dl = &conn->dl;
    if (!dl->ms || conn->state != XPORT__CONN_CONNECTED)
      continue;
    if (!(conn->ntx || conn->hq.head)) {
      dl->watching = 0;
    } else if (!dl->watching || conn->heard.done != dl->done_seen) {
      dl->watching = 1;
      dl->done_seen = conn->heard.done;
      dl->since = now;
    } else if (now - dl->since >= dl->ms) {
      XPORT__INFO("connection %u: its operations made no progress for %ld ms "
                  "(xport_conn_timeout): it is lost",
                  conn->id, dl->ms);
      conn->fail_code = -XPORT_ETIMEDOUT;
      lane->tp->drop(conn, -XPORT_ETIMEDOUT);
    }
  }
}

static __attribute__((noinline)) void deadlines_run(xport_ctx_t *ctx)
{
  long now = xport__now_ms();
  if (now == ctx->dl.checked)
    return;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    deadlines_check(ctx->lanes[l], now);
  ctx->dl.checked = now;
}

/* A lane with nothing of the application's on it: no connection, nothing
 * posted. Its CQ is read only with its housekeeping: a poll then costs
 * what the busy lanes cost (an empty read of rxm's CQ runs its progress). */
static inline int lane_idle(const struct xport__lane *lane)
{
  return !lane->conns && !lane->nposted;
}

/* One lane's part of a poll: its CQ read into comps[n, max), its pushed
 * back heartbeats paid, and its housekeeping every XPORT__EQ_EVERY polls.
 * Returns the new n. */
static inline __attribute__((always_inline)) int
poll_lane(struct xport__lane *lane, xport_completion_t *comps, int n, int max, int idle)
{
  struct fi_cq_tagged_entry ents[XPORT__CQ_BATCH];
  fi_addr_t srcs[XPORT__CQ_BATCH];
  xport_ctx_t *ctx = lane->ctx;
  if (n < max && !idle) {
    size_t want = (size_t)(max - n) < XPORT__CQ_BATCH ? (size_t)(max - n) : XPORT__CQ_BATCH;
    ssize_t got = cq_read(lane, ents, want, srcs);
    if (got > 0) {
      for (ssize_t i = 0; i < got; i++) {
        const struct fi_cq_data_entry *e = entry_at(lane, ents, i);
        struct xport__req *req = e->op_context;
        if (XPORT__UNLIKELY(!req))
          continue;
        if (XPORT__UNLIKELY(req->op >= XPORT__OP_CTL_SEND || req->zombie)) {
          internal_entry(lane, req, 0, e, lane->source ? srcs[i] : FI_ADDR_NOTAVAIL);
          continue;
        }
        n += take_deliver(lane, req, e, &comps[n]);
      }
    } else if (got == -FI_EAVAIL) {
      struct xport__req *req = NULL;
      if (read_error(lane, &req) && req)
        n += deliver(ctx, req, &comps[n]);
    }
  }
  /* What the provider pushed back may fit now: the entries just read
   * gave room back, or the target served what held its channel.
   * Heartbeats first: the caller's next post would take that room. */
  if (XPORT__UNLIKELY(lane->ka_owed != 0))
    lane->tp->pay_owed(lane);
  /* Connection events are rare: look at the EQ (or run the RDM checks,
   * which read the clock) once every XPORT__EQ_EVERY polls, and at once
   * after an error completion. Busy or idle alike: a CQ that always has
   * entries must not starve disconnects, heartbeats and peer checks. */
  if (XPORT__UNLIKELY(++lane->eq_skip >= XPORT__EQ_EVERY)) {
    lane->eq_skip = 0;
    if (idle)
      xport__cq_drain(lane); /* what came for it meanwhile (control traffic) */
    lane->tp->progress(lane);
    if (XPORT__UNLIKELY(ctx->dl.min_ms != 0))
      deadlines_run(ctx);
    if (XPORT__UNLIKELY(ctx->pool.want != NULL) && ctx->pool.free)
      ctx->pool.feed(ctx); /* a CQ that was full */
    /* A connection lost just now ended its operations: they come before
     * its disconnect event, as they do where the loss was seen earlier. */
    n = deliver_done(ctx, comps, n, max);
  }
  return n;
}

/* The lanes after the first, the one that went first last time first,
 * so that none starves another. */
static __attribute__((noinline)) int poll_lanes(xport_ctx_t *ctx, xport_completion_t *comps,
                                                int n, int max)
{
  unsigned nl = ctx->nlanes, l = ctx->poll_turn;
  if (XPORT__LIKELY(nl == 2)) { /* a fabric and shm beside it: straight */
    struct xport__lane *a = ctx->lanes[l], *b = ctx->lanes[l ^ 1];
    ctx->poll_turn = l ^ 1;
    n = poll_lane(a, comps, n, max, lane_idle(a));
    return poll_lane(b, comps, n, max, lane_idle(b));
  }
  ctx->poll_turn = l + 1 < nl ? l + 1 : 0;
  for (unsigned k = 0; k < nl; k++, l = l + 1 < nl ? l + 1 : 0) {
    struct xport__lane *lane = ctx->lanes[l];
    n = poll_lane(lane, comps, n, max, lane_idle(lane));
  }
  return n;
}

static inline __attribute__((always_inline)) int xport_poll__locked(xport_ctx_t *ctx,
                                                                   xport_completion_t *comps,
                                                                   int max)
{
  int n = 0;

  if (XPORT__UNLIKELY(ctx->shown != NULL)) /* ctx: checked by xport_poll */
    details_end(ctx);

  /* Events before new entries, or a CQ that always has some (the caller
   * asking for one completion at a time) would hold them back for ever;
   * and before done-list entries pushed after them, which the RDM checks
   * refill from that CQ, but after those pushed before them: a lost
   * connection's operations. */
  if (XPORT__UNLIKELY(ctx->evq != NULL))
    n = deliver_events(ctx, comps, n, max);
  n = deliver_done(ctx, comps, n, max);
  if (XPORT__UNLIKELY(ctx->evq != NULL) && n < max)
    n = deliver_events(ctx, comps, n, max);
  /* One lane: read whatever its state (the fast path). */
  if (XPORT__LIKELY(ctx->nlanes == 1))
    n = poll_lane(ctx->lanes[0], comps, n, max, 0);
  else
    n = poll_lanes(ctx, comps, n, max);
  if (XPORT__UNLIKELY(ctx->holding != NULL))
    xport__held_retry(ctx);
  if (XPORT__UNLIKELY(ctx->evq != NULL))
    n = deliver_events(ctx, comps, n, max);
  if (XPORT__UNLIKELY(ctx->wake.sig_set))
    sig_clear(ctx);
  return n;
}

/* How often a lane without a wait object wakes the context's descriptor. */
#define TICK_NS 1000000L

int xport__wait_fds(struct xport__lane *lane)
{
  struct epoll_event ev = {.events = EPOLLIN};
  xport_ctx_t *ctx = lane->ctx;

  if (lane->cq_fd < 0 || (lane->eq && lane->eq_fd < 0)) {
    lane->no_wait = 1; /* xport_wait sleeps in short steps instead */
    return 0;
  }
  if (ctx->wake.epfd < 0 && (ctx->wake.epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
    return -XPORT_ENOMEM;
  if (epoll_ctl(ctx->wake.epfd, EPOLL_CTL_ADD, lane->cq_fd, &ev) ||
      (lane->eq && epoll_ctl(ctx->wake.epfd, EPOLL_CTL_ADD, lane->eq_fd, &ev)))
    lane->no_wait = 1;
  return 0;
}

/* 1 if some lane has no wait object that the context's epfd holds. */
static int steps_only(const xport_ctx_t *ctx)
{
  if (ctx->wake.epfd < 0)
    return 1;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    if (ctx->lanes[l]->no_wait)
      return 1;
  return 0;
}

/* Gives lane, which has no wait object, a timer in ctx->wake.epfd that fires
 * every millisecond: 0, or a code with nothing made. */
static int tick_open(struct xport__lane *lane)
{
  xport_ctx_t *ctx = lane->ctx;
  struct epoll_event ev = {.events = EPOLLIN};
  struct itimerspec every = {{0, TICK_NS}, {0, TICK_NS}};
  int made = 0;
  if (ctx->wake.epfd < 0) {
    if ((ctx->wake.epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
      return -XPORT_ENOMEM;
    made = 1;
  }
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0 || timerfd_settime(fd, 0, &every, NULL) ||
      epoll_ctl(ctx->wake.epfd, EPOLL_CTL_ADD, fd, &ev)) {
    if (fd >= 0)
      close(fd);
    if (made) {
      close(ctx->wake.epfd);
      ctx->wake.epfd = -1;
    }
    return -XPORT_ENOMEM;
  }
  lane->tick_fd = fd;
  return 0;
}

/* Reads the lanes' timers, so that the descriptor sleeps again until the
 * next millisecond (xport_wait, which the documented loop calls before it
 * sleeps). */
static void ticks_clear(xport_ctx_t *ctx)
{
  uint64_t n;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    if (XPORT__UNLIKELY(ctx->lanes[l]->tick_fd >= 0) &&
        read(ctx->lanes[l]->tick_fd, &n, sizeof n) < 0 && errno != EAGAIN)
      XPORT__DEBUG("lane timer: %s", strerror(errno));
}

/* A timer, not armed, in ctx->wake.epfd: into *fd_p, where it stays -1 on
 * failure (-XPORT_ENOMEM). */
static int timer_open(xport_ctx_t *ctx, int *fd_p)
{
  struct epoll_event ev = {.events = EPOLLIN};
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0 || epoll_ctl(ctx->wake.epfd, EPOLL_CTL_ADD, fd, &ev)) {
    if (fd >= 0)
      close(fd);
    return -XPORT_ENOMEM;
  }
  *fd_p = fd;
  return 0;
}

int xport__deadline_tick(xport_ctx_t *ctx)
{
  if (!ctx->dl.min_ms || ctx->wake.epfd < 0)
    return 0;
  long ms = ctx->dl.min_ms / 4 > 0 ? ctx->dl.min_ms / 4 : 1;
  struct timespec every = {ms / 1000, (ms % 1000) * 1000000L};
  struct itimerspec t = {every, every};
  if (ctx->dl.tick_fd < 0 && timer_open(ctx, &ctx->dl.tick_fd))
    return -XPORT_ENOMEM;
  return timerfd_settime(ctx->dl.tick_fd, 0, &t, NULL) ? -XPORT_EIO : 0;
}

/* Reads the deadlines' timer and looks at them, as the timer asked.
 * Under the lock. */
static void deadline_tick_clear(xport_ctx_t *ctx)
{
  uint64_t n;
  if (ctx->dl.tick_fd >= 0 && read(ctx->dl.tick_fd, &n, sizeof n) < 0 && errno != EAGAIN)
    XPORT__DEBUG("deadline timer: %s", strerror(errno));
  deadlines_run(ctx);
}

/* Makes the descriptor readable in ms milliseconds, once; disarmed (and
 * read) by the next xport_wait. */
static void nap_arm(xport_ctx_t *ctx, long ms)
{
  if (ctx->wake.nap_fd < 0)
    return;
  if (ms < 1)
    ms = 1;
  struct itimerspec t = {{0, 0}, {ms / 1000, (ms % 1000) * 1000000L}};
  if (timerfd_settime(ctx->wake.nap_fd, 0, &t, NULL))
    XPORT__DEBUG("nap timer: %s", strerror(errno));
}

static void nap_clear(xport_ctx_t *ctx)
{
  uint64_t n;
  if (ctx->wake.nap_fd >= 0 && read(ctx->wake.nap_fd, &n, sizeof n) < 0 && errno != EAGAIN)
    XPORT__DEBUG("nap timer: %s", strerror(errno));
}

XPORT_API int xport_ctx_fd(xport_ctx_t *ctx, int *fd_p)
{
  if (!ctx || !fd_p)
    return -XPORT_EINVAL;
  int ret = 0;
  XPORT__LOCK(ctx);
  /* Wait objects turned off: the caller polls, or waits (in steps). */
  for (unsigned l = 0; l < ctx->nlanes && !ret; l++)
    if (ctx->lanes[l]->no_wait == 2)
      ret = -XPORT_ENOSYS;
  /* A lane without a wait object (shm) is covered by a timer: the
   * descriptor wakes its sleeper within a millisecond of the lane's work,
   * as xport_wait's steps do. */
  for (unsigned l = 0; l < ctx->nlanes && !ret; l++)
    if (ctx->lanes[l]->no_wait == 1 && ctx->lanes[l]->tick_fd < 0)
      ret = tick_open(ctx->lanes[l]);
  if (!ret && ctx->wake.nap_fd < 0 && !steps_only(ctx))
    ret = timer_open(ctx, &ctx->wake.nap_fd); /* objects.h */
  if (!ret)
    *fd_p = ctx->wake.epfd;
  XPORT__UNLOCK(ctx);
  return ret;
}

/* 1 when the wait fds may be slept on, 0 when something is pending. */
static int may_sleep(struct xport__lane *lane)
{
  struct fid *fids[2] = {&lane->cq->fid, lane->eq ? &lane->eq->fid : NULL};
  return fi_trywait(lane->fabric, fids, lane->eq ? 2 : 1) == FI_SUCCESS;
}

/* Reads the progress thread's signal once the work it announced is gone,
 * so that the context's fd stops being readable. Under progress_lock. */
static void sig_clear(xport_ctx_t *ctx)
{
  uint64_t v;
  if (ctx->wake.sig_set && !ctx->done && !ctx->evq) {
    ctx->wake.sig_set = 0;
    if (read(ctx->wake.sig_fd, &v, sizeof v) < 0)
      XPORT__DEBUG("progress signal: %s", strerror(errno));
  }
}

/* Called with the lock held: 1 if xport_poll has something to return. */
static int work_queued(xport_ctx_t *ctx)
{
  if (XPORT__UNLIKELY(ctx->wake.sig_set))
    sig_clear(ctx);
  return ctx->done || ctx->evq;
}

/* One look for work without sleeping, on every lane: 1 if the caller
 * should return. */
static int wait_check(xport_ctx_t *ctx, int drain)
{
  XPORT__LOCK(ctx);
  for (unsigned l = 0; drain && l < ctx->nlanes; l++)
    xport__cq_drain(ctx->lanes[l]);
  if (ctx->holding)
    xport__held_retry(ctx);
  for (unsigned l = 0; l < ctx->nlanes && !ctx->done && !ctx->evq; l++)
    ctx->lanes[l]->tp->progress(ctx->lanes[l]);
  if (ctx->dl.min_ms)
    deadlines_run(ctx);
  int ready = work_queued(ctx);
  XPORT__UNLOCK(ctx);
  return ready;
}

/* No wait object (shm), or one that does not cover every lane of the
 * context: check for work, then sleep in growing steps (up to 1 ms) so
 * that an idle process does not burn a core. */
static int wait_steps(xport_ctx_t *ctx, int timeout_ms)
{
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  long step_us = 10;
  for (;;) {
    if (wait_check(ctx, 1))
      return 0;
    if (deadline >= 0 && xport__now_ms() >= deadline)
      return -XPORT_ETIMEDOUT;
    struct timespec ts = {0, step_us * 1000};
    nanosleep(&ts, NULL);
    if (step_us < 1000)
      step_us *= 2;
  }
}

static int wait_any(xport_ctx_t *ctx, int timeout_ms);

XPORT_API int xport_wait(xport_ctx_t *ctx, int timeout_ms)
{
  if (!ctx)
    return -XPORT_EINVAL;
  /* Completions held back (XPORT_FAULT delay_ms) wake no fd. */
  if (XPORT__UNLIKELY(ctx->fault != NULL))
    return xport__fault_wait(ctx, timeout_ms, wait_any);
  return wait_any(ctx, timeout_ms);
}

/* 1 if lane watches its peers by the clock and has some to watch. */
static int watching(const struct xport__lane *lane)
{
  return lane->tp->watches_peers && (lane->conns || lane->draining);
}

static int wait_any(xport_ctx_t *ctx, int timeout_ms)
{
  if (steps_only(ctx)) {
    ticks_clear(ctx);
    if (ctx->dl.min_ms) {
      XPORT__LOCK(ctx);
      deadline_tick_clear(ctx);
      XPORT__UNLOCK(ctx);
    }
    return wait_steps(ctx, timeout_ms);
  }
  /* Where peers are watched for death (RDM), never sleep past a check. */
  int cap = -1, watches = 0;
  for (unsigned l = 0; l < ctx->nlanes; l++) {
    watches |= ctx->lanes[l]->tp->watches_peers;
    if (watching(ctx->lanes[l]))
      cap = (int)(ctx->peer_check_ms / 4);
  }
  struct epoll_event ev;
  /* The done list, the drain (control traffic over RDM must not look
   * like work) and fi_trywait are one step under the lock: the progress
   * thread may fill the done list from the CQ just before fi_trywait
   * finds the CQ empty; from then on it signals sig_fd, which is in
   * epfd, for whatever it queues. */
  XPORT__LOCK(ctx);
  nap_clear(ctx);
  if (ctx->dl.min_ms)
    deadline_tick_clear(ctx);
  for (unsigned l = 0; l < ctx->nlanes; l++)
    if (ctx->lanes[l]->ka_owed)
      ctx->lanes[l]->tp->pay_owed(ctx->lanes[l]);
  if (ctx->holding)
    xport__held_retry(ctx);
  /* Held posts wake nothing when they fit again: look often. Deadlines
   * are looked at a few times within the shortest. */
  if (ctx->dl.min_ms && (cap < 0 || cap > ctx->dl.min_ms / 4))
    cap = ctx->dl.min_ms / 4 > 0 ? (int)(ctx->dl.min_ms / 4) : 1;
  if (ctx->holding)
    cap = 1;
  int ready = work_queued(ctx);
  for (unsigned l = 0; l < ctx->nlanes && !ready; l++) {
    struct xport__lane *lane = ctx->lanes[l];
    if (lane->tp->watches_peers) {
      xport__cq_drain(lane);
      lane->tp->progress(lane);
      ready = work_queued(ctx);
    }
  }
  /* A provider may refuse to sleep for work of its own that nothing of
   * the caller's comes from: drained and run, if it still refuses, it is
   * busy, not ready. Saying "ready" would make the caller poll nothing
   * and wait again at once, tens of thousands of times a second; it is
   * looked at again within a millisecond instead. */
  int busy = 0;
  for (unsigned l = 0; l < ctx->nlanes && !ready; l++) {
    struct xport__lane *lane = ctx->lanes[l];
    if (may_sleep(lane))
      continue;
    xport__cq_drain(lane);
    lane->tp->progress(lane);
    ready = work_queued(ctx);
    busy |= !ready && !may_sleep(lane);
  }
  if (busy)
    cap = 1;
  /* A sleeper on the descriptor (the caller, after a wait of 0) must wake
   * for the next look too. */
  if (!ready && cap >= 0)
    nap_arm(ctx, cap);
  XPORT__UNLOCK(ctx);
  if (ready)
    return 0;
  /* Nothing more of the provider's after fi_trywait when the caller is
   * about to sleep on the descriptor: a call into it (the peer checks
   * below) may signal its wait object again, and the sleeper would wake
   * at once, again and again (rxm beside a send to a stopped peer: tens of
   * thousands of times a second). The checks ran above. */
  if (timeout_ms == 0)
    return -XPORT_ETIMEDOUT;
  int t = timeout_ms < 0 ? cap : cap < 0 ? timeout_ms : timeout_ms < cap ? timeout_ms : cap;
  int r = epoll_wait(ctx->wake.epfd, &ev, 1, t);
  if (r < 0 && errno != EINTR)
    return -XPORT_EIO;
  if (r == 0 && (watches || ctx->dl.min_ms) && wait_check(ctx, 0))
    return 0;
  return r != 0 ? 0 : (t == timeout_ms ? -XPORT_ETIMEDOUT : 0);
}

/* 1 if the thread may sleep on every lane's CQ fd. A lane that refuses
 * may have woken it for the transport's own checks (xshm: a peer's socket
 * that closed): they run now rather than at their next turn, and it is
 * asked once more. Only the CQs: the EQs are the application's
 * (fi_trywait would keep failing on an event it left there). */
static int progress_may_sleep(xport_ctx_t *ctx)
{
  for (unsigned l = 0; l < ctx->nlanes; l++) {
    struct xport__lane *lane = ctx->lanes[l];
    struct fid *cq = &lane->cq->fid;
    if (fi_trywait(lane->fabric, &cq, 1) == FI_SUCCESS)
      continue;
    lane->tp->progress(lane);
    if (ctx->done || ctx->evq || fi_trywait(lane->fabric, &cq, 1) != FI_SUCCESS)
      return 0;
  }
  return 1;
}

/* The progress thread reads the CQ on the application's behalf, under
 * ctx->progress_lock like every other call into the provider while it
 * runs, queues what it finds for the next xport_poll, and signals sig_fd
 * so that a waiter wakes for it. */
static void *progress_main(void *arg)
{
  xport_ctx_t *ctx = arg;
  /* It sleeps on the lanes' CQ fds, joined in an epoll set of its own
   * (the context's holds the EQs and the signal it writes itself), where
   * every lane has one: else it looks every 100 us. */
  int fd = -1;
  if (!steps_only(ctx) && (fd = epoll_create1(EPOLL_CLOEXEC)) >= 0)
    for (unsigned l = 0; l < ctx->nlanes; l++) {
      struct epoll_event ev = {.events = EPOLLIN};
      if (epoll_ctl(fd, EPOLL_CTL_ADD, ctx->lanes[l]->cq_fd, &ev)) {
        close(fd);
        fd = -1;
        break;
      }
    }
  for (;;) {
    pthread_mutex_lock(&ctx->progress_lock);
    if (ctx->progress_stop) {
      pthread_mutex_unlock(&ctx->progress_lock);
      break;
    }
    for (unsigned l = 0; l < ctx->nlanes; l++) {
      struct xport__lane *lane = ctx->lanes[l];
      xport__cq_drain(lane);
      if (lane->ka_owed)
        lane->tp->pay_owed(lane);
    }
    if (ctx->holding)
      xport__held_retry(ctx);
    for (unsigned l = 0; l < ctx->nlanes; l++) {
      struct xport__lane *lane = ctx->lanes[l];
      /* A listener that accepts in the background (a job's) is served
       * from here too: over MSG its requests and handshakes come through
       * the EQ (RDM ones through the CQ, just drained). Within one sleep
       * below. */
      if (XPORT__UNLIKELY(ctx->nhooked) && lane->tp->background)
        lane->tp->background(lane);
      /* Where peers are watched by the clock, what keeps a connection
       * alive (heartbeats, answers to the RMA probe, peer checks) runs
       * here too: an application that computes outside xport for longer
       * than XPORT_KEEPALIVE_TIMEOUT must not look dead to its peers.
       * Only when a check is due and there are peers to keep: the
       * transport's progress does more each call (a peek for unexpected
       * messages, which may leave an entry in the CQ and wake a waiting
       * application). */
      if (watching(lane) && xport__now_ms() - lane->last_check >= ctx->peer_check_ms / 4)
        lane->tp->progress(lane);
    }
    if (ctx->wake.sig_fd >= 0 && !ctx->wake.sig_set && (ctx->done || ctx->evq)) {
      uint64_t one = 1;
      ctx->wake.sig_set = 1;
      if (write(ctx->wake.sig_fd, &one, sizeof one) < 0)
        XPORT__DEBUG("progress signal: %s", strerror(errno));
    }
    int sleep_ok = fd >= 0 && progress_may_sleep(ctx);
    pthread_mutex_unlock(&ctx->progress_lock);
    if (sleep_ok) {
      /* Bounded, so that a stop request is seen soon. */
      struct pollfd p = {.fd = fd, .events = POLLIN};
      poll(&p, 1, 10);
    } else {
      /* A lane that keeps refusing (work of the provider's own, or what
       * the application has yet to poll): looked at again in 100 us, not
       * spun on. */
      struct timespec ts = {0, 100 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  if (fd >= 0)
    close(fd);
  return NULL;
}

int xport__close_fid(xport_ctx_t *ctx, struct fid *fid)
{
  XPORT__LOCK(ctx);
  int ret = fi_close(fid);
  XPORT__UNLOCK(ctx);
  return ret;
}

struct kept_fid {
  struct kept_fid *next;
  struct fid *fid;
};
static struct kept_fid *kept_fids;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

void xport__fid_keep(struct fid *fid)
{
  struct kept_fid *k = fid ? malloc(sizeof *k) : NULL;
  if (!k)
    return;
  pthread_mutex_lock(&kept_lock);
  k->fid = fid;
  k->next = kept_fids;
  kept_fids = k;
  pthread_mutex_unlock(&kept_lock);
}

int xport__progress_start(xport_ctx_t *ctx)
{
  pthread_mutexattr_t a;
  ctx->progress_stop = 0;
  if (ctx->wake.epfd >= 0) {
    struct epoll_event ev = {.events = EPOLLIN};
    ctx->wake.sig_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctx->wake.sig_fd < 0)
      return -XPORT_ENOMEM;
    if (epoll_ctl(ctx->wake.epfd, EPOLL_CTL_ADD, ctx->wake.sig_fd, &ev)) {
      close(ctx->wake.sig_fd);
      ctx->wake.sig_fd = -1;
      return -XPORT_ENOMEM;
    }
  }
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&ctx->progress_lock, &a);
  pthread_mutexattr_destroy(&a);
  if (pthread_create(&ctx->progress_tid, NULL, progress_main, ctx)) {
    pthread_mutex_destroy(&ctx->progress_lock);
    return -XPORT_ENOMEM;
  }
  ctx->progress_on = 1;
  return 0;
}

void xport__progress_stop(xport_ctx_t *ctx)
{
  if (!ctx->progress_on)
    return;
  pthread_mutex_lock(&ctx->progress_lock);
  ctx->progress_stop = 1;
  pthread_mutex_unlock(&ctx->progress_lock);
  pthread_join(ctx->progress_tid, NULL);
  pthread_mutex_destroy(&ctx->progress_lock);
  ctx->progress_on = 0;
}

void xport__progress_beside(struct xport__lane *lane)
{
  xport_ctx_t *ctx = lane->ctx;
  if (ctx->nlanes < 2 || ctx->in_beside)
    return;
  ctx->in_beside = 1;
  for (unsigned l = 0; l < ctx->nlanes; l++) {
    struct xport__lane *o = ctx->lanes[l];
    if (o == lane)
      continue;
    xport__cq_drain(o);
    o->tp->progress(o);
  }
  if (ctx->holding)
    xport__held_retry(ctx);
  if (ctx->accept_due && ctx->auto_accept)
    ctx->auto_accept(ctx);
  ctx->in_beside = 0;
}

/* xport_poll past its checks, for the fault injection's (src/core/fault.c). */
static __attribute__((noinline)) int poll_any(xport_ctx_t *ctx, xport_completion_t *comps,
                                              int max)
{
  XPORT__LOCK(ctx);
  int ret = xport_poll__locked(ctx, comps, max);
  XPORT__UNLOCK(ctx);
  return ret;
}

XPORT_API int xport_poll(xport_ctx_t *ctx, xport_completion_t *comps, int max)
{
  if (XPORT__UNLIKELY(!ctx || !comps || max <= 0))
    return -XPORT_EINVAL;
  if (XPORT__UNLIKELY(ctx->fault != NULL))
    return xport__fault_poll(ctx, comps, max, poll_any);
  xport_ctx_t *lctx = ctx;
  XPORT__LOCK(lctx);
  int ret = xport_poll__locked(ctx, comps, max);
  XPORT__UNLOCK(lctx);
  return ret;
}
