/* The shared receive pool (xport_recv_shared(3)) where its receives come
 * back: the connections that may take more, in turn, and the entries a
 * connection's end returns. Lending itself is a post, above (api/pool.c,
 * reached through ctx->pool.feed). */
#include "xport_int.h"

#include <stdlib.h>

void xport__pool_want(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (conn->pool.wanting || conn->pool.own || conn->state != XPORT__CONN_CONNECTED ||
      conn->pool.lent >= ctx->pool.lend)
    return;
  conn->pool.wanting = 1;
  XPORT__FIFO_PUSH(ctx->pool.want, ctx->pool.want_tail, conn, pool.next);
}

void xport__pool_forget(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (!conn->pool.wanting)
    return;
  /* A close: rare enough for a walk. */
  xport_conn_t **pp = &ctx->pool.want, *prev = NULL;
  while (*pp && *pp != conn) {
    prev = *pp;
    pp = &(*pp)->pool.next;
  }
  XPORT__ASSERT(*pp == conn);
  *pp = conn->pool.next;
  if (ctx->pool.want_tail == conn)
    ctx->pool.want_tail = prev;
  conn->pool.wanting = 0;
  conn->pool.next = NULL;
}

int xport__pool_done(xport_ctx_t *ctx, struct xport__req *req)
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
    p->next = ctx->pool.spare;
    ctx->pool.spare = p;
  } else {
    p->next = ctx->pool.free;
    ctx->pool.free = p;
    if (!ctx->pool.free_tail)
      ctx->pool.free_tail = p;
    ctx->pool.nfree++;
  }
  xport__pool_want(conn);
  if (!shown)
    xport__req_release(ctx, req); /* may free a closed conn: last */
  if (ctx->pool.want && ctx->pool.free)
    ctx->pool.feed(ctx);
  return shown;
}

void xport__pool_fini(xport_ctx_t *ctx)
{
  while (ctx->pool.chunks) {
    struct xport__pent_chunk *c = ctx->pool.chunks;
    ctx->pool.chunks = c->next;
    free(c);
  }
  ctx->pool.free = ctx->pool.free_tail = ctx->pool.spare = NULL;
  ctx->pool.want = ctx->pool.want_tail = NULL;
  ctx->pool.nfree = 0;
}
