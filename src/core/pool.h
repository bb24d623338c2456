/* The shared receive pool's bookkeeping below the API (core/pool.c):
 * which connections may take more of it, and what comes back to it. */
#ifndef XPORT_CORE_POOL_H
#define XPORT_CORE_POOL_H

#include "objects.h"

/* conn may take more of the pool (a connection handed out, a lent receive
 * ended): queued once on ctx->pool.want, if it is connected, has no
 * receive of the application's own and holds fewer than lend. */
void xport__pool_want(xport_conn_t *conn);
/* conn goes (unlinked): out of the pool, off ctx->pool.want. */
void xport__pool_forget(xport_conn_t *conn);
/* conn no longer counts toward the pool's shares (its end, seen late). */
void xport__pool_leave(xport_conn_t *conn);
/* The application posted a receive of its own on conn: it leaves the
 * pool for good (xport_recv_shared(3)). */
void xport__pool_own(xport_conn_t *conn);
/* How many of the pool's receives conn may hold now, at least one: what
 * its traffic earned (one when it joins, one more per message it took),
 * at most lend and its share of the pool among the connections in it.
 * So an idle connection holds one, and a pool of fewer than lend per
 * connection still reaches every connection; one that holds more than a
 * shrunken share keeps them until messages take them. */
static inline unsigned xport__pool_cap(const xport_ctx_t *ctx, const xport_conn_t *conn)
{
  size_t n = ctx->pool.nconns, share = n ? ctx->pool.total / n : ctx->pool.lend;
  size_t cap = conn->pool.took < ctx->pool.lend ? conn->pool.took + 1 : ctx->pool.lend;
  if (share < cap)
    cap = share;
  return cap ? (unsigned)cap : 1;
}
/* p, lent and not taken by a message, is first in the pool's line again. */
static inline void xport__pool_put_back(xport_ctx_t *ctx, struct xport__pent *p)
{
  p->next = ctx->pool.free;
  ctx->pool.free = p;
  if (!ctx->pool.free_tail)
    ctx->pool.free_tail = p;
}
/* Frees the pool's entries (the context's end, after the done list: the
 * pool is not used again). */
void xport__pool_fini(xport_ctx_t *ctx);

#endif /* XPORT_CORE_POOL_H */
