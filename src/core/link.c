/* Connections and listeners as the context holds them: its list of
 * connections, listeners' backlogs, and the queue of disconnect events.
 * What every transport uses to hand a connection over and to report its
 * end; it calls no transport. */
#include "xport_int.h"

#include <stdlib.h>

/* Queues a connection request at the tail of its listener's backlog. */
void xport__connreq_push(xport_listener_t *lst, struct xport__connreq *cr)
{
  XPORT__FIFO_PUSH(lst->pending, lst->pending_tail, cr, next);
  lst->npending++;
  if (lst->admit)
    lst->ctx->accept_due = 1;
}

void xport__evq_push(xport_ctx_t *ctx, xport_conn_t *conn, int status)
{
  if (conn->ev.queued)
    return;
  conn->ev.queued = 1;
  conn->ev.status = status;
  conn->ev.after = ctx->done_in;
  XPORT__FIFO_PUSH(ctx->evq, ctx->evq_tail, conn, ev.next);
}

void xport__evq_remove(xport_ctx_t *ctx, xport_conn_t *conn)
{
  xport_conn_t **pp = &ctx->evq, *prev = NULL;
  while (*pp && *pp != conn) {
    prev = *pp;
    pp = &(*pp)->ev.next;
  }
  if (!*pp)
    return;
  *pp = conn->ev.next;
  if (ctx->evq_tail == conn)
    ctx->evq_tail = prev;
  conn->ev.queued = 0;
}

xport_conn_t *xport__conn_new(struct xport__lane *lane)
{
  xport_conn_t *conn = calloc(1, sizeof *conn + lane->tp->conn_size);
  if (!conn)
    return NULL;
  conn->ctx = lane->ctx;
  conn->lane = lane;
  conn->ops = lane->tp->data;
  conn->proc.pidfd = -1;
  if (!lane->prof || !lane->prof->hung_keeps_buffers)
    conn->dl.ms = lane->ctx->dl.op_ms;
  conn->state = XPORT__CONN_CONNECTING;
  return conn;
}

void xport__conn_unlink(xport_conn_t *conn)
{
  XPORT__LIST_UNLINK(conn->lane->conns, conn, next, prev);
  conn->next = conn->prev = NULL;
  xport__pool_forget(conn);
}

void xport__conn_link(xport_conn_t *conn)
{
  /* Once, and on a lane of its own context. */
  XPORT__ASSERT(!conn->app.handed && conn->lane->ctx == conn->ctx &&
                conn->lane == conn->ctx->lanes[conn->lane->index]);
  conn->app.handed = 1;
  XPORT__LIST_PUSH(conn->lane->conns, conn, next, prev);
}

int xport__listener_shaking_from(const xport_listener_t *lst, uint64_t peer_ctx_id)
{
  for (const xport_conn_t *c = lst->shaking; c; c = c->shake.next)
    if (c->peer_ctx_id == peer_ctx_id)
      return 1;
  return 0;
}

void xport__conn_free_if_done(xport_conn_t *conn)
{
  /* And once its transport let go of it (RDM: its endpoint). */
  if (conn->state == XPORT__CONN_CLOSED && conn->nreqs == 0 && !conn->ev.queued &&
      !conn->attached)
    free(conn);
}
