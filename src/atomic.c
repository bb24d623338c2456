/* Remote atomics: 64-bit fetch-and-add, compare-and-swap and add.
 *
 * Native where libfabric does them right (shm, rxm): one provider call.
 * Emulated over FI_EP_MSG (tcp has no atomics; verbs 1.17 sends the
 * operand's address as its value): every connection then has a second
 * endpoint, the service channel, made with it (conn.c), on which a
 * request travels as a message and the target's xport applies it with
 * the CPU's atomic instructions, inside its own poll, and answers with the
 * old value. The channel's traffic never takes a receive of the user's.
 * It also keeps a dead peer from going unnoticed: tcp stops reading a
 * connection at a message no receive takes, and so never sees the end of
 * the stream behind it, while the channel, read to its end, does.
 *
 * Wire (little-endian, both directions on the service channel):
 *   request  0 magic "XATQ"  4 kind (1 fetch-add, 2 cswap, 3 add)
 *            8 sequence  12 zero  16 key  24 address  32 operand  40 compare
 *   answer   0 magic "XATA"  4 status (0 or -XPORT_E*)
 *            8 sequence  12 zero  16 old value
 */
#include "xport_int.h"

#include <string.h>

#define ATOM_REQ_MAGIC 0x51544158u /* "XATQ" */
#define ATOM_ANS_MAGIC 0x41544158u /* "XATA" */
#define ATOM_REQ_LEN 48
#define ATOM_ANS_LEN 24
/* A channel's receives: the peer's requests (as many as it may have
 * outstanding) and the answers to ours. */
#define SVC_RX (2 * XPORT__SVC_DEPTH)

enum { ATOM_FADD = 1, ATOM_CSWAP = 2, ATOM_ADD = 3 };

/* ---- the service channel --------------------------------------------- */

static struct xport__req *svc_req(xport_conn_t *conn, xport_op_t op)
{
  xport_ctx_t *ctx = conn->ctx;
  struct xport__req *req = xport__req_new(ctx, conn, op, NULL);
  if (!req)
    return NULL;
  req->bounce = xport__small_get(ctx);
  if (!req->bounce) {
    req->conn = NULL;
    xport__req_release(ctx, req);
    return NULL;
  }
  return req;
}

/* Gives a service request back; it had left conn->svc_out, or never joined. */
static void svc_req_free(xport_ctx_t *ctx, struct xport__req *req)
{
  xport__req_free_mem(ctx, req);
  req->conn = NULL; /* never counted in the connection's nreqs */
  xport__req_release(ctx, req);
}

static int svc_post_recv(xport_conn_t *conn, struct xport__req *req)
{
  xport_ctx_t *ctx = conn->ctx;
  ssize_t ret = fi_recv(conn->svc, req->bounce->buf, XPORT__SMALL_SLOT, req->bounce->desc, 0,
                        &req->fictx);
  if (ret)
    return xport__err_from_fi((int)ret);
  XPORT__LIST_PUSH(conn->svc_out, req, cnext, cprev);
  ctx->nposted++;
  return 0;
}

/* Sends len bytes the caller wrote into the returned buffer's request. */
static int svc_send(xport_conn_t *conn, struct xport__req *req, size_t len)
{
  xport_ctx_t *ctx = conn->ctx;
  ssize_t ret = fi_send(conn->svc, req->bounce->buf, len, req->bounce->desc, 0, &req->fictx);
  if (ret) {
    svc_req_free(ctx, req);
    return ret == -FI_EAGAIN ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  XPORT__LIST_PUSH(conn->svc_out, req, cnext, cprev);
  ctx->nposted++;
  return 0;
}

int xport__svc_open(xport_conn_t *conn, struct fi_info *info)
{
  xport_ctx_t *ctx = conn->ctx;
  if (ctx->nposted + SVC_RX > ctx->max_posted)
    return -XPORT_EAGAIN; /* the CQ has no room for another channel */
  int ret = fi_endpoint(ctx->domain, info, &conn->svc, conn);
  if (!ret)
    ret = fi_ep_bind(conn->svc, &ctx->eq->fid, 0);
  if (!ret)
    ret = fi_ep_bind(conn->svc, &ctx->cq->fid, FI_TRANSMIT | FI_RECV);
  if (!ret)
    ret = fi_enable(conn->svc);
  if (ret) {
    if (conn->svc)
      fi_close(&conn->svc->fid);
    conn->svc = NULL;
    return xport__err_from_fi(ret);
  }
  /* Posted before the channel connects: the peer may send at once. */
  for (int i = 0; i < SVC_RX && !ret; i++) {
    struct xport__req *req = svc_req(conn, XPORT__OP_SVC_RECV);
    ret = req ? svc_post_recv(conn, req) : -XPORT_ENOMEM;
    if (ret && req)
      svc_req_free(ctx, req);
  }
  if (ret)
    xport__svc_close(conn);
  conn->svc_state = ret ? -1 : 1;
  return ret;
}

void xport__svc_lost(xport_conn_t *conn, int status)
{
  xport_ctx_t *ctx = conn->ctx;
  xport__svc_close(conn);
  /* Their answers would have come over it. */
  for (struct xport__req *r = conn->out, *next; r; r = next) {
    next = r->cnext;
    if (r->op == XPORT_OP_ATOMIC) {
      conn->natom--;
      xport__req_complete(ctx, r, status);
    }
  }
}

void xport__svc_close(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (!conn->svc)
    return;
  xport__close_fid(ctx, &conn->svc->fid);
  conn->svc = NULL;
  conn->svc_state = -1;
  /* What the close flushed comes through here too (svc_internal). */
  xport__cq_drain(ctx);
  while (conn->svc_out) {
    struct xport__req *req = conn->svc_out;
    XPORT__LIST_UNLINK(conn->svc_out, req, cnext, cprev);
    ctx->nposted--;
    svc_req_free(ctx, req);
  }
}

/* Applies a request to this context's memory: the old value, or an error
 * for a key that names no region of ours with the atomic right, or a word
 * outside it or misaligned. */
static int apply(xport_ctx_t *ctx, const uint8_t *m, uint64_t *old_p)
{
  char *base;
  size_t len;
  unsigned access;
  unsigned kind = xport__get32(m + 4);
  uint64_t key = xport__get64(m + 16), addr = xport__get64(m + 24);
  uint64_t operand = xport__get64(m + 32), compare = xport__get64(m + 40);
  if (kind < ATOM_FADD || kind > ATOM_ADD)
    return -XPORT_EPROTO;
  if (xport__mr_by_key(ctx, key, &base, &len, &access) ||
      !(access & XPORT_ACCESS_REMOTE_ATOMIC))
    return -XPORT_EACCES;
  /* Outside the key's registration, or misaligned: the initiator checks
   * both against the key it holds, so only a forged key gets here, and is
   * refused as any key the target does not honour. */
  uint64_t off = ctx->virt_addr ? addr - (uint64_t)(uintptr_t)base : addr;
  if (off > len || len - off < 8)
    return -XPORT_EACCES;
  uint64_t *word = (uint64_t *)(void *)(base + off);
  if ((uintptr_t)word % 8)
    return -XPORT_EACCES;
  /* Sequentially consistent, as a device's atomics are to one another:
   * other emulated operations on the word, and the target's own atomic
   * operations on it, see one order. */
  if (kind == ATOM_CSWAP) {
    uint64_t expect = compare;
    __atomic_compare_exchange_n(word, &expect, operand, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    *old_p = expect;
  } else {
    *old_p = __atomic_fetch_add(word, operand, __ATOMIC_SEQ_CST);
  }
  return 0;
}

/* Answers a request in the receive's own slot: the receive goes back up
 * once the answer is out (svc_internal). A peer that never takes its
 * answers thus runs this side's receives dry, and its own channel stalls,
 * instead of piling answers up here without bound. */
static void on_request(xport_conn_t *conn, struct xport__req *req)
{
  uint8_t *m = (uint8_t *)req->bounce->buf;
  uint64_t old = 0;
  int status = apply(conn->ctx, m, &old);
  uint32_t seq = xport__get32(m + 8);
  memset(m, 0, ATOM_ANS_LEN);
  xport__put32(m, ATOM_ANS_MAGIC);
  xport__put32(m + 4, (uint32_t)status);
  xport__put32(m + 8, seq);
  xport__put64(m + 16, old);
  req->op = XPORT__OP_SVC_SEND;
  req->pair = 1; /* a receive, lent */
  if (svc_send(conn, req, ATOM_ANS_LEN))
    XPORT__WARN("an atomic's answer could not be sent; its initiator waits for the "
                "connection's end");
}

static void on_answer(xport_conn_t *conn, const uint8_t *m)
{
  uint32_t seq = xport__get32(m + 8);
  for (struct xport__req *r = conn->out; r; r = r->cnext)
    if (r->op == XPORT_OP_ATOMIC && r->imm == seq) {
      int status = (int)xport__get32(m + 4);
      if (status > 0 || status < -4096)
        status = -XPORT_EPROTO;
      r->atom[2] = xport__get64(m + 16);
      conn->natom--;
      xport__req_complete(conn->ctx, r, status);
      r->len = status ? 0 : 8;
      r->imm = 0;
      return;
    }
  XPORT__INFO("an atomic's answer names no operation of ours; dropped");
}

void xport__svc_internal(xport_ctx_t *ctx, struct xport__req *req, int status,
                         const struct fi_cq_data_entry *e)
{
  xport_conn_t *conn = req->conn;
  XPORT__LIST_UNLINK(conn->svc_out, req, cnext, cprev);
  ctx->nposted--;
  if (req->op == XPORT__OP_SVC_SEND && req->pair && !status && conn->svc) {
    req->op = XPORT__OP_SVC_RECV; /* an answer went out: its receive again */
    req->pair = 0;
    if (svc_post_recv(conn, req))
      svc_req_free(ctx, req);
    return;
  }
  if (req->op == XPORT__OP_SVC_SEND || status || !conn->svc) {
    svc_req_free(ctx, req);
    return;
  }
  /* Data from the peer: checked before it is trusted. */
  const uint8_t *m = (const uint8_t *)req->bounce->buf;
  if (e->len == ATOM_REQ_LEN && xport__get32(m) == ATOM_REQ_MAGIC) {
    on_request(conn, req);
    return;
  }
  if (e->len == ATOM_ANS_LEN && xport__get32(m) == ATOM_ANS_MAGIC)
    on_answer(conn, m);
  else
    XPORT__INFO("dropped a malformed message on a service channel (%zu bytes)", e->len);
  if (svc_post_recv(conn, req))
    svc_req_free(ctx, req);
}

/* ---- posting ------------------------------------------------------------ */

static int post_atomic_locked(xport_conn_t *conn, unsigned kind, uint64_t *result,
                              uint64_t operand, uint64_t compare, const xport_rkey_t *rk,
                              size_t offset, void *user_ctx)
{
  if (XPORT__UNLIKELY(!conn || (kind != ATOM_ADD && !result)))
    return -XPORT_EINVAL;
  if (XPORT__UNLIKELY(conn->state != XPORT__CONN_CONNECTED))
    return conn->state == XPORT__CONN_CLOSED ? -XPORT_EINVAL : -XPORT_ENOTCONN;
  xport_ctx_t *ctx = conn->ctx;
  if (XPORT__UNLIKELY(ctx->caps.atomics == XPORT_SUPPORT_NONE))
    return -XPORT_ENOSYS;
  if (XPORT__UNLIKELY(offset % 8))
    return -XPORT_EINVAL;
  int ret = xport__check_remote(conn, rk, offset, 8, XPORT_ACCESS_REMOTE_ATOMIC);
  if (XPORT__UNLIKELY(ret))
    return ret;
  uint64_t addr = rk->addr + offset;
  if (ctx->atom_emulated) {
    if (XPORT__UNLIKELY(conn->svc_state != 2))
      return -XPORT_ENOSYS; /* a peer that made no service channel */
    if (XPORT__UNLIKELY(conn->natom >= XPORT__SVC_DEPTH))
      return -XPORT_EAGAIN;
  }
  ret = xport__post_room(conn, XPORT_OP_ATOMIC, 1);
  if (XPORT__UNLIKELY(ret))
    return ret;
  /* Not kept behind posts waiting for the provider: it would pass them. */
  if (XPORT__UNLIKELY(conn->held != NULL))
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
  if (ctx->atom_emulated) {
    struct xport__req *msg = svc_req(conn, XPORT__OP_SVC_SEND);
    if (XPORT__UNLIKELY(!msg)) {
      req->conn = NULL;
      xport__req_release(ctx, req);
      return -XPORT_ENOMEM;
    }
    req->imm = ++conn->atom_seq;
    uint8_t *m = (uint8_t *)msg->bounce->buf;
    xport__put32(m, ATOM_REQ_MAGIC);
    xport__put32(m + 4, kind);
    xport__put32(m + 8, req->imm);
    xport__put32(m + 12, 0);
    xport__put64(m + 16, rk->key);
    xport__put64(m + 24, addr);
    xport__put64(m + 32, operand);
    xport__put64(m + 40, compare);
    fret = svc_send(conn, msg, ATOM_REQ_LEN);
    if (!fret)
      conn->natom++;
    /* The request itself owes no CQ entry; the answer completes it. */
    return xport__post_end(conn, req, fret == -XPORT_EAGAIN ? -FI_EAGAIN : fret);
  }

  /* Native: the operands and the fetched value in the request itself, or
   * in a registered slot where the provider wants descriptors. */
  uint64_t *v = req->atom;
  void *desc = NULL;
  if (ctx->need_local_mr) {
    req->bounce = xport__small_get(ctx);
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
  if (XPORT__UNLIKELY(ctx->rma_timeout_ms))
    req->posted_ms = xport__now_ms(), req->posted_seq = ++ctx->rma_seq;
  /* Where a refused operation is never answered (rma_never_fails: shm),
   * an add is carried as a fetch-add whose value nobody reads: only an
   * operation that waits for its answer learns of the refusal (its
   * deadline), where a bare add completes at once and changes nothing. */
  if (kind == ATOM_ADD && ctx->prof && ctx->prof->rma_never_fails)
    kind = ATOM_FADD;
  if (kind == ATOM_FADD)
    fret = fi_fetch_atomic(conn->ep, &v[0], 1, desc, &v[2], desc, conn->dest, addr, rk->key,
                           FI_UINT64, FI_SUM, &req->fictx);
  else if (kind == ATOM_CSWAP)
    fret = fi_compare_atomic(conn->ep, &v[0], 1, desc, &v[1], desc, &v[2], desc, conn->dest,
                             addr, rk->key, FI_UINT64, FI_CSWAP, &req->fictx);
  else
    fret = fi_atomic(conn->ep, &v[0], 1, desc, conn->dest, addr, rk->key, FI_UINT64, FI_SUM,
                     &req->fictx);
  return xport__post_end(conn, req, fret);
}

static int post_atomic(xport_conn_t *conn, unsigned kind, uint64_t *result, uint64_t operand,
                       uint64_t compare, const xport_rkey_t *rk, size_t offset, void *user_ctx)
{
  if (XPORT__UNLIKELY(!conn))
    return -XPORT_EINVAL;
  XPORT__LOCK(conn->ctx);
  int ret = post_atomic_locked(conn, kind, result, operand, compare, rk, offset, user_ctx);
  XPORT__UNLOCK(conn->ctx);
  return ret;
}

XPORT_API int xport_fetch_add(xport_conn_t *conn, uint64_t *result, uint64_t add,
                              const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  return post_atomic(conn, ATOM_FADD, result, add, 0, rkey, offset, user_ctx);
}

XPORT_API int xport_cswap(xport_conn_t *conn, uint64_t *result, uint64_t compare,
                          uint64_t swap, const xport_rkey_t *rkey, size_t offset,
                          void *user_ctx)
{
  return post_atomic(conn, ATOM_CSWAP, result, swap, compare, rkey, offset, user_ctx);
}

XPORT_API int xport_atomic_add(xport_conn_t *conn, uint64_t add, const xport_rkey_t *rkey,
                               size_t offset, void *user_ctx)
{
  return post_atomic(conn, ATOM_ADD, NULL, add, 0, rkey, offset, user_ctx);
}
