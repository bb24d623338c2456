/* Remote atomics: 64-bit fetch-and-add, compare-and-swap and add.
 *
 * Native where libfabric does them right (shm, rxm): one provider call.
 * Where it does not (tcp has no atomics; verbs 1.17 sends the operand's
 * address as its value), the context's transport carries them where it
 * can (lane->tp->atomic: the MSG transport's service channel, whose
 * target applies them with the CPU's atomic instructions).
 */
#include "xport_int.h"

#include <string.h>

/* ---- posting ------------------------------------------------------------ */

static int post_atomic_locked(xport_conn_t *conn, unsigned kind, uint64_t *result,
                              uint64_t operand, uint64_t compare, const xport_rkey_t *rk,
                              size_t offset, void *user_ctx)
{
  if (XPORT__UNLIKELY(!conn || (kind != XPORT__ATOM_ADD && !result)))
    return -XPORT_EINVAL;
  if (XPORT__UNLIKELY(conn->state != XPORT__CONN_CONNECTED))
    return conn->state == XPORT__CONN_CLOSED ? -XPORT_EINVAL : -XPORT_ENOTCONN;
  xport_ctx_t *ctx = conn->ctx;
  if (XPORT__UNLIKELY(conn->lane->caps.atomics == XPORT_SUPPORT_NONE))
    return -XPORT_ENOSYS;
  if (XPORT__UNLIKELY(offset % 8))
    return -XPORT_EINVAL;
  int ret = xport__check_remote(conn, rk, offset, 8, XPORT_ACCESS_REMOTE_ATOMIC);
  if (XPORT__UNLIKELY(ret))
    return ret;
  uint64_t addr = rk->addr + offset;
  ret = xport__post_room(conn, XPORT_OP_ATOMIC, 1);
  if (XPORT__UNLIKELY(ret))
    return ret;
  /* Not kept behind posts waiting for the provider: it would pass them. */
  if (XPORT__UNLIKELY(conn->hq.head != NULL))
    return -XPORT_EAGAIN;

  struct xport__req *req = xport__req_new(ctx, conn, XPORT_OP_ATOMIC, user_ctx);
  if (XPORT__UNLIKELY(!req))
    return -XPORT_ENOMEM;
  req->len = 8;
  req->result = result;
  req->atom[0] = operand;
  req->atom[1] = compare;
  req->atom[2] = 0;

  ssize_t fret;
  if (conn->lane->atom_emulated) {
    /* The transport's own carriage of it: the answer completes req. */
    ret = conn->lane->tp->atomic ? conn->lane->tp->atomic(conn, req, kind, rk->key, addr) : -XPORT_ENOSYS;
    if (XPORT__UNLIKELY(ret)) {
      req->conn = NULL;
      xport__req_release(ctx, req);
      return ret;
    }
    return xport__post_end(conn, req, 0);
  }

  /* Native: the operands and the fetched value in the request itself, or
   * in a registered slot where the provider wants descriptors. */
  uint64_t *v = req->atom;
  void *desc = NULL;
  if (conn->lane->need_local_mr) {
    req->bounce = xport__small_get(conn->lane);
    if (XPORT__UNLIKELY(!req->bounce)) {
      req->conn = NULL;
      xport__req_release(ctx, req);
      return -XPORT_ENOMEM;
    }
    v = (uint64_t *)(void *)req->bounce->buf;
    v[0] = operand;
    v[1] = compare;
    desc = req->bounce->desc;
  }
  if (XPORT__UNLIKELY(conn->lane->rma_timeout_ms))
    req->posted_ms = xport__now_ms(), req->posted_seq = ++ctx->dl.rma_seq;
  /* Where a refused operation is never answered (rma_never_fails: shm),
   * an add is carried as a fetch-add whose value nobody reads: only an
   * operation that waits for its answer learns of the refusal (its
   * deadline), where a bare add completes at once and changes nothing. */
  if (kind == XPORT__ATOM_ADD && conn->lane->prof && conn->lane->prof->rma_never_fails)
    kind = XPORT__ATOM_FADD;
  fret = conn->ops->atomic(conn, req, kind, v, desc, addr, rk->key);
  return xport__post_end(conn, req, fret);
}

static int post_atomic(xport_conn_t *conn, unsigned kind, uint64_t *result, uint64_t operand,
                       uint64_t compare, const xport_rkey_t *rk, size_t offset, void *user_ctx)
{
  int ret;
  if (XPORT__UNLIKELY(!conn))
    return -XPORT_EINVAL;
  XPORT__LOCK(conn->ctx);
  /* Fault injection (XPORT_FAULT): pushed back before anything is taken. */
  if (XPORT__UNLIKELY(conn->ctx->fault != NULL) && (ret = xport__fault_post(conn))) {
    XPORT__UNLOCK(conn->ctx);
    return ret;
  }
  ret = post_atomic_locked(conn, kind, result, operand, compare, rk, offset, user_ctx);
  XPORT__UNLOCK(conn->ctx);
  return ret;
}

XPORT_API int xport_fetch_add(xport_conn_t *conn, uint64_t *result, uint64_t add,
                              const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  return post_atomic(conn, XPORT__ATOM_FADD, result, add, 0, rkey, offset, user_ctx);
}

XPORT_API int xport_cswap(xport_conn_t *conn, uint64_t *result, uint64_t compare,
                          uint64_t swap, const xport_rkey_t *rkey, size_t offset,
                          void *user_ctx)
{
  return post_atomic(conn, XPORT__ATOM_CSWAP, result, swap, compare, rkey, offset, user_ctx);
}

XPORT_API int xport_atomic_add(xport_conn_t *conn, uint64_t add, const xport_rkey_t *rkey,
                               size_t offset, void *user_ctx)
{
  return post_atomic(conn, XPORT__ATOM_ADD, NULL, add, 0, rkey, offset, user_ctx);
}
