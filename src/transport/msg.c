/* The MSG transport: one libfabric endpoint per connection, made by the
 * connection manager. Its events arrive on the context's one EQ and are
 * dispatched here to the listener or connection they belong to; the
 * greeting (struct xport__hello) travels in the connection's private data.
 *
 * Where the provider has no trustworthy atomics (caps.atomics EMULATED)
 * every connection has a second endpoint, the service channel, made with
 * it, on which a request travels as a message and the target's xport
 * applies it with the CPU's atomic instructions, inside its own poll, and
 * answers with the old value. The channel's traffic never takes a receive
 * of the user's. It also keeps a dead peer from going unnoticed: tcp stops
 * reading a connection at a message no receive takes, and so never sees
 * the end of the stream behind it, while the channel, read to its end,
 * does. The wire format is in msg_wire.h.
 */
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

/* How long a request an accept took has to be connected, its service
 * channel included, which the client asks for as soon as it is. */
#define HANDSHAKE_MS 30000
/* How long a connected handshake waits for its service channel: the
 * client asks for it in the same breath, and one that does not (a
 * stranger who greeted and stopped) must not hold a slot of the
 * handshake budget for HANDSHAKE_MS. */
#define SVC_WAIT_MS 5000

struct cm_buf {
  struct fi_eq_cm_entry e;
  uint8_t data[256];
};

static void conn_discard(xport_conn_t *conn);
static void note_peer(xport_conn_t *conn, const struct fi_info *info);

/* This process's part of a greeting: where it runs. */
static void hello_whence(struct xport__hello *h)
{
  struct stat st;
  h->pid = (uint32_t)getpid();
  h->pidns = stat("/proc/self/ns/pid", &st) ? 0 : (uint64_t)st.st_ino;
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f || !fgets(h->boot_id, sizeof h->boot_id, f))
    snprintf(h->boot_id, sizeof h->boot_id, "unknown");
  if (f)
    fclose(f);
  h->boot_id[strcspn(h->boot_id, "\n")] = '\0';
}

/* The peer's pid where it means the same process here (same node and PID
 * namespace, another process), else 0. */
static uint32_t hello_local_pid(const struct xport__hello *h)
{
  struct xport__hello me;
  hello_whence(&me);
  int local = h->pidns && h->pidns == me.pidns &&
              !strncmp(h->boot_id, me.boot_id, sizeof me.boot_id) && h->pid != me.pid;
  return local ? h->pid : 0;
}

/* Watches the peer's process, where it runs here (pid, else 0). */
static void watch_pid(xport_conn_t *conn, uint32_t pid)
{
#ifdef SYS_pidfd_open
  if (pid && conn->proc.pidfd < 0)
    conn->proc.pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
  (void)conn;
  (void)pid;
#endif
}

/* How much of a greeting ep's connection data carries: the process tail
 * only where the provider has room for it (rdma_cm over verbs carries
 * 56 bytes less its own header; a longer one fails the connect). */
static size_t hello_len(struct fid_ep *ep)
{
  size_t room = 0, len = sizeof room;
  if (fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &room, &len) == 0 &&
      room >= sizeof(struct xport__hello))
    return sizeof(struct xport__hello);
  return offsetof(struct xport__hello, pid);
}

/* Validates a peer's greeting; 1 with it in *h, or 0. The process tail
 * is optional: a greeting that ends before it is whole names no process. */
int xport__hello_parse(const void *buf, size_t len, struct xport__hello *h)
{
  struct xport__hello m;
  if (len < offsetof(struct xport__hello, pid))
    return 0;
  memset(&m, 0, sizeof m);
  memcpy(&m, buf, len < sizeof m ? len : sizeof m);
  if (m.magic != HELLO_MAGIC || m.version != HELLO_VERSION)
    return 0;
  *h = m;
  return 1;
}

/* Closes the endpoint and gives every operation still outstanding on it
 * exactly one completion: what the provider flushes, and status
 * (-XPORT_ECANCELED at the user's close, -XPORT_ECONNRESET when the peer
 * went away) for whatever it did not report. */
static void conn_release_ep(xport_conn_t *conn, int status)
{
  struct xport__lane *lane = conn->lane;
  if (!conn->ep)
    return;
  xport__close_fid(lane->ctx, &conn->ep->fid);
  conn->ep = NULL;
  if (mconn(conn)->svc_gone_at) {
    mconn(conn)->svc_gone_at = 0;
    mctx(lane)->nsvc_gone--;
  }
  msg_svc_close(conn);
  xport__cq_drain(lane);
  msg_auth_end_reqs(conn);
  while (conn->out)
    xport__req_complete(lane->ctx, conn->out, status);
  xport__held_flush(conn, status);
  if (conn->proc.pidfd >= 0) /* peer_gone is settled: nothing more fails */
    close(conn->proc.pidfd);
  conn->proc.pidfd = -1;
}

static void conn_lost(xport_conn_t *conn, int status)
{
  if (conn->state == XPORT__CONN_CONNECTING) {
    conn->state = XPORT__CONN_FAILED;
    conn->fail_code = status;
  } else if (conn->state == XPORT__CONN_CONNECTED) {
    /* A dead connection's operations must not wait for a close that the
     * application may only call after seeing them end. */
    conn->state = XPORT__CONN_DISCONNECTED;
    xport__conn_check_gone(conn);
    conn_release_ep(conn, xport__lost_status(status));
    /* Only a connection the application holds has an event: one lost
     * in its handshake is dropped by the accept or connect making it. */
    if (conn->app.handed)
      xport__evq_push(conn->lane->ctx, conn, xport__lost_status(status));
  }
}

/* An endpoint of a connection failed or shut down: the connection, or
 * its service channel. The channel's end is not the connection's: a peer
 * that closes both ends the channel first as seen from here whenever the
 * connection's own stream is backed up (its FIN waits behind the data),
 * and ending the connection then would drop messages whose sends had
 * completed. The connection ends with its own endpoint. */
static void ep_lost(struct fid *fid, int status)
{
  xport_conn_t *conn = fid->context;
  if (mconn(conn)->svc && fid == &mconn(conn)->svc->fid) {
    if (mconn(conn)->svc_state == 1) {
      mconn(conn)->svc_state = -1;
      return;
    }
    msg_svc_lost(conn, status);
    /* A dead peer's connection may never hear of it by itself (tcp reads
     * nothing where no receive is posted): one that stays quiet ends. */
    if (conn->state == XPORT__CONN_CONNECTED && !mconn(conn)->svc_gone_at) {
      mconn(conn)->svc_gone_at = xport__now_ms();
      conn->heard.done_seen = conn->heard.done;
      mctx(conn->lane)->nsvc_gone++;
    }
    return;
  }
  conn_lost(conn, status);
}

/* Connections whose service channel the peer shut: lost once nothing on
 * them completed for XPORT_PEER_TIMEOUT. */
static void svc_gone_check(struct xport__lane *lane)
{
  long now = xport__now_ms();
  for (xport_conn_t *c = lane->conns; c; c = c->next) {
    if (!mconn(c)->svc_gone_at)
      continue;
    if (c->heard.done != c->heard.done_seen) {
      c->heard.done_seen = c->heard.done;
      mconn(c)->svc_gone_at = now;
    } else if (now - mconn(c)->svc_gone_at >= lane->ctx->peer_check_ms) {
      conn_lost(c, -XPORT_ECONNRESET);
    }
  }
}

/* A client's service channel: taken only for a connection whose
 * handshake is under way, named by the cookie only that client was told. */
static void on_svc_request(xport_listener_t *lst, struct fi_info *info,
                           const struct xport__hello *h) {
  xport_conn_t *conn = lst->shaking;
  while (conn && !(mconn(conn)->svc_cookie && h->cookie == mconn(conn)->svc_cookie))
    conn = conn->shake.next;
  struct xport__hello a = {.magic = HELLO_MAGIC, .version = HELLO_VERSION};
  int ret = -FI_EINVAL;
  if (conn && !mconn(conn)->svc && h->ctx_id == conn->peer_ctx_id) {
    a.ctx_id = lst->lane->ctx->id;
    ret = msg_svc_open(conn, info);
    if (!ret && (ret = fi_accept(mconn(conn)->svc, &a, hello_len(mconn(conn)->svc))))
      msg_svc_close(conn);
    mconn(conn)->svc_accepted = !ret;
  } else {
    /* A stranger's doing, as below: a debug line, so that strangers do not
     * decide how much a listener writes to stderr. */
    XPORT__DEBUG("listener %s: rejected a service channel no accepted connection asked for",
                lst->addr);
  }
  if (ret)
    fi_reject(lst->pep, info->handle, NULL, 0);
  fi_freeinfo(info);
}

static void on_connreq(xport_listener_t *lst, struct fi_info *info,
                       const uint8_t *data, size_t dlen)
{
  struct xport__connreq *cr;
  struct xport__hello h;
  if (!xport__hello_parse(data, dlen, &h)) {
    XPORT__DEBUG("listener %s: rejected a connection request without xport's "
                "greeting", lst->addr);
    fi_reject(lst->pep, info->handle, NULL, 0);
    fi_freeinfo(info);
    return;
  }
  if (h.flags & HELLO_SVC) {
    on_svc_request(lst, info, &h);
    return;
  }
  /* A key on one side only: refused, and the rejection says why (logged
   * at info level only: strangers must not decide what a listener writes
   * to stderr). */
  if (!!(h.flags & HELLO_AUTH) != lst->lane->ctx->auth_on) {
    struct xport__hello r = {.magic = HELLO_MAGIC, .version = HELLO_VERSION,
                             .flags = HELLO_AUTH_REJ, .ctx_id = lst->lane->ctx->id};
    XPORT__INFO("listener %s: refused a request %s", lst->addr,
                lst->lane->ctx->auth_on ? "without a key: authentication failed: the peer does not "
                                    "hold this listener's key"
                                  : "that offers a key: this listener has none "
                                    "(XPORT_AUTH_KEY_FILE)");
    fi_reject(lst->pep, info->handle, &r, offsetof(struct xport__hello, pid));
    fi_freeinfo(info);
    return;
  }
  /* Like listen(2), a bounded queue: beyond it, a request is refused at
   * once rather than held (each holds a socket). */
  if (lst->npending >= lst->backlog) {
    if (!lst->refusing)
      XPORT__INFO("listener %s: backlog of %zu full: refusing requests", lst->addr,
                  lst->backlog);
    lst->refusing = 1; /* logged once per overflow */
    fi_reject(lst->pep, info->handle, NULL, 0);
    fi_freeinfo(info);
    return;
  }
  cr = malloc(sizeof *cr);
  if (!cr) {
    fi_reject(lst->pep, info->handle, NULL, 0);
    fi_freeinfo(info);
    return;
  }
  lst->refusing = 0;
  cr->info = info;
  cr->peer_ctx_id = h.ctx_id;
  cr->want_svc = !!(h.flags & HELLO_WANT_SVC);
  cr->want_data = !!(h.flags & HELLO_DATA);
  cr->peer_pid = hello_local_pid(&h);
  cr->next = NULL;
  xport__connreq_push(lst, cr);
}

static void conn_broken(xport_conn_t *conn)
{
  if (mconn(conn)->broken || conn->closing || conn->state != XPORT__CONN_CONNECTED)
    return;
  mconn(conn)->broken = 1;
  mctx(conn->lane)->nbroken++;
}

/* Connections whose endpoint an operation's failure took down. On tcp
 * the provider also reports the shutdown, but verbs says nothing: the
 * failed operation (a refused key, a message longer than the receive)
 * put the QP in error, the rest of its work is flushed, and neither end
 * hears of it from the connection manager. */
static void lose_broken(struct xport__lane *lane)
{
  mctx(lane)->nbroken = 0;
  for (xport_conn_t *c = lane->conns, *next; c; c = next) {
    next = c->next;
    if (mconn(c)->broken) {
      mconn(c)->broken = 0;
      XPORT__DEBUG("a connection's endpoint failed under an operation: it is lost");
      conn_lost(c, -XPORT_ECONNRESET);
    }
  }
}

static void eq_read_all(struct xport__lane *lane)
{
  struct cm_buf buf;
  uint32_t event;

  for (;;) {
    /* tcp (1.17) reads a request's socket inside this call and takes a
     * short read with errno EAGAIN, left over from anything before, for
     * "more to come": a socket at its end (a stranger's, or one
     * halfopen.c shut) would then stay open, readable for ever. */
    errno = 0;
    ssize_t r = fi_eq_read(lane->eq, &event, &buf, sizeof buf, 0);
    if (r == -FI_EAGAIN)
      return;
    if (r == -FI_EAVAIL) {
      struct fi_eq_err_entry err;
      memset(&err, 0, sizeof err);
      if (fi_eq_readerr(lane->eq, &err, 0) < 0)
        return;
      int status = xport__err_from_fi(err.err ? err.err : FI_EIO);
      struct xport__hello rh;
      /* A rejection that says why: a key on one side only. */
      if (err.err == FI_ECONNREFUSED && err.err_data &&
          xport__hello_parse(err.err_data, err.err_data_size, &rh) &&
          (rh.flags & HELLO_AUTH_REJ)) {
        XPORT__WARN("authentication failed: %s", lane->ctx->auth_on
                    ? "the listener refused this context's key: it holds none"
                    : "the listener requires a key (XPORT_AUTH_KEY_FILE), and this context has "
                      "none");
        status = -XPORT_EACCES;
      }
      if (err.fid && err.fid->fclass == FI_CLASS_EP && err.fid->context)
        ep_lost(err.fid, status);
      continue;
    }
    if (r < 0) {
      XPORT__WARN("fi_eq_read: %s", fi_strerror((int)-r));
      return;
    }
    size_t dlen = (size_t)r > sizeof buf.e ? (size_t)r - sizeof buf.e : 0;
    switch (event) {
    case FI_CONNREQ: {
      /* A request the provider noticed only after its listener closed
       * (tcp: a client that connected while nobody polled) names an
       * endpoint that is gone: compared, never followed. */
      xport_listener_t *l = lane->listeners;
      while (l && (!l->pep || &l->pep->fid != buf.e.fid))
        l = l->next;
      if (l)
        on_connreq(l, buf.e.info, buf.data, dlen);
      else
        fi_freeinfo(buf.e.info);
      break;
    }
    case FI_CONNECTED: {
      /* The active side learns the server's context id from the accept
       * data; the passive side got the client's with the request. */
      xport_conn_t *conn = buf.e.fid->context;
      struct xport__hello h;
      if (mconn(conn)->svc && buf.e.fid == &mconn(conn)->svc->fid) {
        if (mconn(conn)->svc_state == 1)
          mconn(conn)->svc_state = 2;
        break;
      }
      if (conn->state != XPORT__CONN_CONNECTING)
        break;
      note_peer(conn, NULL); /* where the request's info did not say */
      if (conn->peer_ctx_id) {
        conn->state = XPORT__CONN_CONNECTED;
      } else if (xport__hello_parse(buf.data, dlen, &h) &&
                 !(h.flags & HELLO_AUTH) != !lane->ctx->auth_on) {
        XPORT__WARN("authentication failed: the listener accepted %s", lane->ctx->auth_on
                    ? "without a key" : "under a key, which this context has not");
        conn->state = XPORT__CONN_FAILED;
        conn->fail_code = -XPORT_EACCES;
      } else if (xport__hello_parse(buf.data, dlen, &h)) {
        conn->peer_ctx_id = h.ctx_id;
        watch_pid(conn, hello_local_pid(&h));
        mconn(conn)->svc_cookie = h.cookie;
        conn->state = XPORT__CONN_CONNECTED;
      } else {
        XPORT__WARN("connection accepted without xport's greeting; dropping it");
        conn->state = XPORT__CONN_FAILED;
        conn->fail_code = -XPORT_EPROTO;
      }
      break;
    }
    case FI_SHUTDOWN:
      ep_lost(buf.e.fid, -XPORT_ECONNRESET);
      break;
    default:
      break;
    }
  }
}

void msg_progress(struct xport__lane *lane)
{
  if (XPORT__UNLIKELY(mctx(lane)->nbroken))
    lose_broken(lane);
  if (XPORT__UNLIKELY(mctx(lane)->nsvc_gone))
    svc_gone_check(lane);
  if (!lane->eq)
    return;
  xport__halfopen_watch(lane, sizeof(struct xport__hello));
  eq_read_all(lane);
  /* Handshakes of a listener that accepts in the background move on
   * with the events just read. */
  if (XPORT__UNLIKELY(lane->ctx->nhooked))
    lane->ctx->auto_accept(lane->ctx);
}

/* Waits up to timeout_ms for an EQ event. Called with the progress lock
 * held (connect, accept), it lets go of it while it sleeps: the progress
 * thread must keep serving the other connections meanwhile. */
static int wait_eq(struct xport__lane *lane, int timeout_ms)
{
  struct fid *fids[1] = {&lane->eq->fid};
  if (lane->ctx->nlanes > 1) {
    /* The other transport's peers are served between short sleeps. */
    xport__progress_beside(lane);
    if (timeout_ms > 1)
      timeout_ms = 1;
  }
  if (lane->eq_fd >= 0) {
    if (fi_trywait(lane->fabric, fids, 1) != FI_SUCCESS)
      return 0;
    struct pollfd p = {.fd = lane->eq_fd, .events = POLLIN};
    XPORT__UNLOCK(lane->ctx);
    poll(&p, 1, timeout_ms);
    XPORT__LOCK(lane->ctx);
    return 0;
  }
  struct timespec ts = {0, 1000 * 1000};
  if (timeout_ms == 0)
    return 0;
  XPORT__UNLOCK(lane->ctx);
  nanosleep(&ts, NULL);
  XPORT__LOCK(lane->ctx);
  return 0;
}

/* Notes conn's peer's address (msg_conn peer): the one info names (the
 * listener's, or a request's client), else what the endpoint says once
 * connected (info NULL). */
static void note_peer(xport_conn_t *conn, const struct fi_info *info)
{
  char *p = mconn(conn)->peer;
  if (p[0])
    return;
  if (info) {
    if (info->dest_addr && xport__format_sockaddr(info->dest_addr, info->dest_addrlen, p,
                                                  sizeof mconn(conn)->peer))
      p[0] = '\0';
    return;
  }
  union {
    struct sockaddr_in6 s6;
    char raw[128];
  } sa;
  size_t n = sizeof sa;
  if (!conn->ep || fi_getpeer(conn->ep, &sa, &n) || n > sizeof sa ||
      xport__format_sockaddr(&sa, n, p, sizeof mconn(conn)->peer))
    p[0] = '\0';
}

static int ep_open(xport_conn_t *conn, struct fi_info *info)
{
  struct xport__lane *lane = conn->lane;
  note_peer(conn, info);
  int ret = fi_endpoint(lane->domain, info, &conn->ep, conn);
  if (ret)
    return ret;
  ret = fi_ep_bind(conn->ep, &lane->eq->fid, 0);
  if (!ret)
    ret = fi_ep_bind(conn->ep, &lane->cq->fid, FI_TRANSMIT | FI_RECV);
  if (!ret)
    ret = fi_enable(conn->ep);
  if (ret) {
    fi_close(&conn->ep->fid);
    conn->ep = NULL;
  }
  return ret;
}

/* Waits for a CONNECTING connection to settle; 0 when connected. */
static int wait_connected(xport_conn_t *conn, long deadline)
{
  struct xport__lane *lane = conn->lane;
  for (;;) {
    msg_progress(lane);
    if (conn->state == XPORT__CONN_CONNECTED || conn->state == XPORT__CONN_DISCONNECTED)
      return 0; /* connected, perhaps lost already: the event is queued */
    if (conn->state != XPORT__CONN_CONNECTING)
      return conn->fail_code ? conn->fail_code : -XPORT_ECONNREFUSED;
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    wait_eq(lane, left < 100 ? (int)left : 100);
  }
}

static void conn_discard(xport_conn_t *conn)
{
  struct xport__lane *lane = conn->lane;
  if (conn->ep)
    fi_close(&conn->ep->fid);
  conn->ep = NULL;
  if (mconn(conn)->auth_out) {
    xport__cq_drain(lane); /* what the close flushed ends here */
    msg_auth_end_reqs(conn);
  }
  xport__auth_wipe(mconn(conn)->auth, sizeof mconn(conn)->auth);
  msg_svc_close(conn);
  if (conn->proc.pidfd >= 0)
    close(conn->proc.pidfd);
  /* Lost while it was being made: its event must not outlive it. */
  xport__evq_remove(lane->ctx, conn);
  free(conn);
}

/* Waits for conn's service channel to connect: 0, or why not. */
static int wait_svc(xport_conn_t *conn, long deadline)
{
  struct xport__lane *lane = conn->lane;
  for (;;) {
    msg_progress(lane);
    if (mconn(conn)->svc_state == 2)
      return 0;
    if (conn->state != XPORT__CONN_CONNECTED)
      return -XPORT_ECONNRESET; /* lost since it connected */
    if (mconn(conn)->svc_state < 0)
      return -XPORT_ECONNREFUSED;
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    wait_eq(lane, left < 100 ? (int)left : 100);
  }
}

/* Takes the next request off lst's backlog and answers it: the new
 * connection joins the handshakes in progress. 0, or a code that ends
 * the accept (no memory). */
static int handshake_start(xport_listener_t *lst)
{
  struct xport__lane *lane = lst->lane;
  struct xport__hello h = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .ctx_id = lane->ctx->id};
  hello_whence(&h);
  struct xport__connreq *cr = lst->pending;
  lst->pending = cr->next;
  if (!lst->pending)
    lst->pending_tail = NULL;
  lst->npending--;
  xport_conn_t *conn = xport__conn_new(lane);
  if (conn) {
    conn->peer_ctx_id = cr->peer_ctx_id;
    watch_pid(conn, cr->peer_pid);
    if (cr->want_svc && lane->atom_emulated)
      mconn(conn)->svc_cookie = xport__random_key(8);
    h.cookie = mconn(conn)->svc_cookie;
  }
  int ret = conn ? 0 : -FI_ENOMEM;
  if (!ret && lst->admit && !lst->admit(lst->hook_arg, cr->peer_ctx_id))
    ret = -FI_ECONNREFUSED; /* the layer that owns lst said no */
  if (!ret)
    ret = ep_open(conn, cr->info);
  if (!ret && lane->ctx->auth_on) {
    /* Before the acceptance: the client's nonce comes as soon as it has it. */
    h.flags |= HELLO_AUTH;
    mconn(conn)->auth_state = AS_WAIT_HELLO;
    if (msg_auth_post_recv(conn, NULL))
      ret = -FI_ENOMEM;
  }
  if (!ret && cr->want_data) {
    /* Its data may come right behind the handshake: a receive of xport's
     * takes it, whichever of the handshake's it lands in (msg_auth.c). */
    conn->shake.data_due = 1;
    if (msg_auth_post_recv(conn, NULL))
      ret = -FI_ENOMEM;
  }
  if (!ret)
    ret = fi_accept(conn->ep, &h, hello_len(conn->ep));
  if (ret)
    fi_reject(lst->pep, cr->info->handle, NULL, 0);
  fi_freeinfo(cr->info);
  free(cr);
  if (ret) {
    XPORT__INFO("listener %s: accept failed: %s", lst->addr, fi_strerror(-ret));
    if (conn)
      conn_discard(conn);
    return ret == -FI_ENOMEM ? -XPORT_ENOMEM : 0;
  }
  conn->shake.deadline = xport__now_ms() + HANDSHAKE_MS;
  conn->shake.next = lst->shaking;
  lst->shaking = conn;
  lst->nshaking++;
  return 0;
}

/* The first handshake of lst that has ended well, taken off the list;
 * those that failed or ran out of time go. */
static xport_conn_t *handshake_done(xport_listener_t *lst)
{
  long now = xport__now_ms();
  for (xport_conn_t **pp = &lst->shaking; *pp;) {
    xport_conn_t *c = *pp;
    /* Under a key, only once the client proved it: nothing of its reaches
     * the application before. With its data, once that came. */
    int proven = (mconn(c)->auth_state == AS_NONE || mconn(c)->auth_state == AS_DONE) &&
                 !c->shake.data_due;
    int up = c->state == XPORT__CONN_CONNECTED &&
             (!mconn(c)->svc_cookie || mconn(c)->svc_state == 2) && proven;
    int lost =
        c->state == XPORT__CONN_DISCONNECTED ||
        (c->state == XPORT__CONN_CONNECTED && mconn(c)->svc_accepted && mconn(c)->svc_state < 0);
    if (c->state == XPORT__CONN_CONNECTED && mconn(c)->svc_cookie && !mconn(c)->svc &&
        c->shake.deadline > now + SVC_WAIT_MS)
      c->shake.deadline = now + SVC_WAIT_MS; /* once: it only moves nearer */
    int gone = c->state == XPORT__CONN_FAILED || lost || mconn(c)->svc_state < 0 ||
               mconn(c)->auth_state == AS_FAILED || now > c->shake.deadline;
    if (!up && !gone) {
      pp = &c->shake.next;
      continue;
    }
    *pp = c->shake.next;
    lst->nshaking--;
    /* The client asks for its service channel only once it has connected:
     * the request says it holds the connection. Without a channel there
     * is no later message to wait for. */
    c->peer_holds = up || mconn(c)->svc_accepted;
    /* Lost once the client could hold it (its connect ends when we have
     * accepted its last step, before we hear that step completed): it
     * is still a connection, handed out lost, with its disconnect event,
     * as the client closed it. */
    if (up || (lost && proven && (!mconn(c)->svc_cookie || mconn(c)->svc_accepted)))
      return c;
    /* This peer went away, or never finished its handshake. */
    XPORT__INFO("listener %s: a connection's handshake did not end", lst->addr);
    conn_discard(c);
  }
  return NULL;
}

/* Makes room in lst's handshake budget for a new request: the oldest
 * unfinished handshake goes (its client, if honest and only slow, is
 * refused and may try again). Finished ones never count here, since
 * accept hands them out at once, and requests waiting in the backlog are
 * answered in turn however many strangers greeted and stopped before
 * them. */
static void handshake_evict(xport_listener_t *lst)
{
  xport_conn_t **pp = &lst->shaking;
  while ((*pp)->shake.next) /* newest first: the oldest is last */
    pp = &(*pp)->shake.next;
  xport_conn_t *c = *pp;
  *pp = NULL;
  lst->nshaking--;
  XPORT__DEBUG("listener %s: %zu handshakes unfinished: the oldest is dropped", lst->addr,
               lst->backlog);
  conn_discard(c);
}

/* ---- the ops ----------------------------------------------------------- */

static int msg_listen(xport_listener_t *lst, const char *addr, const char *host, const char *port)
{
  struct xport__lane *lane = lst->lane;
  struct fi_info *info = NULL;
  int ret = xport__resolve(lane, host, port, FI_SOURCE, &info);
  if (ret)
    return ret;
  ret = fi_passive_ep(lane->fabric, info, &lst->pep, lst);
  if (!ret)
    ret = fi_pep_bind(lst->pep, &lane->eq->fid, 0);
  if (!ret) {
    /* Connection requests queue while the application accepts others. */
    int fi_backlog = lst->backlog > 65535 ? 65535 : (int)lst->backlog;
    fi_control(&lst->pep->fid, FI_BACKLOG, &fi_backlog);
    ret = fi_listen(lst->pep);
  }
  fi_freeinfo(info);
  if (ret) {
    if (lst->pep)
      fi_close(&lst->pep->fid);
    lst->pep = NULL;
    return ret == -FI_EADDRINUSE ? -XPORT_EADDRINUSE : xport__err_from_fi(ret);
  }
  union {
    struct sockaddr sa;
    struct sockaddr_in6 s6;
    char raw[128];
  } name;
  size_t nlen = sizeof name;
  if (fi_getname(&lst->pep->fid, &name, &nlen) == 0)
    xport__format_sockaddr(&name, nlen, lst->addr, sizeof lst->addr);
  else
    xport__strlcpy(lst->addr, addr, sizeof lst->addr);
  return 0;
}

static void msg_listener_close(xport_listener_t *lst)
{
  struct xport__lane *lane = lst->lane;
  /* Requests still waiting are refused, so that their clients hear it
   * now rather than at their timeout; then the endpoint goes. A client
   * that connected while nobody polled becomes a request only after a few
   * steps of the provider's progress (tcp: the socket is accepted, then its
   * greeting read): a few, a millisecond apart. */
  for (int i = 0; i < 4; i++) {
    if (i) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    msg_progress(lane);
  }
  while (lst->pending) {
    struct xport__connreq *cr = lst->pending;
    lst->pending = cr->next;
    fi_reject(lst->pep, cr->info->handle, NULL, 0);
    fi_freeinfo(cr->info);
    free(cr);
  }
  while (lst->shaking) { /* handshakes no accept will return */
    xport_conn_t *c = lst->shaking;
    lst->shaking = c->shake.next;
    conn_discard(c);
  }
  xport__close_fid(lane->ctx, &lst->pep->fid);
}

static int msg_connect(struct xport__lane *lane, const char *host, const char *port,
                       const struct xport__conn_data *data, long deadline, xport_conn_t **conn_p)
{
  struct xport__hello h = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .ctx_id = lane->ctx->id,
                           .flags = (lane->atom_emulated ? HELLO_WANT_SVC : 0) |
                                    (lane->ctx->auth_on ? HELLO_AUTH : 0) |
                                    (data->len ? HELLO_DATA : 0)};
  hello_whence(&h);
  struct fi_info *info = NULL;
  int ret = xport__resolve(lane, host, port, 0, &info);
  if (ret)
    return ret;
  xport_conn_t *conn = xport__conn_new(lane);
  if (!conn) {
    fi_freeinfo(info);
    return -XPORT_ENOMEM;
  }
  ret = ep_open(conn, info);
  if (!ret && lane->ctx->auth_on) {
    /* Before the request: the listener's answer may come at once. */
    mconn(conn)->auth_state = AS_WAIT_ANSWER;
    xport__auth_nonce(mconn(conn)->auth);
    if (msg_auth_post_recv(conn, NULL))
      ret = -FI_ENOMEM;
  }
  if (!ret)
    ret = fi_connect(conn->ep, info->dest_addr, &h, hello_len(conn->ep));
  if (ret) {
    fi_freeinfo(info);
    conn_discard(conn);
    return xport__err_from_fi(ret);
  }
  ret = wait_connected(conn, deadline);
  /* Under a key: the nonce goes first, then both prove it, before the
   * service channel and before anything of the user's. */
  if (!ret && lane->ctx->auth_on && !(ret = msg_auth_send(conn, AUTH_HELLO, mconn(conn)->auth, NULL)))
    ret = msg_wait_auth(conn, deadline);
  /* Then its data, before anything of the user's: the listener hands the
   * connection out once it came. */
  if (!ret && data->len)
    ret = msg_data_send(conn, data);
  /* The server asked for the service channel (emulated atomics): made
   * now, on the same listener, before the connection is the user's. */
  if (!ret && mconn(conn)->svc_cookie && lane->atom_emulated) {
    h.flags = HELLO_SVC;
    h.cookie = mconn(conn)->svc_cookie;
    ret = msg_svc_open(conn, info);
    if (!ret &&
        (ret = fi_connect(mconn(conn)->svc, info->dest_addr, &h, hello_len(mconn(conn)->svc))))
      ret = xport__err_from_fi(ret);
    /* The server takes that request as this side's word that it holds the
     * connection (peer_holds): once it is out, the connect waits for the
     * answer as long as the server waits for the request, whatever the
     * caller's timeout, rather than give up on a connection the server
     * may already count as made. */
    long svc_deadline = xport__now_ms() + SVC_WAIT_MS;
    if (deadline < 0 || deadline > svc_deadline)
      svc_deadline = deadline;
    if (!ret)
      ret = wait_svc(conn, svc_deadline);
  }
  fi_freeinfo(info);
  /* Accepted, and lost already (the peer closed at once): the caller gets
   * the connection and its disconnect event, as a moment later. */
  int lost = (!ret || ret == -XPORT_ECONNRESET) && conn->state == XPORT__CONN_DISCONNECTED;
  if (ret && !lost) {
    conn_discard(conn);
    return ret;
  }
  xport__conn_link(conn);
  conn->peer_holds = 1; /* its acceptance came */
  if (lost)
    xport__evq_push(lane->ctx, conn, -XPORT_ECONNRESET);
  *conn_p = conn;
  return 0;
}

/* 1 if a handshake of lst waits for a message of xport's (the proofs
 * under a key, a client's data), which come through the CQ. */
static int shaking_on_cq(const xport_listener_t *lst)
{
  if (lst->shaking && lst->lane->ctx->auth_on)
    return 1;
  for (const xport_conn_t *c = lst->shaking; c; c = c->shake.next)
    if (c->shake.data_due)
      return 1;
  return 0;
}

/* Handshakes run side by side, so that a peer that never finishes its
 * own (a service channel it never makes) holds up no other: each has
 * HANDSHAKE_MS (SVC_WAIT_MS once connected without its channel), whatever
 * the caller's timeout, and one still running when the timeout ends goes
 * on in the next call. At most backlog of them: beyond, the oldest
 * makes way (handshake_evict). */
static int msg_accept(xport_listener_t *lst, long deadline, xport_conn_t **conn_p)
{
  struct xport__lane *lane = lst->lane;
  for (;;) {
    int on_cq = shaking_on_cq(lst);
    if (on_cq)
      xport__cq_drain(lane); /* the handshakes' messages */
    msg_progress(lane);
    xport_conn_t *conn = handshake_done(lst);
    if (conn) {
      xport__conn_link(conn);
      if (conn->state == XPORT__CONN_DISCONNECTED)
        xport__evq_push(lane->ctx, conn, -XPORT_ECONNRESET);
      else if (mconn(conn)->svc_cookie && mconn(conn)->svc_state != 2)
        conn_lost(conn, -XPORT_ECONNRESET);
      *conn_p = conn;
      return 0;
    }
    if (lst->pending) {
      if (lst->nshaking >= lst->backlog)
        handshake_evict(lst);
      int ret = handshake_start(lst);
      if (ret)
        return ret;
      continue;
    }
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    /* The EQ's wait does not wake for the CQ, where handshakes under a key
     * go on: those are looked at every millisecond. */
    long most = on_cq ? 1 : 100;
    wait_eq(lane, (int)(left < most ? left : most));
  }
}

/* XPORT_FAULT drop_conn: the loss a peer's shutdown brings, whose
 * endpoint close ends the stream: the peer's provider sees the
 * shutdown in turn. */
static void msg_drop(xport_conn_t *conn, int status)
{
  conn_lost(conn, status);
}

static void msg_close_conn(xport_conn_t *conn)
{
  if (conn->state == XPORT__CONN_CONNECTED)
    fi_shutdown(conn->ep, 0);
  conn_release_ep(conn, -XPORT_ECANCELED);
}

/* Any failed operation: its endpoint may be down without a word. */
static void msg_op_failed(struct xport__lane *lane, struct xport__req *req, int status)
{
  (void)lane;
  (void)status;
  if (!req->conn)
    return;
  /* Whether the target died or refused a key, tcp ends the connection
   * the same way: only the target's process can tell them apart. */
  xport__conn_check_gone(req->conn);
  conn_broken(req->conn);
}

/* ---- the data path: an endpoint per connection ---------------------------- */

static ssize_t msg_send(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t flags, uint64_t data)
{
  if (flags == FI_REMOTE_CQ_DATA && cnt == 1)
    return fi_senddata(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], data, 0,
                       &req->fictx);
  /* Small sends still go inline, with a completion (verbs). */
  if (cnt == 1 && iov[0].iov_len && iov[0].iov_len <= conn->lane->caps.inject_size)
    flags |= FI_INJECT;
  if (flags) {
    /* An empty message carries no scatter element: some providers (verbs)
     * would look up a descriptor for it. */
    struct fi_msg msg = {.msg_iov = iov, .desc = desc, .iov_count = req->len ? cnt : 0,
                         .context = &req->fictx, .data = data};
    return fi_sendmsg(conn->ep, &msg, flags);
  }
  if (cnt == 1)
    return fi_send(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], 0, &req->fictx);
  return fi_sendv(conn->ep, iov, desc, cnt, 0, &req->fictx);
}

static ssize_t msg_inject(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                          uint32_t imm)
{
  if (with_imm)
    return fi_injectdata(conn->ep, buf, len, imm, 0);
  return fi_inject(conn->ep, buf, len, 0);
}

static ssize_t msg_recv(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt)
{
  if (cnt == 1)
    return fi_recv(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], 0, &req->fictx);
  return fi_recvv(conn->ep, iov, desc, cnt, 0, &req->fictx);
}

/* The marker rides the upper half of 8-byte CQ data. */
static ssize_t msg_marker(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  struct fi_msg msg = {.msg_iov = NULL, .desc = NULL, .iov_count = 0, .context = &req->fictx,
                       .data = XPORT__WIMM_MARK << 32 | req->imm};
  return fi_sendmsg(conn->ep, &msg, FI_REMOTE_CQ_DATA | flags);
}

static int msg_is_marker(const struct fi_cq_data_entry *e)
{
  return (e->data >> 32) == XPORT__WIMM_MARK;
}

/* An endpoint per connection: no address to name. */
static ssize_t msg_read(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t addr, uint64_t key)
{
  return xport__fi_read(conn->ep, 0, req, iov, desc, cnt, addr, key);
}

static ssize_t msg_write(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt, uint64_t addr, uint64_t key, uint64_t flags,
                         uint64_t data)
{
  return xport__fi_write(conn->ep, 0, req, iov, desc, cnt, addr, key, flags, data);
}

static ssize_t msg_atomic_op(xport_conn_t *conn, struct xport__req *req, unsigned kind,
                             uint64_t *v, void *desc, uint64_t addr, uint64_t key)
{
  return xport__fi_atomic(conn->ep, 0, req, kind, v, desc, addr, key);
}

static const struct xport__data_ops msg_data = {
    .send = msg_send,
    .inject = msg_inject,
    .recv = msg_recv,
    .marker = msg_marker,
    .is_marker = msg_is_marker,
    .read = msg_read,
    .write = msg_write,
    .atomic = msg_atomic_op,
};

static void msg_peer_addr(const xport_conn_t *conn, char *buf, size_t len)
{
  snprintf(buf, len, "%s", mconn(conn)->peer);
}

const struct xport__transport xport__transport_msg = {
    .name = "msg",
    .ep_type = FI_EP_MSG,
    .ctx_size = sizeof(struct msg_ctx),
    .conn_size = sizeof(struct msg_conn),
    .listen = msg_listen,
    .listener_close = msg_listener_close,
    .connect = msg_connect,
    .accept = msg_accept,
    .peer_addr = msg_peer_addr,
    .close_conn = msg_close_conn,
    .drop = msg_drop,
    .progress = msg_progress,
    .background = msg_progress,
    .op_failed = msg_op_failed,
    .atomic = msg_atomic,
    .data = &msg_data,
};
