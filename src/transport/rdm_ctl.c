/* RDM control messages (rdm_wire.h): posting and sending them, goodbyes,
 * answers to connection requests (challenge tokens), and the dispatch of
 * what arrives, each message checked before it acts. */
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

/* ---- control messages ----------------------------------------------- */

/* Control receives are untagged and take any sender: the data's tag
 * matching never walks past them. Where the provider can, they are two
 * multi-receive buffers, one of which is always posted: then every
 * untagged message lands in xport's memory as it arrives, is checked and
 * dropped if it must be, and none waits in the provider's unexpected
 * queue (rxm buffers those without bound). Otherwise XPORT__CTL_RX
 * single receives. */
#define CTL_MRECV_SIZE (256 * 1024)
int rdm_ctl_post_recv(struct xport__rep *rep, struct xport__req *req)
{
  ssize_t ret;
  if (rctx(rep->lane)->multi_recv) {
    struct iovec iov = {req->uiov[0].base, CTL_MRECV_SIZE};
    void *desc = req->ntmp ? fi_mr_desc(req->tmp[0]) : NULL;
    struct fi_msg msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1,
                         .addr = FI_ADDR_UNSPEC, .context = &req->fictx};
    ret = fi_recvmsg(rep->ep, &msg, FI_MULTI_RECV);
  } else if (rep->lane->sink) {
    /* A longer message than a control message (a stranger's) must not
     * truncate this receive, which would never complete (truncation_hangs)
     * and leave the endpoint without its control path: the rest goes to
     * the sink, and on_ctl drops it for its length. */
    struct iovec iov[2] = {{req->bounce->buf, sizeof(struct xport__ctl)},
                           {rep->lane->sink, rep->lane->sink_len}};
    void *desc[2] = {req->bounce->desc, NULL};
    ret = fi_recvv(rep->ep, iov, desc, 2, FI_ADDR_UNSPEC, &req->fictx);
  } else {
    ret = fi_recv(rep->ep, req->bounce->buf, sizeof(struct xport__ctl), req->bounce->desc,
                  FI_ADDR_UNSPEC, &req->fictx);
  }
  return ret ? xport__err_from_fi((int)ret) : 0;
}

/* A control request of rep, blank but for what says it is one. */
static struct xport__req *ctl_req_blank(struct xport__rep *rep, unsigned op)
{
  struct xport__req *req = xport__req_get(rep->lane->ctx);
  if (!req)
    return NULL;
  memset(req, 0, sizeof *req);
  req->op = op;
  req->rep = rep;
  req->on_done = rdm_internal;
  return req;
}

struct xport__req *rdm_ctl_req(struct xport__rep *rep, unsigned op)
{
  struct xport__lane *lane = rep->lane;
  struct xport__req *req = ctl_req_blank(rep, op);
  if (!req)
    return NULL;
  req->bounce = xport__bounce_get(lane);
  if (!req->bounce) {
    xport__req_release(lane->ctx, req);
    return NULL;
  }
  return req;
}

void rdm_ctl_req_free(struct xport__lane *lane, struct xport__req *req)
{
  xport__req_free_mem(lane, req);
  req->conn = NULL;
  req->peer = NULL;
  xport__req_release(lane->ctx, req);
}

/* A control receive request with its buffer: a bounce slot, or a
 * registered multi-receive buffer (in uiov[0], its registration in tmp[0]). */
struct xport__req *rdm_ctl_recv_req(struct xport__rep *rep)
{
  struct xport__lane *lane = rep->lane;
  if (!rctx(lane)->multi_recv)
    return rdm_ctl_req(rep, XPORT__OP_CTL_RECV);
  struct xport__req *req = ctl_req_blank(rep, XPORT__OP_CTL_RECV);
  if (!req)
    return NULL;
  req->uiov[0].base = aligned_alloc(64, CTL_MRECV_SIZE);
  if (req->uiov[0].base && (!lane->need_local_mr ||
                            !xport__reg(lane, req->uiov[0].base, CTL_MRECV_SIZE, FI_RECV,
                                        &req->tmp[0]))) {
    req->ntmp = lane->need_local_mr;
    return req;
  }
  free(req->uiov[0].base);
  xport__req_release(lane->ctx, req);
  return NULL;
}

void rdm_ctl_recv_free(struct xport__lane *lane, struct xport__req *req)
{
  void *mbuf = req->uiov[0].base;
  rdm_ctl_req_free(lane, req);
  if (rctx(lane)->multi_recv)
    free(mbuf);
}

/* Sends a control message; the provider may push back for a while. */
int rdm_ctl_send(struct xport__rep *rep, fi_addr_t dest, uint32_t type,
                 const struct ctl_args *a)
{
  struct xport__lane *lane = rep->lane;
  if (a->once && a->to && lane->prof && lane->prof->peer_locked &&
      lane->prof->peer_locked(a->to->addr, a->to->addrlen))
    return -XPORT_EAGAIN;
  struct xport__req *req = rdm_ctl_req(rep, XPORT__OP_CTL_SEND);
  if (!req)
    return -XPORT_ENOMEM;
  struct xport__ctl *m = (struct xport__ctl *)req->bounce->buf;
  memset(m, 0, sizeof *m);
  m->magic = CTL_MAGIC;
  m->version = CTL_VERSION;
  m->type = type;
  m->ctx_id = lane->ctx->id;
  m->src_id = a->src_id;
  m->dst_id = a->dst_id;
  m->cookie = a->cookie;
  m->tag = a->tag;
  m->pid = (uint32_t)getpid();
  m->pidns = rdm_pid_ns();
  snprintf(m->boot_id, sizeof m->boot_id, "%s", rdm_boot_id());
  m->flags = a->flags;
  if (a->nonce)
    memcpy(m->nonce, a->nonce, sizeof m->nonce);
  if (a->mac)
    memcpy(m->mac, a->mac, sizeof m->mac);
  if (type == CTL_CONNREQ || (type == CTL_CONNACK && (a->flags & CTL_F_AUTH))) {
    memcpy(m->addr, rep->addr, rep->addrlen);
    m->addrlen = (uint32_t)rep->addrlen;
  }
  if (type == CTL_CONNREQ && a->data) {
    m->datalen = (uint32_t)a->data->len;
    memcpy(m->data, a->data->bytes, a->data->len);
  }
  req->imm = a->src_id; /* so that a failed request can fail its connection */
  /* The first message to a peer may be pushed back while the provider
   * maps it (shm): keep progressing, briefly. */
  ssize_t ret;
  for (int tries = 0;; tries++) {
    ret = fi_send(rep->ep, m, sizeof *m, req->bounce->desc, dest, &req->fictx);
    if (ret != -FI_EAGAIN || tries == (a->once == 2 ? 0 : a->once ? 16 : 2000))
      break;
    xport__cq_drain(lane);
    if (tries > 10 && !a->once) {
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  if (lane->prof && lane->prof->peer_may_map && (ret == -FI_EAGAIN || rep->unreached))
    rdm_peer_reached(rep, dest, !ret);
  if (ret) {
    rdm_ctl_req_free(lane, req);
    return ret == -FI_EAGAIN ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  req->peer = a->peer;
  XPORT__LIST_PUSH(rep->ctl_out, req, cnext, cprev);
  return 0;
}

/* A control message of conn's, to its peer; once as in struct ctl_args. */
int rdm_ctl_send_conn(xport_conn_t *conn, uint32_t type, int once)
{
  struct ctl_args a = {.src_id = conn->id,
                       .dst_id = rconn(conn)->peer_id,
                       .cookie = rconn(conn)->tag,
                       .once = once,
                       .to = rconn(conn)->peer};
  return rdm_ctl_send(rconn(conn)->rep, rconn(conn)->dest, type, &a);
}

/* Counts and drops a control message that failed a check. Logged at
 * debug level only: a stranger must not be able to flood the log. */
void rdm_ctl_drop(struct xport__lane *lane, const char *why, uint32_t type, size_t len)
{
  rctx(lane)->ctl_dropped++;
  XPORT__DEBUG("dropped a control message: %s (type %u, %zu bytes; %zu dropped so far)", why,
               type, len, rctx(lane)->ctl_dropped);
}

/* ---- goodbyes ---------------------------------------------------------- */

/* A closed connection whose goodbye (CTL_DISC) the peer has yet to rdm_answer,
 * where the provider must not drop a peer that may still be sending
 * (close_needs_quiet). It holds the connection's reference on the peer,
 * so the peer stays in the address vector, and its endpoint does not
 * close, until the rdm_answer comes, the peer's process ends, or
 * XPORT_PEER_TIMEOUT passes. The rdm_answer is the peer's last message on that
 * connection: whatever it sent before has been taken off the wire. */
struct xport__bye {
  struct xport__bye *next;
  struct xport__rep *rep;
  struct xport__peer *peer;
  uint64_t peer_ctx_id;
  uint64_t rx_tag;            /* the cookie the rdm_answer carries */
  uint64_t tag;               /* the cookie the goodbye carries */
  uint32_t id, peer_id;
  int pidfd;
  int withdrawn;              /* a request given up on: not waited for (rdm_withdraw) */
  int resend;                 /* the goodbye goes again (rdm_bye_resent) ... */
  long again;                 /* ... from then on */
  long deadline;
};

static void bye_end(struct xport__lane *lane, struct xport__bye *b)
{
  struct xport__bye **pp = &rctx(lane)->byes;
  while (*pp != b)
    pp = &(*pp)->next;
  *pp = b->next;
  if (b->pidfd >= 0)
    close(b->pidfd);
  rdm_peer_put(b->rep, b->peer);
  free(b);
}

/* Takes over conn's peer reference and process watch until the rdm_answer;
 * 0 where nothing needs to wait. */
int rdm_bye_start(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  struct xport__bye *b;
  if (!lane->prof || !lane->prof->close_needs_quiet || !(b = malloc(sizeof *b)))
    return 0;
  *b = (struct xport__bye){.next = rctx(lane)->byes,
                           .rep = rconn(conn)->rep,
                           .peer = rconn(conn)->peer,
                           .peer_ctx_id = conn->peer_ctx_id,
                           .rx_tag = rconn(conn)->rx_tag,
                           .tag = rconn(conn)->tag,
                           .id = conn->id,
                           .peer_id = rconn(conn)->peer_id,
                           .pidfd = conn->proc.pidfd,
                           .deadline = xport__now_ms() + lane->ctx->peer_check_ms};
  conn->proc.pidfd = -1;
  rctx(lane)->byes = b;
  return 1;
}

/* A goodbye that the provider may lose with its own connection, which
 * broke under it (rxm over tcp: the target dropped it over a refused key,
 * and makes a new one on the next send; over verbs the endpoint cannot
 * reach that peer again at all): it goes again at every check (a quarter
 * of XPORT_PEER_TIMEOUT), from the probe endpoint, until the peer answers
 * or 16 x XPORT_PEER_TIMEOUT pass, so that the peer's side ends too. The
 * connection keeps its own peer reference (the user still holds it);
 * the goodbye takes one more. Nothing waits for it: the connection is
 * lost already, and its endpoint may close before the rdm_answer. */
void rdm_bye_resent(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (!rdm_bye_start(conn))
    return;
  struct xport__bye *b = rctx(lane)->byes;
  conn->proc.pidfd = b->pidfd;
  b->pidfd = -1;
  b->resend = 1;
  b->again = xport__now_ms() + lane->ctx->peer_check_ms / 4;
  b->deadline = xport__now_ms() + 16 * lane->ctx->peer_check_ms;
  rconn(conn)->peer->refs++;
}

/* 1 if m answered one of our goodbyes (and so ended it). */
static int bye_answered(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  for (struct xport__bye *b = rctx(rep->lane)->byes; b; b = b->next)
    if (b->rep == rep && !b->withdrawn && b->id == m->dst_id && b->peer_id == m->src_id &&
        b->peer_ctx_id == m->ctx_id && b->rx_tag == m->cookie &&
        (!rep->lane->source || src == b->peer->fi_addr)) {
      bye_end(rep->lane, b);
      return 1;
    }
  return 0;
}

/* Ends the goodbyes whose peer died or had its time; sends again those
 * that may have been lost. */
void rdm_byes_expire(struct xport__lane *lane)
{
  long now = xport__now_ms();
  for (struct xport__bye *b = rctx(lane)->byes, *next; b; b = next) {
    next = b->next;
    struct pollfd p = {.fd = b->pidfd, .events = POLLIN};
    if (now >= b->deadline || (b->pidfd >= 0 && poll(&p, 1, 0) > 0)) {
      bye_end(lane, b);
    } else if (b->resend && now >= b->again && !rctx(lane)->rdm_closing) {
      struct ctl_args a = {.src_id = b->id, .dst_id = b->peer_id, .cookie = b->tag, .once = 1};
      rdm_probe_ctl(lane, b->peer, CTL_DISC, &a);
      b->again = now + lane->ctx->peer_check_ms / 4;
    }
  }
}

int rdm_byes_on(const struct xport__rep *rep)
{
  for (const struct xport__bye *b = rctx(rep->lane)->byes; b; b = b->next)
    if (b->rep == rep && !b->withdrawn && !b->resend)
      return 1;
  return 0;
}

/* An endpoint closing: the withdrawn requests sent from it end with it. */
void rdm_byes_drop(struct xport__lane *lane, struct xport__rep *rep)
{
  for (struct xport__bye *b = rctx(lane)->byes, *next; b; b = next) {
    next = b->next;
    if (b->rep == rep)
      bye_end(lane, b);
  }
}

/* A connect that gave up while its request may be waiting at the
 * listener, or accepted there: the listener is told to drop the request
 * (a goodbye to connection 0, with the request's tag as cookie: only the
 * listener knows it, rdm_on_withdraw), and for a while an acceptance that
 * crosses this is answered with a goodbye (withdrawn_accepted), so that
 * the server's accept never hands out a connection nobody holds. */
void rdm_withdraw(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  struct ctl_args a = {.src_id = conn->id, .cookie = rconn(conn)->rx_tag, .once = 1};
  struct xport__bye *b = malloc(sizeof *b);
  rdm_ctl_send(rconn(conn)->rep, rconn(conn)->dest, CTL_DISC, &a);
  if (!b)
    return;
  *b = (struct xport__bye){.next = rctx(lane)->byes,
                           .rep = rconn(conn)->rep,
                           .peer = rconn(conn)->peer,
                           .rx_tag = rconn(conn)->rx_tag,
                           .id = conn->id,
                           .pidfd = -1,
                           .withdrawn = 1,
                           .deadline = xport__now_ms() + lane->ctx->peer_check_ms};
  rconn(conn)->peer->refs++;
  rctx(lane)->byes = b;
}

/* 1 if m accepted a request we withdrew: the new connection is ended at
 * once with a goodbye, which the send carries with the peer reference. */
static int withdrawn_accepted(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  for (struct xport__bye *b = rctx(rep->lane)->byes; b; b = b->next)
    if (b->rep == rep && b->withdrawn && b->id == m->dst_id && b->rx_tag == m->cookie &&
        (!rep->lane->source || src == b->peer->fi_addr)) {
      struct ctl_args a = {.src_id = b->id, .dst_id = m->src_id, .cookie = m->tag, .once = 1,
                           .peer = b->peer};
      if (rdm_ctl_send(rep, b->peer->fi_addr, CTL_DISC, &a) == 0)
        b->peer = NULL;
      bye_end(rep->lane, b);
      return 1;
    }
  return 0;
}

/* ---- answers to requests --------------------------------------------- */

/* A challenge token: SipHash-2-4 keyed with the listener's secret over
 * what the request says (its sender's address first), and a time epoch of
 * about 16 s, so that a token is good for that request, from that
 * address, for a while. Fixed layout, whole words: no length ambiguity. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
  do {                                                                                             \
    v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                      \
    v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                         \
    v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                         \
    v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                      \
  } while (0)
static uint64_t token(const struct xport__rep *rep, const struct xport__ctl *m, long epoch)
{
  uint64_t w[6 + XPORT__CTL_ADDR_MAX / 8] = {(uint64_t)epoch, m->ctx_id,
                                             m->src_id | (uint64_t)m->pid << 32, m->tag, m->pidns,
                                             m->addrlen};
  size_t n = 6 + (m->addrlen + 7) / 8; /* addrlen <= XPORT__ADDR_MAX: on_ctl checked */
  memcpy(&w[6], m->addr, m->addrlen);
  uint64_t k0 = rep->secret[0], k1 = rep->secret[1];
  uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
  for (size_t i = 0; i < n; i++) {
    v3 ^= w[i];
    SIPROUND;
    SIPROUND;
    v0 ^= w[i];
  }
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}
#define TOKEN_EPOCH_MS 16384

static int token_ok(const struct xport__rep *rep, const struct xport__ctl *m)
{
  long epoch = xport__now_ms() / TOKEN_EPOCH_MS;
  return m->cookie && (m->cookie == token(rep, m, epoch) || m->cookie == token(rep, m, epoch - 1));
}

#define ANSWERS_INFLIGHT 16
#define REFUSE_EVERY_MS 100
/* Answers request m with a refusal (CTL_CONNREJ) or a challenge, or
 * (type 0) only keeps its address in the address vector; answers are sent
 * with a few quick tries: a requester that does not read (a flood), or an
 * address nobody answers at, is not waited for. The send holds the peer
 * until it is done. Answers are what a flood makes the server send, to
 * whatever address the requests name, and the provider may buffer them
 * without bound (rxm, to a peer that reads slowly): so at most a few are
 * in flight, and one peer is refused at most every REFUSE_EVERY_MS; past
 * that its requests go unanswered, and time out. At listener close the
 * backlog's requests (pending: each from a live address, it answered a
 * challenge) are all refused. */
#define ANSWER_ELSEWHERE 0x100u /* or'ed into a CONNREJ: XPORT__CTL_REJ_ELSEWHERE */
#define ANSWER_AUTH 0x200u      /* or'ed into a CONNREJ: XPORT__CTL_REJ_AUTH */
void rdm_answer(struct xport__rep *rep, const struct xport__ctl *m, uint32_t type,
                int pending)
{
  int elsewhere = !!(type & ANSWER_ELSEWHERE), auth = !!(type & ANSWER_AUTH);
  type &= ~(ANSWER_ELSEWHERE | ANSWER_AUTH);
  const struct xport__profile *prof = rep->lane->prof;
  if (type && rep->answering >= ANSWERS_INFLIGHT && !pending) {
    rdm_ctl_drop(rep->lane, "answers backed up", m->type, sizeof *m);
    return;
  }
  /* A name no endpoint has would go into the address vector (named
   * providers: shm), where it could later misdirect traffic. */
  if (prof && prof->name_exists &&
      (m->addr[m->addrlen - 1] != '\0' || !prof->name_exists((const char *)m->addr))) {
    rdm_ctl_drop(rep->lane, "request from no endpoint", m->type, sizeof *m);
    return;
  }
  int ret = 0;
  struct xport__peer *peer = rdm_peer_get(rep, m->addr, m->addrlen, &ret);
  if (!peer)
    return;
  /* The last few answered peers stay in the address vector: a flood from
   * one endpoint then costs no address vector churn, which some providers
   * pay for with a connection each (rxm), and a challenged client's
   * request comes back to the peer it was answered at. */
  long now = xport__now_ms();
  unsigned slot = XPORT__REFUSED_KEEP;
  for (unsigned i = 0; i < XPORT__REFUSED_KEEP; i++)
    if (rep->refused[i] == peer)
      slot = i;
  if (type == CTL_CONNREJ && slot < XPORT__REFUSED_KEEP && !pending &&
      now - rep->refused_ms[slot] < REFUSE_EVERY_MS) {
    rdm_peer_put(rep, peer);
    rdm_ctl_drop(rep->lane, "refused a moment ago", m->type, sizeof *m);
    return;
  }
  /* An address where answers fail (nobody there, or a bogus one: each try
   * may cost the provider a connection attempt) is answered again only
   * after a while. */
  if (type && !pending && now < peer->quiet_until) {
    rdm_peer_put(rep, peer);
    rdm_ctl_drop(rep->lane, "answers to that address fail", m->type, sizeof *m);
    return;
  }
  if (slot == XPORT__REFUSED_KEEP) {
    slot = rep->refused_next++ % XPORT__REFUSED_KEEP;
    if (rep->refused[slot])
      rdm_peer_put(rep, rep->refused[slot]);
    rep->refused[slot] = peer;
    peer->refs++;
    rep->refused_ms[slot] = 0;
  }
  if (type == CTL_CONNREJ)
    rep->refused_ms[slot] = now;
  if (!type) {
    rdm_peer_put(rep, peer);
    return;
  }
  struct ctl_args a = {.dst_id = m->src_id, .cookie = m->tag, .once = 1, .peer = peer};
  if (elsewhere)
    a.tag = XPORT__CTL_REJ_ELSEWHERE;
  if (auth)
    a.tag = XPORT__CTL_REJ_AUTH;
  if (type == CTL_CHALLENGE)
    a.tag = token(rep, m, now / TOKEN_EPOCH_MS);
  if (rdm_ctl_send(rep, peer->fi_addr, type, &a)) {
    peer->quiet_until = now + REFUSE_EVERY_MS;
    rdm_peer_put(rep, peer);
  } else {
    rep->answering++;
  }
}

/* 1 if the completion of request m named its sender (src), as the
 * address the request names. */
int rdm_from_named(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  if (src == FI_ADDR_NOTAVAIL || src == FI_ADDR_UNSPEC)
    return 0;
  for (struct xport__peer *p = rep->peers; p; p = p->next)
    if (p->fi_addr == src)
      return p->addrlen == rdm_addr_len(rep, m->addr, m->addrlen) &&
             !memcmp(p->addr, m->addr, p->addrlen);
  return 0;
}

/* A request is queued once its sender has shown it receives at the
 * address it names. Where sending to an address the provider has no
 * connection to costs a connection attempt (answer_needs_source: rxm,
 * which keeps megabytes of each failed one), nothing is sent to an
 * address a request names until a request has come from it: the first
 * only puts that address into the address vector, and the client's next
 * (it asks again until answered) then arrives named as from there, which
 * is the proof. Elsewhere the listener challenges the address instead. */
static void on_connreq(struct xport__rep *rep, const struct xport__ctl *m, size_t len,
                       fi_addr_t src)
{
  struct xport__lane *lane = rep->lane;
  xport_listener_t *lst = rep->lst;
  int by_source = lane->prof && lane->prof->answer_needs_source && lane->source;
  if (by_source && !rdm_from_named(rep, m, src)) {
    rdm_answer(rep, m, 0, 0);
    rdm_ctl_drop(lane, "not (yet) from the address it names", m->type, len);
    return;
  }
  if (!lst || lst->closing) {
    rdm_answer(rep, m, CTL_CONNREJ, 0); /* nobody listens here any more */
    return;
  }
  if (!by_source && !m->cookie) {
    rdm_answer(rep, m, CTL_CHALLENGE, 0); /* is the requester at the address it names? */
    return;
  }
  if (!by_source && !token_ok(rep, m)) {
    rdm_ctl_drop(lane, "wrong or stale token", m->type, len);
    return;
  }
  for (unsigned i = 0; i < XPORT__SEEN_KEEP; i++)
    if (rep->seen[i].ctx_id == m->ctx_id && rep->seen[i].src_id == m->src_id) {
      rdm_ctl_drop(lane, "repeated request", m->type, len);
      return;
    }
  for (struct xport__connreq *cr = lst->pending; cr; cr = cr->next)
    if (cr->ctl->ctx_id == m->ctx_id && cr->ctl->src_id == m->src_id) {
      rdm_ctl_drop(lane, "repeated request", m->type, len);
      return;
    }
  /* A key on one side only: neither could prove anything to the other.
   * Said at info level only: strangers must not decide what a listener
   * writes to stderr. */
  if (!!(m->flags & CTL_F_AUTH) != lane->ctx->auth_on) {
    XPORT__INFO("listener %s: refused a request %s", lst->addr,
                lane->ctx->auth_on ? "without a key: authentication failed: the peer does not hold "
                               "this listener's key"
                             : "that offers a key: this listener has none (XPORT_AUTH_KEY_FILE)");
    rdm_answer(rep, m, CTL_CONNREJ | ANSWER_AUTH, 0);
    return;
  }
  if (lane->prof && lane->prof->in_process_peers_unsafe && rdm_in_this_process(m)) {
    XPORT__WARN("listener %s: a connection from another context of this process is refused: "
                "%s would crash when one of the two contexts is destroyed",
                lst->addr, lane->caps.provider);
    rdm_answer(rep, m, CTL_CONNREJ | ANSWER_ELSEWHERE, 0);
    return;
  }
  /* A node-local provider reaches a peer by its pid (cross-memory
   * copies): a requester that found our name in a /dev/shm it shares with
   * us from another kernel or PID namespace must go over the fabric. */
  if (lane->prof && lane->prof->node_local && m->pidns && rdm_pid_ns() && !rdm_same_node(m)) {
    XPORT__INFO("listener %s: refused a request from another node or PID namespace",
                lst->addr);
    rdm_answer(rep, m, CTL_CONNREJ | ANSWER_ELSEWHERE, 0);
    return;
  }
  if (lst->npending >= lst->backlog) {
    if (!lst->refusing)
      XPORT__INFO("listener %s: backlog of %zu full: refusing requests", lst->addr,
                  lst->backlog);
    lst->refusing = 1; /* logged once per overflow: a flood must not flood the log */
    rdm_answer(rep, m, CTL_CONNREJ, 0);
    return;
  }
  lst->refusing = 0;
  struct xport__connreq *cr = calloc(1, sizeof *cr);
  if (cr)
    cr->ctl = malloc(sizeof *m);
  if (!cr || !cr->ctl) {
    free(cr);
    return;
  }
  memcpy(cr->ctl, m, sizeof *m);
  cr->peer_ctx_id = m->ctx_id;
  unsigned at = rep->seen_next++ % XPORT__SEEN_KEEP;
  rep->seen[at].ctx_id = m->ctx_id;
  rep->seen[at].src_id = m->src_id;
  xport__connreq_push(lst, cr);
}

/* The connection that m (an rdm_answer, goodbye or heartbeat) is for, if it
 * is for one: the ids, the cookie and, where completions name it, the
 * sender must all be that connection's. NULL and *why otherwise. */
static xport_conn_t *ctl_conn(struct xport__rep *rep, const struct xport__ctl *m,
                              fi_addr_t src, const char **why)
{
  xport_conn_t *conn = rdm_find_conn(rep->lane, m->dst_id);
  /* Or one whose client proved the key, not yet taken by accept: its
   * client holds it already, and may say goodbye. */
  for (xport_conn_t *c = rep->lst && !conn ? rep->lst->shaking : NULL; c; c = c->shake.next)
    if (c->id == m->dst_id && c->state != XPORT__CONN_CONNECTING)
      conn = c;
  *why = "no such connection";
  if (!conn || rconn(conn)->rep != rep)
    return NULL;
  *why = "wrong cookie";
  if (m->cookie != rconn(conn)->rx_tag)
    return NULL;
  *why = "wrong sender";
  /* A probe's ping, and the goodbye after a refusal, come from the
   * prober's probe endpoint (rma_check): the cookie and ids vouch for
   * them, and the rdm_answer goes to conn's peer. */
  if (rep->lane->source && src != rconn(conn)->dest && m->type != CTL_PING && m->type != CTL_DISC)
    return NULL;
  if (m->type == CTL_CONNACK || m->type == CTL_CONNREJ || m->type == CTL_CHALLENGE) {
    *why = "rdm_answer to no request";
    return conn->state == XPORT__CONN_CONNECTING ? conn : NULL;
  }
  *why = "wrong peer";
  if (rconn(conn)->peer_id != m->src_id || conn->peer_ctx_id != m->ctx_id)
    return NULL;
  *why = "connection not established";
  return conn->state == XPORT__CONN_CONNECTED ? conn : NULL;
}

const char *xport__ctl_parse(const void *buf, size_t len, struct xport__ctl *m)
{
  struct xport__ctl c;
  if (len != sizeof c)
    return "malformed";
  memcpy(&c, buf, sizeof c); /* a packed buffer aligns nothing */
  if (c.magic != CTL_MAGIC || c.version != CTL_VERSION || c.addrlen > XPORT__ADDR_MAX ||
      c.datalen > XPORT__CTL_DATA_MAX || c.zero2 || (c.datalen && c.type != CTL_CONNREQ))
    return "malformed";
  if (c.type < CTL_CONNREQ || c.type > CTL_AUTH)
    return "unknown type";
  if (c.type == CTL_CONNREQ && (!c.addrlen || c.dst_id || !rdm_tag_ok(c.tag)))
    return "malformed request";
  *m = c;
  return NULL;
}

/* Acts on a control message of len bytes from src, once it passed every
 * check; drops it otherwise. */
static void on_ctl(struct xport__rep *rep, const struct xport__ctl *m, size_t len,
                   fi_addr_t src)
{
  struct xport__lane *lane = rep->lane;
  const char *why;
  if (m->type == CTL_CONNREQ) {
    on_connreq(rep, m, len, src);
    return;
  }
  if (m->type == CTL_AUTH) {
    rdm_on_auth(rep, m, len, src);
    return;
  }
  if (m->type == CTL_KEEPALIVE && !m->dst_id)
    return; /* to no connection: a closing peer's nudge (settle_names) */
  xport_conn_t *conn = ctl_conn(rep, m, src, &why);
  if (!conn) {
    /* A goodbye to a connection we closed: the rdm_answer to ours, or theirs
     * crossing it. */
    if (m->type == CTL_DISC) {
      int a = bye_answered(rep, m, src), w = rdm_on_withdraw(rep, m, src);
      if (!rdm_sink_answered(rep, m) && !a && !w)
        rdm_ctl_drop(lane, why, m->type, len);
    } else if (m->type != CTL_CONNACK || !withdrawn_accepted(rep, m, src)) {
      rdm_ctl_drop(lane, why, m->type, len);
    }
    return;
  }
  conn->heard.msg = 1; /* any message from the peer says it is alive */
  conn->peer_holds = 1; /* ... and, past its handshake, that it holds this connection */
  switch (m->type) {
  case CTL_CONNACK: {
    if (!rdm_tag_ok(m->tag)) {
      rdm_ctl_drop(lane, "malformed rdm_answer", m->type, len);
      return;
    }
    if (lane->ctx->auth_on || (m->flags & CTL_F_AUTH)) {
      uint8_t mac[XPORT__AUTH_MAC];
      int ret = lane->ctx->auth_on ? rdm_auth_client(conn, m, mac) : -XPORT_EACCES;
      struct ctl_args a = {.src_id = conn->id, .dst_id = m->src_id, .cookie = m->tag,
                           .flags = ret ? 0 : CTL_F_AUTH, .mac = ret ? NULL : mac, .once = !!ret};
      /* A refusal too goes back, with a few quick tries (the listener's
       * handshake then ends now, not at its deadline); the proof is waited
       * for, as the connect that needs it would be. */
      int sent = rdm_ctl_send(rep, rconn(conn)->dest, CTL_AUTH, &a);
      if (ret) {
        XPORT__WARN("authentication failed: the listener does not hold this context's key");
        rdm_conn_lost(conn, ret, 0);
        return;
      }
      if (sent) {
        rdm_conn_lost(conn, sent, 0);
        return;
      }
    }
    rconn(conn)->peer_id = m->src_id;
    rconn(conn)->tag = m->tag;
    conn->peer_ctx_id = m->ctx_id;
    rdm_watch_peer(conn, m);
    conn->state = XPORT__CONN_CONNECTED;
    break;
  }
  case CTL_CONNREJ:
    if (m->tag == XPORT__CTL_REJ_AUTH) {
      XPORT__WARN("authentication failed: %s", lane->ctx->auth_on
                  ? "the listener refused this context's key: it holds none"
                  : "the listener requires a key (XPORT_AUTH_KEY_FILE), and this context has none");
      rdm_conn_lost(conn, -XPORT_EACCES, 0);
      break;
    }
    /* "Not this way" matters where there is another way (XPORT_SHM); a
     * context of this provider alone is refused, as by a full backlog. */
    rdm_conn_lost(conn,
                  lane->index && m->tag == XPORT__CTL_REJ_ELSEWHERE ? -XPORT_EADDRNOTAVAIL
                                                                : -XPORT_ECONNREFUSED,
              0);
    break;
  case CTL_CHALLENGE: {
    /* Only the first is answered: a second request with a token could be
     * queued twice, after the first was accepted. */
    if (rconn(conn)->challenged) {
      rdm_ctl_drop(lane, "repeated challenge", m->type, len);
      return;
    }
    rconn(conn)->challenged = 1;
    struct ctl_args a = {.src_id = conn->id, .tag = rconn(conn)->rx_tag, .cookie = m->tag,
                         .data = &conn->shake.data};
    if (lane->ctx->auth_on) {
      a.flags = CTL_F_AUTH;
      a.nonce = rconn(conn)->auth;
    }
    int ret = rdm_ctl_send(rep, rconn(conn)->dest, CTL_CONNREQ, &a);
    if (ret)
      rdm_conn_lost(conn, ret, 0);
    break;
  }
  case CTL_KEEPALIVE:
    break; /* heard, above */
  case CTL_PING:
    rdm_ctl_send_conn(conn, CTL_PONG, 1);
    break;
  case CTL_PONG:
    rdm_rma_probe_answered(conn);
    break;
  case CTL_DISC:
    /* The rdm_answer is the last message of this connection: the peer may
     * wait for it before it lets go of us (struct xport__bye), and stops
     * draining what we sent before it (struct xport__sink). */
    rdm_ctl_send_conn(conn, CTL_DISC, 1);
    rdm_conn_lost(conn, -XPORT_ECONNRESET, 0);
    break;
  }
}

void rdm_internal(struct xport__lane *lane, struct xport__req *req, int status,
                  const struct fi_cq_data_entry *e, fi_addr_t src)
{
  size_t len = e ? e->len : 0;
  struct xport__rep *rep = req->rep;
  if (req->op == XPORT__OP_PEEK) {
    if (req->flags) {
      xport__req_release(lane->ctx, req); /* answered after peek() gave up on it */
      return;
    }
    /* Only a successful entry is a tagged one (an error's is built by cq.c
     * as a data entry): the tag is read from it alone. */
    req->status = status ? -1 : 0;
    req->len = !status && e ? (size_t)((const struct fi_cq_tagged_entry *)e)->tag : 0;
    return;
  }
  if (req->op == XPORT__OP_SINK) {
    rdm_sink_done(lane, req->user_ctx, status);
    return;
  }
  if (req->op == XPORT__OP_CTL_SEND) {
    XPORT__LIST_UNLINK(rep->ctl_out, req, cnext, cprev);
    uint32_t type = ((const struct xport__ctl *)req->bounce->buf)->type;
    if (type == CTL_CONNREJ || type == CTL_CHALLENGE) {
      rep->answering--;
      if (status && req->peer)
        req->peer->quiet_until = xport__now_ms() + REFUSE_EVERY_MS;
    }
    if (status) {
      xport_conn_t *conn = rdm_find_conn(lane, req->imm);
      if (conn && rconn(conn)->rep == rep && conn->state == XPORT__CONN_CONNECTING)
        rdm_conn_lost(conn, status == -XPORT_ECANCELED ? -XPORT_ECONNREFUSED : status, 0);
    }
    if (req->peer)
      rdm_peer_put(rep, req->peer);
    rdm_ctl_req_free(lane, req);
    return;
  }
  /* A control receive: act on it and post it again (unless its endpoint
   * is closing, which leaves the request to rdm_rep_close). What arrived is
   * len bytes, whatever the buffer held before; a multi-receive buffer is
   * posted again once the provider is done with it (FI_MULTI_RECV, on its
   * last message or an entry of its own). */
  const void *msg = rctx(lane)->multi_recv ? (e ? e->buf : NULL) : req->bounce->buf;
  if (!status && len && msg) {
    struct xport__ctl m;
    const char *why = xport__ctl_parse(msg, len, &m);
    if (why) {
      uint32_t type = 0;
      if (len >= offsetof(struct xport__ctl, type) + sizeof type)
        memcpy(&type, (const char *)msg + offsetof(struct xport__ctl, type), sizeof type);
      rdm_ctl_drop(lane, why, type, len);
    } else {
      on_ctl(rep, &m, len, src);
    }
  } else if (status && status != -XPORT_ECANCELED) {
    rdm_ctl_drop(lane, xport_strerror(status), 0, len);
  }
  /* A message longer than what is left of a multi-receive buffer
   * truncates into it, and then the provider has let go of the whole
   * buffer, though the error entry does not say FI_MULTI_RECV (rxm): it is
   * posted again, or a stranger's long messages would take both away. */
  if (rctx(lane)->multi_recv && !(e && (e->flags & FI_MULTI_RECV)) && status != -XPORT_ETRUNC)
    return;
  if (!rep->ep || status == -XPORT_ECANCELED || rdm_ctl_post_recv(rep, req))
    XPORT__DEBUG("control receive not reposted (%s)", xport_strerror(status));
}
