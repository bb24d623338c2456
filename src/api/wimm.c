/* Write-with-immediate, emulated where the provider's consumes no
 * receive (tcp, shm, rxm; the lane's native_wimm 0): the write, then an
 * empty message carrying the value, marked as its transport marks it
 * (struct xport__data_ops marker). rma.c posts through here; cq.c
 * delivers the pair; housekeeping posts the markers that waited. */
#include "xport_int.h"

static int marker_post(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  ssize_t ret =
      XPORT__UNLIKELY(conn->hq.head != NULL) ? -FI_EAGAIN : conn->ops->marker(conn, req, flags);
  if (!XPORT__UNLIKELY(xport__pushed_back(ret)))
    return xport__post_end(conn, req, ret);
  struct xport__held h = {.kind = XPORT__H_MARK, .flags = flags};
  return xport__post_hold(conn, req, &h, NULL, NULL);
}

/* A deferred user half leaves the connection's deferred count: posted
 * (ret 0, now on its outstanding list) or failed with status. */
static void wimm_settle(xport_ctx_t *ctx, struct xport__req *p, int status)
{
  xport_conn_t *conn = p->conn;
  conn->wimm_deferred--;
  p->pair = 0;
  if (!status) {
    XPORT__LIST_PUSH(conn->out, p, cnext, cprev); /* ntx and nreqs counted already */
    conn->lane->nposted++;
    return;
  }
  conn->ntx--;
  p->status = status;
  p->flags = 0;
  p->imm = 0;
  xport__done_push(ctx, p);
}

/* 1 if p's marker went, or p failed; 0 if the provider has no room now. */
static int wimm_try(xport_ctx_t *ctx, struct xport__req *p, int status)
{
  xport_conn_t *conn = p->conn;
  if (!status && conn->state != XPORT__CONN_CONNECTED)
    status = conn->closing ? -XPORT_ECANCELED : -XPORT_ECONNRESET;
  if (!status) {
    if (conn->lane->nposted + 1 > conn->lane->max_posted)
      return 0;
    ssize_t ret = conn->ops->marker(conn, p, 0);
    if (ret == -FI_EAGAIN || ret == -FI_ENOMEM)
      return 0;
    status = ret ? xport__err_from_fi((int)ret) : 0;
  }
  wimm_settle(ctx, p, status);
  return 1;
}

void xport__wimm_write_done(xport_ctx_t *ctx, struct xport__req *p, int status)
{
  /* Behind the markers already waiting, in order. */
  if (!ctx->wimm_wait && wimm_try(ctx, p, status))
    return;
  XPORT__FIFO_PUSH(ctx->wimm_wait, ctx->wimm_wait_tail, p, next);
  p->pair_status = status;
}

void xport__wimm_retry(xport_ctx_t *ctx, int fail)
{
  while (ctx->wimm_wait) {
    struct xport__req *p = ctx->wimm_wait, *next = p->next;
    if (!wimm_try(ctx, p, fail ? -XPORT_ECANCELED : p->pair_status))
      return;
    ctx->wimm_wait = next; /* p->next is the done list's now, if it failed */
    if (!ctx->wimm_wait)
      ctx->wimm_wait_tail = NULL;
  }
}

int xport__wimm_post(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt, size_t len,
                     uint64_t addr, uint64_t key, uint32_t imm, void *user_ctx)
{
  struct iovec fiov[XPORT__IOV_MAX];
  void *desc[XPORT__IOV_MAX];
  struct xport__req *req;
  size_t cnt;
  ssize_t ret;
  xport_ctx_t *ctx = conn->ctx;
  /* Both halves fit, or neither is posted. */
  ret = xport__post_room(conn, XPORT_OP_WRITE, 1);
  if (!ret && len)
    ret = xport__post_room(conn, XPORT__OP_SILENT, 2); /* its CQ room */
  if (XPORT__UNLIKELY(ret))
    return (int)ret;
  /* Emulation for providers whose write-with-immediate consumes no
   * receive (tcp, shm, rxm): the write, then an empty message carrying
   * the value, marked by a tag bit (RDM) or the upper half of its CQ
   * data (MSG). The message is ordered after the write (FI_ORDER_SAW),
   * so the data is in place when the target's receive completes. The
   * write is a silent request paired with the message's, which the user
   * sees once both have finished, with the write's error if it
   * failed, else the message's. With
   * delivery-complete both carry the flag (rxm honours it on the write
   * only), except where it would hold up the rest (dc_holds_peer: shm,
   * whose 0-byte delivery-complete message never arrives either).
   *
   * Where a refused operation is never answered (rma_never_fails: shm)
   * the target takes the message all the same, after dropping the
   * write: the message then waits for the write, which goes with
   * delivery-complete (a small one would otherwise complete at once,
   * refused or not), and goes only if the write succeeded (a refused
   * one fails after XPORT_RMA_TIMEOUT, transport/rdm.c rma_check). */
  struct xport__req *wreq = NULL;
  int defer = len && conn->lane->prof && conn->lane->prof->rma_never_fails;
  uint64_t dc = defer ? FI_DELIVERY_COMPLETE
                      : conn->lane->prof && conn->lane->prof->dc_holds_peer ? 0 : conn->lane->write_flags;
  if (XPORT__UNLIKELY(conn->wimm_deferred) && !defer)
    return -XPORT_EAGAIN; /* its message stays behind theirs */
  struct xport__req *dreq = NULL;
  if (defer && !(dreq = xport__req_new(ctx, conn, XPORT_OP_WRITE, user_ctx)))
    return -XPORT_ENOMEM;
  if (len) {
    ret = xport__post_begin(conn, XPORT__OP_SILENT, iov, iovcnt, NULL, fiov, desc, &cnt, &req);
    if (!ret) {
      if (XPORT__UNLIKELY(conn->lane->rma_timeout_ms))
        req->posted_ms = xport__now_ms(), req->posted_seq = ++ctx->dl.rma_seq;
      ret = XPORT__UNLIKELY(conn->hq.head != NULL)
                ? -FI_EAGAIN
                : conn->ops->write(conn, req, fiov, desc, cnt, addr, key, dc, 0);
      struct xport__held h = {.kind = XPORT__H_WRITE, .flags = dc, .cnt = cnt,
                              .rma = {addr, len, key}};
      ret = xport__pushed_back(ret) ? xport__post_hold(conn, req, &h, fiov, desc)
                                    : xport__post_end(conn, req, ret);
    }
    if (XPORT__UNLIKELY(ret)) {
      if (dreq) {
        dreq->conn = NULL;
        xport__req_release(ctx, dreq);
      }
      return (int)ret;
    }
    wreq = req;
  }
  if (defer) {
    /* Counted as posted (the connection's room and handle) until its
     * marker goes or it fails (xport__wimm_write_done). */
    dreq->len = len;
    dreq->imm = imm;
    dreq->pair = XPORT__PAIR_DEFER;
    dreq->pair_status = 0;
    conn->nreqs++;
    conn->ntx++;
    conn->wimm_deferred++;
    wreq->user_ctx = dreq;
    return 0;
  }
  xport_iov_t none = {NULL, 0, NULL};
  ret = xport__post_begin(conn, XPORT_OP_WRITE, &none, 1, user_ctx, fiov, desc, &cnt, &req);
  if (XPORT__UNLIKELY(ret))
    return (int)ret;
  req->len = len;
  req->imm = imm;
  ret = marker_post(conn, req, dc);
  /* A failed post never completes: the write already out stays silent
   * (the caller posts the whole operation again). */
  if (XPORT__UNLIKELY(ret) || !wreq)
    return (int)ret;
  wreq->user_ctx = req;
  req->pair = XPORT__PAIR_WAIT;
  req->pair_status = 0;
  return 0;
}
