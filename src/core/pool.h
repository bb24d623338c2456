/* The shared receive pool's bookkeeping below the API (core/pool.c):
 * which connections may take more of it, and what comes back to it. */
#ifndef XPORT_CORE_POOL_H
#define XPORT_CORE_POOL_H

#include "objects.h"

/* conn may take more of the pool (a connection handed out, a lent receive
 * ended): queued once on ctx->pool.want, if it is connected, has no
 * receive of the application's own and holds fewer than lend. */
void xport__pool_want(xport_conn_t *conn);
/* conn goes (unlinked): off ctx->pool.want. */
void xport__pool_forget(xport_conn_t *conn);
/* Frees the pool's entries (the context's end, after the done list). */
void xport__pool_fini(xport_ctx_t *ctx);

#endif /* XPORT_CORE_POOL_H */
