/* Listeners and connections, the public calls: what they check, and the
 * transport of the context that carries them out (ctx->tp). A listener
 * that a layer above owns (a job's) accepts in the background, through
 * the hook the context calls where it makes progress. */
#include "xport_int.h"

#include <stdlib.h>
#include <string.h>

static int xport_listen__locked(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  char host[256], port[8];
  if (!ctx || !addr || !lst_p)
    return -XPORT_EINVAL;
  size_t backlog = xport__env_size(XPORT__ENV_LISTEN_BACKLOG, XPORT__BACKLOG_DEFAULT);
  if (backlog < 1)
    backlog = 1;
  int ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
  if (ret)
    return ret;
  xport_listener_t *lst = calloc(1, sizeof *lst);
  if (!lst)
    return -XPORT_ENOMEM;
  lst->ctx = ctx;
  lst->backlog = backlog;
  ret = ctx->tp->listen(lst, addr, host, port);
  if (ret) {
    free(lst);
    return ret;
  }
  XPORT__LIST_PUSH(ctx->listeners, lst, next, prev);
  *lst_p = lst;
  return 0;
}

XPORT_API int xport_listener_addr(const xport_listener_t *lst, char *buf, size_t len)
{
  if (!lst || !buf || !len)
    return -XPORT_EINVAL;
  size_t n = strlen(lst->addr);
  if (n + 1 > len)
    return -XPORT_ERANGE;
  memcpy(buf, lst->addr, n + 1);
  return 0;
}

static int xport_listener_close__locked(xport_listener_t *lst)
{
  if (!lst)
    return 0;
  xport_ctx_t *ctx = lst->ctx;
  xport__listener_hook(lst, NULL, NULL, NULL); /* what waits is refused */
  ctx->tp->listener_close(lst);
  XPORT__LIST_UNLINK(ctx->listeners, lst, next, prev);
  free(lst);
  return 0;
}

static int xport_connect__locked(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                                 xport_conn_t **conn_p)
{
  char host[256], port[8];
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  if (!ctx || !addr || !conn_p)
    return -XPORT_EINVAL;
  int ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
  return ret ? ret : ctx->tp->connect(ctx, host, port, deadline, conn_p);
}

static int xport_accept__locked(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  if (!lst || !conn_p)
    return -XPORT_EINVAL;
  return lst->ctx->tp->accept(lst, deadline, conn_p);
}

/* Runs where the context makes progress (EQ dispatch, the RDM drain and
 * housekeeping), and so inside a connect that waits: two peers that
 * connect to each other at once each accept the other meanwhile. An
 * accept that would wait does not: a timeout of 0. */
void xport__auto_accept(xport_ctx_t *ctx)
{
  if (ctx->in_auto)
    return;
  ctx->in_auto = 1;
  ctx->accept_due = 0;
  for (xport_listener_t *l = ctx->listeners, *next; l; l = next) {
    next = l->next;
    if (!l->admit)
      continue;
    xport_conn_t *conn;
    while ((l->pending || l->shaking) && xport_accept__locked(l, 0, &conn) == 0)
      l->accepted(l->hook_arg, conn);
  }
  ctx->in_auto = 0;
}

void xport__listener_hook(xport_listener_t *lst, int (*admit)(void *, uint64_t),
                          void (*accepted)(void *, xport_conn_t *), void *arg)
{
  xport_ctx_t *ctx = lst->ctx;
  ctx->nhooked += (admit != NULL) - (lst->admit != NULL);
  ctx->auto_accept = xport__auto_accept; /* the lower layers' way back up */
  lst->admit = admit;
  lst->accepted = accepted;
  lst->hook_arg = arg;
  if (admit && lst->pending)
    ctx->accept_due = 1;
}

static int xport_conn_close__locked(xport_conn_t *conn)
{
  if (!conn)
    return 0;
  xport_ctx_t *ctx = conn->ctx;
  /* A closed handle is no handle (xport_conn_close(3)): this catches a
   * second close only while completions keep the memory, and promises
   * nothing. */
  if (conn->state == XPORT__CONN_CLOSED)
    return -XPORT_EINVAL;
  conn->closing = 1;
  ctx->tp->close_conn(conn);
  xport__evq_remove(ctx, conn);
  xport__conn_unlink(conn);
  conn->state = XPORT__CONN_CLOSED;
  xport__conn_free_if_done(conn);
  return 0;
}

XPORT_API int xport_listen(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  if (!ctx)
    return xport_listen__locked(ctx, addr, lst_p);
  xport_ctx_t *lctx = ctx;
  XPORT__LOCK(lctx);
  int ret = xport_listen__locked(ctx, addr, lst_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_listener_close(xport_listener_t *lst)
{
  if (!lst)
    return xport_listener_close__locked(lst);
  xport_ctx_t *lctx = lst->ctx;
  XPORT__LOCK(lctx);
  int ret = xport_listener_close__locked(lst);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_connect(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                            xport_conn_t **conn_p)
{
  if (!ctx)
    return xport_connect__locked(ctx, addr, timeout_ms, conn_p);
  xport_ctx_t *lctx = ctx;
  XPORT__LOCK(lctx);
  int ret = xport_connect__locked(ctx, addr, timeout_ms, conn_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_accept(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  if (!lst)
    return xport_accept__locked(lst, timeout_ms, conn_p);
  xport_ctx_t *lctx = lst->ctx;
  XPORT__LOCK(lctx);
  int ret = xport_accept__locked(lst, timeout_ms, conn_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_conn_close(xport_conn_t *conn)
{
  if (!conn)
    return xport_conn_close__locked(conn);
  xport_ctx_t *lctx = conn->ctx;
  XPORT__LOCK(lctx);
  if (conn->owned && conn->state != XPORT__CONN_CLOSED) {
    XPORT__UNLOCK(lctx);
    XPORT__WARN("connection %llu belongs to a job: xport_job_fini closes it",
                (unsigned long long)conn->id);
    return -XPORT_EPERM;
  }
  int ret = xport_conn_close__locked(conn);
  XPORT__UNLOCK(lctx);
  return ret;
}
