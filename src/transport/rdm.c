/* Connections over FI_EP_RDM endpoints (shm, tcp;ofi_rxm), which have no
 * connection manager: xport runs its own handshake with control messages
 * and watches peers for death itself.
 *
 * One RDM endpoint serves many connections: the context's own for the
 * connections it opens, and one per listener, and anyone who can reach it
 * can send to it. So:
 * - data is tagged with the receiving connection's receive tag, 62 random
 *   bits it chose and told its peer in the handshake (rdm_wire.h), and
 *   receives are directed to the peer's address where the provider can;
 * - control messages travel untagged, off the data's matching queue, and
 *   each is checked before it acts: its length, format, sender, ids, the
 *   cookie only the two ends know, and the connection's state; one that
 *   fails is counted (lane->ctl_dropped) and dropped;
 * - a request is queued only once its sender has shown it receives at the
 *   address it names (a challenge, or its source: on_connreq), and waits
 *   in a bounded backlog; beyond it, and at listener close, it is refused.
 * A listener's endpoint is named after its host:port where the provider
 * names endpoints (shm), or bound to it (rxm). */
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

static void rdm_internal(struct xport__lane *lane, struct xport__req *req, int status,
                         const struct fi_cq_data_entry *e, fi_addr_t src);
static void orphan_all(xport_conn_t *conn, int status);
static void rdm_drop(xport_conn_t *conn);
/* A connection's data path, with and without messages it claimed. */
static void data_plain(xport_conn_t *conn);
static void data_claimed(xport_conn_t *conn);
static void shake_discard(xport_listener_t *lst, xport_conn_t *c, const char *why);

#define CTL_MAGIC XPORT__CTL_MAGIC
#define CTL_VERSION XPORT__CTL_VERSION
#define CTL_CONNREQ XPORT__CTL_CONNREQ
#define CTL_CONNACK XPORT__CTL_CONNACK
#define CTL_CONNREJ XPORT__CTL_CONNREJ
#define CTL_DISC XPORT__CTL_DISC
#define CTL_KEEPALIVE XPORT__CTL_KEEPALIVE
#define CTL_PING XPORT__CTL_PING
#define CTL_PONG XPORT__CTL_PONG
#define CTL_CHALLENGE XPORT__CTL_CHALLENGE
#define CTL_AUTH XPORT__CTL_AUTH
#define CTL_F_AUTH XPORT__CTL_F_AUTH
_Static_assert(XPORT__CTL_NONCE == XPORT__AUTH_NONCE && XPORT__CTL_MAC == XPORT__AUTH_MAC,
               "the wire carries what auth.c makes");
_Static_assert(XPORT__CTL_ADDR_MAX == XPORT__ADDR_MAX, "address sizes agree");
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "a request's len holds a tag (peek)");
_Static_assert(sizeof(struct xport__ctl) <= XPORT__CTL_SLOT, "a control message fits a slot");

/* A receive tag (rdm_wire.h) as a peer may name it. */
static int tag_ok(uint64_t tag)
{
  return tag && !(tag & ~XPORT__TAG_MASK);
}

static uint64_t pid_ns(void)
{
  struct stat st;
  return stat("/proc/self/ns/pid", &st) ? 0 : (uint64_t)st.st_ino;
}

/* The kernel's boot id, read once per process: contexts of several
 * threads ask at once (a context per thread). */
static char boot_id_buf[40];
static pthread_once_t boot_id_once = PTHREAD_ONCE_INIT;

static void boot_id_read(void)
{
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f || !fgets(boot_id_buf, sizeof boot_id_buf, f))
    snprintf(boot_id_buf, sizeof boot_id_buf, "unknown");
  if (f)
    fclose(f);
  boot_id_buf[strcspn(boot_id_buf, "\n")] = '\0';
}

static const char *boot_id(void)
{
  pthread_once(&boot_id_once, boot_id_read);
  return boot_id_buf;
}

/* ---- peers in an endpoint's address vector -------------------------- */

/* The bytes of an address the provider reads. A string address
 * (FI_ADDR_STR: shm's names) ends at its first NUL: two that differ only
 * after it are one peer to the provider, one slot in its address vector,
 * and removing either unmaps that peer (libfabric 1.17 shm counts no
 * references), so they must be one entry here too. */
static size_t addr_len(const struct xport__rep *rep, const void *addr, size_t len)
{
  const char *nul;
  if (rep->lane->info->addr_format != FI_ADDR_STR || !(nul = memchr(addr, '\0', len)))
    return len;
  return (size_t)(nul - (const char *)addr) + 1;
}

/* One entry per peer, counted by its users (connections, answers, the
 * refused list): only the last one removes it from the address vector. */
static struct xport__peer *peer_get(struct xport__rep *rep, const void *addr, size_t len,
                                    int *ret_p)
{
  struct xport__peer *p;
  len = addr_len(rep, addr, len);
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
static void peer_put(struct xport__rep *rep, struct xport__peer *peer)
{
  if (!peer || --peer->refs || peer->unreached)
    return;
  peer_free(rep, peer);
}

/* After a control message to dest was taken (reached) or pushed back. */
static void peer_reached(struct xport__rep *rep, fi_addr_t dest, int reached)
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

/* ---- control messages ----------------------------------------------- */

/* Control receives are untagged and take any sender: the data's tag
 * matching never walks past them. Where the provider can, they are two
 * multi-receive buffers, one of which is always posted: then every
 * untagged message lands in xport's memory as it arrives, is checked and
 * dropped if it must be, and none waits in the provider's unexpected
 * queue (rxm buffers those without bound). Otherwise XPORT__CTL_RX
 * single receives. */
#define CTL_MRECV_SIZE (256 * 1024)
static int ctl_post_recv(struct xport__rep *rep, struct xport__req *req)
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

static struct xport__req *ctl_req(struct xport__rep *rep, unsigned op)
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

static void ctl_req_free(struct xport__lane *lane, struct xport__req *req)
{
  xport__req_free_mem(lane, req);
  req->conn = NULL;
  req->peer = NULL;
  xport__req_release(lane->ctx, req);
}

/* A control receive request with its buffer: a bounce slot, or a
 * registered multi-receive buffer (in uiov[0], its registration in tmp[0]). */
static struct xport__req *ctl_recv_req(struct xport__rep *rep)
{
  struct xport__lane *lane = rep->lane;
  if (!rctx(lane)->multi_recv)
    return ctl_req(rep, XPORT__OP_CTL_RECV);
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

static void ctl_recv_free(struct xport__lane *lane, struct xport__req *req)
{
  void *mbuf = req->uiov[0].base;
  ctl_req_free(lane, req);
  if (rctx(lane)->multi_recv)
    free(mbuf);
}

static void peer_put(struct xport__rep *rep, struct xport__peer *peer);

/* What a control message says besides its type. */
struct ctl_args {
  uint32_t src_id, dst_id;
  uint64_t cookie, tag;
  int once;                   /* 1: a few quick tries: an answer to a requester, or
                                 a message of housekeeping (which runs inside
                                 xport_poll, where nothing waits on a peer), is
                                 not worth waiting for; 2: one try, no progress
                                 (an owed heartbeat, tried at every poll) */
  struct xport__peer *peer;   /* a reference the send holds until it is done */
  /* The peer it goes to, if known: a send waits while that peer holds the
   * provider's lock (profile peer_locked) rather than spin on it. */
  const struct xport__peer *to;
  /* Under a key: CTL_F_AUTH, the sender's nonce (CONNREQ, CONNACK) and its
   * proof (CONNACK, AUTH); a CONNACK then names the listener's address. */
  uint32_t flags;
  const uint8_t *nonce, *mac;
};

/* Sends a control message; the provider may push back for a while. */
static int ctl_send(struct xport__rep *rep, fi_addr_t dest, uint32_t type,
                    const struct ctl_args *a)
{
  struct xport__lane *lane = rep->lane;
  if (a->once && a->to && lane->prof && lane->prof->peer_locked &&
      lane->prof->peer_locked(a->to->addr, a->to->addrlen))
    return -XPORT_EAGAIN;
  struct xport__req *req = ctl_req(rep, XPORT__OP_CTL_SEND);
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
  m->pidns = pid_ns();
  snprintf(m->boot_id, sizeof m->boot_id, "%s", boot_id());
  m->flags = a->flags;
  if (a->nonce)
    memcpy(m->nonce, a->nonce, sizeof m->nonce);
  if (a->mac)
    memcpy(m->mac, a->mac, sizeof m->mac);
  if (type == CTL_CONNREQ || (type == CTL_CONNACK && (a->flags & CTL_F_AUTH))) {
    memcpy(m->addr, rep->addr, rep->addrlen);
    m->addrlen = (uint32_t)rep->addrlen;
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
    peer_reached(rep, dest, !ret);
  if (ret) {
    ctl_req_free(lane, req);
    return ret == -FI_EAGAIN ? -XPORT_EAGAIN : xport__err_from_fi((int)ret);
  }
  req->peer = a->peer;
  XPORT__LIST_PUSH(rep->ctl_out, req, cnext, cprev);
  return 0;
}

/* A control message of conn's, to its peer; once as in struct ctl_args. */
static int ctl_send_conn(xport_conn_t *conn, uint32_t type, int once)
{
  struct ctl_args a = {.src_id = conn->id,
                       .dst_id = rconn(conn)->peer_id,
                       .cookie = rconn(conn)->tag,
                       .once = once,
                       .to = rconn(conn)->peer};
  return ctl_send(rconn(conn)->rep, rconn(conn)->dest, type, &a);
}

/* Counts and drops a control message that failed a check. Logged at
 * debug level only: a stranger must not be able to flood the log. */
static void ctl_drop(struct xport__lane *lane, const char *why, uint32_t type, size_t len)
{
  rctx(lane)->ctl_dropped++;
  XPORT__DEBUG("dropped a control message: %s (type %u, %zu bytes; %zu dropped so far)", why,
               type, len, rctx(lane)->ctl_dropped);
}

/* ---- goodbyes ---------------------------------------------------------- */

/* A closed connection whose goodbye (CTL_DISC) the peer has yet to answer,
 * where the provider must not drop a peer that may still be sending
 * (close_needs_quiet). It holds the connection's reference on the peer,
 * so the peer stays in the address vector, and its endpoint does not
 * close, until the answer comes, the peer's process ends, or
 * XPORT_PEER_TIMEOUT passes. The answer is the peer's last message on that
 * connection: whatever it sent before has been taken off the wire. */
struct xport__bye {
  struct xport__bye *next;
  struct xport__rep *rep;
  struct xport__peer *peer;
  uint64_t peer_ctx_id;
  uint64_t rx_tag;            /* the cookie the answer carries */
  uint64_t tag;               /* the cookie the goodbye carries */
  uint32_t id, peer_id;
  int pidfd;
  int withdrawn;              /* a request given up on: not waited for (withdraw) */
  int resend;                 /* the goodbye goes again (bye_resent) ... */
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
  peer_put(b->rep, b->peer);
  free(b);
}

/* Takes over conn's peer reference and process watch until the answer;
 * 0 where nothing needs to wait. */
static int bye_start(xport_conn_t *conn)
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
 * lost already, and its endpoint may close before the answer. */
static void bye_resent(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (!bye_start(conn))
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

static int probe_ctl(struct xport__lane *lane, const struct xport__peer *to, uint32_t type,
                     const struct ctl_args *a);

/* Ends the goodbyes whose peer died or had its time; sends again those
 * that may have been lost. */
static void byes_expire(struct xport__lane *lane)
{
  long now = xport__now_ms();
  for (struct xport__bye *b = rctx(lane)->byes, *next; b; b = next) {
    next = b->next;
    struct pollfd p = {.fd = b->pidfd, .events = POLLIN};
    if (now >= b->deadline || (b->pidfd >= 0 && poll(&p, 1, 0) > 0)) {
      bye_end(lane, b);
    } else if (b->resend && now >= b->again && !rctx(lane)->rdm_closing) {
      struct ctl_args a = {.src_id = b->id, .dst_id = b->peer_id, .cookie = b->tag, .once = 1};
      probe_ctl(lane, b->peer, CTL_DISC, &a);
      b->again = now + lane->ctx->peer_check_ms / 4;
    }
  }
}

static int byes_on(const struct xport__rep *rep)
{
  for (const struct xport__bye *b = rctx(rep->lane)->byes; b; b = b->next)
    if (b->rep == rep && !b->withdrawn && !b->resend)
      return 1;
  return 0;
}

/* An endpoint closing: the withdrawn requests sent from it end with it. */
static void byes_drop(struct xport__lane *lane, struct xport__rep *rep)
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
 * listener knows it, on_withdraw), and for a while an acceptance that
 * crosses this is answered with a goodbye (withdrawn_accepted), so that
 * the server's accept never hands out a connection nobody holds. */
static void withdraw(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  struct ctl_args a = {.src_id = conn->id, .cookie = rconn(conn)->rx_tag, .once = 1};
  struct xport__bye *b = malloc(sizeof *b);
  ctl_send(rconn(conn)->rep, rconn(conn)->dest, CTL_DISC, &a);
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
      if (ctl_send(rep, b->peer->fi_addr, CTL_DISC, &a) == 0)
        b->peer = NULL;
      bye_end(rep->lane, b);
      return 1;
    }
  return 0;
}

/* ---- sinks ------------------------------------------------------------- */

/* A closed connection's receive tag, still drained. Messages the peer sent
 * before it heard of the close would otherwise wait in the provider's
 * unexpected queue for ever, and fill it (shm: its 1,024 entries are shared
 * with posted receives, and the endpoint stops). A sink is a receive under
 * that tag alone, posted again as each stale message lands in it; it ends
 * once the peer has answered the goodbye (its last message on that
 * connection) and nothing more came, or after 4 x XPORT_PEER_TIMEOUT. */
#define SINK_MAX 256 /* per context: past it, a closed connection gets none */
struct xport__sink {
  struct xport__sink *next;
  struct xport__rep *rep;
  struct xport__req *req;
  uint64_t tag, peer_ctx_id;
  uint32_t id, peer_id;
  long deadline;
  int answered, hits, ending;
};

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
  ctl_req_free(lane, k->req);
  free(k);
}

static void sink_start(xport_conn_t *conn)
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
  k->req = ctl_req(rconn(conn)->rep, XPORT__OP_SINK);
  if (!k->req) {
    free(k);
    return;
  }
  k->req->user_ctx = k;
  if (sink_post(k)) {
    ctl_req_free(lane, k->req);
    free(k);
    return;
  }
  k->next = rctx(lane)->sinks;
  rctx(lane)->sinks = k;
  rctx(lane)->nsinks++;
}

/* A stale message landed (or the sink was taken back). */
static void sink_done(struct xport__lane *lane, struct xport__sink *k, int status)
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
static int sink_answered(struct xport__rep *rep, const struct xport__ctl *m)
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
static void sinks_expire(struct xport__lane *lane)
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
static void sinks_drop(struct xport__lane *lane, struct xport__rep *rep)
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
 * or did not answer. The provider answers in the CQ during the call
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
  req->status = 1; /* no answer yet */
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
    req->flags = 1; /* abandoned: released when the answer comes */
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
  data_claimed(conn);
  return 0;
}

/* Discards what conn claimed: it ended. */
static void claims_drop(xport_conn_t *conn)
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
  data_plain(conn);
}

/* The data path's receive while conn holds messages its peer sent ahead
 * of the receives: the oldest it sent first. */
static ssize_t rdm_recv_claimed(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
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
    data_plain(conn);
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
  rdm_drop(conn); /* as the peer's death would end it, and the peer told */
  return 0;
}

/* Deals with the provider's unexpected messages, oldest first: a
 * connection's peer's are claimed (ahead); those under tags that no
 * connection of rep receives (a stranger's guesses, or a connection that
 * ended: closed ones have no sink where the provider discards, sink_start)
 * or from another than the peer are discarded; one that waits for its
 * receive (no bound) stops the scan, and the rest wait behind it until
 * then. At most a batch per call. */
static void discard_unused(struct xport__rep *rep)
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

static xport_conn_t *find_conn(struct xport__lane *lane, uint32_t id)
{
  for (xport_conn_t *c = lane->conns; c; c = c->next)
    if (c->id == id)
      return c;
  return NULL;
}

/* The sender of m runs on this node, in this PID namespace: its pid
 * means what it says here. */
static int same_node(const struct xport__ctl *m)
{
  return !strcmp(m->boot_id, boot_id()) && m->pidns == pid_ns() && m->pidns;
}

/* The sender of m is this very process (another of its contexts). */
static int in_this_process(const struct xport__ctl *m)
{
  return same_node(m) && m->pid == (uint32_t)getpid();
}

/* Same node and PID namespace: watch the peer's process. Otherwise (or
 * when asked) exchange heartbeats. */
static void watch_peer(xport_conn_t *conn, const struct xport__ctl *m)
{
  struct xport__lane *lane = conn->lane;
  conn->proc.pidfd = -1;
  rconn(conn)->last_heard = rconn(conn)->last_sent = xport__now_ms();
  if (same_node(m)) {
#ifdef SYS_pidfd_open
    conn->proc.pidfd = (int)syscall(SYS_pidfd_open, (pid_t)m->pid, 0);
#endif
    if (lane->prof && lane->prof->peer_watch)
      lane->prof->peer_watch(rconn(conn)->peer->addr, rconn(conn)->peer->addrlen, m->pid);
    if (conn->proc.pidfd < 0)
      XPORT__INFO("cannot watch peer process %u: %s", m->pid, strerror(errno));
  }
  rconn(conn)->keepalive =
      rctx(lane)->keepalive_mode == 1 || (rctx(lane)->keepalive_mode == -1 && conn->proc.pidfd < 0);
}

/* Takes a shared endpoint out of service for new connections: those
 * open a fresh one, and this one closes once its remaining connections
 * are closed or dead (rep_maybe_close). */
static void rep_withdraw(struct xport__rep *rep)
{
  struct xport__lane *lane = rep->lane;
  if (rep->withdrawn)
    return;
  rep->withdrawn = 1;
  if (rctx(lane)->cep == rep)
    rctx(lane)->cep = NULL;
  XPORT__INFO("retiring an endpoint: operations to a dead peer end only when it closes");
  lane->reap = 1;
}

/* The peer can complete nothing any more (gone, silent, or its endpoint
 * pair is blocked). What the provider still holds for it is released
 * only by closing the endpoint: retire it. */
static void conn_dead(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (rconn(conn)->dead || !rconn(conn)->rep)
    return;
  rconn(conn)->dead = 1;
  rconn(conn)->rep->ndead++;
  /* A process known gone has nothing more to tell, and a closed
   * connection whose operation the provider keeps for ever (a rendezvous
   * send to the dead peer, on a listener's endpoint that stays open) must
   * not keep a descriptor with it: one per killed client, for the
   * listener's life. */
  if (conn->proc.gone && conn->proc.pidfd >= 0) {
    close(conn->proc.pidfd);
    conn->proc.pidfd = -1;
  }
  if (rconn(conn)->rep->dest_len)
    rep_withdraw(rconn(conn)->rep); /* its one target is gone: it closes (dest_rep) */
  if (conn->orphans.n && lane->prof && lane->prof->dead_peer_lets_go)
    xport__zombie_show(lane->ctx, conn);
  else if (conn->orphans.n)
    rep_withdraw(rconn(conn)->rep);
  lane->reap = 1;
}

/* dead: the peer is gone (rather than closed), see conn_dead. */
static void conn_lost(xport_conn_t *conn, int status, int dead)
{
  if (conn->state == XPORT__CONN_CONNECTING) {
    conn->state = XPORT__CONN_FAILED;
    conn->fail_code = status;
    return;
  }
  if (conn->state != XPORT__CONN_CONNECTED)
    return;
  conn->state = XPORT__CONN_DISCONNECTED;
  orphan_all(conn, status);
  if (dead)
    conn_dead(conn);
  /* One proven under a key and not yet accepted has its event once
   * accept hands it out (rdm_accept). */
  if (conn->handed)
    xport__evq_push(conn->lane->ctx, conn, -XPORT_ECONNRESET);
}

/* The answer to an RMA probe: judged at the next check, after one more
 * pass over the CQ, since shm may post the answer to an operation just
 * after xport last looked for answers. */
static void rma_probe_answered(xport_conn_t *conn)
{
  if (rconn(conn)->ping_at)
    rconn(conn)->ponged = 1;
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
static void answer(struct xport__rep *rep, const struct xport__ctl *m, uint32_t type,
                   int pending)
{
  int elsewhere = !!(type & ANSWER_ELSEWHERE), auth = !!(type & ANSWER_AUTH);
  type &= ~(ANSWER_ELSEWHERE | ANSWER_AUTH);
  const struct xport__profile *prof = rep->lane->prof;
  if (type && rep->answering >= ANSWERS_INFLIGHT && !pending) {
    ctl_drop(rep->lane, "answers backed up", m->type, sizeof *m);
    return;
  }
  /* A name no endpoint has would go into the address vector (named
   * providers: shm), where it could later misdirect traffic. */
  if (prof && prof->name_exists &&
      (m->addr[m->addrlen - 1] != '\0' || !prof->name_exists((const char *)m->addr))) {
    ctl_drop(rep->lane, "request from no endpoint", m->type, sizeof *m);
    return;
  }
  int ret = 0;
  struct xport__peer *peer = peer_get(rep, m->addr, m->addrlen, &ret);
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
    peer_put(rep, peer);
    ctl_drop(rep->lane, "refused a moment ago", m->type, sizeof *m);
    return;
  }
  /* An address where answers fail (nobody there, or a bogus one: each try
   * may cost the provider a connection attempt) is answered again only
   * after a while. */
  if (type && !pending && now < peer->quiet_until) {
    peer_put(rep, peer);
    ctl_drop(rep->lane, "answers to that address fail", m->type, sizeof *m);
    return;
  }
  if (slot == XPORT__REFUSED_KEEP) {
    slot = rep->refused_next++ % XPORT__REFUSED_KEEP;
    if (rep->refused[slot])
      peer_put(rep, rep->refused[slot]);
    rep->refused[slot] = peer;
    peer->refs++;
    rep->refused_ms[slot] = 0;
  }
  if (type == CTL_CONNREJ)
    rep->refused_ms[slot] = now;
  if (!type) {
    peer_put(rep, peer);
    return;
  }
  struct ctl_args a = {.dst_id = m->src_id, .cookie = m->tag, .once = 1, .peer = peer};
  if (elsewhere)
    a.tag = XPORT__CTL_REJ_ELSEWHERE;
  if (auth)
    a.tag = XPORT__CTL_REJ_AUTH;
  if (type == CTL_CHALLENGE)
    a.tag = token(rep, m, now / TOKEN_EPOCH_MS);
  if (ctl_send(rep, peer->fi_addr, type, &a)) {
    peer->quiet_until = now + REFUSE_EVERY_MS;
    peer_put(rep, peer);
  } else {
    rep->answering++;
  }
}

/* 1 if the completion of request m named its sender (src), as the
 * address the request names. */
static int from_named(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  if (src == FI_ADDR_NOTAVAIL || src == FI_ADDR_UNSPEC)
    return 0;
  for (struct xport__peer *p = rep->peers; p; p = p->next)
    if (p->fi_addr == src)
      return p->addrlen == addr_len(rep, m->addr, m->addrlen) &&
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
  if (by_source && !from_named(rep, m, src)) {
    answer(rep, m, 0, 0);
    ctl_drop(lane, "not (yet) from the address it names", m->type, len);
    return;
  }
  if (!lst || lst->closing) {
    answer(rep, m, CTL_CONNREJ, 0); /* nobody listens here any more */
    return;
  }
  if (!by_source && !m->cookie) {
    answer(rep, m, CTL_CHALLENGE, 0); /* is the requester at the address it names? */
    return;
  }
  if (!by_source && !token_ok(rep, m)) {
    ctl_drop(lane, "wrong or stale token", m->type, len);
    return;
  }
  for (unsigned i = 0; i < XPORT__SEEN_KEEP; i++)
    if (rep->seen[i].ctx_id == m->ctx_id && rep->seen[i].src_id == m->src_id) {
      ctl_drop(lane, "repeated request", m->type, len);
      return;
    }
  for (struct xport__connreq *cr = lst->pending; cr; cr = cr->next)
    if (cr->ctl->ctx_id == m->ctx_id && cr->ctl->src_id == m->src_id) {
      ctl_drop(lane, "repeated request", m->type, len);
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
    answer(rep, m, CTL_CONNREJ | ANSWER_AUTH, 0);
    return;
  }
  if (lane->prof && lane->prof->in_process_peers_unsafe && in_this_process(m)) {
    XPORT__WARN("listener %s: a connection from another context of this process is refused: "
                "%s would crash when one of the two contexts is destroyed",
                lst->addr, lane->caps.provider);
    answer(rep, m, CTL_CONNREJ | ANSWER_ELSEWHERE, 0);
    return;
  }
  /* A node-local provider reaches a peer by its pid (cross-memory
   * copies): a requester that found our name in a /dev/shm it shares with
   * us from another kernel or PID namespace must go over the fabric. */
  if (lane->prof && lane->prof->node_local && m->pidns && pid_ns() && !same_node(m)) {
    XPORT__INFO("listener %s: refused a request from another node or PID namespace",
                lst->addr);
    answer(rep, m, CTL_CONNREJ | ANSWER_ELSEWHERE, 0);
    return;
  }
  if (lst->npending >= lst->backlog) {
    if (!lst->refusing)
      XPORT__INFO("listener %s: backlog of %zu full: refusing requests", lst->addr,
                  lst->backlog);
    lst->refusing = 1; /* logged once per overflow: a flood must not flood the log */
    answer(rep, m, CTL_CONNREJ, 0);
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

/* ---- authentication (rdm_wire.h, xport(7) AUTHENTICATION) ------------- */

/* One end of a handshake as the transcript names it. */
struct auth_end {
  const uint8_t *nonce;
  uint64_t ctx_id, tag;
  uint32_t conn_id;
  const uint8_t *addr;
  size_t addrlen;
};

/* A proof: the MAC, keyed with the context's key, over the direction's
 * label and both ends, the client's first; whole fields of fixed size and
 * each address with its length, so that no two transcripts read alike. */
static void auth_proof(const struct xport__lane *lane, int by_listener, const struct auth_end *client,
                       const struct auth_end *listener, uint8_t mac[XPORT__AUTH_MAC])
{
  static const char label[2][32] = {"xport rdm 5: the client's proof",
                                    "xport rdm 5: the listener's"};
  uint8_t t[32 + 2 * (XPORT__AUTH_NONCE + 24 + XPORT__ADDR_MAX)], *p = t;
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
  }
  xport__auth_mac(lane->ctx->auth_key, t, (size_t)(p - t), mac);
}

/* The client's side of the acceptance m under a key: 0 with conn's
 * proof in mac if the listener's proof in m holds, else -XPORT_EACCES. */
static int auth_client(xport_conn_t *conn, const struct xport__ctl *m, uint8_t mac[XPORT__AUTH_MAC])
{
  struct xport__rep *rep = rconn(conn)->rep;
  struct auth_end c = {rconn(conn)->auth, conn->lane->ctx->id, rconn(conn)->rx_tag, conn->id, rep->addr,
                       rep->addrlen};
  struct auth_end l = {m->nonce, m->ctx_id, m->tag, m->src_id, m->addr, m->addrlen};
  uint8_t want[XPORT__AUTH_MAC];
  int ok = 0;
  if (m->flags & CTL_F_AUTH) {
    auth_proof(conn->lane, 1, &c, &l, want);
    ok = xport__auth_same(want, m->mac);
  }
  if (ok)
    auth_proof(conn->lane, 0, &c, &l, mac);
  xport__auth_wipe(rconn(conn)->auth, sizeof rconn(conn)->auth);
  return ok ? 0 : -XPORT_EACCES;
}

/* The client's proof (or its refusal) for a handshake of the listener's:
 * the connection is accepted (accept returns it) or refused. Only a
 * handshake under way matches: ids, cookie and, where completions name
 * it, the sender. */
static void on_auth(struct xport__rep *rep, const struct xport__ctl *m, size_t len, fi_addr_t src)
{
  struct xport__lane *lane = rep->lane;
  xport_listener_t *lst = rep->lst;
  xport_conn_t *c = lst ? lst->shaking : NULL;
  while (c &&
         (c->id != m->dst_id || rconn(c)->rx_tag != m->cookie || rconn(c)->peer_id != m->src_id ||
          c->peer_ctx_id != m->ctx_id || (lane->source && src != rconn(c)->dest)))
    c = c->shake.next;
  if (!c || c->state != XPORT__CONN_CONNECTING) {
    ctl_drop(lane, "proof for no handshake", m->type, len);
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

/* 1 if m withdrew a request still waiting in rep's backlog (withdraw):
 * it must name the request's ids and tag and, where completions name
 * it, come from where the request came. */
static int on_withdraw(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src)
{
  xport_listener_t *lst = rep->lst;
  if (!lst || m->dst_id)
    return 0;
  for (struct xport__connreq **pp = &lst->pending, *prev = NULL; *pp;
       prev = *pp, pp = &prev->next) {
    struct xport__connreq *cr = *pp;
    if (cr->ctl->ctx_id != m->ctx_id || cr->ctl->src_id != m->src_id ||
        cr->ctl->tag != m->cookie || (rep->lane->source && !from_named(rep, cr->ctl, src)))
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
      conn_lost(c, -XPORT_ECONNRESET, 0);
      return 1;
    }
  return 0;
}

/* The connection that m (an answer, goodbye or heartbeat) is for, if it
 * is for one: the ids, the cookie and, where completions name it, the
 * sender must all be that connection's. NULL and *why otherwise. */
static xport_conn_t *ctl_conn(struct xport__rep *rep, const struct xport__ctl *m,
                              fi_addr_t src, const char **why)
{
  xport_conn_t *conn = find_conn(rep->lane, m->dst_id);
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
   * them, and the answer goes to conn's peer. */
  if (rep->lane->source && src != rconn(conn)->dest && m->type != CTL_PING && m->type != CTL_DISC)
    return NULL;
  if (m->type == CTL_CONNACK || m->type == CTL_CONNREJ || m->type == CTL_CHALLENGE) {
    *why = "answer to no request";
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
  if (c.magic != CTL_MAGIC || c.version != CTL_VERSION || c.addrlen > XPORT__ADDR_MAX)
    return "malformed";
  if (c.type < CTL_CONNREQ || c.type > CTL_AUTH)
    return "unknown type";
  if (c.type == CTL_CONNREQ && (!c.addrlen || c.dst_id || !tag_ok(c.tag)))
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
    on_auth(rep, m, len, src);
    return;
  }
  if (m->type == CTL_KEEPALIVE && !m->dst_id)
    return; /* to no connection: a closing peer's nudge (settle_names) */
  xport_conn_t *conn = ctl_conn(rep, m, src, &why);
  if (!conn) {
    /* A goodbye to a connection we closed: the answer to ours, or theirs
     * crossing it. */
    if (m->type == CTL_DISC) {
      int a = bye_answered(rep, m, src), w = on_withdraw(rep, m, src);
      if (!sink_answered(rep, m) && !a && !w)
        ctl_drop(lane, why, m->type, len);
    } else if (m->type != CTL_CONNACK || !withdrawn_accepted(rep, m, src)) {
      ctl_drop(lane, why, m->type, len);
    }
    return;
  }
  conn->heard.msg = 1; /* any message from the peer says it is alive */
  conn->peer_holds = 1; /* ... and, past its handshake, that it holds this connection */
  switch (m->type) {
  case CTL_CONNACK: {
    if (!tag_ok(m->tag)) {
      ctl_drop(lane, "malformed answer", m->type, len);
      return;
    }
    if (lane->ctx->auth_on || (m->flags & CTL_F_AUTH)) {
      uint8_t mac[XPORT__AUTH_MAC];
      int ret = lane->ctx->auth_on ? auth_client(conn, m, mac) : -XPORT_EACCES;
      struct ctl_args a = {.src_id = conn->id, .dst_id = m->src_id, .cookie = m->tag,
                           .flags = ret ? 0 : CTL_F_AUTH, .mac = ret ? NULL : mac, .once = !!ret};
      /* A refusal too goes back, with a few quick tries (the listener's
       * handshake then ends now, not at its deadline); the proof is waited
       * for, as the connect that needs it would be. */
      int sent = ctl_send(rep, rconn(conn)->dest, CTL_AUTH, &a);
      if (ret) {
        XPORT__WARN("authentication failed: the listener does not hold this context's key");
        conn_lost(conn, ret, 0);
        return;
      }
      if (sent) {
        conn_lost(conn, sent, 0);
        return;
      }
    }
    rconn(conn)->peer_id = m->src_id;
    rconn(conn)->tag = m->tag;
    conn->peer_ctx_id = m->ctx_id;
    watch_peer(conn, m);
    conn->state = XPORT__CONN_CONNECTED;
    break;
  }
  case CTL_CONNREJ:
    if (m->tag == XPORT__CTL_REJ_AUTH) {
      XPORT__WARN("authentication failed: %s", lane->ctx->auth_on
                  ? "the listener refused this context's key: it holds none"
                  : "the listener requires a key (XPORT_AUTH_KEY_FILE), and this context has none");
      conn_lost(conn, -XPORT_EACCES, 0);
      break;
    }
    /* "Not this way" matters where there is another way (XPORT_SHM); a
     * context of this provider alone is refused, as by a full backlog. */
    conn_lost(conn,
              lane->index && m->tag == XPORT__CTL_REJ_ELSEWHERE ? -XPORT_EADDRNOTAVAIL
                                                                : -XPORT_ECONNREFUSED,
              0);
    break;
  case CTL_CHALLENGE: {
    /* Only the first is answered: a second request with a token could be
     * queued twice, after the first was accepted. */
    if (rconn(conn)->challenged) {
      ctl_drop(lane, "repeated challenge", m->type, len);
      return;
    }
    rconn(conn)->challenged = 1;
    struct ctl_args a = {.src_id = conn->id, .tag = rconn(conn)->rx_tag, .cookie = m->tag};
    if (lane->ctx->auth_on) {
      a.flags = CTL_F_AUTH;
      a.nonce = rconn(conn)->auth;
    }
    int ret = ctl_send(rep, rconn(conn)->dest, CTL_CONNREQ, &a);
    if (ret)
      conn_lost(conn, ret, 0);
    break;
  }
  case CTL_KEEPALIVE:
    break; /* heard, above */
  case CTL_PING:
    ctl_send_conn(conn, CTL_PONG, 1);
    break;
  case CTL_PONG:
    rma_probe_answered(conn);
    break;
  case CTL_DISC:
    /* The answer is the last message of this connection: the peer may
     * wait for it before it lets go of us (struct xport__bye), and stops
     * draining what we sent before it (struct xport__sink). */
    ctl_send_conn(conn, CTL_DISC, 1);
    conn_lost(conn, -XPORT_ECONNRESET, 0);
    break;
  }
}

static void rdm_internal(struct xport__lane *lane, struct xport__req *req, int status,
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
    sink_done(lane, req->user_ctx, status);
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
      xport_conn_t *conn = find_conn(lane, req->imm);
      if (conn && rconn(conn)->rep == rep && conn->state == XPORT__CONN_CONNECTING)
        conn_lost(conn, status == -XPORT_ECANCELED ? -XPORT_ECONNREFUSED : status, 0);
    }
    if (req->peer)
      peer_put(rep, req->peer);
    ctl_req_free(lane, req);
    return;
  }
  /* A control receive: act on it and post it again (unless its endpoint
   * is closing, which leaves the request to rep_close). What arrived is
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
      ctl_drop(lane, why, type, len);
    } else {
      on_ctl(rep, &m, len, src);
    }
  } else if (status && status != -XPORT_ECANCELED) {
    ctl_drop(lane, xport_strerror(status), 0, len);
  }
  /* A message longer than what is left of a multi-receive buffer
   * truncates into it, and then the provider has let go of the whole
   * buffer, though the error entry does not say FI_MULTI_RECV (rxm): it is
   * posted again, or a stranger's long messages would take both away. */
  if (rctx(lane)->multi_recv && !(e && (e->flags & FI_MULTI_RECV)) && status != -XPORT_ETRUNC)
    return;
  if (!rep->ep || status == -XPORT_ECANCELED || ctl_post_recv(rep, req))
    XPORT__DEBUG("control receive not reposted (%s)", xport_strerror(status));
}

/* ---- endpoints -------------------------------------------------------- */

/* Lets go of what a connection holds of its endpoint once it has nothing
 * in flight there; rep_close has already let go of the peer. */
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
        peer_reached(rep, p->fi_addr, 1); /* its process is gone */
      else if (p->unreached)
        ctl_send(rep, p->fi_addr, CTL_KEEPALIVE, &a);
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
/* rep->lingering: left open for a peer; due for a look; being looked at. */
enum { LINGER_OPEN = 1, LINGER_DUE, LINGER_LOOK };

static void rep_close(struct xport__rep *rep)
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
  while (!rep->parked && byes_on(rep)) {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
    xport__cq_drain(lane);
    byes_expire(lane);
  }
  byes_drop(lane, rep);
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
  sinks_drop(lane, rep);
  for (int i = 0; i < XPORT__CTL_RX; i++)
    if (rep->ctl_rx[i])
      ctl_recv_free(lane, rep->ctl_rx[i]);
  while (rep->ctl_out) {
    struct xport__req *r = rep->ctl_out;
    rep->ctl_out = r->cnext;
    ctl_req_free(lane, r);
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
 * own ones for outgoing connections (dest_rep) only once retired. */
static int rep_maybe_close(struct xport__rep *rep)
{
  struct xport__lane *lane = rep->lane;
  if (rep->closing || (rep->lingering && rep->lingering != LINGER_LOOK) || rep->lst ||
      rep == rctx(lane)->cep || rep == rctx(lane)->probe ||
      (rep->dest_len && !rep->withdrawn) || rep->nconns != rep->ndead)
    return 0;
  /* Control messages still in flight (a goodbye) and goodbyes awaiting
   * their answers go first (rep_close), but this runs inside xport_poll,
   * which never waits on a peer (a hung one would hold every call):
   * later passes of housekeeping look again, up to CLOSE_QUIET_MS for
   * messages in flight, until they expire for goodbyes. */
  if (!rctx(lane)->rdm_closing && !rep->parked && rep->ep && (rep->ctl_out || byes_on(rep))) {
    long now = xport__now_ms();
    if (!rep->quiet_by)
      rep->quiet_by = now + CLOSE_QUIET_MS;
    if (now < rep->quiet_by || byes_on(rep)) { /* goodbyes expire on their own */
      xport__cq_drain(lane);
      lane->reap = 1; /* again at the next housekeeping */
      return 0;
    }
  }
  rep_close(rep);
  return 1;
}

/* Opens an RDM endpoint; info (may be NULL) carries a source address. */
static int rep_open(struct xport__lane *lane, struct fi_info *info, const char *name,
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
    rep_close(rep);
    return -XPORT_EPROVIDER;
  }
  if (ret) {
    XPORT__INFO("opening an endpoint: %s: %s", step, fi_strerror(-ret));
    rep_close(rep);
    return ret == -FI_EADDRINUSE ? -XPORT_EADDRINUSE : xport__err_from_fi(ret);
  }
  /* Room for one control message is enough to keep a multi-receive
   * buffer posted (set after fi_enable: shm faults before). */
  size_t min = XPORT__CTL_SLOT;
  if (rctx(lane)->multi_recv)
    fi_setopt(&rep->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof min);
  for (int i = 0; i < (rctx(lane)->multi_recv ? 2 : XPORT__CTL_RX) && !ret; i++) {
    rep->ctl_rx[i] = ctl_recv_req(rep);
    ret = rep->ctl_rx[i] ? ctl_post_recv(rep, rep->ctl_rx[i]) : -XPORT_ENOMEM;
  }
  if (ret) {
    XPORT__INFO("posting control receives: %s", xport_strerror(ret));
    rep_close(rep);
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
static int anon_rep_open(struct xport__lane *lane, struct xport__rep **rep_p)
{
  const struct xport__profile *prof = lane->prof;
  char name[XPORT__ADDR_MAX];
  int lock = -1, ret;
  if (!prof || !prof->anon_name)
    return rep_open(lane, NULL, NULL, rep_p);
  if ((ret = prof->anon_name(name, sizeof name)) || (ret = prof->claim_name(name, &lock)))
    return ret;
  ret = rep_open(lane, NULL, name, rep_p);
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
  return anon_rep_open(lane, &rctx(lane)->cep);
}

/* The endpoint outgoing connections to addr go through: the context's
 * one, or where a dead target would stall the answers to every other
 * (answers_in_order), one of addr's own, shared only by connections to
 * the same listener, whose process they die with. Like the context's
 * one it stays open while no connection uses it, until its target dies
 * or refuses a key (rep_withdraw); then it is never chosen again: its
 * address vector may still map the dead process's region under a name a
 * new listener has taken since. */
static int dest_rep(struct xport__lane *lane, const uint8_t *addr, size_t alen,
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
  if ((ret = anon_rep_open(lane, rep_p)))
    return ret;
  memcpy((*rep_p)->dest_addr, addr, alen);
  (*rep_p)->dest_len = alen;
  return 0;
}

/* ---- listen, connect, accept, close ----------------------------------- */

/* An address vector holds the address format of its domain (rxm: an IPv4
 * domain refuses IPv6 addresses, and the reverse), and every connection
 * of the context goes through one domain: a listener or a peer of the
 * other family could never be reached. Say so at once, not as EINVAL
 * from the first send. */
static int format_ok(struct xport__lane *lane, const struct fi_info *info, const char *host)
{
  uint32_t have = lane->info->addr_format, want = info->addr_format;
  if (have == want || (have != FI_SOCKADDR_IN && have != FI_SOCKADDR_IN6) ||
      (want != FI_SOCKADDR_IN && want != FI_SOCKADDR_IN6))
    return 0;
  XPORT__WARN("%s: %s is an %s address, but this context's domain (%s) speaks %s only; "
              "use an %s address, or a provider with connected endpoints (tcp)",
              lane->caps.provider, host, want == FI_SOCKADDR_IN6 ? "IPv6" : "IPv4",
              lane->info->domain_attr->name, have == FI_SOCKADDR_IN6 ? "IPv6" : "IPv4",
              have == FI_SOCKADDR_IN6 ? "IPv6" : "IPv4");
  return -XPORT_EADDRNOTAVAIL;
}

/* A named listener of its own (no fabric beside it holds the port, as
 * one with XPORT_SHM does): a TCP socket bound to the port in this network
 * namespace, so that no TCP server there has that number while it
 * listens, and a client with shm beside its fabric that finds a live name
 * for host:port finds the listener a TCP connect there would reach. Port
 * "0": the kernel's choice, written to out. The socket, or -1 (errno). */
static int hold_port(const char *port, char *out, size_t len)
{
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
  socklen_t l = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  snprintf(out, len, "%u", ntohs(a.sin_port));
  return fd;
}

static int rdm_listen(xport_listener_t *lst, const char *addr, const char *host,
                      const char *port)
{
  (void)addr;
  struct xport__lane *lane = lst->lane;
  const struct xport__profile *prof = lane->prof;
  struct xport__rep *rep = NULL;
  int ret;

  if (prof && prof->listen_name) {
    char name[XPORT__ADDR_MAX], p[8];
    int lock = -1, hold = -1;
    /* Port 0: the port the kernel gives the held socket; where none can
     * be held, an unused number chosen at random like the kernel's
     * ephemeral ports, so that the name can still be given to clients. */
    for (int tries = 0; tries < 64; tries++) {
      /* A lane beside the fabric shares the fabric's listener's port. */
      hold = lane->index ? -1 : hold_port(port, p, sizeof p);
      if (hold < 0 && !lane->index && errno == EADDRINUSE) {
        ret = -XPORT_EADDRINUSE; /* a TCP server of this namespace has it */
        break;
      }
      if (hold < 0 && strcmp(port, "0"))
        snprintf(p, sizeof p, "%s", port);
      else if (hold < 0)
        snprintf(p, sizeof p, "%u", 49152u + (unsigned)(xport__random_key(8) % 16384));
      ret = prof->listen_name(host, p, 0, name, sizeof name);
      if (!ret)
        ret = prof->claim_name(name, &lock);
      /* The provider may find the name in use where the lock did not (a
       * file of a live process that is not xport's). */
      if (!ret && (ret = rep_open(lane, NULL, name, &rep)))
        prof->release_name(name, lock);
      if (ret && hold >= 0)
        close(hold);
      if (ret != -XPORT_EADDRINUSE || strcmp(port, "0"))
        break;
    }
    if (ret)
      return ret;
    snprintf(rep->name, sizeof rep->name, "%s", name);
    rep->lock = lock;
    rep->port_fd = hold;
    if (host[strspn(host, "0123456789abcdefABCDEF.:")] == '\0' && strchr(host, ':'))
      snprintf(lst->addr, sizeof lst->addr, "[%s]:%s", host, p);
    else
      snprintf(lst->addr, sizeof lst->addr, "%s:%s", host, p);
  } else {
    struct fi_info *info;
    ret = xport__resolve(lane, host, port, FI_SOURCE, &info);
    if (ret)
      return ret;
    ret = format_ok(lane, info, host);
    if (!ret)
      ret = rep_open(lane, info, NULL, &rep);
    fi_freeinfo(info);
    if (ret)
      return ret;
    if (strcmp(port, "0")) {
      snprintf(lst->addr, sizeof lst->addr, "%s:%s", host, port);
    } else {
      /* The real port is in the bound name (same place for IPv4 and 6). */
      struct sockaddr_in sin;
      memcpy(&sin, rep->addr, sizeof sin);
      unsigned real = ntohs(sin.sin_port);
      if (strchr(host, ':'))
        snprintf(lst->addr, sizeof lst->addr, "[%s]:%u", host, real);
      else
        snprintf(lst->addr, sizeof lst->addr, "%s:%u", host, real);
    }
  }
  rep->lst = lst;
  lst->rep = rep;
  return 0;
}

static void rdm_listener_close(xport_listener_t *lst)
{
  /* Requests still waiting are refused, so that their clients hear it now
   * rather than at their timeout: those queued, and those the CQ still
   * holds (a listener nobody polled). */
  lst->closing = 1;
  xport__cq_drain(lst->lane);
  while (lst->pending) {
    struct xport__connreq *cr = lst->pending;
    lst->pending = cr->next;
    answer(lst->rep, cr->ctl, CTL_CONNREJ, 1);
    free(cr->ctl);
    free(cr);
  }
  lst->pending_tail = NULL;
  lst->npending = 0;
  while (lst->shaking) { /* handshakes no accept will return */
    xport_conn_t *c = lst->shaking;
    lst->shaking = c->shake.next;
    shake_discard(lst, c, NULL);
  }
  /* Connections accepted here live on this endpoint: it closes with the
   * last of them (and keeps its name until then). */
  lst->rep->lst = NULL;
  rep_maybe_close(lst->rep);
  lst->rep = NULL;
}

/* link 0: a listener's handshake under a key, on lst->shaking and not
 * the context's until its client's proof came (accept links it). */
static xport_conn_t *conn_new(struct xport__rep *rep, struct xport__peer *peer, int link)
{
  struct xport__lane *lane = rep->lane;
  xport_conn_t *conn = xport__conn_new(lane);
  if (!conn)
    return NULL;
  conn->ep = rep->ep;
  rconn(conn)->rep = rep;
  conn->attached = 1;
  rconn(conn)->peer = peer;
  rconn(conn)->dest = peer->fi_addr;
  rconn(conn)->rx_src = rctx(lane)->directed ? peer->fi_addr : FI_ADDR_UNSPEC;
  data_plain(conn);
  /* The receive tag is the connection's secret: random, and unique on its
   * endpoint (its data receives match it exactly). */
  for (int unique = 0; !unique;) {
    rconn(conn)->rx_tag = xport__random_key(8) & XPORT__TAG_MASK;
    unique = tag_ok(rconn(conn)->rx_tag);
    for (xport_conn_t *c = lane->conns; c && unique; c = c->next)
      unique = rconn(c)->rep != rep || rconn(c)->rx_tag != rconn(conn)->rx_tag;
    for (struct xport__sink *k = rctx(lane)->sinks; k && unique; k = k->next)
      unique = k->rep != rep || k->tag != rconn(conn)->rx_tag;
  }
  rep->nconns++;
  /* Ids start at 1 and are not reused within a context, so that a late
   * message for a closed connection matches nothing. */
  conn->id = ++rctx(lane)->next_conn_id;
  if (link)
    xport__conn_link(conn);
  return conn;
}

/* Lets go of the peer and the endpoint; the last connection of a closed
 * listener's endpoint closes it. */
/* said_bye: a goodbye went to the peer, which may call for waiting for its
 * answer (struct xport__bye). */
static void conn_detach(xport_conn_t *conn, int said_bye)
{
  struct xport__rep *rep = rconn(conn)->rep;
  if (!said_bye || !bye_start(conn)) {
    if (conn->proc.pidfd >= 0)
      close(conn->proc.pidfd);
    peer_put(rep, rconn(conn)->peer);
  }
  conn->proc.pidfd = -1;
  rconn(conn)->peer = NULL;
  rconn(conn)->rep = NULL;
  conn->attached = 0;
  rep->nconns--;
  rep->ndead -= rconn(conn)->dead;
  rep_maybe_close(rep);
}

static void conn_discard(xport_conn_t *conn)
{
  xport__conn_unlink(conn);
  conn_detach(conn, 0);
  free(conn);
}

/* A step of connect's and accept's wait loops. They run with the progress
 * lock held, which is let go of while sleeping: the progress thread must
 * keep serving the other connections meanwhile. */
static int wait_progress(struct xport__lane *lane, long deadline)
{
  long left = deadline < 0 ? 10 : deadline - xport__now_ms();
  if (left <= 0)
    return -XPORT_ETIMEDOUT;
  struct timespec ts = {0, 200 * 1000};
  XPORT__UNLOCK(lane->ctx);
  nanosleep(&ts, NULL);
  XPORT__LOCK(lane->ctx);
  xport__cq_drain(lane);
  xport__progress_beside(lane);
  return 0;
}

#define REQUEST_AGAIN_MS 200
static int rdm_connect(struct xport__lane *lane, const char *host, const char *port, long deadline,
                       xport_conn_t **conn_p)
{
  const struct xport__profile *prof = lane->prof;
  uint8_t addr[XPORT__ADDR_MAX];
  size_t alen;
  int ret;

  char name[XPORT__ADDR_MAX] = "";
  if (prof && prof->listen_name) {
    /* The host's own address first, then the port's wildcard, as TCP
     * would find them. Inserting a name nobody owns can later misdirect
     * traffic (shm): only a live listener's name goes into the address
     * vector. */
    int alive = 0;
    for (int any = 0; any < 2 && !alive; any++) {
      if ((ret = prof->listen_name(host, port, any, name, sizeof name)))
        return ret;
      alive = prof->name_alive(name);
    }
    if (!alive)
      return -XPORT_ECONNREFUSED;
    /* Processes of two users do not meet over shm: the listener cannot
     * map the client's region, and libfabric 1.17 crashes there. */
    if (prof->name_same_user && !prof->name_same_user(name)) {
      XPORT__INFO("%s:%s: the listener there is another user's: not over %s", host, port,
                  lane->caps.provider);
      return -XPORT_ECONNREFUSED;
    }
    alen = strlen(name) + 1;
    memcpy(addr, name, alen);
  } else {
    struct fi_info *info;
    ret = xport__resolve(lane, host, port, 0, &info);
    if (ret)
      return ret;
    alen = info->dest_addrlen;
    if ((ret = format_ok(lane, info, host)) || alen > sizeof addr) {
      fi_freeinfo(info);
      return ret ? ret : -XPORT_EADDRNOTAVAIL;
    }
    memcpy(addr, info->dest_addr, alen);
    fi_freeinfo(info);
  }
  struct xport__rep *rep;
  if ((ret = dest_rep(lane, addr, alen, &rep)))
    return ret;
  struct xport__peer *peer = peer_get(rep, addr, alen, &ret);
  if (!peer)
    return ret;
  xport_conn_t *conn = conn_new(rep, peer, 1);
  if (!conn) {
    peer_put(rep, peer);
    return -XPORT_ENOMEM;
  }
  /* A listener that is not there makes some providers push back for
   * ever (rxm) rather than fail: retry until the deadline. The first
   * request goes again, after 1, 2, 4 ... up to REQUEST_AGAIN_MS, until the
   * listener answers (on_connreq: it may want a request from where the
   * request says; its challenge, which on_ctl answers, may be lost). */
  struct ctl_args a = {.src_id = conn->id, .tag = rconn(conn)->rx_tag};
  if (lane->ctx->auth_on) {
    xport__auth_nonce(rconn(conn)->auth); /* fresh: the listener's proof covers it */
    a.flags = CTL_F_AUTH;
    a.nonce = rconn(conn)->auth;
  }
  for (;;) {
    while ((ret = ctl_send(rep, peer->fi_addr, CTL_CONNREQ, &a)) == -XPORT_EAGAIN &&
           (ret = wait_progress(lane, deadline)) == 0)
      ;
    for (long gap = 1, again = xport__now_ms() + gap;
         !ret && conn->state == XPORT__CONN_CONNECTING;) {
      ret = wait_progress(lane, deadline);
      if (!ret && !rconn(conn)->challenged && conn->state == XPORT__CONN_CONNECTING &&
          xport__now_ms() >= again) {
        gap = gap * 2 < REQUEST_AGAIN_MS ? gap * 2 : REQUEST_AGAIN_MS;
        again = xport__now_ms() + gap;
        int r = ctl_send(rep, peer->fi_addr, CTL_CONNREQ, &a);
        if (r && r != -XPORT_EAGAIN)
          ret = r;
        /* A named listener that is gone (closed before it answered, or
         * killed) answers nothing: its name says so. */
        if (!ret && name[0] && !prof->name_alive(name))
          ret = -XPORT_ECONNREFUSED;
      }
    }
    /* The request went down with the provider's own connection to that
     * peer, which the peer had just dropped (rxm, after a refused key):
     * the provider makes a new one on the next send, so ask again. */
    if (ret || conn->state != XPORT__CONN_FAILED || conn->fail_code != -XPORT_ENOTCONN)
      break;
    conn->state = XPORT__CONN_CONNECTING;
    conn->fail_code = 0;
    rconn(conn)->challenged = 0;
  }
  /* Connected and already lost is still a connection: its disconnect
   * event is queued for the application. */
  if (!ret && conn->state != XPORT__CONN_CONNECTED && conn->state != XPORT__CONN_DISCONNECTED)
    ret = conn->fail_code ? conn->fail_code : -XPORT_ECONNREFUSED;
  if (ret) {
    if (conn->state == XPORT__CONN_CONNECTING)
      withdraw(conn);
    conn_discard(conn);
    return ret;
  }
  /* The listener has no other sign that its acceptance reached us, and
   * that we did not give up first (peer_holds). */
  conn->peer_holds = 1;
  if (conn->state == XPORT__CONN_CONNECTED)
    ctl_send_conn(conn, CTL_KEEPALIVE, 0); /* a user call: it may wait for room */
  *conn_p = conn;
  return 0;
}

/* Forgets that request m was queued: it was never answered (its accept
 * failed), and the client, which asks again until answered, must not be
 * taken for repeating an accepted one. */
static void seen_forget(struct xport__rep *rep, const struct xport__ctl *m)
{
  for (unsigned i = 0; i < XPORT__SEEN_KEEP; i++)
    if (rep->seen[i].ctx_id == m->ctx_id && rep->seen[i].src_id == m->src_id)
      rep->seen[i].ctx_id = 0, rep->seen[i].src_id = 0;
}

/* A handshake of lst under a key that will not end well (refused, timed
 * out, or evicted): it goes, with what it held of the endpoint. */
static void shake_discard(xport_listener_t *lst, xport_conn_t *c, const char *why)
{
  lst->nshaking--;
  if (why)
    XPORT__INFO("listener %s: a handshake %s", lst->addr, why);
  xport__auth_wipe(rconn(c)->auth, sizeof rconn(c)->auth);
  conn_detach(c, 0);
  free(c);
}

/* The first of lst's handshakes under a key whose client proved the key,
 * taken off the list (the caller links it); those refused or out of time
 * go. */
static xport_conn_t *shake_done(xport_listener_t *lst)
{
  long now = xport__now_ms();
  for (xport_conn_t **pp = &lst->shaking; *pp;) {
    xport_conn_t *c = *pp;
    if (c->state == XPORT__CONN_CONNECTING && now <= c->shake.deadline) {
      pp = &c->shake.next;
      continue;
    }
    *pp = c->shake.next;
    if (c->state == XPORT__CONN_CONNECTED || c->state == XPORT__CONN_DISCONNECTED) {
      lst->nshaking--;
      return c;
    }
    shake_discard(lst, c, c->state != XPORT__CONN_FAILED  ? "timed out: no proof came"
                          : c->fail_code == -XPORT_EACCES ? "was refused: the client proved no key"
                                                          : "ended: its client gave up");
  }
  return NULL;
}

/* Answers request cr under a key: the acceptance carries the listener's
 * nonce and proof, and the connection waits on lst->shaking for the
 * client's (HANDSHAKE_MS at most; beyond backlog of them, the oldest
 * goes). 0, or a code with nothing sent. */
#define HANDSHAKE_MS 30000
static int shake_start(xport_listener_t *lst, const struct xport__ctl *req, xport_conn_t *conn)
{
  struct xport__lane *lane = lst->lane;
  struct xport__rep *rep = lst->rep;
  uint8_t nonce[XPORT__AUTH_NONCE], mac[XPORT__AUTH_MAC];
  xport__auth_nonce(nonce);
  struct auth_end c = {req->nonce, req->ctx_id, req->tag, req->src_id, req->addr, req->addrlen};
  struct auth_end l = {nonce, lane->ctx->id, rconn(conn)->rx_tag, conn->id, rep->addr, rep->addrlen};
  auth_proof(lane, 1, &c, &l, mac);
  auth_proof(lane, 0, &c, &l, rconn(conn)->auth); /* what the client owes */
  struct ctl_args a = {.src_id = conn->id,
                       .dst_id = rconn(conn)->peer_id,
                       .cookie = rconn(conn)->tag,
                       .tag = rconn(conn)->rx_tag,
                       .flags = CTL_F_AUTH,
                       .nonce = nonce,
                       .mac = mac};
  int ret = ctl_send(rep, rconn(conn)->dest, CTL_CONNACK, &a);
  if (ret)
    return ret;
  if (lst->nshaking >= lst->backlog) {
    xport_conn_t **pp = &lst->shaking;
    while ((*pp)->shake.next) /* newest first: the oldest is last */
      pp = &(*pp)->shake.next;
    xport_conn_t *old = *pp;
    *pp = NULL;
    shake_discard(lst, old, NULL);
  }
  conn->shake.deadline = xport__now_ms() + HANDSHAKE_MS;
  conn->shake.next = lst->shaking;
  lst->shaking = conn;
  lst->nshaking++;
  return 0;
}

static int rdm_accept(xport_listener_t *lst, long deadline, xport_conn_t **conn_p)
{
  struct xport__lane *lane = lst->lane;
  struct xport__rep *rep = lst->rep;
  for (;;) {
    /* Where strangers' sockets took the descriptors, rxm accepts nothing
     * until some are given back. */
    xport__halfopen_watch(lane, 0);
    xport__cq_drain(lane);
    xport_conn_t *done = lst->shaking ? shake_done(lst) : NULL;
    if (done) {
      xport__conn_link(done);
      if (done->state == XPORT__CONN_DISCONNECTED) /* the client has closed it already */
        xport__evq_push(lane->ctx, done, -XPORT_ECONNRESET);
      *conn_p = done;
      return 0;
    }
    struct xport__connreq *cr = lst->pending;
    if (!cr) {
      int ret = wait_progress(lane, deadline);
      if (ret)
        return ret;
      continue;
    }
    lst->pending = cr->next;
    if (!lst->pending)
      lst->pending_tail = NULL;
    lst->npending--;
    int ret = 0;
    if (lst->admit && !lst->admit(lst->hook_arg, cr->peer_ctx_id)) {
      answer(rep, cr->ctl, CTL_CONNREJ, 1); /* the layer that owns lst said no */
      free(cr->ctl);
      free(cr);
      continue;
    }
    struct xport__peer *peer = peer_get(rep, cr->ctl->addr, cr->ctl->addrlen, &ret);
    xport_conn_t *conn = peer ? conn_new(rep, peer, !lane->ctx->auth_on) : NULL;
    if (conn) {
      rconn(conn)->peer_id = cr->ctl->src_id;
      rconn(conn)->tag = cr->ctl->tag;
      conn->peer_ctx_id = cr->ctl->ctx_id;
      watch_peer(conn, cr->ctl);
      struct ctl_args a = {.src_id = conn->id,
                           .dst_id = rconn(conn)->peer_id,
                           .cookie = rconn(conn)->tag,
                           .tag = rconn(conn)->rx_tag};
      ret = lane->ctx->auth_on ? shake_start(lst, cr->ctl, conn)
                         : ctl_send(rep, peer->fi_addr, CTL_CONNACK, &a);
    } else if (peer) {
      peer_put(rep, peer);
      ret = -XPORT_ENOMEM;
    }
    if (ret)
      seen_forget(rep, cr->ctl); /* the client's next try is queued again */
    free(cr->ctl);
    free(cr);
    if (conn && !ret && lane->ctx->auth_on)
      continue; /* its client's proof is awaited (shake_done) */
    if (conn && !ret) {
      conn->state = XPORT__CONN_CONNECTED;
      *conn_p = conn;
      return 0;
    }
    XPORT__INFO("listener %s: accept failed: %s", lst->addr, xport_strerror(ret));
    if (conn && lane->ctx->auth_on) {
      conn_detach(conn, 0);
      free(conn);
    } else if (conn) {
      conn_discard(conn);
    }
    if (ret == -XPORT_ENOMEM)
      return ret;
  }
}

static void orphan_all(xport_conn_t *conn, int status)
{
  xport__held_flush(conn, status);
  claims_drop(conn);
  while (conn->out) {
    struct xport__req *req = conn->out;
    /* Receives can be taken back; sends and RMA run their course (or
     * never finish, if the peer is dead) and are reclaimed then. */
    if (req->op == XPORT_OP_RECV)
      fi_cancel(&conn->ep->fid, &req->fictx);
    req->rep = rconn(conn)->rep;
    xport__req_orphan(req, status);
  }
}

/* A one-sided operation failed. Under rxm that means its connection to
 * the peer broke (the target refused a key and dropped it) and was, or
 * will be, re-made without a word: messages around the operation are
 * lost while later ones would arrive. So the connection ends here, as a
 * MSG provider ends it, and the peer is told to end its side. */
static void rma_failed(xport_conn_t *conn, int status)
{
  struct xport__lane *lane = conn->lane;
  if (rconn(conn)->rep)
    rconn(conn)->rep->rma_failed = 1;
  /* Nor can that endpoint reach the peer again (close_after_refusal_crashes):
   * later connections go out through a fresh one. */
  if (rconn(conn)->rep && rconn(conn)->rep == rctx(lane)->cep && lane->prof &&
      lane->prof->close_after_refusal_crashes)
    rep_withdraw(rconn(conn)->rep);
  if (conn->state != XPORT__CONN_CONNECTED)
    return;
  XPORT__INFO("connection %u: a one-sided operation failed (%s); the target may have "
              "refused its key: the connection ends, with every other one to that peer "
              "on its endpoint", conn->id, xport_strerror(status));
  /* The provider carries all of them over one connection of its own,
   * which the refusal broke (rxm): what they had in flight is lost, and
   * the target would never hear of it. */
  for (xport_conn_t *o = lane->conns; o; o = o->next)
    if (rconn(o)->rep == rconn(conn)->rep && rconn(o)->peer == rconn(conn)->peer &&
        o->state == XPORT__CONN_CONNECTED) {
      ctl_send_conn(o, CTL_DISC, 1);
      bye_resent(o);
      conn_lost(o, -XPORT_ECONNRESET, 0);
    }
}

static void rdm_close(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (!rconn(conn)->rep)
    return; /* lost, and its endpoint closed since */
  int connected = conn->state == XPORT__CONN_CONNECTED;
  orphan_all(conn, -XPORT_ECANCELED);
  /* The goodbye follows the operations the provider still has (the peer
   * must see a send's message before the end of the connection: rxm
   * carried a goodbye past a rendezvous send's data). */
  int sent = connected && !conn->orphans.n ? ctl_send_conn(conn, CTL_DISC, 0) : -XPORT_EINVAL;
  int said_bye = sent == 0;
  if (conn->state == XPORT__CONN_CONNECTED || conn->state == XPORT__CONN_DISCONNECTED)
    sink_start(conn);
  /* A goodbye the provider pushed back (the peer's queue is full: it is
   * busy elsewhere while others stream to it) is owed, and goes later
   * (rdm_reap); dropped, it would leave the peer's side open. */
  if (!conn->orphans.n && sent != -XPORT_EAGAIN) {
    conn_detach(conn, said_bye);
    return;
  }
  if (!conn->orphans.n)
    lane->reap = 1;
  /* The provider still owns some of its operations, which may still
   * reach the peer: the peer stays in the address vector, and the
   * endpoint open, until they end (rdm_reap). The goodbye goes out then:
   * a send the peer has not taken yet keeps the connection open at the
   * peer until it takes it, as a tcp stream does. */
  rconn(conn)->said_bye = said_bye ? 1 : connected ? -1 : 0;
  XPORT__LIST_PUSH(lane->draining, conn, drain.next, drain.prev);
}

/* Sends the goodbye a closed connection still owes its peer, if any.
 * Pushed back, it stays owed (said_bye -1) for 4 x XPORT_PEER_TIMEOUT,
 * unless final, and is tried at every housekeeping; the posts waiting for
 * room (xport__held_retry) let it go first meanwhile (lane->ctl_owed). */
static void pay_bye(xport_conn_t *c, int final)
{
  struct xport__lane *lane = c->lane;
  if (rconn(c)->said_bye >= 0)
    return;
  int ret = -XPORT_ECONNRESET;
  if (!rconn(c)->dead) {
    struct ctl_args a = {.src_id = c->id, .dst_id = rconn(c)->peer_id, .cookie = rconn(c)->tag,
                         .once = !final};
    ret = ctl_send(rconn(c)->rep, rconn(c)->dest, CTL_DISC, &a);
  }
  long now = xport__now_ms();
  if (ret == -XPORT_EAGAIN && !final) {
    if (!rconn(c)->bye_owed) {
      rconn(c)->bye_owed = 1;
      rconn(c)->bye_until = now + 4 * lane->ctx->peer_check_ms;
      lane->ctl_owed++;
    }
    if (now < rconn(c)->bye_until)
      return;
    XPORT__WARN("connection %u: its peer took no goodbye for %ld ms: its side stays open "
                "until its process ends", c->id, 4 * lane->ctx->peer_check_ms);
  }
  rconn(c)->said_bye = ret == 0;
  if (rconn(c)->bye_owed) {
    rconn(c)->bye_owed = 0;
    lane->ctl_owed--;
  }
}

/* Detaches the closed connections whose last operation ended, and closes
 * the endpoints nothing holds open any more. Not called from inside a CQ
 * read: closing an endpoint frees requests a batch may still name. */
static void rdm_reap(struct xport__lane *lane)
{
  lane->reap = 0;
  for (xport_conn_t *c = lane->draining, *next; c; c = next) {
    next = c->drain.next;
    if (c->orphans.n)
      continue;
    pay_bye(c, 0);
    if (rconn(c)->said_bye < 0) {
      lane->reap = 1; /* owed still: again at the next housekeeping */
      continue;
    }
    XPORT__LIST_UNLINK(lane->draining, c, drain.next, drain.prev);
    conn_detach(c, rconn(c)->said_bye);
    xport__conn_free_if_done(c);
    next = lane->draining; /* a closed endpoint may have taken others along */
  }
  for (struct xport__rep *r = rctx(lane)->reps, *next; r; r = next) {
    next = r->next;
    if (rep_maybe_close(r))
      next = rctx(lane)->reps;
  }
}

/* 1 if the peer process behind pidfd is gone. */
static int pid_gone(int pidfd)
{
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

/* Sends type (a ping, or a goodbye) to the peer of c from the context's
 * probe endpoint: the operation under probe may hold every send over c's
 * own endpoint pair (shm sends nothing to a peer while a segmented
 * transfer to it is unfinished). The peer answers over c itself. 0 once
 * sent. */
static int probe_ctl(struct xport__lane *lane, const struct xport__peer *to, uint32_t type,
                     const struct ctl_args *a)
{
  int ret = 0;
  if (!rctx(lane)->probe && (ret = anon_rep_open(lane, &rctx(lane)->probe)))
    return ret;
  struct xport__peer *p = peer_get(rctx(lane)->probe, to->addr, to->addrlen, &ret);
  if (!p)
    return ret;
  p->refs = 1; /* the probe endpoint holds each peer once, until it closes */
  struct ctl_args b = *a;
  b.to = to;
  return ctl_send(rctx(lane)->probe, p->fi_addr, type, &b);
}

static int probe_send(struct xport__lane *lane, xport_conn_t *c, uint32_t type)
{
  struct ctl_args a = {
      .src_id = c->id, .dst_id = rconn(c)->peer_id, .cookie = rconn(c)->tag, .once = 1};
  return probe_ctl(lane, rconn(c)->peer, type, &a);
}

/* The RMA probe, where a refused one-sided operation neither completes
 * nor fails (rma_never_fails, shm). An operation unanswered for
 * XPORT_RMA_TIMEOUT proves nothing by itself: the target may merely be
 * busy, outside xport. So xport pings the target, and only if the target
 * answers (it has taken everything sent before the ping off its queue,
 * which serves all its senders in order) while the operation is still
 * unanswered, concludes that it was refused. shm then holds back every
 * later answer to this endpoint: its connections are lost, and the
 * endpoint retires. 1 if c was lost. */
/* Of the connections on c's endpoint to c's peer, the one whose oldest
 * outstanding one-sided operation was posted first. */
static xport_conn_t *oldest_rma(struct xport__lane *lane, xport_conn_t *c)
{
  xport_conn_t *best = c;
  uint64_t best_seq = 0;
  for (xport_conn_t *o = lane->conns; o; o = o->next) {
    if (rconn(o)->rep != rconn(c)->rep || rconn(o)->peer != rconn(c)->peer ||
        o->state != XPORT__CONN_CONNECTED)
      continue;
    for (struct xport__req *r = o->out; r; r = r->cnext)
      if (r->posted_seq && (!best_seq || r->posted_seq < best_seq)) {
        best_seq = r->posted_seq;
        best = o;
      }
  }
  return best;
}

static int rma_check(struct xport__lane *lane, xport_conn_t *c, long now, int *drained)
{
  struct xport__req *r = c->out;
  if (rconn(c)->ponged) {
    if (!*drained) {
      xport__cq_drain(lane); /* answers the target gave before its pong */
      *drained = 1;
    }
    while (r && !(r->posted_ms && r->posted_ms < rconn(c)->ping_at))
      r = r->cnext;
    rconn(c)->ponged = 0;
    rconn(c)->ping_at = 0;
    if (!r || c->state != XPORT__CONN_CONNECTED)
      return 0;
    /* The refused operation holds up everything after it to that peer,
     * other connections' operations included: it is the oldest of all. */
    c = oldest_rma(lane, c);
    XPORT__WARN("connection %u: the target took a one-sided operation off its queue "
                "without answering it: it refused the remote key (revoked, forged or out "
                "of range); the endpoint's later answers are held up behind it, so its "
                "connections are dropped", c->id);
    /* Their peers are told, the way the ping went: over this endpoint a
     * goodbye would wait behind the refused operation for ever. */
    for (xport_conn_t *o = lane->conns; o; o = o->next)
      if (o != c && rconn(o)->rep == rconn(c)->rep && o->state == XPORT__CONN_CONNECTED) {
        probe_send(lane, o, CTL_DISC);
        conn_lost(o, -XPORT_ECONNRESET, 1);
      }
    probe_send(lane, c, CTL_DISC);
    conn_lost(c, -XPORT_EACCES, 1);
    return 1;
  }
  if (rconn(c)->ping_at)
    return 0; /* asked; the target has not been inside libfabric since */
  while (r && !(r->posted_ms && now - r->posted_ms > lane->rma_timeout_ms))
    r = r->cnext;
  if (r && probe_send(lane, c, CTL_PING) == 0)
    rconn(c)->ping_at = now;
  return 0;
}

/* A heartbeat the provider pushed back goes at the next poll (and every
 * one after, until it goes or the connection ends): see lane->ka_owed. */
static void ka_owe(xport_conn_t *c)
{
  rconn(c)->ka_owed = 1;
  c->lane->ka_owed++;
}

static void rdm_pay_owed(struct xport__lane *lane)
{
  size_t left = 0;
  for (xport_conn_t *c = lane->conns; c; c = c->next) {
    if (!rconn(c)->ka_owed)
      continue;
    if (c->state == XPORT__CONN_CONNECTED && !rconn(c)->dead) {
      struct ctl_args a = {.src_id = c->id,
                           .dst_id = rconn(c)->peer_id,
                           .cookie = rconn(c)->tag,
                           .once = 2,
                           .to = rconn(c)->peer};
      int ret = ctl_send(rconn(c)->rep, rconn(c)->dest, CTL_KEEPALIVE, &a);
      if (ret == -XPORT_EAGAIN) {
        left++;
        continue;
      }
      if (!ret)
        rconn(c)->last_sent = xport__now_ms();
    }
    rconn(c)->ka_owed = 0;
  }
  /* Counted afresh: a connection freed while it owed one is gone from
   * the list. */
  lane->ka_owed = left;
}

/* Looks for peers that died: on the same node their process is gone;
 * elsewhere (or when asked) their heartbeats stopped, and any message
 * from the peer counts as one. Runs a few times per XPORT_PEER_TIMEOUT;
 * it also lets go of what closed connections held, once their
 * operations have ended. */
static void rdm_progress(struct xport__lane *lane)
{
  if (lane->ctx->wimm_wait)
    lane->ctx->wimm_retry(lane->ctx, 0);
  if (lane->ctx->accept_due && lane->ctx->auto_accept)
    lane->ctx->auto_accept(lane->ctx);
  /* Every time (every XPORT__EQ_EVERY polls, busy or idle): a flood
   * grows the provider's memory at the rate it arrives. */
  if (lane->prof && lane->prof->peek_discard) {
    if (rctx(lane)->cep)
      discard_unused(rctx(lane)->cep);
    for (xport_listener_t *l = lane->listeners; l; l = l->next)
      if (l->rep)
        discard_unused(l->rep);
  }
  if (lane->reap)
    rdm_reap(lane);
  /* rxm's request is all there is: xport's own travels later, as messages. */
  xport__halfopen_watch(lane, 0);
  long now = xport__now_ms();
  if (now - lane->last_check < lane->ctx->peer_check_ms / 4)
    return;
  lane->last_check = now;
  /* Endpoints left open for a peer yet to take their first message: once
   * it has, or has died, they close, and what their dead peers' operations
   * held ends with them. */
  for (struct xport__rep *r = rctx(lane)->reps; r; r = r->next)
    r->lingering = r->lingering ? LINGER_DUE : 0;
  for (;;) { /* once each: a close may take other endpoints along */
    struct xport__rep *r = rctx(lane)->reps;
    while (r && r->lingering != LINGER_DUE)
      r = r->next;
    if (!r)
      break;
    r->lingering = LINGER_LOOK;
    if (!rep_maybe_close(r) && r->lingering == LINGER_LOOK)
      r->lingering = LINGER_OPEN;
  }
  if (rctx(lane)->byes)
    byes_expire(lane);
  if (rctx(lane)->sinks)
    sinks_expire(lane);
  int drained = 0;
  for (xport_conn_t *c = lane->conns, *next; c; c = next) {
    next = c->next;
    if (c->heard.msg) {
      c->heard.msg = 0;
      rconn(c)->last_heard = now;
    }
    if (c->state == XPORT__CONN_DISCONNECTED && c->orphans.n && !rconn(c)->dead &&
        pid_gone(c->proc.pidfd)) {
      c->proc.gone = 1;
      conn_dead(c); /* lost, and now gone: its operations will never end */
      continue;
    }
    if (c->state != XPORT__CONN_CONNECTED)
      continue;
    if (lane->rma_timeout_ms && rma_check(lane, c, now, &drained))
      continue;
    if (rconn(c)->keepalive) {
      if (now - rconn(c)->last_sent >= rctx(lane)->keepalive_ms / 3 && !rconn(c)->ka_owed) {
        int ret = ctl_send_conn(c, CTL_KEEPALIVE, 1);
        if (!ret)
          rconn(c)->last_sent = now;
        else if (ret == -XPORT_EAGAIN)
          ka_owe(c);
      }
      if (now - rconn(c)->last_heard > rctx(lane)->keepalive_ms && !drained) {
        xport__cq_drain(lane); /* heartbeats may be waiting unread */
        drained = 1;
      }
      if (c->heard.msg) {
        c->heard.msg = 0;
        rconn(c)->last_heard = now;
      }
      if (now - rconn(c)->last_heard > rctx(lane)->keepalive_ms) {
        XPORT__INFO("connection %u: nothing heard from the peer in %ld ms", c->id,
                    now - rconn(c)->last_heard);
        c->proc.gone = 1;
        conn_lost(c, -XPORT_ECONNRESET, 1);
        continue;
      }
    }
    if (!pid_gone(c->proc.pidfd))
      continue;
    if (!drained) {
      /* What the provider finished before the death is not failed by it:
       * a receive rxm has all of, waiting only for its own answer to go
       * out, completes with its bytes, as the sender was told. */
      xport__cq_drain(lane);
      drained = 1;
    }
    XPORT__INFO("connection %u: the peer process is gone", c->id);
    c->proc.gone = 1;
    if (lane->prof && lane->prof->peer_gone)
      lane->prof->peer_gone(rconn(c)->peer->addr, rconn(c)->peer->addrlen);
    conn_lost(c, -XPORT_ECONNRESET, 1);
  }
  /* Closed connections waiting for their operations: a peer that dies
   * will never finish them. */
  for (xport_conn_t *c = lane->draining; c; c = c->drain.next)
    if (!rconn(c)->dead && pid_gone(c->proc.pidfd)) {
      c->proc.gone = 1;
      conn_dead(c);
    }
  if (lane->reap)
    rdm_reap(lane);
}

/* Every connection is closed: close every endpoint, retired or held open
 * by operations still in flight, which ends those operations. */
static void rdm_fini(struct xport__lane *lane)
{
  /* Closed connections that wait for the provider to let go of their
   * operations still owe their peers a goodbye: those operations end with
   * the endpoints now, and the peer, alive, would hear nothing. Its answer
   * is waited for in rep_close (rxm carries the goodbye behind the data
   * still going out), by a goodbye holding a reference of its own: the
   * peer's address must stay while the operations are the provider's. */
  for (xport_conn_t *c = lane->draining; c; c = c->drain.next)
    if (rconn(c)->said_bye < 0 && rconn(c)->rep && rconn(c)->rep->ep && rconn(c)->peer) {
      pay_bye(c, 1);
      if (rconn(c)->said_bye && bye_start(c))
        rconn(c)->peer->refs++;
    }
  rctx(lane)->rdm_closing = 1; /* nobody waits on the CQ any more */
  for (;;) { /* the retired (retire_eps) ones included */
    struct xport__rep *r = rctx(lane)->reps;
    while (r && r->parked)
      r = r->next;
    if (!r)
      break;
    rep_close(r);
  }
  while (rctx(lane)->reps) /* parked: nothing reads the CQ after them */
    rep_close(rctx(lane)->reps);
  rctx(lane)->cep = NULL;
  rctx(lane)->retired = NULL;
}

/* One-sided operations end their connection where they fail (rma_failed);
 * a message's failure is its connection's loss, which the provider
 * reports itself. */
static void rdm_op_failed(struct xport__lane *lane, struct xport__req *req, int status)
{
  (void)lane;
  if (req->conn)
    xport__conn_check_gone(req->conn); /* not a refusal, whatever the provider says */
  if (req->op == XPORT_OP_WRITE || req->op == XPORT_OP_READ || req->op == XPORT_OP_ATOMIC ||
      req->op == XPORT__OP_SILENT)
    rma_failed(req->conn, status);
}

/* XPORT_FAULT drop_conn, and a peer past XPORT_RECV_AHEAD (ahead): the
 * loss a refused key brings (rma_failed), a live peer told with a
 * goodbye: from the probe endpoint where its own pushes back, and again
 * where the provider may lose it (bye_resent). */
static void rdm_drop(xport_conn_t *conn)
{
  if (ctl_send_conn(conn, CTL_DISC, 1))
    probe_send(conn->lane, conn, CTL_DISC);
  bye_resent(conn);
  conn_lost(conn, -XPORT_ECONNRESET, 0);
}

/* ---- the data path -------------------------------------------------------
 * One endpoint for many connections: the tag picks the connection, the
 * peer's receive tag on sends, ours on receives, which only the two ends
 * know. */

static ssize_t rdm_send(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t flags, uint64_t data)
{
  if (XPORT__UNLIKELY(flags)) {
    /* An empty message carries no scatter element. */
    struct fi_msg_tagged msg = {.msg_iov = iov, .desc = desc, .iov_count = req->len ? cnt : 0,
                                .addr = rconn(conn)->dest, .tag = rconn(conn)->tag,
                                .context = &req->fictx, .data = data};
    return fi_tsendmsg(conn->ep, &msg, flags);
  }
  if (cnt == 1)
    return fi_tsend(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], rconn(conn)->dest,
                    rconn(conn)->tag, &req->fictx);
  return fi_tsendv(conn->ep, iov, desc, cnt, rconn(conn)->dest, rconn(conn)->tag, &req->fictx);
}

static ssize_t rdm_inject(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                          uint32_t imm)
{
  if (with_imm)
    return fi_tinjectdata(conn->ep, buf, len, imm, rconn(conn)->dest, rconn(conn)->tag);
  return fi_tinject(conn->ep, buf, len, rconn(conn)->dest, rconn(conn)->tag);
}

/* Ignoring the write_imm bit lets an emulated write_imm's message
 * consume a receive like any other (the portable rule). */
static ssize_t rdm_recv(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt)
{
  if (cnt == 1)
    return fi_trecv(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], rconn(conn)->rx_src,
                    rconn(conn)->rx_tag, XPORT__WIMM_TAG, &req->fictx);
  return fi_trecvv(conn->ep, iov, desc, cnt, rconn(conn)->rx_src, rconn(conn)->rx_tag,
                   XPORT__WIMM_TAG, &req->fictx);
}

/* truncation_hangs: room behind the caller's buffer for the rest of a
 * longer message; the completion then says ETRUNC. */
static ssize_t rdm_recv_sunk(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                             void **desc, size_t cnt)
{
  iov[cnt].iov_base = conn->lane->sink;
  iov[cnt].iov_len = conn->lane->sink_len;
  desc[cnt] = NULL;
  return fi_trecvv(conn->ep, iov, desc, cnt + 1, rconn(conn)->rx_src, rconn(conn)->rx_tag,
                   XPORT__WIMM_TAG, &req->fictx);
}

/* The marker rides a tag bit, not the CQ data: some RDM providers carry
 * only 4 bytes of it (verbs;ofi_rxm). */
static ssize_t rdm_marker(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  struct fi_msg_tagged tm = {.msg_iov = NULL, .desc = NULL, .iov_count = 0,
                             .addr = rconn(conn)->dest, .tag = rconn(conn)->tag | XPORT__WIMM_TAG,
                             .context = &req->fictx, .data = req->imm};
  return fi_tsendmsg(conn->ep, &tm, FI_REMOTE_CQ_DATA | flags);
}

static int rdm_is_marker(const struct fi_cq_data_entry *e)
{
  return !!(((const struct fi_cq_tagged_entry *)(const void *)e)->tag & XPORT__WIMM_TAG);
}

static int rdm_open(struct xport__lane *lane)
{
  struct rdm_ctx *x = rctx(lane);
  /* A bound asked for but malformed fails closed: it is meant for peers
   * not trusted. */
  x->recv_ahead = xport__env_str(XPORT__ENV_RECV_AHEAD)
                      ? xport__env_size(XPORT__ENV_RECV_AHEAD, XPORT__RECV_AHEAD_BAD)
                      : 0;
  x->keepalive_ms = (long)xport__env_size(XPORT__ENV_KEEPALIVE_TIMEOUT, 30000);
  if (x->keepalive_ms < 4)
    x->keepalive_ms = 4;
  const char *ka = xport__env_str(XPORT__ENV_KEEPALIVE);
  x->keepalive_mode = !ka || !strcmp(ka, "auto") ? -1 : xport__env_bool(XPORT__ENV_KEEPALIVE, -1);
  x->directed = !!(lane->info->caps & FI_DIRECTED_RECV);
  x->multi_recv = (lane->info->caps & FI_MULTI_RECV) && lane->prof &&
                  lane->prof->unexpected_unbounded;
  XPORT__INFO("shared endpoints: receives %s their source, completions %s their sender",
              x->directed ? "name" : "cannot name", lane->source ? "name" : "do not name");
  return 0;
}

static ssize_t rdm_read(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t addr, uint64_t key)
{
  return xport__fi_read(conn->ep, rconn(conn)->dest, req, iov, desc, cnt, addr, key);
}

static ssize_t rdm_write(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt, uint64_t addr, uint64_t key, uint64_t flags,
                         uint64_t data)
{
  return xport__fi_write(conn->ep, rconn(conn)->dest, req, iov, desc, cnt, addr, key, flags,
                         data);
}

static ssize_t rdm_atomic_op(xport_conn_t *conn, struct xport__req *req, unsigned kind,
                             uint64_t *v, void *desc, uint64_t addr, uint64_t key)
{
  return xport__fi_atomic(conn->ep, rconn(conn)->dest, req, kind, v, desc, addr, key);
}

static const struct xport__data_ops rdm_data = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};
static const struct xport__data_ops rdm_data_sunk = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv_sunk,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};
static const struct xport__data_ops rdm_data_claimed = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv_claimed,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};

static void data_plain(xport_conn_t *conn)
{
  conn->ops = conn->lane->sink ? &rdm_data_sunk : &rdm_data;
}

static void data_claimed(xport_conn_t *conn)
{
  conn->ops = &rdm_data_claimed;
}

const struct xport__transport xport__transport_rdm = {
    .name = "rdm",
    .ep_type = FI_EP_RDM,
    .ctx_size = sizeof(struct rdm_ctx),
    .conn_size = sizeof(struct rdm_conn),
    .rx_reserved = XPORT__CTL_RX,
    .open = rdm_open,
    .listen = rdm_listen,
    .listener_close = rdm_listener_close,
    .connect = rdm_connect,
    .accept = rdm_accept,
    .close_conn = rdm_close,
    .drop = rdm_drop,
    .data = &rdm_data,
    .progress = rdm_progress,
    .pay_owed = rdm_pay_owed,
    .op_failed = rdm_op_failed,
    .fini = rdm_fini,
    .watches_peers = 1,
};
