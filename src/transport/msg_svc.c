/* The MSG service channel: a second endpoint per connection that carries
 * the atomics xport emulates where the provider has none (tcp), applied
 * by the target's progress and answered (msg_wire.h). */
#include "msg.h"
#include "msg_wire.h"
#include "fi_rma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void svc_internal(struct xport__lane *lane, struct xport__req *req, int status,
                         const struct fi_cq_data_entry *e, fi_addr_t src);

/* ---- the service channel --------------------------------------------- */

static struct xport__req *svc_req(xport_conn_t *conn, xport_op_t op)
{
  struct xport__lane *lane = conn->lane;
  struct xport__req *req = xport__req_new(lane->ctx, conn, op, NULL);
  if (!req)
    return NULL;
  req->on_done = svc_internal;
  req->bounce = xport__small_get(lane);
  if (!req->bounce) {
    req->conn = NULL;
    xport__req_release(lane->ctx, req);
    return NULL;
  }
  return req;
}

/* Gives a service request back; it had left conn->svc_out, or never joined. */
static void svc_req_free(struct xport__lane *lane, struct xport__req *req)
{
  xport__req_free_mem(lane, req);
  req->conn = NULL; /* never counted in the connection's nreqs */
  xport__req_release(lane->ctx, req);
}

static int svc_post_recv(xport_conn_t *conn, struct xport__req *req)
{
  struct xport__lane *lane = conn->lane;
  ssize_t ret = fi_recv(mconn(conn)->svc, req->bounce->buf, XPORT__SMALL_SLOT, req->bounce->desc, 0,
                        &req->fictx);
  if (ret)
    return xport__err_from_fi((int)ret);
  XPORT__LIST_PUSH(mconn(conn)->svc_out, req, cnext, cprev);
  lane->nposted++;
  return 0;
}

/* Sends len bytes the caller wrote into the returned buffer's request. */
static int svc_send(xport_conn_t *conn, struct xport__req *req, size_t len)
{
  struct xport__lane *lane = conn->lane;
  ssize_t ret = fi_send(mconn(conn)->svc, req->bounce->buf, len, req->bounce->desc, 0, &req->fictx);
  if (ret) {
    svc_req_free(lane, req);
    /* A full queue: EAGAIN, or ENOMEM where the provider's entry pool ran out. */
    return xport__pushed_back(ret) ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  XPORT__LIST_PUSH(mconn(conn)->svc_out, req, cnext, cprev);
  lane->nposted++;
  return 0;
}

int msg_svc_open(xport_conn_t *conn, struct fi_info *info)
{
  struct xport__lane *lane = conn->lane;
  if (lane->nposted + SVC_RX > lane->max_posted)
    return -XPORT_EAGAIN; /* the CQ has no room for another channel */
  int ret = fi_endpoint(lane->domain, info, &mconn(conn)->svc, conn);
  if (!ret)
    ret = fi_ep_bind(mconn(conn)->svc, &lane->eq->fid, 0);
  if (!ret)
    ret = fi_ep_bind(mconn(conn)->svc, &lane->cq->fid, FI_TRANSMIT | FI_RECV);
  if (!ret)
    ret = fi_enable(mconn(conn)->svc);
  if (ret) {
    if (mconn(conn)->svc)
      fi_close(&mconn(conn)->svc->fid);
    mconn(conn)->svc = NULL;
    return xport__err_from_fi(ret);
  }
  /* Posted before the channel connects: the peer may send at once. */
  for (int i = 0; i < SVC_RX && !ret; i++) {
    struct xport__req *req = svc_req(conn, XPORT__OP_SVC_RECV);
    ret = req ? svc_post_recv(conn, req) : -XPORT_ENOMEM;
    if (ret && req)
      svc_req_free(lane, req);
  }
  if (ret)
    msg_svc_close(conn);
  mconn(conn)->svc_state = ret ? -1 : 1;
  return ret;
}

void msg_svc_lost(xport_conn_t *conn, int status)
{
  struct xport__lane *lane = conn->lane;
  msg_svc_close(conn);
  /* Their answers would have come over it. */
  for (struct xport__req *r = conn->out, *next; r; r = next) {
    next = r->cnext;
    if (r->op == XPORT_OP_ATOMIC) {
      mconn(conn)->natom--;
      xport__req_complete(lane->ctx, r, status);
    }
  }
}

void msg_svc_close(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (!mconn(conn)->svc)
    return;
  xport__close_fid(lane->ctx, &mconn(conn)->svc->fid);
  mconn(conn)->svc = NULL;
  mconn(conn)->svc_state = -1;
  /* What the close flushed comes through here too (svc_internal). */
  xport__cq_drain(lane);
  while (mconn(conn)->svc_out) {
    struct xport__req *req = mconn(conn)->svc_out;
    XPORT__LIST_UNLINK(mconn(conn)->svc_out, req, cnext, cprev);
    lane->nposted--;
    svc_req_free(lane, req);
  }
}

/* Applies a request to this context's memory: the old value, or an error
 * for a key that names no region of ours with the atomic right, or a word
 * outside it or misaligned. */
int xport__svc_apply(struct xport__lane *lane, const uint8_t *m, uint64_t *old_p)
{
  return xport__atomic_apply(lane, xport__get32(m + 4), xport__get64(m + 16),
                             xport__get64(m + 24), xport__get64(m + 32), xport__get64(m + 40),
                             old_p);
}

/* Answers a request in the receive's own slot: the receive goes back up
 * once the answer is out (svc_internal). A peer that never takes its
 * answers thus runs this side's receives dry, and its own channel stalls,
 * instead of piling answers up here without bound. */
static void on_request(xport_conn_t *conn, struct xport__req *req)
{
  uint8_t *m = (uint8_t *)req->bounce->buf;
  uint64_t old = 0;
  int status = xport__svc_apply(conn->lane, m, &old);
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

int xport__svc_kind(const void *buf, size_t len)
{
  if (len == ATOM_REQ_LEN && xport__get32(buf) == ATOM_REQ_MAGIC)
    return XPORT__SVC_REQUEST;
  if (len == ATOM_ANS_LEN && xport__get32(buf) == ATOM_ANS_MAGIC)
    return XPORT__SVC_ANSWER;
  return 0;
}

static void on_answer(xport_conn_t *conn, const uint8_t *m)
{
  uint32_t seq = xport__get32(m + 8);
  for (struct xport__req *r = conn->out; r; r = r->cnext)
    if (r->op == XPORT_OP_ATOMIC && r->imm == seq) {
      /* The peer's word: only a code of ours reaches the user. */
      int status = (int)xport__get32(m + 4);
      if (!xport__err_known(status))
        status = -XPORT_EPROTO;
      r->atom[2] = xport__get64(m + 16);
      mconn(conn)->natom--;
      xport__req_complete(conn->lane->ctx, r, status);
      r->len = status ? 0 : 8;
      r->imm = 0;
      return;
    }
  XPORT__INFO("an atomic's answer names no operation of ours; dropped");
}

static void svc_internal(struct xport__lane *lane, struct xport__req *req, int status,
                         const struct fi_cq_data_entry *e, fi_addr_t src)
{
  (void)src;
  xport_conn_t *conn = req->conn;
  XPORT__LIST_UNLINK(mconn(conn)->svc_out, req, cnext, cprev);
  lane->nposted--;
  if (req->op == XPORT__OP_SVC_SEND && req->pair && !status && mconn(conn)->svc) {
    req->op = XPORT__OP_SVC_RECV; /* an answer went out: its receive again */
    req->pair = 0;
    if (svc_post_recv(conn, req))
      svc_req_free(lane, req);
    return;
  }
  if (req->op == XPORT__OP_SVC_SEND || status || !mconn(conn)->svc) {
    svc_req_free(lane, req);
    return;
  }
  /* Data from the peer: checked before it is trusted. */
  const uint8_t *m = (const uint8_t *)req->bounce->buf;
  int kind = xport__svc_kind(m, e->len);
  if (kind == XPORT__SVC_REQUEST) {
    on_request(conn, req);
    return;
  }
  if (kind == XPORT__SVC_ANSWER)
    on_answer(conn, m);
  else
    XPORT__INFO("dropped a malformed message on a service channel (%zu bytes)", e->len);
  if (svc_post_recv(conn, req))
    svc_req_free(lane, req);
}

/* An emulated atomic (atomic.c took req, XPORT_OP_ATOMIC, and counted
 * it): its request goes over the service channel, and the answer
 * completes req (on_answer). The request itself owes no CQ entry. */
int msg_atomic(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t key,
               uint64_t addr)
{
  if (XPORT__UNLIKELY(mconn(conn)->svc_state != 2))
    return -XPORT_ENOSYS; /* a peer that made no service channel */
  if (XPORT__UNLIKELY(mconn(conn)->natom >= XPORT__SVC_DEPTH))
    return -XPORT_EAGAIN;
  struct xport__req *msg = svc_req(conn, XPORT__OP_SVC_SEND);
  if (XPORT__UNLIKELY(!msg))
    return -XPORT_ENOMEM;
  req->imm = ++mconn(conn)->atom_seq;
  uint8_t *m = (uint8_t *)msg->bounce->buf;
  xport__put32(m, ATOM_REQ_MAGIC);
  xport__put32(m + 4, kind);
  xport__put32(m + 8, req->imm);
  xport__put32(m + 12, 0);
  xport__put64(m + 16, key);
  xport__put64(m + 24, addr);
  xport__put64(m + 32, req->atom[0]);
  xport__put64(m + 40, req->atom[1]);
  int ret = svc_send(conn, msg, ATOM_REQ_LEN);
  if (!ret)
    mconn(conn)->natom++;
  return ret;
}
