/* What a closed RDM connection leaves under its tag: sinks that drain
 * its peer's messages, and messages sent ahead of the receives, claimed
 * from the unexpected queue (peek_discard). */
#include "rdm.h"
#include "rdm_wire.h"
#include "fi_rma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- sinks ------------------------------------------------------------- */

/* A closed connection's receive tag, still drained. Messages the peer sent
 * before it heard of the close would otherwise wait in the provider's
 * unexpected queue for ever, and fill it (shm: its 1,024 entries are shared
 * with posted receives, and the endpoint stops). A sink is a receive under
 * that tag alone, posted again as each stale message lands in it; it ends
 * once the peer has answered the goodbye (its last message on that
 * connection) and nothing more came, or after 4 x XPORT_PEER_TIMEOUT. */
#define SINK_MAX 256 /* per context: past it, a closed connection gets none */

static int sink_post(struct xport__sink *k)
{
  struct xport__req *req = k->req;
  struct xport__lane *lane = k->rep->lane;
  /* A stale message may be of any size, and one that truncates the
   * receive never lets it complete (truncation_hangs: shm's copy spins in
   * fi_trecv itself, and the peer, sending to us, spins behind it): the
   * rest goes to the context's sink. */
  struct iovec iov[2] = {{req->bounce->buf, lane->bounce_size}, {lane->sink, lane->sink_len}};
  void *desc[2] = {req->bounce->desc, NULL};
  ssize_t ret = fi_trecvv(k->rep->ep, iov, desc, lane->sink ? 2 : 1, FI_ADDR_UNSPEC, k->tag,
                          XPORT__WIMM_TAG, &req->fictx);
  return ret ? xport__err_from_fi((int)ret) : 0;
}

static void sink_free(struct xport__lane *lane, struct xport__sink *k)
{
  struct xport__sink **pp = &rctx(lane)->sinks;
  while (*pp != k)
    pp = &(*pp)->next;
  *pp = k->next;
  rctx(lane)->nsinks--;
  rdm_ctl_req_free(lane, k->req);
  free(k);
}

void rdm_sink_start(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  struct xport__sink *k;
  /* Where the provider discards unexpected messages (peek_discard), a
   * closed connection's are discarded with the strangers' (its tag is no
   * longer live): a receive would take a rendezvous message, and rxm then
   * reads it from the peer, which may be gone (rxm crashed doing so). */
  if (lane->prof && lane->prof->peek_discard)
    return;
  if (rctx(lane)->nsinks >= SINK_MAX || !rconn(conn)->rep->ep || !(k = calloc(1, sizeof *k)))
    return;
  *k = (struct xport__sink){.rep = rconn(conn)->rep, .tag = rconn(conn)->rx_tag,
                            .peer_ctx_id = conn->peer_ctx_id, .id = conn->id,
                            .peer_id = rconn(conn)->peer_id,
                            .deadline = xport__now_ms() + 4 * lane->ctx->peer_check_ms};
  k->req = rdm_ctl_req(rconn(conn)->rep, XPORT__OP_SINK);
  if (!k->req) {
    free(k);
    return;
  }
  k->req->user_ctx = k;
  if (sink_post(k)) {
    rdm_ctl_req_free(lane, k->req);
    free(k);
    return;
  }
  k->next = rctx(lane)->sinks;
  rctx(lane)->sinks = k;
  rctx(lane)->nsinks++;
}

/* A stale message landed (or the sink was taken back). */
void rdm_sink_done(struct xport__lane *lane, struct xport__sink *k, int status)
{
  if (status == -XPORT_ECANCELED || !k->rep->ep) {
    sink_free(lane, k);
    return;
  }
  rctx(lane)->stale_dropped++;
  k->hits++;
  XPORT__DEBUG("dropped a message for closed connection %u (%zu so far)", k->id,
               rctx(lane)->stale_dropped);
  if (k->ending || sink_post(k))
    sink_free(lane, k);
}

/* 1 if m answered the goodbye of a drained connection. */
int rdm_sink_answered(struct xport__rep *rep, const struct xport__ctl *m)
{
  for (struct xport__sink *k = rctx(rep->lane)->sinks; k; k = k->next)
    if (k->rep == rep && k->id == m->dst_id && k->peer_id == m->src_id &&
        k->peer_ctx_id == m->ctx_id && k->tag == m->cookie) {
      k->answered = 1;
      return 1;
    }
  return 0;
}

/* Takes back the sinks whose time is up: answered and idle since the last
 * look, or past their deadline. */
void rdm_sinks_expire(struct xport__lane *lane)
{
  long now = xport__now_ms();
  for (struct xport__sink *k = rctx(lane)->sinks; k; k = k->next) {
    if (!k->ending && ((k->answered && !k->hits) || now >= k->deadline)) {
      k->ending = 1;
      fi_cancel(&k->rep->ep->fid, &k->req->fictx);
    }
    k->hits = 0;
  }
}

/* An endpoint closing: its sinks went with it. */
void rdm_sinks_drop(struct xport__lane *lane, struct xport__rep *rep)
{
  for (struct xport__sink *k = rctx(lane)->sinks, *next; k; k = next) {
    next = k->next;
    if (k->rep == rep)
      sink_free(lane, k);
  }
}

/* ---- unexpected messages under unused tags (peek_discard) -------------- */

/* One FI_PEEK (with flags) for a message from addr: 1 if one was there
 * (its tag in *tag_p), 0 if none, -1 if the provider could not be asked
 * or did not rdm_answer. The provider answers in the CQ during the call
 * (peek_discard). With keep (FI_CLAIM), the request of a message found is
 * left in *keep: it bears the claim's mark. */
static int peek_from(struct xport__rep *rep, fi_addr_t addr, uint64_t tag, uint64_t ignore,
                     uint64_t flags, uint64_t *tag_p, struct xport__req **keep)
{
  struct xport__lane *lane = rep->lane;
  struct xport__req *req = xport__req_get(lane->ctx);
  if (!req)
    return -1;
  memset(req, 0, sizeof *req);
  req->op = XPORT__OP_PEEK;
  req->rep = rep;
  req->on_done = rdm_internal;
  req->status = 1; /* no rdm_answer yet */
  struct fi_msg_tagged msg = {.addr = addr, .tag = tag, .ignore = ignore,
                              .context = &req->fictx};
  ssize_t ret = fi_trecvmsg(rep->ep, &msg, FI_PEEK | flags);
  if (!ret)
    xport__cq_drain(lane);
  int found = ret || req->status == 1 ? -1 : req->status == 0;
  if (tag_p)
    *tag_p = (uint64_t)req->len;
  if (found == 1 && keep) {
    *keep = req;
    return 1;
  }
  if (ret || req->status != 1)
    xport__req_release(lane->ctx, req);
  else
    req->flags = 1; /* abandoned: released when the rdm_answer comes */
  return found;
}

static int peek(struct xport__rep *rep, uint64_t tag, uint64_t ignore, uint64_t flags,
                uint64_t *tag_p)
{
  return peek_from(rep, FI_ADDR_UNSPEC, tag, ignore, flags, tag_p, NULL) == 1;
}

/* ---- messages sent ahead of the receives (peek_discard) --------------
 * The provider keeps a message that matches no posted receive in memory
 * of its own, without bound (rxm). A connection's peer that sends ahead
 * of the receives would grow it for ever: its messages are claimed (out
 * of the provider's unexpected queue, still in its buffers, counted on
 * the connection), and the next receives posted take them, oldest first,
 * as they would have taken them had they been posted before; past
 * XPORT_RECV_AHEAD of them the connection ends. A claimed message is
 * received, or discarded, through the context its claim left its mark
 * in (rxm 1.17 reads the message from fi_context's internal[0]). */

/* The connection of rep that receives under tag (the write_imm bit aside). */
static xport_conn_t *tag_conn(struct xport__rep *rep, uint64_t tag)
{
  tag &= ~XPORT__WIMM_TAG;
  for (xport_conn_t *c = rep->lane->conns; c; c = c->next)
    if (rconn(c)->rep == rep && rconn(c)->rx_tag == tag)
      return c;
  return NULL;
}

/* Claims for conn the oldest unexpected message under tag from conn's
 * peer (a receive of conn's would match no other's): 0 once claimed, -1
 * if there is none (the oldest under that tag is someone else's), 1 if it
 * could not be done now. */
static int claim(struct xport__rep *rep, xport_conn_t *conn, uint64_t tag)
{
  struct xport__req *req;
  int found = peek_from(rep, rconn(conn)->rx_src, tag, 0, FI_CLAIM, NULL, &req);
  if (found != 1)
    return found ? 1 : -1;
  req->cnext = NULL;
  if (rconn(conn)->claimed_tail)
    rconn(conn)->claimed_tail->cnext = req;
  else
    rconn(conn)->claimed = req;
  rconn(conn)->claimed_tail = req;
  rconn(conn)->nclaimed++;
  rdm_ops_claimed(conn);
  return 0;
}

/* Discards what conn claimed: it ended. */
void rdm_claims_drop(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  while (rconn(conn)->claimed) {
    struct xport__req *c = rconn(conn)->claimed;
    rconn(conn)->claimed = c->cnext;
    c->flags = 1; /* the discard's completion releases it */
    struct fi_msg_tagged msg = {
        .addr = FI_ADDR_UNSPEC, .tag = rconn(conn)->rx_tag, .context = &c->fictx};
    if (!conn->ep || fi_trecvmsg(conn->ep, &msg, FI_CLAIM | FI_DISCARD))
      xport__req_release(lane->ctx, c);
    rctx(lane)->stale_dropped++;
  }
  rconn(conn)->claimed_tail = NULL;
  rconn(conn)->nclaimed = 0;
  rdm_ops_plain(conn);
}

/* The data path's receive while conn holds messages its peer sent ahead
 * of the receives: the oldest it sent first. */
ssize_t rdm_recv_claimed(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt)
{
  struct xport__req *c = rconn(conn)->claimed;
  req->fictx.internal[0] = c->fictx.internal[0]; /* the claim's mark */
  struct fi_msg_tagged msg = {.msg_iov = iov, .desc = desc, .iov_count = cnt,
                              .addr = rconn(conn)->rx_src, .tag = rconn(conn)->rx_tag,
                              .ignore = XPORT__WIMM_TAG, .context = &req->fictx};
  ssize_t ret = fi_trecvmsg(conn->ep, &msg, FI_CLAIM);
  if (ret)
    return ret;
  rconn(conn)->claimed = c->cnext;
  if (!rconn(conn)->claimed) {
    rconn(conn)->claimed_tail = NULL;
    rdm_ops_plain(conn);
  }
  rconn(conn)->nclaimed--;
  xport__req_release(conn->lane->ctx, c);
  return 0;
}

/* The oldest unexpected message, under conn's tag: claimed if conn's peer
 * sent it ahead of conn's receives (and past XPORT_RECV_AHEAD of them the
 * connection ends); as claim says. Without a bound it stays, first in the
 * queue, until its receive comes (1). */
static int ahead(struct xport__rep *rep, xport_conn_t *conn, uint64_t tag)
{
  struct xport__lane *lane = rep->lane;
  if (!rctx(lane)->recv_ahead)
    return 1;
  int ret = claim(rep, conn, tag);
  if (ret || rconn(conn)->nclaimed <= rctx(lane)->recv_ahead)
    return ret;
  /* Logged once per connection, which a peer had to be let make. */
  XPORT__WARN("connection %u: the peer sent more than %zu messages ahead of the receives "
              "posted for them (XPORT_RECV_AHEAD): the connection ends",
              conn->id, rctx(lane)->recv_ahead);
  rdm_drop(conn, -XPORT_ECONNRESET); /* as the peer's death would end it, and the peer told */
  return 0;
}

/* Deals with the provider's unexpected messages, oldest first: a
 * connection's peer's are claimed (ahead); those under tags that no
 * connection of rep receives (a stranger's guesses, or a connection that
 * ended: closed ones have no sink where the provider discards, rdm_sink_start)
 * or from another than the peer are discarded; one that waits for its
 * receive (no bound) stops the scan, and the rest wait behind it until
 * then. At most a batch per call. */
void rdm_discard_unused(struct xport__rep *rep)
{
  uint64_t tag;
  for (int n = 0; n < 1024 && rep->ep && peek(rep, 0, ~UINT64_C(0), 0, &tag); n++) {
    xport_conn_t *c = tag_conn(rep, tag);
    if (c && c->state == XPORT__CONN_CONNECTED) {
      int ret = ahead(rep, c, tag);
      if (ret > 0)
        return;
      if (!ret)
        continue;
      /* None of the peer's: the oldest under its tag is a stranger's. */
    }
    rctx(rep->lane)->stale_dropped++;
    peek(rep, tag, 0, FI_DISCARD, &tag);
  }
}
