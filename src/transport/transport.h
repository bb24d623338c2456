/* What a transport is to the core (src/transport/): its table, its data
 * path, and the parsers of what a peer sends. */
#ifndef XPORT_TRANSPORT_TRANSPORT_H
#define XPORT_TRANSPORT_TRANSPORT_H

#include "../core/objects.h"

/*
 * How connections are made and kept over one kind of endpoint: MSG (the
 * connection manager makes one endpoint per connection, transport/msg.c)
 * or RDM (one endpoint for many peers, and xport's own handshake,
 * transport/rdm.c). One table per transport, chosen at the context's
 * creation by the endpoint type its provider offers (transport/registry.c).
 * The core reaches a transport only through this table; a transport uses
 * the core's services below it (requests, the CQ, the event queue, the
 * connection list) and its own requests' on_done handlers, and reaches
 * the layers above only through the context's hooks (auto_accept).
 *
 * Every member is called with the context's lock held (XPORT__LOCK); a
 * member that may block says so, and lets go of the lock while it sleeps.
 * Mandatory unless marked "may be NULL".
 */
struct xport__transport {
  const char *name;      /* "msg", "rdm": what xport_info shows */
  enum fi_ep_type ep_type; /* the endpoints it runs on */
  /* The sizes of its private parts of a context (ctx->tpd) and of a
   * connection (conn->tpd), zeroed when made. */
  size_t ctx_size, conn_size;
  /* Receives of its own it keeps posted on an endpoint: what the user may
   * post is the provider's depth less these. */
  size_t rx_reserved;
  /* A transport of its own provider, with none of libfabric's behind it
   * (the provider-free tests' fake one): what it offers, as libfabric
   * describes a provider (fi_allocinfo'd; the lane frees it), in place of
   * the probe; its open then sets the lane's CQ. NULL for the transports
   * that run on the probe's choice (msg, rdm). */
  int (*describe)(struct fi_info **info_p);
  /* Fills its part of ctx, once the provider is open, the CQ and the
   * settings read (may be NULL); 0, or a code, logged. Does not block. */
  int (*open)(struct xport__lane *lane);
  /* Opens lst at host:port (addr the caller's string): lst->ctx and
   * backlog are set; on success lst->addr names it (a port 0 resolved).
   * 0, or a code with nothing of lst's left open. Does not block. */
  int (*listen)(xport_listener_t *lst, const char *addr, const char *host, const char *port);
  /* Refuses what waits on lst (its peers hear it now), discards its
   * unfinished handshakes and closes its endpoint; the caller frees lst.
   * Never fails. */
  void (*listener_close)(xport_listener_t *lst);
  /* For a lane beside the fabric (XPORT_SHM): 1 if a listener of this
   * node answers at addr on this lane, so that xport_connect tries it
   * first (it may still say "not this way": -XPORT_EADDRNOTAVAIL, and the
   * fabric carries the connection). NULL: never. */
  int (*here)(const struct xport__lane *lane, const char *addr);
  /* What a user should know of this lane that its candidate's reason
   * says after its verdict (a limit the host imposes), into buf; "" for
   * nothing. NULL: nothing ever. */
  void (*remark)(const struct xport__lane *lane, char *buf, size_t len);
  /* Makes a connection to host:port by deadline (xport__now_ms, or -1
   * for none), its request carrying data (len 0: none), which the
   * accepting side keeps in its conn->shake.data. May block. On success
   * *conn_p is linked (xport__conn_link), perhaps lost already with its
   * event queued; on failure nothing is left. */
  int (*connect)(struct xport__lane *lane, const char *host, const char *port,
                 const struct xport__conn_data *data, long deadline, xport_conn_t **conn_p);
  /* The next connection lst has made, waiting until deadline for one (0:
   * never waits). May block. As connect on success; -XPORT_ETIMEDOUT when
   * none came. */
  int (*accept)(xport_listener_t *lst, long deadline, xport_conn_t **conn_p);
  /* 1 if a handshake with the context peer_ctx_id is under way at lst
   * (its request read, its connection not yet accepted), so that a job
   * does not cross it with a connect of its own. NULL: the transport
   * keeps its handshakes on lst->shaking (xport__listener_shaking_from). */
  int (*shaking_from)(const xport_listener_t *lst, uint64_t peer_ctx_id);
  /* The user closes conn (conn->closing set, the caller then unlinks it
   * and marks it CLOSED): its share of the endpoint goes, and every
   * operation still outstanding completes with -XPORT_ECANCELED, now or
   * once the provider lets go of its buffer. Never fails; may wait a
   * bounded time for a peer's answer. */
  void (*close_conn)(xport_conn_t *conn);
  /* Housekeeping: connection events, broken endpoints, peer checks and
   * heartbeats, what closed connections still hold. Runs every
   * XPORT__EQ_EVERY polls and in waits; cheap when there is nothing to
   * do. Does not block. */
  void (*progress)(struct xport__lane *lane);
  /* Sends the heartbeats owed (ctx->ka_owed), one try each; run by every
   * poll while there are any. NULL where none are ever owed. */
  void (*pay_owed)(struct xport__lane *lane);
  /* What the progress thread runs while listeners accept in the
   * background, besides draining the CQ (may be NULL: the CQ brings
   * their requests). Does not block. */
  void (*background)(struct xport__lane *lane);
  /* A user operation failed (req finished with status, not yet
   * delivered): what that says of its connection (an endpoint the
   * provider took down, a target that refused a key). */
  void (*op_failed)(struct xport__lane *lane, struct xport__req *req, int status);
  /* Carries an atomic the provider cannot do (caps.atomics EMULATED;
   * may be NULL where the transport cannot): req is the user's, its
   * operands in req->atom; kind XPORT__ATOM_*. 0 once it is out (its
   * answer completes req), or a code with nothing posted. */
  int (*atomic)(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t key,
                uint64_t addr);
  /* 0 while a post to conn's peer would not return until the peer
   * moves (a provider lock the peer holds: profile peer_locked), so that
   * the held posts' retries in xport_poll pass it by until then (may be
   * NULL: never). */
  int (*may_post)(const xport_conn_t *conn);
  /* Fault injection (XPORT_FAULT drop_conn, src/core/fault.c): conn, CONNECTED,
   * is lost as if its peer had died, by the path a real loss takes (its
   * operations end with -XPORT_ECONNRESET, or 0 where the provider had
   * finished them; its disconnect event is queued), and its end reaches
   * the peer, which loses it too. Never fails; does not block. */
  void (*drop)(xport_conn_t *conn, int status);
  /* Where conn's peer is, into buf as struct xport_peer's addr says;
   * "" where the transport cannot tell (may be NULL: never). */
  void (*peer_addr)(const xport_conn_t *conn, char *buf, size_t len);
  /* The data path of its connections, unless it gives one another
   * (conn->ops). */
  const struct xport__data_ops *data;
  /* What xport grants a registration of its lane (XPORT_ACCESS_*), told
   * once it is made, where the transport itself checks remote rights
   * (xshm: libfabric's access bits cannot say "atomics only"); may be
   * NULL. */
  void (*mr_access)(struct fid_mr *mr, unsigned access);
  /* Ends every endpoint the transport opened, after the last connection
   * and listener closed and before the CQ closes; may be NULL. */
  void (*fini)(struct xport__lane *lane);
  /* 1: peers are watched by the clock (process checks, heartbeats): a
   * wait never sleeps past a quarter of XPORT_PEER_TIMEOUT while there
   * are connections, and runs progress when it wakes with nothing. */
  int watches_peers;
};
/* The transport of xport's own provider called name (XPORT_PROVIDER), or
 * NULL (transport/registry.c). */
const struct xport__transport *xport__transport_named(const char *name);
/* The transport for endpoints of type t, or NULL (transport/registry.c). */
const struct xport__transport *xport__transport_for(enum fi_ep_type t);
/* xport's own transport for peers on this node (XPORT_SHM=auto, only). */
const struct xport__transport *xport__transport_node_local(void);

/* The part of mr that lane's endpoints take (mr itself, or its second
 * lane's part), or NULL where mr belongs to another context. */
static inline const xport_mr_t *xport__mr_for(const xport_mr_t *mr,
                                              const struct xport__lane *lane)
{
  if (XPORT__LIKELY(mr->lane == lane))
    return mr;
  return mr->sub && mr->sub->lane == lane ? mr->sub : NULL;
}

#define XPORT__ACCESS_REMOTE                                                  \
  (XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_ATOMIC)

/* What a peer sends, parsed apart from acting on it, so that the fuzz
 * targets (test/fuzz/) reach the very code the transports run. Each
 * reads only [buf, buf + len) and writes its outputs only on success. */

/* A remote key's fields, as a blob (one key, or one per transport back
 * to back) offers them to a context of ctx's provider and mode whose
 * peer context is peer_ctx_id; key points into the blob. */
struct xport__rkey_wire {
  uint64_t addr, len;
  unsigned access;
  const uint8_t *key;
  size_t klen;
};
int xport__rkey_parse(const struct xport__lane *lane, uint64_t peer_ctx_id, const void *buf, size_t len,
                      struct xport__rkey_wire *k);
/* An RDM control message (rdm_wire.h): NULL with it in *m if it is well
 * formed, or why it is not. */
struct xport__ctl;
const char *xport__ctl_parse(const void *buf, size_t len, struct xport__ctl *m);
/* The MSG greeting (msg_wire.h) in a connection's private data: 1 with it
 * in *h, or 0. */
struct xport__hello;
int xport__hello_parse(const void *buf, size_t len, struct xport__hello *h);
/* A message on a service channel (msg_wire.h): XPORT__SVC_REQUEST,
 * XPORT__SVC_ANSWER or 0 for one to drop. */
enum { XPORT__SVC_REQUEST = 1, XPORT__SVC_ANSWER };
int xport__svc_kind(const void *buf, size_t len);
/* Applies the atomic a service request (ATOM_REQ_LEN bytes, passed by
 * xport__svc_kind) asks for to ctx's memory: 0 with the word's old value
 * in *old_p, or why it is refused; nothing outside a registration whose
 * key the request names, with the atomic right, is touched. */
int xport__svc_apply(struct xport__lane *lane, const uint8_t *m, uint64_t *old_p);

/* Checks the remote side of an operation against the unpacked key. */
static inline int xport__check_remote(const xport_conn_t *conn, const xport_rkey_t *rk,
                                      size_t offset, size_t len, unsigned need)
{
  if (XPORT__UNLIKELY(!rk || rk->conn != conn))
    return -XPORT_EINVAL;
  if (XPORT__UNLIKELY(offset > rk->len || len > rk->len - offset))
    return -XPORT_ERANGE;
  if (XPORT__UNLIKELY(!(rk->access & need)))
    return -XPORT_EACCES;
  return 0;
}

#define XPORT__SVC_DEPTH 8 /* emulated atomics outstanding per connection */

#endif /* XPORT_TRANSPORT_TRANSPORT_H */
