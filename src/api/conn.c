/* Listeners and connections, the public calls: what they check, and the
 * lane whose transport carries them out (lane->tp). A listener
 * that a layer above owns (a job's) accepts in the background, through
 * the hook the context calls where it makes progress. */
#include "xport_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Opens a listener on lane at addr (host:port), on its list. */
static int listen_on(struct xport__lane *lane, const char *addr, size_t backlog,
                     xport_listener_t **lst_p)
{
  char host[256], port[8];
  int ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
  if (ret)
    return ret;
  xport_listener_t *lst = calloc(1, sizeof *lst);
  if (!lst)
    return -XPORT_ENOMEM;
  lst->ctx = lane->ctx;
  lst->lane = lane;
  lst->backlog = backlog;
  ret = lane->tp->listen(lst, addr, host, port);
  if (ret) {
    free(lst);
    return ret;
  }
  XPORT__LIST_PUSH(lane->listeners, lst, next, prev);
  *lst_p = lst;
  return 0;
}

static int xport_listen__locked(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  if (!ctx || !addr || !lst_p)
    return -XPORT_EINVAL;
  size_t backlog = xport__env_size(XPORT__ENV_LISTEN_BACKLOG, XPORT__BACKLOG_DEFAULT);
  if (backlog < 1)
    backlog = 1;
  return listen_on(ctx->lanes[0], addr, backlog, lst_p);
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
  xport__listener_hook(lst, NULL, NULL, NULL); /* what waits is refused */
  lst->lane->tp->listener_close(lst);
  XPORT__LIST_UNLINK(lst->lane->listeners, lst, next, prev);
  free(lst);
  return 0;
}

static int connect_on(struct xport__lane *lane, const char *addr,
                      const struct xport__conn_data *data, int timeout_ms, xport_conn_t **conn_p)
{
  char host[256], port[8];
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  int ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
  return ret ? ret : lane->tp->connect(lane, host, port, data, deadline, conn_p);
}

static int xport_accept__locked(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  if (!lst || !conn_p)
    return -XPORT_EINVAL;
  return lst->lane->tp->accept(lst, deadline, conn_p);
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
  for (unsigned n = 0; n < ctx->nlanes; n++)
    for (xport_listener_t *l = ctx->lanes[n]->listeners, *next; l; l = next) {
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
  if (lst->sub)
    xport__listener_hook(lst->sub, admit, accepted, arg);
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
  conn->lane->tp->close_conn(conn);
  xport__evq_remove(ctx, conn);
  if (XPORT__UNLIKELY(ctx->fault != NULL))
    xport__fault_forget(conn); /* and the one held back */
  xport__conn_unlink(conn);
  conn->state = XPORT__CONN_CLOSED;
  xport__conn_free_if_done(conn);
  return 0;
}

/* The second lane's half of a listener (XPORT_SHM): the same host, at the
 * port the fabric's half got. Where it cannot open (a host that is not
 * this node's, a port another process took there), peers on this node
 * reach the listener over the fabric. */
static void listen_sub(xport_listener_t *lst, const char *addr)
{
  char host[256], port[8], h2[256], sub_addr[300];
  xport_listener_t *sub;
  struct xport__lane *lane = lst->ctx->lanes[1];
  if (xport__addr_split(addr, host, sizeof host, port, sizeof port) ||
      xport__addr_split(lst->addr, h2, sizeof h2, port, sizeof port))
    return;
  snprintf(sub_addr, sizeof sub_addr, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
  int ret = listen_on(lane, sub_addr, lst->backlog, &sub);
  if (ret) {
    XPORT__INFO("listener %s: not on %s too (%s): peers on this node come over %s", lst->addr,
                lane->caps.provider, xport_strerror(ret), lst->lane->caps.provider);
    return;
  }
  lst->sub = sub;
}

XPORT_API int xport_listen(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  if (!ctx)
    return xport_listen__locked(ctx, addr, lst_p);
  XPORT__LOCK(ctx);
  int ret = xport_listen__locked(ctx, addr, lst_p);
  if (!ret && ctx->nlanes > 1)
    listen_sub(*lst_p, addr);
  XPORT__UNLOCK(ctx);
  return ret;
}

XPORT_API int xport_listener_close(xport_listener_t *lst)
{
  if (!lst)
    return 0;
  xport_ctx_t *ctx = lst->ctx;
  XPORT__LOCK(ctx);
  if (lst->sub) {
    xport_listener_close__locked(lst->sub);
    lst->sub = NULL;
  }
  int ret = xport_listener_close__locked(lst);
  XPORT__UNLOCK(ctx);
  return ret;
}

static int connect_locked(struct xport__lane *lane, const char *addr,
                          const struct xport__conn_data *data, int timeout_ms,
                          xport_conn_t **conn_p)
{
  XPORT__LOCK(lane->ctx);
  int ret = connect_on(lane, addr, data, timeout_ms, conn_p);
  if (!ret)
    xport__pool_join(*conn_p); /* ready for its first message */
  XPORT__UNLOCK(lane->ctx);
  return ret;
}

XPORT_API int xport_connect(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                            xport_conn_t **conn_p)
{
  return xport_connect_data(ctx, addr, NULL, 0, timeout_ms, conn_p);
}

XPORT_API int xport_connect_data(xport_ctx_t *ctx, const char *addr, const void *data,
                                 size_t len, int timeout_ms, xport_conn_t **conn_p)
{
  if (!ctx || !addr || !conn_p || (len && !data))
    return -XPORT_EINVAL;
  if (len > XPORT_CONN_DATA_MAX) {
    XPORT__INFO("xport_connect_data: %zu bytes of data; a request carries at most %d", len,
                XPORT_CONN_DATA_MAX);
    return -XPORT_EINVAL;
  }
  struct xport__conn_data d = {.len = len};
  if (len)
    memcpy(d.bytes, data, len);
  if (ctx->nlanes > 1 && ctx->lanes[1]->tp->here && ctx->lanes[1]->tp->here(ctx->lanes[1], addr)) {
    /* A listener of this node answers over shm. One that is not here
     * (no live name, a host of another node) or that says "not this way"
     * (another PID namespace, another context of this process:
     * EADDRNOTAVAIL), or that speaks another version of it (EPROTO),
     * leaves the peer to the fabric. Its other answers are the
     * listener's: a full backlog refuses over either. */
    long t0 = xport__now_ms();
    int ret = connect_locked(ctx->lanes[1], addr, &d, timeout_ms, conn_p);
    if (ret != -XPORT_EADDRNOTAVAIL && ret != -XPORT_EPROTO)
      return ret;
    if (timeout_ms >= 0) {
      long left = timeout_ms - (xport__now_ms() - t0);
      timeout_ms = left > 0 ? (int)left : 0;
    }
  }
  return connect_locked(ctx->lanes[0], addr, &d, timeout_ms, conn_p);
}

static int accept_one(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  XPORT__LOCK(lst->ctx);
  int ret = xport_accept__locked(lst, timeout_ms, conn_p);
  if (!ret)
    xport__pool_join(*conn_p); /* ready for its first message */
  XPORT__UNLOCK(lst->ctx);
  return ret;
}

XPORT_API int xport_accept(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  if (!lst || !conn_p)
    return xport_accept__locked(lst, timeout_ms, conn_p);
  if (!lst->sub)
    return accept_one(lst, timeout_ms, conn_p);
  /* Both halves, in turn: the node-local one has no wait object, so the
   * fabric's is slept on in slices that grow to a millisecond. */
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  for (int round = 0;; round++) {
    int ret = accept_one(lst->sub, 0, conn_p);
    if (ret != -XPORT_ETIMEDOUT)
      return ret;
    long slice = round < 8 ? 0 : 1;
    if (deadline >= 0 && deadline - xport__now_ms() < slice)
      slice = 0;
    ret = accept_one(lst, (int)slice, conn_p);
    if (ret != -XPORT_ETIMEDOUT || (deadline >= 0 && xport__now_ms() >= deadline))
      return ret;
    if (!slice) {
      struct timespec ts = {0, 100 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

XPORT_API int xport_conn_query(const xport_conn_t *conn, xport_caps_t *caps_p)
{
  if (!conn || !caps_p)
    return -XPORT_EINVAL;
  *caps_p = conn->lane->caps;
  return 0;
}

XPORT_API int xport_conn_peer(const xport_conn_t *conn, xport_peer_t *peer_p)
{
  if (!conn || !peer_p)
    return -XPORT_EINVAL;
  xport_ctx_t *ctx = conn->ctx;
  XPORT__LOCK(ctx);
  int ret = 0;
  if (conn->state == XPORT__CONN_CLOSED) {
    ret = -XPORT_EINVAL;
  } else {
    xport_peer_t p;
    memset(&p, 0, sizeof p);
    if (conn->lane->tp->peer_addr)
      conn->lane->tp->peer_addr(conn, p.addr, sizeof p.addr);
    p.data_len = conn->shake.data.len;
    memcpy(p.data, conn->shake.data.bytes, p.data_len);
    *peer_p = p;
  }
  XPORT__UNLOCK(ctx);
  return ret;
}

XPORT_API int xport_conn_timeout(xport_conn_t *conn, int timeout_ms)
{
  if (!conn || timeout_ms < 0)
    return -XPORT_EINVAL;
  xport_ctx_t *ctx = conn->ctx;
  XPORT__LOCK(ctx);
  int ret = 0;
  const struct xport__profile *prof = conn->lane->prof;
  if (conn->state == XPORT__CONN_CLOSED) {
    ret = -XPORT_EINVAL;
  } else if (timeout_ms && prof && prof->hung_keeps_buffers) {
    XPORT__INFO("xport_conn_timeout: %s cannot give back the buffers of operations to a peer "
                "that hangs: no deadline there", conn->lane->caps.provider);
    ret = -XPORT_ENOSYS;
  } else {
    /* Counted from the next look, as if its operations had just begun. */
    conn->dl.ms = timeout_ms;
    conn->dl.watching = 0;
    if (timeout_ms && (!ctx->dl.min_ms || timeout_ms < ctx->dl.min_ms)) {
      ctx->dl.min_ms = timeout_ms;
      ret = xport__deadline_tick(ctx);
    }
  }
  XPORT__UNLOCK(ctx);
  return ret;
}

XPORT_API int xport_conn_close(xport_conn_t *conn)
{
  if (!conn)
    return xport_conn_close__locked(conn);
  xport_ctx_t *lctx = conn->ctx;
  XPORT__LOCK(lctx);
  if (conn->app.owned && conn->state != XPORT__CONN_CLOSED) {
    XPORT__UNLOCK(lctx);
    XPORT__WARN("connection %llu belongs to a job: xport_job_fini closes it",
                (unsigned long long)conn->id);
    return -XPORT_EPERM;
  }
  int ret = xport_conn_close__locked(conn);
  XPORT__UNLOCK(lctx);
  return ret;
}
