/* The shared receive pool (xport_recv_shared(3)) below the API: the
 * connections that may take more, in turn. Lending itself is a post,
 * above (api/pool.c, reached through ctx->pool.feed); a lent receive's
 * end is the delivery's (cq.c pool_done). */
#include "xport_int.h"

#include <stdlib.h>

void xport__pool_leave(xport_conn_t *conn)
{
  if (conn->pool.in) {
    conn->pool.in = 0;
    conn->ctx->pool.nconns--;
  }
}

void xport__pool_own(xport_conn_t *conn)
{
  conn->pool.own = 1;
  xport__pool_leave(conn);
}

void xport__pool_want(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (conn->pool.own || conn->state != XPORT__CONN_CONNECTED) {
    xport__pool_leave(conn);
    return;
  }
  if (!conn->pool.in) {
    conn->pool.in = 1;
    ctx->pool.nconns++;
  }
  if (conn->pool.wanting || conn->pool.lent >= xport__pool_cap(ctx, conn))
    return;
  conn->pool.wanting = 1;
  XPORT__FIFO_PUSH(ctx->pool.want, ctx->pool.want_tail, conn, pool.next);
}

void xport__pool_forget(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  xport__pool_leave(conn);
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

void xport__pool_fini(xport_ctx_t *ctx)
{
  while (ctx->pool.chunks) {
    struct xport__pent_chunk *c = ctx->pool.chunks;
    ctx->pool.chunks = c->next;
    free(c);
  }
}
