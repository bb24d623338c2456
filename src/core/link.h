/* Connections and listeners linked into their context, backlogs,
 * disconnect events (core/link.c). */
#ifndef XPORT_CORE_LINK_H
#define XPORT_CORE_LINK_H

#include "objects.h"

/* link.c: connections and listeners as the context holds them */
/* A connection being made (CONNECTING), in no list yet: NULL, no memory. */
xport_conn_t *xport__conn_new(struct xport__lane *lane);
/* The connection is the application's now: on ctx->conns, handed. */
void xport__conn_link(xport_conn_t *conn);
void xport__conn_unlink(xport_conn_t *conn);
void xport__connreq_push(xport_listener_t *lst, struct xport__connreq *cr);
/* 1 if a handshake with the context peer_ctx_id is under way at lst. */
int xport__listener_shaking_from(const xport_listener_t *lst, uint64_t peer_ctx_id);
/* Queues conn's disconnect event (once): it is delivered after the
 * done-list entries pushed before it and its own connection's later ones. */
void xport__evq_push(xport_ctx_t *ctx, xport_conn_t *conn, int status);
/* What a lost connection's event carries, whatever ended it: its
 * deadline's -XPORT_ETIMEDOUT (xport_conn_timeout), else the peer's
 * loss, -XPORT_ECONNRESET, the same on every transport. */
static inline int xport__lost_status(int status)
{
  return status == -XPORT_ETIMEDOUT ? status : -XPORT_ECONNRESET;
}
void xport__evq_remove(xport_ctx_t *ctx, xport_conn_t *conn);
/* Frees a closed connection once nothing refers to it any more. */
void xport__conn_free_if_done(xport_conn_t *conn);

#endif /* XPORT_CORE_LINK_H */
