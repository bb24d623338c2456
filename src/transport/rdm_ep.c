/* RDM endpoints (struct xport__rep) and the peers in their address
 * vectors: opened per listener and per context, shared by connections,
 * closed once no connection, goodbye or sink needs them. */
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

/* ---- peers in an endpoint's address vector -------------------------- */

/* The bytes of an address the provider reads. A string address
 * (FI_ADDR_STR: shm's names) ends at its first NUL: two that differ only
 * after it are one peer to the provider, one slot in its address vector,
 * and removing either unmaps that peer (libfabric 1.17 shm counts no
 * references), so they must be one entry here too. */
size_t rdm_addr_len(const struct xport__rep *rep, const void *addr, size_t len)
{
  const char *nul;
  if (rep->lane->info->addr_format != FI_ADDR_STR || !(nul = memchr(addr, '\0', len)))
    return len;
  return (size_t)(nul - (const char *)addr) + 1;
}

/* One entry per peer, counted by its users (connections, answers, the
 * refused list): only the last one removes it from the address vector. */
struct xport__peer *rdm_peer_get(struct xport__rep *rep, const void *addr, size_t len,
                                 int *ret_p)
{
  struct xport__peer *p;
  len = rdm_addr_len(rep, addr, len);
  for (p = rep->peers; p; p = p->next)
    if (p->addrlen == len && !memcmp(p->addr, addr, len)) {
      p->refs++;
      return p;
    }
  if (len > XPORT__ADDR_MAX || !(p = calloc(1, sizeof *p))) {
    *ret_p = -XPORT_ENOMEM;
    return NULL;
  }
  memcpy(p->addr, addr, len);
  p->addrlen = len;
  int ret = fi_av_insert(rep->av, p->addr, 1, &p->fi_addr, 0, NULL);
  if (ret != 1) {
    free(p);
    *ret_p = ret < 0 ? xport__err_from_fi(ret) : -XPORT_EADDRNOTAVAIL;
    return NULL;
  }
  /* An address the provider took for one it holds (a spelling xport does
   * not know to be the same) is that peer: a second entry would remove
   * it from under the first one's users. */
  for (struct xport__peer *q = rep->peers; q; q = q->next)
    if (q->fi_addr == p->fi_addr) {
      free(p);
      q->refs++;
      return q;
    }
  p->refs = 1;
  p->next = rep->peers;
  rep->peers = p;
  return p;
}

static void peer_free(struct xport__rep *rep, struct xport__peer *peer)
{
  struct xport__peer **pp = &rep->peers;
  while (*pp != peer)
    pp = &(*pp)->next;
  *pp = peer->next;
  fi_av_remove(rep->av, &peer->fi_addr, 1, 0);
  free(peer);
}

/* A peer our first message still waits at stays in the address vector
 * (peer_may_map): the endpoint's close waits for it (settle_names). */
void rdm_peer_put(struct xport__rep *rep, struct xport__peer *peer)
{
  if (!peer || --peer->refs || peer->unreached)
    return;
  peer_free(rep, peer);
}

/* After a control message to dest was taken (reached) or pushed back. */
void rdm_peer_reached(struct xport__rep *rep, fi_addr_t dest, int reached)
{
  struct xport__peer *p = rep->peers;
  while (p && p->fi_addr != dest)
    p = p->next;
  if (!p || p->unreached == !reached || (!reached && p->taken))
    return;
  p->taken |= reached;
  p->unreached = !reached;
  rep->unreached += reached ? (size_t)-1 : 1;
  /* Its file must stay while the first peer waits, whatever ends us. */
  const struct xport__profile *prof = rep->lane->prof;
  if (rep->unreached == !reached && rep->name[0] && prof->keep_name)
    prof->keep_name(rep->name, rep->lock, !reached);
  if (reached && !p->refs)
    peer_free(rep, p);
}

/* ---- endpoints -------------------------------------------------------- */

/* Lets go of what a connection holds of its endpoint once it has nothing
 * in flight there; rdm_rep_close has already let go of the peer. */
static void conn_unhook(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (conn->proc.pidfd >= 0)
    close(conn->proc.pidfd);
  conn->proc.pidfd = -1;
  rconn(conn)->peer = NULL;
  rconn(conn)->rep = NULL;
  conn->attached = 0;
  conn->ep = NULL;
  if (conn->state == XPORT__CONN_CLOSED) {
    XPORT__LIST_UNLINK(lane->draining, conn, drain.next, drain.prev);
    xport__conn_free_if_done(conn);
  }
}

/* Waits, for up to wait_ms, until every live peer that our first
 * message still waits at has taken it (peer_may_map), nudging each with a
 * keepalive to no connection, which goes through once it has; 1 if one
 * never did. */
static int settle_names(struct xport__rep *rep, long wait_ms)
{
  struct xport__lane *lane = rep->lane;
  long end = xport__now_ms() + wait_ms;
  for (;;) {
    for (struct xport__peer *p = rep->peers, *next; p; p = next) {
      next = p->next;
      struct ctl_args a = {.once = 1};
      if (p->unreached && !lane->prof->peer_may_map(p->addr, p->addrlen))
        rdm_peer_reached(rep, p->fi_addr, 1); /* its process is gone */
      else if (p->unreached)
        rdm_ctl_send(rep, p->fi_addr, CTL_KEEPALIVE, &a);
    }
    if (!rep->unreached || xport__now_ms() >= end)
      return rep->unreached != 0;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
    xport__cq_drain(lane);
  }
}

/* Leaves rep's endpoint, and the address vector bound to it, open for the
 * rest of the process; the context's objects they are bound to stay too. */
static void rep_leave_open(struct xport__rep *rep)
{
  rep->lane->keep_fids = 1;
  xport__fid_keep(&rep->ep->fid);
  xport__fid_keep(rep->av ? &rep->av->fid : NULL);
  rep->ep = NULL;
  rep->av = NULL;
}

/* How long an endpoint's close lets control messages in flight finish. */
#define CLOSE_QUIET_MS 200

void rdm_rep_close(struct xport__rep *rep)
{
  if (!rep)
    return;
  struct xport__lane *lane = rep->lane;
  rep->closing = 1;
  if (rctx(lane)->cep == rep)
    rctx(lane)->cep = NULL;
  if (rctx(lane)->probe == rep)
    rctx(lane)->probe = NULL;
  /* Let control messages still in flight (a goodbye) finish first: some
   * providers (rxm over verbs) do not survive closing under them; and
   * where the provider needs quiet, wait for the answers to goodbyes.
   * A parked endpoint's turn comes when nothing reads the CQ any more. */
  for (long end = rep->quiet_by ? rep->quiet_by : xport__now_ms() + CLOSE_QUIET_MS;
       !rep->parked && rep->ep && rep->ctl_out && xport__now_ms() < end;)
    xport__cq_drain(lane);
  while (!rep->parked && rdm_byes_on(rep)) {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
    xport__cq_drain(lane);
    rdm_byes_expire(lane);
  }
  rdm_byes_drop(lane, rep);
  /* A peer that has yet to take our first message would crash on it once
   * our endpoint is gone (peer_may_map): the endpoint then stays open,
   * serving nobody, until the context goes, and then, when every other
   * endpoint has closed (parked, rdm_fini), it is left open with its
   * name and the objects it is bound to: memory and a file in /dev/shm
   * lost, rather than a peer crashed. */
  /* Only the context's end waits for them: housekeeping runs inside
   * xport_poll, which never waits on a peer (a hung one would hold it for
   * the whole wait); it looks once, and the endpoint waits for the end. */
  int leave_open = rep->parked ||
                   (rep->unreached && rep->ep &&
                    settle_names(rep, rctx(lane)->rdm_closing ? 4 * lane->ctx->peer_check_ms : 0));
  if (leave_open && !rep->parked) {
    if (!rep->lingering)
      XPORT__INFO("an endpoint stays open: a peer has yet to take its first message");
    rep->parked = rctx(lane)->rdm_closing;
    rep->lingering = rctx(lane)->rdm_closing ? 0 : LINGER_OPEN;
    rep->closing = 0; /* closed by a later look, or the context's end */
    return;
  }
  if (leave_open) {
    XPORT__WARN("%s: endpoint %s is left open, and its file with it: a live peer did not take "
                "its first message within 4 x XPORT_PEER_TIMEOUT (%ld ms), and would crash on "
                "it once the file is gone", lane->caps.provider,
                rep->name[0] ? rep->name : "(unnamed)", 4 * lane->ctx->peer_check_ms);
    rep_leave_open(rep);
    if (rep->name[0] && lane->prof->keep_name)
      lane->prof->keep_name(rep->name, rep->lock, 1);
    rep->name[0] = '\0'; /* the name's lock is held until the process ends */
  }
  if (rep->enabled && lane->prof && lane->prof->retire_eps && lane->cq_fd >= 0 &&
      !rctx(lane)->rdm_closing) {
    /* Closing it would leave it in the CQ's wait set (retire_eps): it
     * stays open, serving nobody, until the context goes. Its port stays
     * bound until then; a client that connects to it times out. */
    XPORT__DEBUG("endpoint retired until the context is destroyed");
    rep->next_retired = rctx(lane)->retired;
    rctx(lane)->retired = rep;
    return;
  }
  if (rep->ep && rep->rma_failed && rctx(lane)->rdm_closing && lane->prof &&
      lane->prof->close_after_refusal_crashes) {
    XPORT__INFO("an endpoint whose one-sided operation failed is left open: the provider "
                "crashes closing it (close_after_refusal_crashes)");
    rep_leave_open(rep);
  }
  if (rep->ep) {
    xport__close_fid(lane->ctx, &rep->ep->fid);
    rep->ep = NULL;
    /* Entries for this endpoint's requests may sit in the shared CQ:
     * take them now, while the requests and the endpoint still exist. */
    xport__cq_drain(lane);
  }
  /* The endpoint is gone: whatever it still owned is ours again. */
  rdm_sinks_drop(lane, rep);
  for (int i = 0; i < XPORT__CTL_RX; i++)
    if (rep->ctl_rx[i])
      rdm_ctl_recv_free(lane, rep->ctl_rx[i]);
  while (rep->ctl_out) {
    struct xport__req *r = rep->ctl_out;
    rep->ctl_out = r->cnext;
    rdm_ctl_req_free(lane, r);
  }
  xport__zombie_reclaim(lane, rep);
  /* Connections still attached (lost, or closed and draining) have
   * nothing in flight now. */
  for (xport_conn_t *c = lane->conns; c; c = c->next)
    if (rconn(c)->rep == rep)
      conn_unhook(c);
  for (xport_conn_t *c = lane->draining, *next; c; c = next) {
    next = c->drain.next;
    if (rconn(c)->rep == rep)
      conn_unhook(c);
  }
  while (rep->peers) {
    struct xport__peer *p = rep->peers;
    rep->peers = p->next;
    free(p);
  }
  if (rep->av)
    xport__close_fid(lane->ctx, &rep->av->fid);
  if (rep->name[0] && lane->prof && lane->prof->release_name)
    lane->prof->release_name(rep->name, rep->lock);
  if (rep->port_fd >= 0)
    close(rep->port_fd);
  XPORT__LIST_UNLINK(rctx(lane)->reps, rep, next, prev);
  free(rep);
}

/* A listener's endpoint closes with its listener and its last
 * connection, a retired one with its last live connection; the context's
 * own ones for outgoing connections (rdm_dest_rep) only once retired. */
int rdm_rep_maybe_close(struct xport__rep *rep)
{
  struct xport__lane *lane = rep->lane;
  if (rep->closing || (rep->lingering && rep->lingering != LINGER_LOOK) || rep->lst ||
      rep == rctx(lane)->cep || rep == rctx(lane)->probe ||
      (rep->dest_len && !rep->withdrawn) || rep->nconns != rep->ndead)
    return 0;
  /* Control messages still in flight (a goodbye) and goodbyes awaiting
   * their answers go first (rdm_rep_close), but this runs inside xport_poll,
   * which never waits on a peer (a hung one would hold every call):
   * later passes of housekeeping look again, up to CLOSE_QUIET_MS for
   * messages in flight, until they expire for goodbyes. */
  if (!rctx(lane)->rdm_closing && !rep->parked && rep->ep && (rep->ctl_out || rdm_byes_on(rep))) {
    long now = xport__now_ms();
    if (!rep->quiet_by)
      rep->quiet_by = now + CLOSE_QUIET_MS;
    if (now < rep->quiet_by || rdm_byes_on(rep)) { /* goodbyes expire on their own */
      xport__cq_drain(lane);
      lane->reap = 1; /* again at the next housekeeping */
      return 0;
    }
  }
  rdm_rep_close(rep);
  return 1;
}

/* Opens an RDM endpoint; info (may be NULL) carries a source address. */
int rdm_rep_open(struct xport__lane *lane, struct fi_info *info, const char *name,
                 struct xport__rep **rep_p)
{
  struct fi_av_attr av_attr = {.type = FI_AV_UNSPEC};
  struct xport__rep *rep = calloc(1, sizeof *rep);
  int ret;
  if (!rep)
    return -XPORT_ENOMEM;
  rep->lane = lane;
  rep->lock = -1;
  rep->port_fd = -1;
  rep->secret[0] = xport__random_key(8);
  rep->secret[1] = xport__random_key(8);
  XPORT__LIST_PUSH(rctx(lane)->reps, rep, next, prev);
  const char *step = "fi_endpoint";
  ret = fi_endpoint(lane->domain, info ? info : lane->info, &rep->ep, rep);
  if (!ret && (step = "fi_av_open"))
    ret = fi_av_open(lane->domain, &av_attr, &rep->av, rep);
  if (!ret && (step = "fi_ep_bind(av)"))
    ret = fi_ep_bind(rep->ep, &rep->av->fid, 0);
  if (!ret && (step = "fi_ep_bind(cq)"))
    ret = fi_ep_bind(rep->ep, &lane->cq->fid, FI_TRANSMIT | FI_RECV);
  if (!ret && name && (step = "fi_setname"))
    ret = fi_setname(&rep->ep->fid, (void *)name, strlen(name) + 1);
  if (!ret && (step = "fi_enable"))
    ret = fi_enable(rep->ep);
  rep->enabled = !ret;
  rep->addrlen = sizeof rep->addr;
  if (!ret && (step = "fi_getname"))
    ret = fi_getname(&rep->ep->fid, rep->addr, &rep->addrlen);
  if (ret == -FI_EINVAL && !strcmp(step, "fi_enable")) {
    /* xport's arguments were checked: the provider's own limits refused it. */
    XPORT__WARN("%s cannot open an endpoint (fi_enable: %s)%s%s", lane->caps.provider,
                fi_strerror(-ret), lane->prof && lane->prof->enable_hint ? ": " : "",
                lane->prof && lane->prof->enable_hint ? lane->prof->enable_hint : "");
    rdm_rep_close(rep);
    return -XPORT_EPROVIDER;
  }
  if (ret) {
    XPORT__INFO("opening an endpoint: %s: %s", step, fi_strerror(-ret));
    rdm_rep_close(rep);
    return ret == -FI_EADDRINUSE ? -XPORT_EADDRINUSE : xport__err_from_fi(ret);
  }
  /* Room for one control message is enough to keep a multi-receive
   * buffer posted (set after fi_enable: shm faults before). */
  size_t min = XPORT__CTL_SLOT;
  if (rctx(lane)->multi_recv)
    fi_setopt(&rep->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof min);
  for (int i = 0; i < (rctx(lane)->multi_recv ? 2 : XPORT__CTL_RX) && !ret; i++) {
    rep->ctl_rx[i] = rdm_ctl_recv_req(rep);
    ret = rep->ctl_rx[i] ? rdm_ctl_post_recv(rep, rep->ctl_rx[i]) : -XPORT_ENOMEM;
  }
  if (ret) {
    XPORT__INFO("posting control receives: %s", xport_strerror(ret));
    rdm_rep_close(rep);
    return ret;
  }
  *rep_p = rep;
  return 0;
}

/* Opens the context's endpoint for outgoing connections; where the
 * provider names endpoints, under a name of xport's own (anon_name). */
/* Opens an endpoint that is no listener's (the context's own for
 * outgoing connections, or the probe's) under a name of xport's where the
 * provider's endpoints are named, so that sweep knows what a killed
 * process left behind. */
int rdm_anon_rep_open(struct xport__lane *lane, struct xport__rep **rep_p)
{
  const struct xport__profile *prof = lane->prof;
  char name[XPORT__ADDR_MAX];
  int lock = -1, ret;
  if (!prof || !prof->anon_name)
    return rdm_rep_open(lane, NULL, NULL, rep_p);
  if ((ret = prof->anon_name(name, sizeof name)) || (ret = prof->claim_name(name, &lock)))
    return ret;
  ret = rdm_rep_open(lane, NULL, name, rep_p);
  if (ret) {
    prof->release_name(name, lock);
    return ret;
  }
  snprintf((*rep_p)->name, sizeof (*rep_p)->name, "%s", name);
  (*rep_p)->lock = lock;
  return 0;
}

static int cep_open(struct xport__lane *lane)
{
  return rdm_anon_rep_open(lane, &rctx(lane)->cep);
}

/* The endpoint outgoing connections to addr go through: the context's
 * one, or where a dead target would stall the answers to every other
 * (answers_in_order), one of addr's own, shared only by connections to
 * the same listener, whose process they die with. Like the context's
 * one it stays open while no connection uses it, until its target dies
 * or refuses a key (rep_withdraw); then it is never chosen again: its
 * address vector may still map the dead process's region under a name a
 * new listener has taken since. */
int rdm_dest_rep(struct xport__lane *lane, const uint8_t *addr, size_t alen,
                 struct xport__rep **rep_p)
{
  int ret;
  if (!lane->prof || !lane->prof->answers_in_order) {
    if (!rctx(lane)->cep && (ret = cep_open(lane)))
      return ret;
    *rep_p = rctx(lane)->cep;
    return 0;
  }
  for (struct xport__rep *r = rctx(lane)->reps; r; r = r->next)
    if (r->dest_len == alen && !memcmp(r->dest_addr, addr, alen) && !r->withdrawn &&
        !r->closing && !r->lingering && r->ep) {
      *rep_p = r;
      return 0;
    }
  if (alen > sizeof (*rep_p)->dest_addr)
    return -XPORT_EADDRNOTAVAIL;
  if ((ret = rdm_anon_rep_open(lane, rep_p)))
    return ret;
  memcpy((*rep_p)->dest_addr, addr, alen);
  (*rep_p)->dest_len = alen;
  return 0;
}
