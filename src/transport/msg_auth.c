/* The MSG handshake's mutual proof under a context key, on the
 * connection's own endpoint before the user's first receive (msg_wire.h,
 * xport(7) AUTHENTICATION). */
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

static void auth_internal(struct xport__lane *lane, struct xport__req *req, int status,
                          const struct fi_cq_data_entry *e, fi_addr_t src);

static struct xport__req *auth_req(xport_conn_t *conn, xport_op_t op)
{
  struct xport__lane *lane = conn->lane;
  struct xport__req *req = xport__req_new(lane->ctx, conn, op, NULL);
  if (!req)
    return NULL;
  req->on_done = auth_internal;
  req->bounce = xport__bounce_get(lane);
  if (!req->bounce) {
    req->conn = NULL;
    xport__req_release(lane->ctx, req);
    return NULL;
  }
  return req;
}

static void auth_req_free(struct xport__lane *lane, struct xport__req *req)
{
  xport__req_free_mem(lane, req);
  req->conn = NULL; /* never counted in the connection's nreqs */
  xport__req_release(lane->ctx, req);
}

/* A receive of xport's own on the connection's endpoint, posted before
 * the peer may send what it takes. */
int msg_auth_post_recv(xport_conn_t *conn, struct xport__req *req)
{
  struct xport__lane *lane = conn->lane;
  if (!req && !(req = auth_req(conn, XPORT__OP_SVC_RECV)))
    return -XPORT_ENOMEM;
  ssize_t ret = fi_recv(conn->ep, req->bounce->buf, AUTH_LEN, req->bounce->desc, 0, &req->fictx);
  if (ret) {
    auth_req_free(lane, req);
    return xport__err_from_fi((int)ret);
  }
  XPORT__LIST_PUSH(mconn(conn)->auth_out, req, cnext, cprev);
  lane->nposted++;
  return 0;
}

/* Sends a message of kind: a nonce and a proof (the handshake under a
 * key), or data (AUTH_DATA). */
static int auth_send_msg(xport_conn_t *conn, unsigned kind, const uint8_t *nonce,
                         const uint8_t *mac, const struct xport__conn_data *data)
{
  struct xport__lane *lane = conn->lane;
  struct xport__req *req = auth_req(conn, XPORT__OP_SVC_SEND);
  if (!req)
    return -XPORT_ENOMEM;
  uint8_t *m = (uint8_t *)req->bounce->buf;
  memset(m, 0, AUTH_LEN);
  xport__put32(m, AUTH_MAGIC);
  xport__put32(m + 4, kind);
  if (nonce)
    memcpy(m + 8, nonce, XPORT__AUTH_NONCE);
  if (mac)
    memcpy(m + 40, mac, XPORT__AUTH_MAC);
  if (data) {
    xport__put32(m + 8, (uint32_t)data->len);
    memcpy(m + AUTH_DATA_AT, data->bytes, data->len);
  }
  ssize_t ret = fi_send(conn->ep, m, AUTH_LEN, req->bounce->desc, 0, &req->fictx);
  if (ret) {
    auth_req_free(lane, req);
    return xport__pushed_back(ret) ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  XPORT__LIST_PUSH(mconn(conn)->auth_out, req, cnext, cprev);
  lane->nposted++;
  return 0;
}

int msg_auth_send(xport_conn_t *conn, unsigned kind, const uint8_t *nonce, const uint8_t *mac)
{
  return auth_send_msg(conn, kind, nonce, mac, NULL);
}

int msg_data_send(xport_conn_t *conn, const struct xport__conn_data *data)
{
  _Static_assert(AUTH_DATA_AT + XPORT_CONN_DATA_MAX <= AUTH_LEN, "the data fits the message");
  return auth_send_msg(conn, AUTH_DATA, NULL, NULL, data);
}

/* The client's data (m, AUTH_LEN bytes of kind AUTH_DATA): taken where
 * its request announced it, once, and past the proofs under a key;
 * anything else fails the handshake. */
static void data_take(xport_conn_t *conn, const uint8_t *m)
{
  uint32_t len = xport__get32(m + 8);
  int proven = mconn(conn)->auth_state == AS_NONE || mconn(conn)->auth_state == AS_DONE;
  if (!conn->shake.data_due || !proven || len > XPORT_CONN_DATA_MAX || xport__get32(m + 12)) {
    XPORT__INFO("a connection's handshake failed: its data came %s",
                !conn->shake.data_due ? "unannounced" : !proven ? "before its proof" : "malformed");
    mconn(conn)->auth_state = AS_FAILED;
    conn->fail_code = -XPORT_EPROTO;
    return;
  }
  conn->shake.data.len = len;
  memcpy(conn->shake.data.bytes, m + AUTH_DATA_AT, len);
  conn->shake.data_due = 0;
}

/* A proof: the MAC, keyed with the context's key, over the direction's
 * label, both nonces, both context ids and the service channel's cookie
 * (which the acceptance carried unauthenticated). */
static void auth_proof(const struct xport__lane *lane, int by_listener, const uint8_t *client_nonce,
                       const uint8_t *listener_nonce, uint64_t client_id, uint64_t listener_id,
                       uint64_t cookie, uint8_t mac[XPORT__AUTH_MAC])
{
  static const char label[2][32] = {"xport msg 1: the client's proof",
                                    "xport msg 1: the listener's"};
  uint8_t t[32 + 2 * XPORT__AUTH_NONCE + 24];
  memcpy(t, label[by_listener], 32);
  memcpy(t + 32, client_nonce, XPORT__AUTH_NONCE);
  memcpy(t + 32 + XPORT__AUTH_NONCE, listener_nonce, XPORT__AUTH_NONCE);
  xport__put64(t + 32 + 2 * XPORT__AUTH_NONCE, client_id);
  xport__put64(t + 40 + 2 * XPORT__AUTH_NONCE, listener_id);
  xport__put64(t + 48 + 2 * XPORT__AUTH_NONCE, cookie);
  xport__auth_mac(lane->ctx->auth_key, t, sizeof t, mac);
}

/* Acts on a message of the handshake (m, AUTH_LEN bytes checked), as the
 * connection's side and state say; anything out of turn fails it. */
static void auth_step(xport_conn_t *conn, struct xport__req *req, const uint8_t *m)
{
  struct xport__lane *lane = conn->lane;
  unsigned kind = xport__get32(m + 4);
  uint8_t nonce[XPORT__AUTH_NONCE], mac[XPORT__AUTH_MAC];
  int ret = -XPORT_EACCES;
  if (mconn(conn)->auth_state == AS_WAIT_HELLO && kind == AUTH_HELLO) {
    xport__auth_nonce(nonce);
    auth_proof(lane, 1, m + 8, nonce, conn->peer_ctx_id, lane->ctx->id, mconn(conn)->svc_cookie, mac);
    auth_proof(lane, 0, m + 8, nonce, conn->peer_ctx_id, lane->ctx->id, mconn(conn)->svc_cookie,
               mconn(conn)->auth);
    ret = msg_auth_post_recv(conn, req);
    req = NULL;
    if (!ret)
      ret = msg_auth_send(conn, AUTH_ANSWER, nonce, mac);
    if (!ret) {
      mconn(conn)->auth_state = AS_WAIT_PROOF;
      return;
    }
  } else if (mconn(conn)->auth_state == AS_WAIT_PROOF && kind == AUTH_PROOF &&
             xport__auth_same(m + 40, mconn(conn)->auth)) {
    mconn(conn)->auth_state = AS_DONE;
  } else if (mconn(conn)->auth_state == AS_WAIT_ANSWER && kind == AUTH_ANSWER) {
    auth_proof(lane, 1, mconn(conn)->auth, m + 8, lane->ctx->id, conn->peer_ctx_id, mconn(conn)->svc_cookie, mac);
    int ok = xport__auth_same(mac, m + 40);
    if (ok)
      auth_proof(lane, 0, mconn(conn)->auth, m + 8, lane->ctx->id, conn->peer_ctx_id, mconn(conn)->svc_cookie,
                 mac);
    ret = msg_auth_send(conn, ok ? AUTH_PROOF : AUTH_REFUSE, NULL, ok ? mac : NULL);
    if (!ok) {
      XPORT__WARN("authentication failed: the listener does not hold this context's key");
      ret = -XPORT_EACCES;
    }
    mconn(conn)->auth_state = ret ? AS_FAILED : AS_DONE;
    conn->fail_code = ret;
  }
  if (req)
    auth_req_free(lane, req);
  if (mconn(conn)->auth_state == AS_DONE || mconn(conn)->auth_state == AS_FAILED) {
    xport__auth_wipe(mconn(conn)->auth, sizeof mconn(conn)->auth);
    return;
  }
  if (mconn(conn)->auth_state == AS_WAIT_HELLO || mconn(conn)->auth_state == AS_WAIT_PROOF)
    XPORT__INFO("a connection's handshake under a key failed: authentication failed: the "
                "peer does not hold this listener's key%s",
                kind == AUTH_REFUSE ? " (it refused ours)" : "");
  mconn(conn)->auth_state = AS_FAILED;
  conn->fail_code = ret ? ret : -XPORT_EACCES;
  xport__auth_wipe(mconn(conn)->auth, sizeof mconn(conn)->auth);
}

static void auth_internal(struct xport__lane *lane, struct xport__req *req, int status,
                          const struct fi_cq_data_entry *e, fi_addr_t src)
{
  (void)src;
  xport_conn_t *conn = req->conn;
  XPORT__LIST_UNLINK(mconn(conn)->auth_out, req, cnext, cprev);
  lane->nposted--;
  int waiting = mconn(conn)->auth_state != AS_DONE && mconn(conn)->auth_state != AS_FAILED;
  if (req->op == XPORT__OP_SVC_SEND || status || !conn->ep) {
    /* A message of the handshake that did not go, or a receive that broke
     * (a longer message than any of the handshake's: the user's). */
    if (status && waiting) {
      mconn(conn)->auth_state = AS_FAILED;
      /* Flushed before the connection was made, or as it failed to be:
       * the connection manager's event says why (a refusal, which the job
       * layer tells from a reset: it asks again). */
      if (conn->state != XPORT__CONN_CONNECTING && conn->state != XPORT__CONN_FAILED)
        conn->fail_code = status == -XPORT_ECANCELED ? -XPORT_ECONNRESET : status;
    }
    auth_req_free(lane, req);
    return;
  }
  const uint8_t *m = (const uint8_t *)req->bounce->buf;
  if (e->len != AUTH_LEN || xport__get32(m) != AUTH_MAGIC) {
    auth_req_free(lane, req);
    mconn(conn)->auth_state = AS_FAILED;
    conn->fail_code = -XPORT_EACCES;
    return;
  }
  if (xport__get32(m + 4) == AUTH_DATA) {
    data_take(conn, m);
    auth_req_free(lane, req);
    return;
  }
  auth_step(conn, req, m);
}

/* After the endpoint closed and the CQ was read: what the provider did
 * not flush is never reported. */
void msg_auth_end_reqs(xport_conn_t *conn)
{
  while (mconn(conn)->auth_out) {
    struct xport__req *req = mconn(conn)->auth_out;
    XPORT__LIST_UNLINK(mconn(conn)->auth_out, req, cnext, cprev);
    conn->lane->nposted--;
    auth_req_free(conn->lane, req);
  }
}

/* Waits for conn's handshake under a key to end: 0 when both proved it. */
int msg_wait_auth(xport_conn_t *conn, long deadline)
{
  struct xport__lane *lane = conn->lane;
  for (;;) {
    xport__cq_drain(lane);
    if (mconn(conn)->auth_state == AS_DONE)
      return 0;
    if (mconn(conn)->auth_state == AS_FAILED)
      return conn->fail_code ? conn->fail_code : -XPORT_EACCES;
    msg_progress(lane);
    if (conn->state != XPORT__CONN_CONNECTED)
      return -XPORT_ECONNRESET;
    long left = deadline < 0 ? 1 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    struct timespec ts = {0, 200 * 1000};
    XPORT__UNLOCK(lane->ctx);
    nanosleep(&ts, NULL);
    XPORT__LOCK(lane->ctx);
  }
}
