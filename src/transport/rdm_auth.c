/* The RDM handshake's mutual proof under a context key (rdm_wire.h,
 * xport(7) AUTHENTICATION). */
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

/* A proof: the MAC, keyed with the context's key, over the direction's
 * label and both ends, the client's first; whole fields of fixed size and
 * each address with its length, so that no two transcripts read alike. */
void rdm_auth_proof(const struct xport__lane *lane, int by_listener, const struct auth_end *client,
                    const struct auth_end *listener, uint8_t mac[XPORT__AUTH_MAC])
{
  static const char label[2][32] = {"xport rdm 6: the client's proof",
                                    "xport rdm 6: the listener's"};
  uint8_t t[32 + 2 * (XPORT__AUTH_NONCE + 28 + XPORT__ADDR_MAX + XPORT__CTL_DATA_MAX)], *p = t;
  memcpy(p, label[by_listener], 32);
  p += 32;
  for (int i = 0; i < 2; i++) {
    const struct auth_end *e = i ? listener : client;
    memcpy(p, e->nonce, XPORT__AUTH_NONCE);
    xport__put64(p + XPORT__AUTH_NONCE, e->ctx_id);
    xport__put64(p + XPORT__AUTH_NONCE + 8, e->tag);
    xport__put32(p + XPORT__AUTH_NONCE + 16, e->conn_id);
    xport__put32(p + XPORT__AUTH_NONCE + 20, (uint32_t)e->addrlen);
    p += XPORT__AUTH_NONCE + 24;
    memcpy(p, e->addr, e->addrlen); /* at most XPORT__ADDR_MAX: parse checked */
    p += e->addrlen;
    xport__put32(p, (uint32_t)e->datalen);
    if (e->datalen)
      memcpy(p + 4, e->data, e->datalen); /* at most XPORT__CTL_DATA_MAX: parse checked */
    p += 4 + e->datalen;
  }
  xport__auth_mac(lane->ctx->auth_key, t, (size_t)(p - t), mac);
}

/* The client's side of the acceptance m under a key: 0 with conn's
 * proof in mac if the listener's proof in m holds, else -XPORT_EACCES. */
int rdm_auth_client(xport_conn_t *conn, const struct xport__ctl *m, uint8_t mac[XPORT__AUTH_MAC])
{
  struct xport__rep *rep = rconn(conn)->rep;
  struct auth_end c = {rconn(conn)->auth, conn->lane->ctx->id, rconn(conn)->rx_tag, conn->id,
                       rep->addr, rep->addrlen, conn->shake.data.bytes, conn->shake.data.len};
  struct auth_end l = {m->nonce, m->ctx_id, m->tag, m->src_id, m->addr, m->addrlen, NULL, 0};
  uint8_t want[XPORT__AUTH_MAC];
  int ok = 0;
  if (m->flags & CTL_F_AUTH) {
    rdm_auth_proof(conn->lane, 1, &c, &l, want);
    ok = xport__auth_same(want, m->mac);
  }
  if (ok)
    rdm_auth_proof(conn->lane, 0, &c, &l, mac);
  xport__auth_wipe(rconn(conn)->auth, sizeof rconn(conn)->auth);
  return ok ? 0 : -XPORT_EACCES;
}

/* The client's proof (or its refusal) for a handshake of the listener's:
 * the connection is accepted (accept returns it) or refused. Only a
 * handshake under way matches: ids, cookie and, where completions name
 * it, the sender. */
void rdm_on_auth(struct xport__rep *rep, const struct xport__ctl *m, size_t len, fi_addr_t src)
{
  struct xport__lane *lane = rep->lane;
  xport_listener_t *lst = rep->lst;
  xport_conn_t *c = lst ? lst->shaking : NULL;
  while (c &&
         (c->id != m->dst_id || rconn(c)->rx_tag != m->cookie || rconn(c)->peer_id != m->src_id ||
          c->peer_ctx_id != m->ctx_id || (lane->source && src != rconn(c)->dest)))
    c = c->shake.next;
  if (!c || c->state != XPORT__CONN_CONNECTING) {
    rdm_ctl_drop(lane, "proof for no handshake", m->type, len);
    return;
  }
  if ((m->flags & CTL_F_AUTH) && xport__auth_same(m->mac, rconn(c)->auth)) {
    c->state = XPORT__CONN_CONNECTED;
    c->heard.msg = c->peer_holds = 1;
    if (lst->admit)
      lane->ctx->accept_due = 1;
  } else {
    c->state = XPORT__CONN_FAILED;
    c->fail_code = -XPORT_EACCES;
    XPORT__INFO("listener %s: authentication failed: the peer does not hold this listener's "
                "key%s", lst->addr, m->flags & CTL_F_AUTH ? "" : " (it refused ours)");
  }
  xport__auth_wipe(rconn(c)->auth, sizeof rconn(c)->auth);
}

/* 1 if m withdrew a request still waiting in rep's backlog (rdm_withdraw):
 * it must name the request's ids and tag and, where completions name
 * it, come from where the request came. */
int rdm_on_withdraw(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  xport_listener_t *lst = rep->lst;
  if (!lst || m->dst_id)
    return 0;
  for (struct xport__connreq **pp = &lst->pending, *prev = NULL; *pp;
       prev = *pp, pp = &prev->next) {
    struct xport__connreq *cr = *pp;
    if (cr->ctl->ctx_id != m->ctx_id || cr->ctl->src_id != m->src_id ||
        cr->ctl->tag != m->cookie || (rep->lane->source && !rdm_from_named(rep, cr->ctl, src)))
      continue;
    *pp = cr->next;
    if (lst->pending_tail == cr)
      lst->pending_tail = prev;
    lst->npending--;
    free(cr->ctl);
    free(cr);
    return 1;
  }
  /* Under a key, its proof not yet come: the handshake ends. */
  for (xport_conn_t *c = lst->shaking; c; c = c->shake.next)
    if (c->state == XPORT__CONN_CONNECTING && c->peer_ctx_id == m->ctx_id &&
        rconn(c)->peer_id == m->src_id && rconn(c)->tag == m->cookie &&
        (!rep->lane->source || src == rconn(c)->dest)) {
      c->state = XPORT__CONN_FAILED;
      c->fail_code = -XPORT_ECONNRESET;
      return 1;
    }
  /* Accepted already, the acceptance crossing this: the connection ends
   * here too, though the client no longer answers the acceptance (its
   * withdrawal lasts one XPORT_PEER_TIMEOUT, withdrawn_accepted). */
  for (xport_conn_t *c = rep->lane->conns; c; c = c->next)
    if (rconn(c)->rep == rep && c->state == XPORT__CONN_CONNECTED && c->peer_ctx_id == m->ctx_id &&
        rconn(c)->peer_id == m->src_id && rconn(c)->tag == m->cookie &&
        (!rep->lane->source || src == rconn(c)->peer->fi_addr)) {
      rdm_conn_lost(c, -XPORT_ECONNRESET, 0);
      return 1;
    }
  return 0;
}
