/* Two-sided messages: the post path. Every check here runs before the
 * provider sees anything, so a refused post posts nothing. */
#include "xport_int.h"

#include <stdlib.h>
#include <string.h>

/* Validates a post and returns the total length, or a negative code. */
static inline __attribute__((always_inline)) ssize_t
check_post(const xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt)
{
  size_t total = 0;
  if (XPORT__UNLIKELY(!conn || (iovcnt && !iov)))
    return -XPORT_EINVAL;
  if (XPORT__UNLIKELY(conn->state != XPORT__CONN_CONNECTED))
    /* CLOSED: misuse seen while the handle still exists; not promised. */
    return conn->state == XPORT__CONN_CLOSED ? -XPORT_EINVAL : -XPORT_ENOTCONN;
  /* The single-buffer posts pass a constant 1: the test folds away. */
  if (XPORT__UNLIKELY(!iovcnt || (iovcnt > 1 && iovcnt > conn->lane->caps.max_iov)))
    return -XPORT_EINVAL;
  for (size_t i = 0; i < iovcnt; i++) {
    const xport_iov_t *v = &iov[i];
    if (XPORT__UNLIKELY(!v->base && v->len))
      return -XPORT_EINVAL;
    if (v->mr) {
      const xport_mr_t *mr = xport__mr_for(v->mr, conn->lane);
      if (XPORT__UNLIKELY(!mr))
        return -XPORT_EINVAL;
      /* Below the region's start, the offset wraps and is too large. */
      size_t end;
      if (XPORT__UNLIKELY(__builtin_add_overflow((uintptr_t)v->base - (uintptr_t)mr->base,
                                                 v->len, &end) ||
                          end > mr->len))
        return -XPORT_ERANGE;
      if (XPORT__UNLIKELY(!(mr->access & XPORT_ACCESS_LOCAL)))
        return -XPORT_EACCES;
    } else if (XPORT__UNLIKELY((uintptr_t)v->base + v->len < v->len)) {
      return -XPORT_EINVAL; /* its end past the address space's: no object is that */
    }
    total += v->len;
    if (XPORT__UNLIKELY(total < v->len))
      return -XPORT_EMSGSIZE;
  }
  if (XPORT__UNLIKELY(total > conn->lane->caps.max_msg_size))
    return -XPORT_EMSGSIZE;
  return (ssize_t)total;
}

/* Where the provider needs local registration and the caller brought
 * none: copies through a bounce buffer, or registers for the operation
 * (prepare_local's slow half). */
static int prepare_copy(struct xport__lane *lane, struct xport__req *req, int is_send,
                        const xport_iov_t *iov, size_t *cnt, size_t total,
                        struct iovec *fiov, void **desc)
{
  size_t n = *cnt;
  if (total <= lane->ctx->eager_size) {
    struct xport__bounce *b = xport__bounce_get(lane);
    if (!b)
      return -XPORT_ENOMEM;
    if (is_send) {
      char *dst = b->buf;
      for (size_t i = 0; i < n; i++) {
        memcpy(dst, iov[i].base, iov[i].len);
        dst += iov[i].len;
      }
    } else {
      memcpy(req->uiov, iov, n * sizeof *iov);
      req->uiovcnt = n;
    }
    req->bounce = b;
    fiov[0].iov_base = b->buf;
    fiov[0].iov_len = total;
    desc[0] = b->desc;
    *cnt = 1;
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (iov[i].mr || !iov[i].len)
      continue;
    struct fid_mr *mr;
    uint64_t acc = is_send ? FI_SEND | FI_WRITE : FI_RECV | FI_READ;
    int ret = xport__reg(lane, iov[i].base, iov[i].len, acc, &mr);
    if (ret)
      return ret;
    req->tmp[req->ntmp++] = mr;
    desc[i] = fi_mr_desc(mr);
  }
  return 0;
}

/* Gives every element a descriptor. Fills fiov/desc, sets *cnt. */
static inline __attribute__((always_inline)) int
prepare_local(struct xport__lane *lane, struct xport__req *req, int is_send, const xport_iov_t *iov,
              size_t *cnt, size_t total, struct iovec *fiov, void **desc)
{
  int need = 0;
  for (size_t i = 0; i < *cnt; i++) {
    fiov[i].iov_base = iov[i].base;
    fiov[i].iov_len = iov[i].len;
    desc[i] = iov[i].mr ? xport__mr_for(iov[i].mr, lane)->desc : NULL; /* checked */
    need |= !iov[i].mr && iov[i].len;
  }
  if (XPORT__LIKELY(!lane->need_local_mr || !need))
    return 0;
  return prepare_copy(lane, req, is_send, iov, cnt, total, fiov, desc);
}

static void undo_prepare(struct xport__lane *lane, struct xport__req *req)
{
  if (req->bounce)
    xport__bounce_put(lane, req->bounce);
  for (unsigned i = 0; i < req->ntmp; i++)
    fi_close(&req->tmp[i]->fid);
  req->conn = NULL;
  xport__req_release(lane->ctx, req);
}

/* Inlined into each public post below, where op, iovcnt and the rest are
 * constants: the compiler drops the loops and the branches they decide. */
static inline __attribute__((always_inline)) int
post_begin(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov, size_t iovcnt,
           void *user_ctx, struct iovec *fiov, void **desc, size_t *cnt,
           struct xport__req **req_p)
{
  ssize_t total = check_post(conn, iov, iovcnt);
  if (XPORT__UNLIKELY(total < 0))
    return (int)total;
  int room = xport__post_room(conn, op, 1);
  if (XPORT__UNLIKELY(room))
    return room;
  xport_ctx_t *ctx = conn->ctx;
  struct xport__req *req = xport__req_new(ctx, conn, op, user_ctx);
  if (XPORT__UNLIKELY(!req))
    return -XPORT_ENOMEM;
  req->len = (size_t)total;
  *cnt = iovcnt;
  /* Data flows out of the local buffer for sends and writes, into it for
   * receives and reads. */
  int out = op == XPORT_OP_SEND || op == XPORT_OP_WRITE || op == XPORT__OP_SILENT;
  int ret = prepare_local(conn->lane, req, out, iov, cnt, (size_t)total, fiov, desc);
  if (XPORT__UNLIKELY(ret)) {
    undo_prepare(conn->lane, req);
    return ret;
  }
  *req_p = req;
  return 0;
}

int xport__post_begin(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov,
                      size_t iovcnt, void *user_ctx, struct iovec *fiov, void **desc,
                      size_t *cnt, struct xport__req **req_p)
{
  return post_begin(conn, op, iov, iovcnt, user_ctx, fiov, desc, cnt, req_p);
}

/* op is req->op: a constant where post() is inlined. */
static inline __attribute__((always_inline)) int
post_end(xport_conn_t *conn, struct xport__req *req, xport_op_t op, ssize_t ret)
{
  if (XPORT__UNLIKELY(ret)) {
    undo_prepare(conn->lane, req);
    /* A full queue shows as EAGAIN, or as ENOMEM where the provider's
     * per-endpoint entry pool is what ran out (shm). */
    return ret == -FI_EAGAIN || ret == -FI_ENOMEM ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  XPORT__LIST_PUSH(conn->out, req, cnext, cprev);
  conn->nreqs++;
  if (op == XPORT_OP_RECV)
    conn->nrx++;
  else if (op != XPORT__OP_SILENT) /* a write_imm counts once, by its user half */
    conn->ntx++;
  conn->lane->nposted++;
  /* The CQ has an entry for each (xport__post_room). */
  XPORT__ASSERT(conn->lane->nposted <= conn->lane->max_posted);
  return 0;
}

int xport__post_end(xport_conn_t *conn, struct xport__req *req, ssize_t ret)
{
  return post_end(conn, req, req->op, ret);
}

int xport__post_hold(xport_conn_t *conn, struct xport__req *req, const struct xport__held *h,
                     const struct iovec *fiov, void *const *desc)
{
  xport_ctx_t *ctx = conn->ctx;
  struct xport__held *copy = malloc(sizeof *copy);
  if (XPORT__UNLIKELY(!copy)) {
    if (req->unsig & XPORT__UNSIG)
      conn->unsig.out--; /* counted by post(), which posted nothing */
    undo_prepare(conn->lane, req);
    return -XPORT_EAGAIN;
  }
  *copy = *h;
  if (h->cnt) { /* a write_imm's marker carries none (fiov NULL) */
    memcpy(copy->iov, fiov, h->cnt * sizeof *fiov);
    memcpy(copy->desc, desc, h->cnt * sizeof *desc);
  }
  req->held = copy;
  if (!conn->hq.head)
    XPORT__LIST_PUSH(ctx->holding, conn, hq.next, hq.prev);
  XPORT__FIFO_PUSH(conn->hq.head, conn->hq.tail, req, next);
  /* Counted as posted: the depth and the CQ's room are promised to it. */
  conn->nreqs++;
  conn->ntx += req->op != XPORT__OP_SILENT;
  conn->lane->nposted++;
  return 0;
}

int xport__post_room(const xport_conn_t *conn, xport_op_t op, size_t n)
{
  size_t used = op == XPORT_OP_RECV ? conn->nrx : conn->ntx;
  size_t depth = op == XPORT_OP_RECV ? conn->lane->caps.rx_depth : conn->lane->caps.tx_depth;
  /* The silent half of a write_imm takes room in the CQ only. */
  size_t d = op == XPORT__OP_SILENT ? 0 : n;
  if (XPORT__UNLIKELY(used + d > depth || conn->lane->nposted + n > conn->lane->max_posted))
    return -XPORT_EAGAIN;
  return 0;
}

/* Numbers a send posted while unsignaled ones are out on conn, so that a
 * signaled one is delivered after those before it (cq.c deliver). */
static inline void order_send(xport_conn_t *conn, struct xport__req *req, int unsig)
{
  req->unsig = unsig ? XPORT__UNSIG : XPORT__ORDERED;
  req->tx_seq = ++conn->unsig.seq;
}

static inline __attribute__((always_inline)) int
post(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov, size_t iovcnt, int with_imm,
     uint32_t imm, int unsig, void *user_ctx)
{
  struct iovec fiov[XPORT__IOV_MAX];
  void *desc[XPORT__IOV_MAX];
  struct xport__req *req = NULL; /* set by post_begin where it returns 0 */
  size_t cnt = 0;
  ssize_t ret;

  if (XPORT__UNLIKELY(!conn))
    return -XPORT_EINVAL;
  XPORT__LOCK(conn->ctx);
  /* Fault injection (XPORT_FAULT): pushed back before anything is taken. */
  if (XPORT__UNLIKELY(conn->ctx->fault != NULL) && (ret = xport__fault_post(conn))) {
    XPORT__UNLOCK(conn->ctx);
    return (int)ret;
  }
  /* A message stays behind a write_imm whose marker is not out yet. */
  if (XPORT__UNLIKELY(conn->wimm_deferred) && op == XPORT_OP_SEND &&
      conn->state == XPORT__CONN_CONNECTED) {
    XPORT__UNLOCK(conn->ctx);
    return -XPORT_EAGAIN;
  }
  ret = post_begin(conn, op, iov, iovcnt, user_ctx, fiov, desc, &cnt, &req);
  if (XPORT__UNLIKELY(ret)) {
    XPORT__UNLOCK(conn->ctx);
    return (int)ret;
  }
  /* A receive of its own: the shared pool lends it no more. */
  if (op == XPORT_OP_RECV && XPORT__UNLIKELY(conn->ctx->pool.on) && !conn->pool.own)
    xport__pool_own(conn);
  /* Small sends go out by inject: the provider copies the bytes at once,
   * so the send is complete as soon as it is posted and the provider
   * need not report it. */
  if (op == XPORT_OP_SEND && cnt == 1 && fiov[0].iov_len <= conn->lane->caps.inject_size &&
      conn->lane->quick_inject && !conn->hq.head) {
    ret = conn->ops->inject(conn, fiov[0].iov_base, fiov[0].iov_len, with_imm, imm);
    if (!ret) {
      if (unsig) {
        undo_prepare(conn->lane, req); /* finished, and nothing to say */
      } else {
        if (XPORT__UNLIKELY(conn->unsig.out))
          order_send(conn, req, 0);
        xport__req_done_now(conn->ctx, req);
      }
      XPORT__UNLOCK(conn->ctx);
      return 0;
    }
    if (ret != -FI_EAGAIN && ret != -FI_ENOSYS && ret != -FI_EOPNOTSUPP) {
      ret = post_end(conn, req, op, ret);
      XPORT__UNLOCK(conn->ctx);
      return (int)ret;
    }
    /* pushed back: fall through to an ordinary send, which may queue */
  }
  /* An unsignaled small send is copied before the call returns (the rule
   * of xport_send_flags(3)): it goes by FI_INJECT, or not at all. */
  uint64_t unsig_inject = 0;
  if (XPORT__UNLIKELY(unsig) && req->len <= conn->lane->caps.inject_size) {
    if (conn->hq.head) {
      undo_prepare(conn->lane, req); /* behind held sends: they keep their order */
      XPORT__UNLOCK(conn->ctx);
      return -XPORT_EAGAIN;
    }
    unsig_inject = FI_INJECT;
  }
  if (XPORT__UNLIKELY(conn->hq.head != NULL) && op == XPORT_OP_SEND)
    ret = -FI_EAGAIN; /* behind those: messages stay in order */
  else if (op == XPORT_OP_SEND)
    ret = conn->ops->send(conn, req, fiov, desc, cnt,
                         (with_imm ? FI_REMOTE_CQ_DATA : 0) | unsig_inject, imm);
  else
    ret = conn->ops->recv(conn, req, fiov, desc, cnt);
  if (XPORT__UNLIKELY(unsig_inject) && xport__pushed_back(ret)) {
    undo_prepare(conn->lane, req);
    XPORT__UNLOCK(conn->ctx);
    return -XPORT_EAGAIN;
  }
  if (op == XPORT_OP_SEND && XPORT__UNLIKELY(unsig || conn->unsig.out) &&
      (!ret || xport__pushed_back(ret))) {
    order_send(conn, req, unsig);
    conn->unsig.out += unsig != 0;
  }
  if (XPORT__UNLIKELY(xport__pushed_back(ret)) && op == XPORT_OP_SEND) {
    struct xport__held h = {.kind = XPORT__H_SEND, .flags = with_imm ? FI_REMOTE_CQ_DATA : 0,
                            .cnt = cnt, .data = imm};
    ret = xport__post_hold(conn, req, &h, fiov, desc);
    XPORT__UNLOCK(conn->ctx);
    return (int)ret;
  }
  ret = post_end(conn, req, op, ret);
  XPORT__UNLOCK(conn->ctx);
  return (int)ret;
}

XPORT_API int xport_send(xport_conn_t *conn, const void *buf, size_t len, xport_mr_t *mr,
                         void *user_ctx)
{
  xport_iov_t v = {(void *)buf, len, mr};
  return post(conn, XPORT_OP_SEND, &v, 1, 0, 0, 0, user_ctx);
}

/* xport_send_flags past its quick path: out of line, so that the quick
 * path keeps a small frame. */
static __attribute__((noinline)) int send_flags_post(xport_conn_t *conn, const void *buf,
                                                     size_t len, xport_mr_t *mr, int unsig,
                                                     void *user_ctx)
{
  xport_iov_t v = {(void *)buf, len, mr};
  return post(conn, XPORT_OP_SEND, &v, 1, 0, 0, unsig, user_ctx);
}

/* An unsignaled small send that the provider copies at once leaves
 * nothing behind to complete: no request at all. Behind held sends or a
 * deferred write_imm it takes the ordinary path, which keeps order. Out
 * of line, so that a signaled send pays nothing for it. */
static __attribute__((noinline)) int send_unsig(xport_conn_t *conn, const void *buf, size_t len,
                                                xport_mr_t *mr, void *user_ctx)
{
  xport_ctx_t *ctx = conn->ctx;
  xport_iov_t v = {(void *)buf, len, mr};
  XPORT__LOCK(ctx);
  /* With fault injection on, the ordinary path, where it is counted. */
  if (conn->lane->quick_inject && !conn->hq.head && !conn->wimm_deferred && XPORT__LIKELY(!ctx->fault)) {
    ssize_t total = check_post(conn, &v, 1);
    if (total < 0) {
      XPORT__UNLOCK(ctx);
      return (int)total;
    }
    if ((size_t)total <= conn->lane->caps.inject_size) {
      ssize_t ret = conn->ops->inject(conn, buf, len, 0, 0);
      if (ret != -FI_ENOSYS && ret != -FI_EOPNOTSUPP) {
        XPORT__UNLOCK(ctx);
        return !ret                     ? 0
               : xport__pushed_back(ret) ? -XPORT_EAGAIN
                                         : xport__err_from_fi((int)ret);
      }
    }
  }
  XPORT__UNLOCK(ctx);
  return send_flags_post(conn, buf, len, mr, 1, user_ctx);
}

XPORT_API int xport_send_flags(xport_conn_t *conn, const void *buf, size_t len,
                               xport_mr_t *mr, unsigned flags, void *user_ctx)
{
  if (XPORT__UNLIKELY(flags & ~XPORT_SEND_UNSIGNALED))
    return -XPORT_EINVAL;
  if (flags && conn)
    return send_unsig(conn, buf, len, mr, user_ctx);
  return send_flags_post(conn, buf, len, mr, flags != 0, user_ctx);
}

XPORT_API int xport_send_imm(xport_conn_t *conn, const void *buf, size_t len,
                             xport_mr_t *mr, uint32_t imm, void *user_ctx)
{
  xport_iov_t v = {(void *)buf, len, mr};
  return post(conn, XPORT_OP_SEND, &v, 1, 1, imm, 0, user_ctx);
}

XPORT_API int xport_sendv(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt,
                          void *user_ctx)
{
  return post(conn, XPORT_OP_SEND, iov, iovcnt, 0, 0, 0, user_ctx);
}

XPORT_API int xport_recv(xport_conn_t *conn, void *buf, size_t len, xport_mr_t *mr,
                         void *user_ctx)
{
  xport_iov_t v = {buf, len, mr};
  return post(conn, XPORT_OP_RECV, &v, 1, 0, 0, 0, user_ctx);
}

XPORT_API int xport_recvv(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt,
                          void *user_ctx)
{
  return post(conn, XPORT_OP_RECV, iov, iovcnt, 0, 0, 0, user_ctx);
}
