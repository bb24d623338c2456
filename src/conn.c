/* Listeners and connections over FI_EP_MSG: the connection manager's
 * events arrive on the context's one EQ and are dispatched here to the
 * listener or connection they belong to. */
#include "xport_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What both sides send in the connection's private data. A connection
 * request without it (a port scanner, another program) is rejected. */
#define HELLO_MAGIC 0x5850525455ULL /* "XPRTU" */
#define HELLO_VERSION 2
#define HELLO_WANT_SVC 0x1u /* request: the client would make a service channel */
#define HELLO_SVC 0x2u      /* request: this is that channel, for cookie */
struct hello {
  uint64_t magic;
  uint32_t version;
  uint32_t flags;
  uint64_t ctx_id; /* owner of the remote keys this side will pack */
  /* accept: nonzero asks the client for a service channel naming it;
   * a service channel's request: the cookie its accept gave */
  uint64_t cookie;
};
/* How long a request an accept took has to be connected, its service
 * channel included, which the client asks for as soon as it is. */
#define HANDSHAKE_MS 30000

struct cm_buf {
  struct fi_eq_cm_entry e;
  uint8_t data[256];
};

/* Validates a peer's greeting; 1 with it in *h, or 0. */
static int hello_ok(const uint8_t *data, size_t len, struct hello *h)
{
  if (len < sizeof *h)
    return 0;
  memcpy(h, data, sizeof *h);
  return h->magic == HELLO_MAGIC && h->version == HELLO_VERSION;
}

static void conn_discard(xport_conn_t *conn);

/* Queues a connection request at the tail of its listener's backlog. */
void xport__connreq_push(xport_listener_t *lst, struct xport__connreq *cr)
{
  XPORT__FIFO_PUSH(lst->pending, lst->pending_tail, cr, next);
  lst->npending++;
  if (lst->admit)
    lst->ctx->accept_due = 1;
}

void xport__evq_push(xport_ctx_t *ctx, xport_conn_t *conn, int status)
{
  if (conn->ev_queued)
    return;
  conn->ev_queued = 1;
  conn->ev_status = status;
  conn->ev_after = ctx->done_in;
  XPORT__FIFO_PUSH(ctx->evq, ctx->evq_tail, conn, ev_next);
}

void xport__evq_remove(xport_ctx_t *ctx, xport_conn_t *conn)
{
  xport_conn_t **pp = &ctx->evq, *prev = NULL;
  while (*pp && *pp != conn) {
    prev = *pp;
    pp = &(*pp)->ev_next;
  }
  if (!*pp)
    return;
  *pp = conn->ev_next;
  if (ctx->evq_tail == conn)
    ctx->evq_tail = prev;
  conn->ev_queued = 0;
}

/* Closes the endpoint and gives every operation still outstanding on it
 * exactly one completion: what the provider flushes, and status
 * (-XPORT_ECANCELED at the user's close, -XPORT_ECONNRESET when the peer
 * went away) for whatever it did not report. */
static void conn_release_ep(xport_conn_t *conn, int status)
{
  xport_ctx_t *ctx = conn->ctx;
  if (!conn->ep)
    return;
  xport__close_fid(ctx, &conn->ep->fid);
  conn->ep = NULL;
  if (conn->svc_gone_at) {
    conn->svc_gone_at = 0;
    ctx->nsvc_gone--;
  }
  xport__svc_close(conn);
  xport__cq_drain(ctx);
  while (conn->out)
    xport__req_complete(ctx, conn->out, status);
  xport__held_flush(conn, status);
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
    conn_release_ep(conn, -XPORT_ECONNRESET);
    /* Only a connection the application holds has an event: one lost
     * in its handshake is dropped by the accept or connect making it. */
    if (conn->handed)
      xport__evq_push(conn->ctx, conn, -XPORT_ECONNRESET);
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
  if (conn->svc && fid == &conn->svc->fid) {
    if (conn->svc_state == 1) {
      conn->svc_state = -1;
      return;
    }
    xport__svc_lost(conn, status);
    /* A dead peer's connection may never hear of it by itself (tcp reads
     * nothing where no receive is posted): one that stays quiet ends. */
    if (conn->state == XPORT__CONN_CONNECTED && !conn->svc_gone_at) {
      conn->svc_gone_at = xport__now_ms();
      conn->ndone_seen = conn->ndone;
      conn->ctx->nsvc_gone++;
    }
    return;
  }
  conn_lost(conn, status);
}

/* Connections whose service channel the peer shut: lost once nothing on
 * them completed for XPORT_PEER_TIMEOUT. */
static void svc_gone_check(xport_ctx_t *ctx)
{
  long now = xport__now_ms();
  for (xport_conn_t *c = ctx->conns; c; c = c->next) {
    if (!c->svc_gone_at)
      continue;
    if (c->ndone != c->ndone_seen) {
      c->ndone_seen = c->ndone;
      c->svc_gone_at = now;
    } else if (now - c->svc_gone_at >= ctx->peer_check_ms) {
      conn_lost(c, -XPORT_ECONNRESET);
    }
  }
}

/* A client's service channel: taken only for a connection whose
 * handshake is under way, named by the cookie only that client was told. */
static void on_svc_request(xport_listener_t *lst, struct fi_info *info, const struct hello *h)
{
  xport_conn_t *conn = lst->shaking;
  while (conn && !(conn->svc_cookie && h->cookie == conn->svc_cookie))
    conn = conn->shake_next;
  struct hello a = {.magic = HELLO_MAGIC, .version = HELLO_VERSION};
  int ret = -FI_EINVAL;
  if (conn && !conn->svc && h->ctx_id == conn->peer_ctx_id) {
    a.ctx_id = lst->ctx->id;
    ret = xport__svc_open(conn, info);
    if (!ret && (ret = fi_accept(conn->svc, &a, sizeof a)))
      xport__svc_close(conn);
    conn->svc_accepted = !ret;
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
  struct hello h;
  if (!hello_ok(data, dlen, &h)) {
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
  cr->next = NULL;
  xport__connreq_push(lst, cr);
}

void xport__conn_broken(xport_conn_t *conn)
{
  if (conn->broken || conn->closing || conn->state != XPORT__CONN_CONNECTED)
    return;
  conn->broken = 1;
  conn->ctx->nbroken++;
}

/* Connections whose endpoint an operation's failure took down. On tcp
 * the provider also reports the shutdown, but verbs says nothing: the
 * failed operation (a refused key, a message longer than the receive)
 * put the QP in error, the rest of its work is flushed, and neither end
 * hears of it from the connection manager. */
static void lose_broken(xport_ctx_t *ctx)
{
  ctx->nbroken = 0;
  for (xport_conn_t *c = ctx->conns, *next; c; c = next) {
    next = c->next;
    if (c->broken) {
      c->broken = 0;
      XPORT__DEBUG("a connection's endpoint failed under an operation: it is lost");
      conn_lost(c, -XPORT_ECONNRESET);
    }
  }
}

static void eq_read_all(xport_ctx_t *ctx)
{
  struct cm_buf buf;
  uint32_t event;

  for (;;) {
    ssize_t r = fi_eq_read(ctx->eq, &event, &buf, sizeof buf, 0);
    if (r == -FI_EAGAIN)
      return;
    if (r == -FI_EAVAIL) {
      struct fi_eq_err_entry err;
      memset(&err, 0, sizeof err);
      if (fi_eq_readerr(ctx->eq, &err, 0) < 0)
        return;
      if (err.fid && err.fid->fclass == FI_CLASS_EP && err.fid->context)
        ep_lost(err.fid, xport__err_from_fi(err.err ? err.err : FI_EIO));
      continue;
    }
    if (r < 0) {
      XPORT__WARN("fi_eq_read: %s", fi_strerror((int)-r));
      return;
    }
    size_t dlen = (size_t)r > sizeof buf.e ? (size_t)r - sizeof buf.e : 0;
    switch (event) {
    case FI_CONNREQ:
      on_connreq(buf.e.fid->context, buf.e.info, buf.data, dlen);
      break;
    case FI_CONNECTED: {
      /* The active side learns the server's context id from the accept
       * data; the passive side got the client's with the request. */
      xport_conn_t *conn = buf.e.fid->context;
      struct hello h;
      if (conn->svc && buf.e.fid == &conn->svc->fid) {
        if (conn->svc_state == 1)
          conn->svc_state = 2;
        break;
      }
      if (conn->state != XPORT__CONN_CONNECTING)
        break;
      if (conn->peer_ctx_id) {
        conn->state = XPORT__CONN_CONNECTED;
      } else if (hello_ok(buf.data, dlen, &h)) {
        conn->peer_ctx_id = h.ctx_id;
        conn->svc_cookie = h.cookie;
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

void xport__eq_dispatch(xport_ctx_t *ctx)
{
  if (XPORT__UNLIKELY(ctx->nbroken))
    lose_broken(ctx);
  if (XPORT__UNLIKELY(ctx->nsvc_gone))
    svc_gone_check(ctx);
  if (!ctx->eq)
    return;
  eq_read_all(ctx);
  /* Handshakes of a listener that accepts in the background move on
   * with the events just read. */
  if (XPORT__UNLIKELY(ctx->nhooked))
    xport__auto_accept(ctx);
}

/* Waits up to timeout_ms for an EQ event. Called with the progress lock
 * held (connect, accept), it lets go of it while it sleeps: the progress
 * thread must keep serving the other connections meanwhile. */
int xport__wait_eq(xport_ctx_t *ctx, int timeout_ms)
{
  struct fid *fids[1] = {&ctx->eq->fid};
  if (ctx->eq_fd >= 0) {
    if (fi_trywait(ctx->fabric, fids, 1) != FI_SUCCESS)
      return 0;
    struct pollfd p = {.fd = ctx->eq_fd, .events = POLLIN};
    XPORT__UNLOCK(ctx);
    poll(&p, 1, timeout_ms);
    XPORT__LOCK(ctx);
    return 0;
  }
  struct timespec ts = {0, 1000 * 1000};
  if (timeout_ms == 0)
    return 0;
  XPORT__UNLOCK(ctx);
  nanosleep(&ts, NULL);
  XPORT__LOCK(ctx);
  return 0;
}

/* fi_getinfo for host:port on the chosen provider: first on the chosen
 * domain (verbs and verbs;ofi_rxm endpoints must stay on their device),
 * then on any of the provider's (tcp names domains by interface, and the
 * endpoint still opens on ctx's domain). */
int xport__resolve(xport_ctx_t *ctx, const char *host, const char *port, uint64_t flags,
                   struct fi_info **info_p)
{
  int ret = -FI_ENODATA;
  for (int keep = 1; keep >= 0 && ret; keep--) {
    struct fi_info *h = fi_dupinfo(ctx->info);
    if (!h)
      return -XPORT_ENOMEM;
    free(h->src_addr);
    free(h->dest_addr);
    h->src_addr = h->dest_addr = NULL;
    h->src_addrlen = h->dest_addrlen = 0;
    h->addr_format = FI_FORMAT_UNSPEC;
    free(h->fabric_attr->name);
    h->fabric_attr->name = NULL;
    if (!keep) {
      free(h->domain_attr->name);
      h->domain_attr->name = NULL;
    }
    ret = fi_getinfo(XPORT__FI_VERSION, host, port, flags, h, info_p);
    fi_freeinfo(h);
  }
  if (ret == -FI_ENODATA && (flags & FI_SOURCE) && strcmp(port, "0")) {
    /* Some providers (verbs, rxm over it) bind while resolving: a taken
     * port then looks like a bad address. Tell the two apart. */
    struct fi_info *any = NULL;
    if (!xport__resolve(ctx, host, "0", flags, &any)) {
      fi_freeinfo(any);
      return -XPORT_EADDRINUSE;
    }
  }
  if (ret) {
    XPORT__INFO("cannot resolve %s:%s: %s", host, port, fi_strerror(-ret));
    return ret == -FI_ENODATA ? -XPORT_EADDRNOTAVAIL : xport__err_from_fi(ret);
  }
  return 0;
}

static int resolve(xport_ctx_t *ctx, const char *addr, uint64_t flags,
                   struct fi_info **info_p)
{
  char host[256], port[8];
  int ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
  return ret ? ret : xport__resolve(ctx, host, port, flags, info_p);
}

static void format_sockaddr(const struct sockaddr *sa, char *buf, size_t len)
{
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
    snprintf(buf, len, "%s:%u", ip, ntohs(s->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
    snprintf(buf, len, "[%s]:%u", ip, ntohs(s->sin6_port));
  } else {
    snprintf(buf, len, "?");
  }
}

static int xport_listen__locked(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  struct fi_info *info = NULL;
  xport_listener_t *lst;
  int ret;

  if (!ctx || !addr || !lst_p)
    return -XPORT_EINVAL;
  size_t backlog = xport__env_size(XPORT__ENV_LISTEN_BACKLOG, XPORT__BACKLOG_DEFAULT);
  if (backlog < 1)
    backlog = 1;
  if (ctx->rdm) {
    char host[256], port[8];
    ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
    if (ret)
      return ret;
    lst = calloc(1, sizeof *lst);
    if (!lst)
      return -XPORT_ENOMEM;
    lst->ctx = ctx;
    lst->backlog = backlog;
    ret = xport__rdm_listen(lst, host, port);
    if (ret) {
      free(lst);
      return ret;
    }
    goto linked;
  }
  ret = resolve(ctx, addr, FI_SOURCE, &info);
  if (ret)
    return ret;
  lst = calloc(1, sizeof *lst);
  if (!lst) {
    fi_freeinfo(info);
    return -XPORT_ENOMEM;
  }
  lst->ctx = ctx;
  lst->backlog = backlog;
  ret = fi_passive_ep(ctx->fabric, info, &lst->pep, lst);
  if (!ret)
    ret = fi_pep_bind(lst->pep, &ctx->eq->fid, 0);
  if (!ret) {
    /* Connection requests queue while the application accepts others. */
    int fi_backlog = backlog > 65535 ? 65535 : (int)backlog;
    fi_control(&lst->pep->fid, FI_BACKLOG, &fi_backlog);
    ret = fi_listen(lst->pep);
  }
  fi_freeinfo(info);
  if (ret) {
    if (lst->pep)
      fi_close(&lst->pep->fid);
    free(lst);
    return ret == -FI_EADDRINUSE ? -XPORT_EADDRINUSE : xport__err_from_fi(ret);
  }
  union {
    struct sockaddr sa;
    struct sockaddr_in6 s6;
    char raw[128];
  } name;
  size_t nlen = sizeof name;
  if (fi_getname(&lst->pep->fid, &name, &nlen) == 0)
    format_sockaddr(&name.sa, lst->addr, sizeof lst->addr);
  else
    xport__strlcpy(lst->addr, addr, sizeof lst->addr);
linked:
  XPORT__LIST_PUSH(ctx->listeners, lst, next, prev);
  *lst_p = lst;
  return 0;
}

XPORT_API int xport_listener_addr(const xport_listener_t *lst, char *buf, size_t len)
{
  if (!lst || !buf || !len)
    return -XPORT_EINVAL;
  size_t n = strlen(lst->addr);
  if (n + 1 > len)
    return -XPORT_ERANGE;
  memcpy(buf, lst->addr, n + 1);
  return 0;
}

static int xport_listener_close__locked(xport_listener_t *lst)
{
  if (!lst)
    return 0;
  xport_ctx_t *ctx = lst->ctx;
  xport__listener_hook(lst, NULL, NULL, NULL); /* what waits is refused */
  if (ctx->rdm) {
    xport__rdm_listener_close(lst);
  } else {
    /* Requests still waiting are refused, so that their clients hear it
     * now rather than at their timeout; then the endpoint goes. */
    xport__eq_dispatch(ctx);
    while (lst->pending) {
      struct xport__connreq *cr = lst->pending;
      lst->pending = cr->next;
      fi_reject(lst->pep, cr->info->handle, NULL, 0);
      fi_freeinfo(cr->info);
      free(cr);
    }
    while (lst->shaking) { /* handshakes no accept will return */
      xport_conn_t *c = lst->shaking;
      lst->shaking = c->shake_next;
      conn_discard(c);
    }
    xport__close_fid(ctx, &lst->pep->fid);
  }
  XPORT__LIST_UNLINK(ctx->listeners, lst, next, prev);
  free(lst);
  return 0;
}

static xport_conn_t *conn_new(xport_ctx_t *ctx)
{
  xport_conn_t *conn = calloc(1, sizeof *conn);
  if (!conn)
    return NULL;
  conn->ctx = ctx;
  conn->state = XPORT__CONN_CONNECTING;
  return conn;
}

void xport__conn_unlink(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  XPORT__LIST_UNLINK(ctx->conns, conn, next, prev);
  conn->next = conn->prev = NULL;
}

void xport__conn_link(xport_conn_t *conn)
{
  conn->handed = 1;
  xport_ctx_t *ctx = conn->ctx;
  XPORT__LIST_PUSH(ctx->conns, conn, next, prev);
}

static int ep_open(xport_conn_t *conn, struct fi_info *info)
{
  xport_ctx_t *ctx = conn->ctx;
  int ret = fi_endpoint(ctx->domain, info, &conn->ep, conn);
  if (ret)
    return ret;
  ret = fi_ep_bind(conn->ep, &ctx->eq->fid, 0);
  if (!ret)
    ret = fi_ep_bind(conn->ep, &ctx->cq->fid, FI_TRANSMIT | FI_RECV);
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
  xport_ctx_t *ctx = conn->ctx;
  for (;;) {
    xport__eq_dispatch(ctx);
    if (conn->state == XPORT__CONN_CONNECTED || conn->state == XPORT__CONN_DISCONNECTED)
      return 0; /* connected, perhaps lost already: the event is queued */
    if (conn->state != XPORT__CONN_CONNECTING)
      return conn->fail_code ? conn->fail_code : -XPORT_ECONNREFUSED;
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    xport__wait_eq(ctx, left < 100 ? (int)left : 100);
  }
}

static void conn_discard(xport_conn_t *conn)
{
  xport_ctx_t *ctx = conn->ctx;
  if (conn->ep)
    fi_close(&conn->ep->fid);
  conn->ep = NULL;
  xport__svc_close(conn);
  /* Lost while it was being made: its event must not outlive it. */
  xport__evq_remove(ctx, conn);
  free(conn);
}

/* Waits for conn's service channel to connect: 0, or why not. */
static int wait_svc(xport_conn_t *conn, long deadline)
{
  xport_ctx_t *ctx = conn->ctx;
  for (;;) {
    xport__eq_dispatch(ctx);
    if (conn->svc_state == 2)
      return 0;
    if (conn->state != XPORT__CONN_CONNECTED)
      return -XPORT_ECONNRESET; /* lost since it connected */
    if (conn->svc_state < 0)
      return -XPORT_ECONNREFUSED;
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    xport__wait_eq(ctx, left < 100 ? (int)left : 100);
  }
}

static int xport_connect__locked(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                            xport_conn_t **conn_p)
{
  struct hello h = {.magic = HELLO_MAGIC, .version = HELLO_VERSION};
  struct fi_info *info = NULL;
  if (ctx) {
    h.ctx_id = ctx->id;
    h.flags = ctx->atom_emulated ? HELLO_WANT_SVC : 0;
  }
  xport_conn_t *conn;
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;
  int ret;

  if (!ctx || !addr || !conn_p)
    return -XPORT_EINVAL;
  if (ctx->rdm) {
    char host[256], port[8];
    ret = xport__addr_split(addr, host, sizeof host, port, sizeof port);
    return ret ? ret : xport__rdm_connect(ctx, host, port, deadline, conn_p);
  }
  ret = resolve(ctx, addr, 0, &info);
  if (ret)
    return ret;
  conn = conn_new(ctx);
  if (!conn) {
    fi_freeinfo(info);
    return -XPORT_ENOMEM;
  }
  ret = ep_open(conn, info);
  if (!ret)
    ret = fi_connect(conn->ep, info->dest_addr, &h, sizeof h);
  if (ret) {
    fi_freeinfo(info);
    conn_discard(conn);
    return xport__err_from_fi(ret);
  }
  ret = wait_connected(conn, deadline);
  /* The server asked for the service channel (emulated atomics): made
   * now, on the same listener, before the connection is the user's. */
  if (!ret && conn->svc_cookie && ctx->atom_emulated) {
    h.flags = HELLO_SVC;
    h.cookie = conn->svc_cookie;
    ret = xport__svc_open(conn, info);
    if (!ret && (ret = fi_connect(conn->svc, info->dest_addr, &h, sizeof h)))
      ret = xport__err_from_fi(ret);
    if (!ret)
      ret = wait_svc(conn, deadline);
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
  if (lost)
    xport__evq_push(ctx, conn, -XPORT_ECONNRESET);
  *conn_p = conn;
  return 0;
}

/* Takes the next request off lst's backlog and answers it: the new
 * connection joins the handshakes in progress. 0, or a code that ends
 * the accept (no memory). */
static int handshake_start(xport_listener_t *lst)
{
  xport_ctx_t *ctx = lst->ctx;
  struct hello h = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .ctx_id = ctx->id};
  struct xport__connreq *cr = lst->pending;
  lst->pending = cr->next;
  if (!lst->pending)
    lst->pending_tail = NULL;
  lst->npending--;
  xport_conn_t *conn = conn_new(ctx);
  if (conn) {
    conn->peer_ctx_id = cr->peer_ctx_id;
    if (cr->want_svc && ctx->atom_emulated)
      conn->svc_cookie = xport__random_key(8);
    h.cookie = conn->svc_cookie;
  }
  int ret = conn ? 0 : -FI_ENOMEM;
  if (!ret && lst->admit && !lst->admit(lst->hook_arg, cr->peer_ctx_id))
    ret = -FI_ECONNREFUSED; /* the layer that owns lst said no */
  if (!ret)
    ret = ep_open(conn, cr->info);
  if (!ret)
    ret = fi_accept(conn->ep, &h, sizeof h);
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
  conn->shake_deadline = xport__now_ms() + HANDSHAKE_MS;
  conn->shake_next = lst->shaking;
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
    int up = c->state == XPORT__CONN_CONNECTED && (!c->svc_cookie || c->svc_state == 2);
    int lost = c->state == XPORT__CONN_DISCONNECTED ||
               (c->state == XPORT__CONN_CONNECTED && c->svc_accepted && c->svc_state < 0);
    int gone = c->state == XPORT__CONN_FAILED || lost || c->svc_state < 0 ||
               now > c->shake_deadline;
    if (!up && !gone) {
      pp = &c->shake_next;
      continue;
    }
    *pp = c->shake_next;
    lst->nshaking--;
    /* Lost once the client could hold it (its connect ends when we have
     * accepted its last step, before we hear that step completed): it
     * is still a connection, handed out lost, with its disconnect event,
     * as the client closed it. */
    if (up || (lost && (!c->svc_cookie || c->svc_accepted)))
      return c;
    /* This peer went away, or never finished its handshake. */
    XPORT__INFO("listener %s: a connection's handshake did not end", lst->addr);
    conn_discard(c);
  }
  return NULL;
}

/* Handshakes run side by side, so that a peer that never finishes its
 * own (a service channel it never makes) holds up no other: each has
 * HANDSHAKE_MS, whatever the caller's timeout, and one still running
 * when the timeout ends goes on in the next call. */
static int xport_accept__locked(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  long deadline = timeout_ms < 0 ? -1 : xport__now_ms() + timeout_ms;

  if (!lst || !conn_p)
    return -XPORT_EINVAL;
  xport_ctx_t *ctx = lst->ctx;
  if (ctx->rdm)
    return xport__rdm_accept(lst, deadline, conn_p);
  for (;;) {
    xport__eq_dispatch(ctx);
    xport_conn_t *conn = handshake_done(lst);
    if (conn) {
      xport__conn_link(conn);
      if (conn->state == XPORT__CONN_DISCONNECTED)
        xport__evq_push(ctx, conn, -XPORT_ECONNRESET);
      else if (conn->svc_cookie && conn->svc_state != 2)
        conn_lost(conn, -XPORT_ECONNRESET);
      *conn_p = conn;
      return 0;
    }
    if (lst->pending && lst->nshaking < lst->backlog) {
      int ret = handshake_start(lst);
      if (ret)
        return ret;
      continue;
    }
    long left = deadline < 0 ? 100 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    xport__wait_eq(ctx, left < 100 ? (int)left : 100);
  }
}

void xport__listener_hook(xport_listener_t *lst, int (*admit)(void *, uint64_t),
                          void (*accepted)(void *, xport_conn_t *), void *arg)
{
  lst->ctx->nhooked += (admit != NULL) - (lst->admit != NULL);
  lst->admit = admit;
  lst->accepted = accepted;
  lst->hook_arg = arg;
  if (admit && lst->pending)
    lst->ctx->accept_due = 1;
}

int xport__listener_shaking_from(const xport_listener_t *lst, uint64_t peer_ctx_id)
{
  for (const xport_conn_t *c = lst->shaking; c; c = c->shake_next)
    if (c->peer_ctx_id == peer_ctx_id)
      return 1;
  return 0;
}

/* Runs where the context makes progress (EQ dispatch, the RDM drain and
 * housekeeping), and so inside a connect that waits: two peers that
 * connect to each other at once each accept the other meanwhile. An
 * accept that would wait does not: a timeout of 0. */
void xport__auto_accept(xport_ctx_t *ctx)
{
  if (ctx->in_auto)
    return;
  ctx->in_auto = 1;
  ctx->accept_due = 0;
  for (xport_listener_t *l = ctx->listeners, *next; l; l = next) {
    next = l->next;
    if (!l->admit)
      continue;
    xport_conn_t *conn;
    while ((l->pending || l->shaking) && xport_accept__locked(l, 0, &conn) == 0)
      l->accepted(l->hook_arg, conn);
  }
  ctx->in_auto = 0;
}

void xport__conn_free_if_done(xport_conn_t *conn)
{
  /* An RDM connection also waits to be detached from its endpoint. */
  if (conn->state == XPORT__CONN_CLOSED && conn->nreqs == 0 && !conn->ev_queued && !conn->rep)
    free(conn);
}

static int xport_conn_close__locked(xport_conn_t *conn)
{
  if (!conn)
    return 0;
  xport_ctx_t *ctx = conn->ctx;
  /* A closed handle is no handle (xport_conn_close(3)): this catches a
   * second close only while completions keep the memory, and promises
   * nothing. */
  if (conn->state == XPORT__CONN_CLOSED)
    return -XPORT_EINVAL;
  conn->closing = 1;
  if (ctx->rdm) {
    xport__rdm_close(conn);
  } else {
    if (conn->state == XPORT__CONN_CONNECTED)
      fi_shutdown(conn->ep, 0);
    conn_release_ep(conn, -XPORT_ECANCELED);
  }
  xport__evq_remove(ctx, conn);
  xport__conn_unlink(conn);
  conn->state = XPORT__CONN_CLOSED;
  xport__conn_free_if_done(conn);
  return 0;
}

XPORT_API int xport_listen(xport_ctx_t *ctx, const char *addr, xport_listener_t **lst_p)
{
  if (!ctx)
    return xport_listen__locked(ctx, addr, lst_p);
  xport_ctx_t *lctx = ctx;
  XPORT__LOCK(lctx);
  int ret = xport_listen__locked(ctx, addr, lst_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_listener_close(xport_listener_t *lst)
{
  if (!lst)
    return xport_listener_close__locked(lst);
  xport_ctx_t *lctx = lst->ctx;
  XPORT__LOCK(lctx);
  int ret = xport_listener_close__locked(lst);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_connect(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                            xport_conn_t **conn_p)
{
  if (!ctx)
    return xport_connect__locked(ctx, addr, timeout_ms, conn_p);
  xport_ctx_t *lctx = ctx;
  XPORT__LOCK(lctx);
  int ret = xport_connect__locked(ctx, addr, timeout_ms, conn_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_accept(xport_listener_t *lst, int timeout_ms, xport_conn_t **conn_p)
{
  if (!lst)
    return xport_accept__locked(lst, timeout_ms, conn_p);
  xport_ctx_t *lctx = lst->ctx;
  XPORT__LOCK(lctx);
  int ret = xport_accept__locked(lst, timeout_ms, conn_p);
  XPORT__UNLOCK(lctx);
  return ret;
}

XPORT_API int xport_conn_close(xport_conn_t *conn)
{
  if (!conn)
    return xport_conn_close__locked(conn);
  xport_ctx_t *lctx = conn->ctx;
  XPORT__LOCK(lctx);
  if (conn->owned && conn->state != XPORT__CONN_CLOSED) {
    XPORT__UNLOCK(lctx);
    XPORT__WARN("connection %llu belongs to a job: xport_job_fini closes it",
                (unsigned long long)conn->id);
    return -XPORT_EPERM;
  }
  int ret = xport_conn_close__locked(conn);
  XPORT__UNLOCK(lctx);
  return ret;
}
