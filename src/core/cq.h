/* Requests and their completion, the CQs of every lane, poll, wait, the
 * context's lock and progress thread (core/cq.c). */
#ifndef XPORT_CORE_CQ_H
#define XPORT_CORE_CQ_H

#include "objects.h"

#include <stddef.h>
#include <string.h>

/* Posts what waits, oldest first, as far as the provider takes it. */
void xport__held_retry(xport_ctx_t *ctx);
/* Ends what waits on conn with status: the provider never had it. */
void xport__held_flush(xport_conn_t *conn, int status);

/* The pool's slow half: a chunk more, and one of it taken (cq.c). */
struct xport__req *xport__req_grow(xport_ctx_t *ctx);
/* A request from the pool, or NULL where no memory is left. */
static inline struct xport__req *xport__req_get(xport_ctx_t *ctx)
{
  struct xport__req *r = ctx->free_reqs;
  if (XPORT__UNLIKELY(!r))
    return xport__req_grow(ctx);
  ctx->free_reqs = r->next;
  r->result = NULL;
  return r;
}
/* A request from the pool, ready for op on conn (NULL: no memory):
 * nothing of its last life is left but what the post sets itself. */
static inline struct xport__req *xport__req_new(xport_ctx_t *ctx, xport_conn_t *conn,
                                                xport_op_t op, void *user_ctx)
{
  struct xport__req *req = xport__req_get(ctx);
  if (XPORT__UNLIKELY(!req))
    return NULL;
  req->conn = conn;
  req->user_ctx = user_ctx;
  req->op = op;
  memset(&req->bounce, 0, offsetof(struct xport__req, tmp) - offsetof(struct xport__req, bounce));
  return req;
}
/* Marks a request finished with status and queues it for delivery. */
void xport__req_complete(xport_ctx_t *ctx, struct xport__req *req, int status);
/* Queues the completion of a request the provider never took (inject). */
void xport__req_done_now(xport_ctx_t *ctx, struct xport__req *req);
/* Orphans a request the provider still owns (RDM): it completes with
 * status once the provider lets go of it. */
void xport__req_orphan(struct xport__req *req, int status);
/* Queues a finished request for delivery. */
void xport__done_push(xport_ctx_t *ctx, struct xport__req *req);
/* Drops every finished, undelivered request, parked ones too (the
 * context is going). */
void xport__done_discard(xport_ctx_t *ctx);
/* Releases a request's library-owned memory (bounce, registrations). */
void xport__req_free_mem(struct xport__lane *lane, struct xport__req *req);
/* The peer of conn is dead and the provider can no longer touch what its
 * orphaned requests hold (dead_peer_lets_go): the user sees them now;
 * the requests themselves wait for the provider or the endpoint. */
void xport__zombie_show(xport_ctx_t *ctx, xport_conn_t *conn);
/* After an endpoint closed: its zombies will never be reported. */
void xport__zombie_reclaim(struct xport__lane *lane, struct xport__rep *rep);
/* Reads the CQ until it is empty, queueing what the user must see. */
void xport__cq_drain(struct xport__lane *lane);
void xport__req_release(xport_ctx_t *ctx, struct xport__req *req);
void xport__req_fini(xport_ctx_t *ctx);
/* Arms the context's deadline timer (in its epfd, a few times per its
 * shortest deadline), so that a loop asleep on xport_ctx_fd looks at
 * them; nothing without deadlines or an epfd. Under the lock, or before
 * the context is handed out. 0, or a code. */
int xport__deadline_tick(xport_ctx_t *ctx);
int xport__progress_start(xport_ctx_t *ctx);
void xport__progress_stop(xport_ctx_t *ctx);
/* With the progress thread on, every call into the provider is made
 * under ctx->progress_lock (recursive): not every provider survives two
 * threads progressing it (rxm). Without it, this costs one branch. */
#define XPORT__LOCK(ctx)                                                     \
  do {                                                                       \
    if (XPORT__UNLIKELY((ctx)->progress_on))                                 \
      pthread_mutex_lock(&(ctx)->progress_lock);                             \
  } while (0)
#define XPORT__UNLOCK(ctx)                                                   \
  do {                                                                       \
    if (XPORT__UNLIKELY((ctx)->progress_on))                                 \
      pthread_mutex_unlock(&(ctx)->progress_lock);                           \
  } while (0)
/* Closes a fid with the progress thread held off. */
int xport__close_fid(xport_ctx_t *ctx, struct fid *fid);
/* Leaves a fid open for the rest of the process (keep_fids), remembered
 * where a leak checker finds it: memory kept on purpose, not lost. */
void xport__fid_keep(struct fid *fid);
int xport__wait_fds(struct xport__lane *lane);
/* cq.c: one step of progress on every lane of lane's context but lane,
 * accepts for a layer above included: what a transport runs while it
 * waits in a connect or an accept, so that a peer waiting on another
 * lane is not left waiting for this one (two ranks of a job that connect
 * to each other over different transports). Never blocks; does nothing
 * when called from inside itself. With the lock held. */
void xport__progress_beside(struct xport__lane *lane);
/* Sets conn->peer_gone where the peer's process (on this node) ended;
 * asked when the connection broke, the first time it waits briefly for
 * the process to end (see cq.c). */
void xport__conn_check_gone(xport_conn_t *conn);

#endif /* XPORT_CORE_CQ_H */
