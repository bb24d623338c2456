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

static void orphan_all(xport_conn_t *conn, int status);
static void shake_discard(xport_listener_t *lst, xport_conn_t *c, const char *why);

_Static_assert(XPORT__CTL_NONCE == XPORT__AUTH_NONCE && XPORT__CTL_MAC == XPORT__AUTH_MAC,
               "the wire carries what auth.c makes");
_Static_assert(XPORT__CTL_ADDR_MAX == XPORT__ADDR_MAX, "address sizes agree");
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "a request's len holds a tag (peek)");
_Static_assert(sizeof(struct xport__ctl) <= XPORT__CTL_SLOT, "a control message fits a slot");

/* A receive tag (rdm_wire.h) as a peer may name it. */
int rdm_tag_ok(uint64_t tag)
{
  return tag && !(tag & ~XPORT__TAG_MASK);
}

uint64_t rdm_pid_ns(void)
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
  FILE *f = fopen("/proc/sys/kernel/random/rdm_boot_id", "r");
  if (!f || !fgets(boot_id_buf, sizeof boot_id_buf, f))
    snprintf(boot_id_buf, sizeof boot_id_buf, "unknown");
  if (f)
    fclose(f);
  boot_id_buf[strcspn(boot_id_buf, "\n")] = '\0';
}

const char *rdm_boot_id(void)
{
  pthread_once(&boot_id_once, boot_id_read);
  return boot_id_buf;
}

xport_conn_t *rdm_find_conn(struct xport__lane *lane, uint32_t id)
{
  for (xport_conn_t *c = lane->conns; c; c = c->next)
    if (c->id == id)
      return c;
  return NULL;
}

/* The sender of m runs on this node, in this PID namespace: its pid
 * means what it says here. */
int rdm_same_node(const struct xport__ctl *m)
{
  return !strcmp(m->boot_id, rdm_boot_id()) && m->pidns == rdm_pid_ns() && m->pidns;
}

/* The sender of m is this very process (another of its contexts). */
int rdm_in_this_process(const struct xport__ctl *m)
{
  return rdm_same_node(m) && m->pid == (uint32_t)getpid();
}

/* Same node and PID namespace: watch the peer's process. Otherwise (or
 * when asked) exchange heartbeats. */
void rdm_watch_peer(xport_conn_t *conn, const struct xport__ctl *m)
{
  struct xport__lane *lane = conn->lane;
  conn->proc.pidfd = -1;
  rconn(conn)->last_heard = rconn(conn)->last_sent = xport__now_ms();
  if (rdm_same_node(m)) {
    rconn(conn)->peer_pid = m->pid;
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

static int rdm_may_post(const xport_conn_t *conn)
{
  const struct xport__profile *prof = conn->lane->prof;
  const struct xport__peer *p = rconn(conn)->peer;
  return !prof || !prof->peer_locked || !p || !prof->peer_locked(p->addr, p->addrlen);
}

/* Where conn's peer is: its endpoint's address where that is an IP
 * one (rxm over tcp or verbs), else its process on this node. */
static void rdm_peer_addr(const xport_conn_t *conn, char *buf, size_t len)
{
  const struct xport__peer *p = rconn(conn)->peer;
  if (p && !xport__format_sockaddr(p->addr, p->addrlen, buf, len))
    return;
  if (rconn(conn)->peer_pid)
    snprintf(buf, len, "local:%u", rconn(conn)->peer_pid);
  else
    buf[0] = '\0';
}

_Static_assert(XPORT__CTL_DATA_MAX == XPORT_CONN_DATA_MAX, "a request carries the user's data");

/* Takes a shared endpoint out of service for new connections: those
 * open a fresh one, and this one closes once its remaining connections
 * are closed or dead (rdm_rep_maybe_close). */
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
    rep_withdraw(rconn(conn)->rep); /* its one target is gone: it closes (rdm_dest_rep) */
  if (conn->orphans.n && lane->prof && lane->prof->dead_peer_lets_go)
    xport__zombie_show(lane->ctx, conn);
  else if (conn->orphans.n)
    rep_withdraw(rconn(conn)->rep);
  lane->reap = 1;
}

/* dead: the peer is gone (rather than closed), see conn_dead. */
void rdm_conn_lost(xport_conn_t *conn, int status, int dead)
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
  if (conn->app.handed)
    xport__evq_push(conn->lane->ctx, conn, xport__lost_status(status));
}

/* The rdm_answer to an RMA probe: judged at the next check, after one more
 * pass over the CQ, since shm may post the rdm_answer to an operation just
 * after xport last looked for answers. */
void rdm_rma_probe_answered(xport_conn_t *conn)
{
  if (rconn(conn)->ping_at)
    rconn(conn)->ponged = 1;
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
      if (!ret && (ret = rdm_rep_open(lane, NULL, name, &rep)))
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
      ret = rdm_rep_open(lane, info, NULL, &rep);
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
    rdm_answer(lst->rep, cr->ctl, CTL_CONNREJ, 1);
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
  rdm_rep_maybe_close(lst->rep);
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
  rdm_ops_plain(conn);
  /* The receive tag is the connection's secret: random, and unique on its
   * endpoint (its data receives match it exactly). */
  for (int unique = 0; !unique;) {
    rconn(conn)->rx_tag = xport__random_key(8) & XPORT__TAG_MASK;
    unique = rdm_tag_ok(rconn(conn)->rx_tag);
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
 * rdm_answer (struct xport__bye). */
static void conn_detach(xport_conn_t *conn, int said_bye)
{
  struct xport__rep *rep = rconn(conn)->rep;
  if (!said_bye || !rdm_bye_start(conn)) {
    if (conn->proc.pidfd >= 0)
      close(conn->proc.pidfd);
    rdm_peer_put(rep, rconn(conn)->peer);
  }
  conn->proc.pidfd = -1;
  rconn(conn)->peer = NULL;
  rconn(conn)->rep = NULL;
  conn->attached = 0;
  rep->nconns--;
  rep->ndead -= rconn(conn)->dead;
  rdm_rep_maybe_close(rep);
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
static int rdm_connect(struct xport__lane *lane, const char *host, const char *port,
                       const struct xport__conn_data *data, long deadline, xport_conn_t **conn_p)
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
  if ((ret = rdm_dest_rep(lane, addr, alen, &rep)))
    return ret;
  struct xport__peer *peer = rdm_peer_get(rep, addr, alen, &ret);
  if (!peer)
    return ret;
  xport_conn_t *conn = conn_new(rep, peer, 1);
  if (!conn) {
    rdm_peer_put(rep, peer);
    return -XPORT_ENOMEM;
  }
  /* A listener that is not there makes some providers push back for
   * ever (rxm) rather than fail: retry until the deadline. The first
   * request goes again, after 1, 2, 4 ... up to REQUEST_AGAIN_MS, until the
   * listener answers (on_connreq: it may want a request from where the
   * request says; its challenge, which on_ctl answers, may be lost). */
  /* Kept until the connect ends: a challenge asks for the request again. */
  conn->shake.data = *data;
  struct ctl_args a = {.src_id = conn->id, .tag = rconn(conn)->rx_tag, .data = &conn->shake.data};
  if (lane->ctx->auth_on) {
    xport__auth_nonce(rconn(conn)->auth); /* fresh: the listener's proof covers it */
    a.flags = CTL_F_AUTH;
    a.nonce = rconn(conn)->auth;
  }
  for (;;) {
    while ((ret = rdm_ctl_send(rep, peer->fi_addr, CTL_CONNREQ, &a)) == -XPORT_EAGAIN &&
           (ret = wait_progress(lane, deadline)) == 0)
      ;
    for (long gap = 1, again = xport__now_ms() + gap;
         !ret && conn->state == XPORT__CONN_CONNECTING;) {
      ret = wait_progress(lane, deadline);
      if (!ret && !rconn(conn)->challenged && conn->state == XPORT__CONN_CONNECTING &&
          xport__now_ms() >= again) {
        gap = gap * 2 < REQUEST_AGAIN_MS ? gap * 2 : REQUEST_AGAIN_MS;
        again = xport__now_ms() + gap;
        int r = rdm_ctl_send(rep, peer->fi_addr, CTL_CONNREQ, &a);
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
      rdm_withdraw(conn);
    conn_discard(conn);
    return ret;
  }
  /* The listener has no other sign that its acceptance reached us, and
   * that we did not give up first (peer_holds). */
  conn->peer_holds = 1;
  memset(&conn->shake.data, 0, sizeof conn->shake.data); /* the peer's: none */
  if (conn->state == XPORT__CONN_CONNECTED)
    rdm_ctl_send_conn(conn, CTL_KEEPALIVE, 0); /* a user call: it may wait for room */
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
  struct auth_end c = {req->nonce, req->ctx_id, req->tag,  req->src_id,
                       req->addr,  req->addrlen, req->data, req->datalen};
  struct auth_end l = {nonce,     lane->ctx->id, rconn(conn)->rx_tag, conn->id,
                       rep->addr, rep->addrlen,  NULL,                0};
  rdm_auth_proof(lane, 1, &c, &l, mac);
  rdm_auth_proof(lane, 0, &c, &l, rconn(conn)->auth); /* what the client owes */
  struct ctl_args a = {.src_id = conn->id,
                       .dst_id = rconn(conn)->peer_id,
                       .cookie = rconn(conn)->tag,
                       .tag = rconn(conn)->rx_tag,
                       .flags = CTL_F_AUTH,
                       .nonce = nonce,
                       .mac = mac};
  int ret = rdm_ctl_send(rep, rconn(conn)->dest, CTL_CONNACK, &a);
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
      rdm_answer(rep, cr->ctl, CTL_CONNREJ, 1); /* the layer that owns lst said no */
      free(cr->ctl);
      free(cr);
      continue;
    }
    struct xport__peer *peer = rdm_peer_get(rep, cr->ctl->addr, cr->ctl->addrlen, &ret);
    xport_conn_t *conn = peer ? conn_new(rep, peer, !lane->ctx->auth_on) : NULL;
    if (conn) {
      rconn(conn)->peer_id = cr->ctl->src_id;
      rconn(conn)->tag = cr->ctl->tag;
      conn->peer_ctx_id = cr->ctl->ctx_id;
      conn->shake.data.len = cr->ctl->datalen; /* parse checked */
      memcpy(conn->shake.data.bytes, cr->ctl->data, cr->ctl->datalen);
      rdm_watch_peer(conn, cr->ctl);
      struct ctl_args a = {.src_id = conn->id,
                           .dst_id = rconn(conn)->peer_id,
                           .cookie = rconn(conn)->tag,
                           .tag = rconn(conn)->rx_tag};
      ret = lane->ctx->auth_on ? shake_start(lst, cr->ctl, conn)
                         : rdm_ctl_send(rep, peer->fi_addr, CTL_CONNACK, &a);
    } else if (peer) {
      rdm_peer_put(rep, peer);
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
  rdm_claims_drop(conn);
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
void rdm_rma_failed(xport_conn_t *conn, int status)
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
      rdm_ctl_send_conn(o, CTL_DISC, 1);
      rdm_bye_resent(o);
      rdm_conn_lost(o, -XPORT_ECONNRESET, 0);
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
  int sent = connected && !conn->orphans.n ? rdm_ctl_send_conn(conn, CTL_DISC, 0) : -XPORT_EINVAL;
  int said_bye = sent == 0;
  if (conn->state == XPORT__CONN_CONNECTED || conn->state == XPORT__CONN_DISCONNECTED)
    rdm_sink_start(conn);
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
    ret = rdm_ctl_send(rconn(c)->rep, rconn(c)->dest, CTL_DISC, &a);
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
    if (rdm_rep_maybe_close(r))
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
int rdm_probe_ctl(struct xport__lane *lane, const struct xport__peer *to, uint32_t type,
                  const struct ctl_args *a)
{
  int ret = 0;
  if (!rctx(lane)->probe && (ret = rdm_anon_rep_open(lane, &rctx(lane)->probe)))
    return ret;
  struct xport__peer *p = rdm_peer_get(rctx(lane)->probe, to->addr, to->addrlen, &ret);
  if (!p)
    return ret;
  p->refs = 1; /* the probe endpoint holds each peer once, until it closes */
  struct ctl_args b = *a;
  b.to = to;
  return rdm_ctl_send(rctx(lane)->probe, p->fi_addr, type, &b);
}

static int probe_send(struct xport__lane *lane, xport_conn_t *c, uint32_t type)
{
  struct ctl_args a = {
      .src_id = c->id, .dst_id = rconn(c)->peer_id, .cookie = rconn(c)->tag, .once = 1};
  return rdm_probe_ctl(lane, rconn(c)->peer, type, &a);
}

/* The RMA probe, where a refused one-sided operation neither completes
 * nor fails (rma_never_fails, shm). An operation unanswered for
 * XPORT_RMA_TIMEOUT proves nothing by itself: the target may merely be
 * busy, outside xport. So xport pings the target, and only if the target
 * answers (it has taken everything sent before the ping off its queue,
 * which serves all its senders in order) while the operation is still
 * unanswered, concludes that it was refused. shm then holds back every
 * later rdm_answer to this endpoint: its connections are lost, and the
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
        rdm_conn_lost(o, -XPORT_ECONNRESET, 1);
      }
    probe_send(lane, c, CTL_DISC);
    rdm_conn_lost(c, -XPORT_EACCES, 1);
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
      int ret = rdm_ctl_send(rconn(c)->rep, rconn(c)->dest, CTL_KEEPALIVE, &a);
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
      rdm_discard_unused(rctx(lane)->cep);
    for (xport_listener_t *l = lane->listeners; l; l = l->next)
      if (l->rep)
        rdm_discard_unused(l->rep);
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
    if (!rdm_rep_maybe_close(r) && r->lingering == LINGER_LOOK)
      r->lingering = LINGER_OPEN;
  }
  if (rctx(lane)->byes)
    rdm_byes_expire(lane);
  if (rctx(lane)->sinks)
    rdm_sinks_expire(lane);
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
        int ret = rdm_ctl_send_conn(c, CTL_KEEPALIVE, 1);
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
        rdm_conn_lost(c, -XPORT_ECONNRESET, 1);
        continue;
      }
    }
    if (!pid_gone(c->proc.pidfd))
      continue;
    if (!drained) {
      /* What the provider finished before the death is not failed by it:
       * a receive rxm has all of, waiting only for its own rdm_answer to go
       * out, completes with its bytes, as the sender was told. */
      xport__cq_drain(lane);
      drained = 1;
    }
    XPORT__INFO("connection %u: the peer process is gone", c->id);
    c->proc.gone = 1;
    if (lane->prof && lane->prof->peer_gone)
      lane->prof->peer_gone(rconn(c)->peer->addr, rconn(c)->peer->addrlen);
    rdm_conn_lost(c, -XPORT_ECONNRESET, 1);
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
   * the endpoints now, and the peer, alive, would hear nothing. Its rdm_answer
   * is waited for in rdm_rep_close (rxm carries the goodbye behind the data
   * still going out), by a goodbye holding a reference of its own: the
   * peer's address must stay while the operations are the provider's. */
  for (xport_conn_t *c = lane->draining; c; c = c->drain.next)
    if (rconn(c)->said_bye < 0 && rconn(c)->rep && rconn(c)->rep->ep && rconn(c)->peer) {
      pay_bye(c, 1);
      if (rconn(c)->said_bye && rdm_bye_start(c))
        rconn(c)->peer->refs++;
    }
  rctx(lane)->rdm_closing = 1; /* nobody waits on the CQ any more */
  for (;;) { /* the retired (retire_eps) ones included */
    struct xport__rep *r = rctx(lane)->reps;
    while (r && r->parked)
      r = r->next;
    if (!r)
      break;
    rdm_rep_close(r);
  }
  while (rctx(lane)->reps) /* parked: nothing reads the CQ after them */
    rdm_rep_close(rctx(lane)->reps);
  rctx(lane)->cep = NULL;
  rctx(lane)->retired = NULL;
}

/* One-sided operations end their connection where they fail (rdm_rma_failed);
 * a message's failure is its connection's loss, which the provider
 * reports itself. */
static void rdm_op_failed(struct xport__lane *lane, struct xport__req *req, int status)
{
  (void)lane;
  if (req->conn)
    xport__conn_check_gone(req->conn); /* not a refusal, whatever the provider says */
  if (req->op == XPORT_OP_WRITE || req->op == XPORT_OP_READ || req->op == XPORT_OP_ATOMIC ||
      req->op == XPORT__OP_SILENT)
    rdm_rma_failed(req->conn, status);
}

/* XPORT_FAULT drop_conn, and a peer past XPORT_RECV_AHEAD (ahead): the
 * loss a refused key brings (rdm_rma_failed), a live peer told with a
 * goodbye: from the probe endpoint where its own pushes back, and again
 * where the provider may lose it (rdm_bye_resent). A peer past its
 * deadline (-XPORT_ETIMEDOUT) is told too, and taken for neither dead
 * nor gone: alive as far as anyone knows, it may still serve what the
 * provider holds for it, whose buffers are shown only when the provider
 * ends them, its death is seen, or the context goes (rxm keeps its
 * endpoints open until then: retire_eps). */
void rdm_drop(xport_conn_t *conn, int status)
{
  if (rdm_ctl_send_conn(conn, CTL_DISC, 1))
    probe_send(conn->lane, conn, CTL_DISC);
  rdm_bye_resent(conn);
  rdm_conn_lost(conn, status, 0);
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

/* 1 if a live listener of the node-local lane, of this user, has
 * host:port's name in this network namespace. */
static int rdm_here(const struct xport__lane *lane, const char *addr)
{
  char host[256], port[8], name[XPORT__ADDR_MAX];
  const struct xport__profile *p = lane->prof;
  if (!p || !p->listen_name || !p->name_alive ||
      xport__addr_split(addr, host, sizeof host, port, sizeof port))
    return 0;
  for (int any = 0; any < 2; any++) /* the host's own address, then the port's wildcard */
    if (!p->listen_name(host, port, any, name, sizeof name) && p->name_alive(name))
      return !p->name_same_user || p->name_same_user(name);
  return 0;
}

const struct xport__transport xport__transport_rdm = {
    .name = "rdm",
    .ep_type = FI_EP_RDM,
    .ctx_size = sizeof(struct rdm_ctx),
    .conn_size = sizeof(struct rdm_conn),
    .rx_reserved = XPORT__CTL_RX,
    .open = rdm_open,
    .listen = rdm_listen,
    .here = rdm_here,
    .listener_close = rdm_listener_close,
    .connect = rdm_connect,
    .peer_addr = rdm_peer_addr,
    .may_post = rdm_may_post,
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
