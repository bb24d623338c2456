/* The shared receive pool (xport_recv_shared(3)): receives posted to the
 * context, lent to its connections as they need them. No provider's
 * shared receive context can say which connection a message came from
 * (tcp's and verbs' completions name no endpoint; rxm and shm have none),
 * so each connection is lent at most ctx->pool.lend of them, posted as
 * its own receives, and a lent one that ends comes back (core/pool.c). */
#include "xport_int.h"

#include <stdlib.h>
#include <string.h>

#define PENT_CHUNK 64

static struct xport__pent *pent_get(xport_ctx_t *ctx)
{
  struct xport__pent *p = ctx->pool.spare;
  if (XPORT__LIKELY(p != NULL)) {
    ctx->pool.spare = p->next;
    return p;
  }
  struct xport__pent_chunk *c = malloc(sizeof *c + PENT_CHUNK * sizeof c->ents[0]);
  if (!c)
    return NULL;
  c->next = ctx->pool.chunks;
  ctx->pool.chunks = c;
  for (int i = 1; i < PENT_CHUNK; i++) {
    c->ents[i].next = ctx->pool.spare;
    ctx->pool.spare = &c->ents[i];
  }
  return &c->ents[0];
}

/* Posts the pool's oldest receive on conn: 0, or a code with the entry
 * back at the pool's head and nothing posted. */
static int lend_one(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  struct xport__pent *p = ctx->pool.free;
  struct iovec fiov[XPORT__IOV_MAX];
  void *desc[XPORT__IOV_MAX];
  struct xport__req *req = NULL;
  size_t cnt = 0;
  /* No message on conn's lane is longer than its limit (xshm's beside a
   * fabric without one): the rest of a longer receive goes unused. */
  xport_iov_t v = p->iov;
  if (v.len > conn->lane->caps.max_msg_size)
    v.len = conn->lane->caps.max_msg_size;
  int ret = xport__post_begin(conn, XPORT_OP_RECV, &v, 1, p->user_ctx, fiov, desc, &cnt, &req);
  if (ret)
    return ret;
  ctx->pool.free = p->next;
  if (!ctx->pool.free)
    ctx->pool.free_tail = NULL;
  req->pair = XPORT__POOLED;
  req->pent = p;
  ret = xport__post_end(conn, req, conn->ops->recv(conn, req, fiov, desc, cnt));
  if (ret) { /* undone */
    xport__pool_put_back(ctx, p);
    return ret;
  }
  conn->pool.lent++;
  return 0;
}

/* Lends the pool's receives to the connections that want them, one at a
 * time in turn, so that one connection's burst does not take what its
 * neighbours wait for. */
static void pool_feed(xport_ctx_t *ctx)
{
  while (ctx->pool.free && ctx->pool.want) {
    xport_conn_t *conn = ctx->pool.want;
    ctx->pool.want = conn->pool.next;
    if (!ctx->pool.want)
      ctx->pool.want_tail = NULL;
    conn->pool.next = NULL;
    conn->pool.wanting = 0;
    if (conn->pool.own || conn->state != XPORT__CONN_CONNECTED) {
      xport__pool_leave(conn);
      continue;
    }
    if (conn->pool.lent >= xport__pool_cap(ctx, conn))
      continue; /* its share shrank meanwhile */
    int ret = lend_one(conn);
    if (ret == -XPORT_EAGAIN || ret == -XPORT_ENOMEM) {
      /* The CQ has no room for more (its receive queue has, lend being
       * at most its depth), or no memory is left for a request: first in
       * line again when entries come back or housekeeping feeds the
       * pool. */
      conn->pool.wanting = 1;
      conn->pool.next = ctx->pool.want;
      ctx->pool.want = conn;
      if (!ctx->pool.want_tail)
        ctx->pool.want_tail = conn;
      break;
    }
    if (ret) {
      XPORT__INFO("connection %llu: a shared receive could not be lent to it: %s",
                  (unsigned long long)conn->id, xport_strerror(ret));
      continue;
    }
    xport__pool_want(conn); /* behind the others, if it may take more */
  }
}

/* The pool starts with the first receive posted to it: the context's
 * connections join, and every later one as it is handed out. */
static void pool_start(xport_ctx_t *ctx)
{
  size_t lend = xport__env_size(XPORT__ENV_POOL_LEND, 4), depth = SIZE_MAX;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    if (ctx->lanes[l]->caps.rx_depth < depth)
      depth = ctx->lanes[l]->caps.rx_depth;
  if (lend < 1 || lend > depth) {
    size_t use = lend < 1 ? 1 : depth;
    if (xport__env_str(XPORT__ENV_POOL_LEND))
      XPORT__WARN("XPORT_POOL_LEND=%zu: a connection takes 1 to %zu (its receive depth); using %zu",
                lend, depth, use);
    lend = use;
  }
  ctx->pool.lend = (unsigned)lend;
  ctx->pool.on = 1;
  ctx->pool.feed = pool_feed;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    for (xport_conn_t *c = ctx->lanes[l]->conns; c; c = c->next)
      xport__pool_want(c);
}

/* The checks of xport_recv's, against every lane, since any connection
 * may take the receive; the size against the context's limit
 * (xport_ctx_query), which lend_one fits to each lane's. */
static int check_entry(const xport_ctx_t *ctx, const void *buf, size_t len, xport_mr_t *mr)
{
  if (!buf && len)
    return -XPORT_EINVAL;
  if (len > ctx->lanes[0]->caps.max_msg_size)
    return -XPORT_EMSGSIZE;
  if (!mr)
    return (uintptr_t)buf + len < len ? -XPORT_EINVAL : 0; /* past the address space */
  for (unsigned l = 0; l < ctx->nlanes; l++) {
    const xport_mr_t *m = xport__mr_for(mr, ctx->lanes[l]);
    if (!m)
      return -XPORT_EINVAL; /* another context's */
    size_t end;
    if (__builtin_add_overflow((uintptr_t)buf - (uintptr_t)m->base, len, &end) || end > m->len)
      return -XPORT_ERANGE;
    if (!(m->access & XPORT_ACCESS_LOCAL))
      return -XPORT_EACCES;
  }
  return 0;
}

XPORT_API int xport_recv_shared(xport_ctx_t *ctx, void *buf, size_t len, xport_mr_t *mr,
                                void *user_ctx)
{
  if (!ctx)
    return -XPORT_EINVAL;
  XPORT__LOCK(ctx);
  int ret = check_entry(ctx, buf, len, mr);
  struct xport__pent *p = ret ? NULL : pent_get(ctx);
  if (!ret && !p)
    ret = -XPORT_ENOMEM;
  if (ret) {
    XPORT__UNLOCK(ctx);
    return ret;
  }
  p->iov = (xport_iov_t){buf, len, mr};
  p->user_ctx = user_ctx;
  XPORT__FIFO_PUSH(ctx->pool.free, ctx->pool.free_tail, p, next);
  ctx->pool.total++;
  if (XPORT__UNLIKELY(!ctx->pool.on))
    pool_start(ctx);
  if (ctx->pool.want)
    pool_feed(ctx);
  XPORT__UNLOCK(ctx);
  return 0;
}

void xport__pool_join(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (!ctx->pool.on)
    return;
  xport__pool_want(conn);
  if (ctx->pool.want && ctx->pool.free)
    pool_feed(ctx);
}
