/* The RDM transport's private state (transport/rdm.c): what it keeps in a
 * context, a connection, and its shared endpoints. Only the transport's
 * own files include it. */
#ifndef XPORT_TRANSPORT_RDM_H
#define XPORT_TRANSPORT_RDM_H

#include "../xport_int.h"

/* A peer endpoint in an RDM endpoint's address vector. */
struct xport__peer {
  struct xport__peer *next;
  fi_addr_t fi_addr;
  size_t refs;
  long quiet_until;   /* an answer to it failed: answer none before (ms) */
  int unreached;      /* our first message waits there, untaken (peer_may_map) */
  /* It took a message of ours: it has mapped us, and a push-back now
   * means its queue is full (a peer busy or hung), never an unmapped one. */
  int taken;
  size_t addrlen;
  uint8_t addr[XPORT__ADDR_MAX];
};

/* An RDM endpoint shared by many connections: the context's one for
 * outgoing connections, or a listener's. */
#define XPORT__CTL_RX 8
#define XPORT__REFUSED_KEEP 16
#define XPORT__SEEN_KEEP 256
struct xport__rep {
  struct xport__lane *lane;
  struct fid_ep *ep;
  struct fid_av *av;
  xport_listener_t *lst;          /* NULL for the context's own */
  size_t nconns;                  /* connections attached to this endpoint */
  size_t ndead;                   /* of which the peer is known dead */
  /* Withdrawn: no new connection uses it; it closes once every
   * connection still attached is closed or dead, which releases what its
   * dead peers' operations hold (shm never completes them). */
  int withdrawn;
  int closing;
  /* Housekeeping's close waits, pass after pass, for control messages in
   * flight and goodbyes until then (rep_maybe_close); 0: not asked yet. */
  long quiet_by;
  /* Its close found a live peer yet to take its first message: open,
   * serving nobody, and looked at again by the peer checks (rdm_progress)
   * until that peer takes it or dies, which ends what it still holds. */
  int lingering;
  int rma_failed;                 /* a one-sided operation on it failed */
  size_t unreached;               /* peers with unreached set */
  int parked;                     /* left open at the context's end (settle_names) */
  struct xport__rep *next, *prev; /* lane->reps */
  struct xport__peer *peers;
  struct xport__req *ctl_out;     /* control messages in flight */
  struct xport__req *ctl_rx[XPORT__CTL_RX];
  /* Requesters lately refused or challenged, kept in the AV (transport/rdm.c). */
  struct xport__peer *refused[XPORT__REFUSED_KEEP];
  long refused_ms[XPORT__REFUSED_KEEP];             /* when each was last refused */
  unsigned refused_next;
  size_t answering;               /* refusals and challenges in flight */
  /* The last requests queued, by (context id, connection id): a client
   * asks again until answered, and a copy that comes after its request
   * was accepted must not be queued again (transport/rdm.c, on_connreq). */
  struct { uint64_t ctx_id; uint32_t src_id; } seen[XPORT__SEEN_KEEP];
  unsigned seen_next;
  uint64_t secret[2];             /* keys the challenge tokens (listeners) */
  char name[XPORT__ADDR_MAX];     /* claimed name (named providers) */
  int lock;
  int port_fd;                    /* holds the listener's port number (rdm.c hold_port) */
  size_t addrlen;
  uint8_t addr[XPORT__ADDR_MAX];  /* fi_getname */
  int enabled;                    /* fi_enable succeeded */
  /* Serves outgoing connections to this address only (answers_in_order):
   * a target that dies stalls no other target's answers. */
  size_t dest_len;
  uint8_t dest_addr[XPORT__ADDR_MAX];
  struct xport__rep *next_retired; /* lane->retired (profile retire_eps) */
};

/* Its part of a connection (conn->tpd). */
struct rdm_conn {
  struct xport__rep *rep;
  struct xport__peer *peer;
  fi_addr_t dest;                 /* the peer's address in rep's address vector */
  /* Under a key (ctx->auth_on): the client's nonce until the listener's
   * answer; on the listener's side, the proof the client owes, until it
   * comes (then the connection is accepted). Wiped once used. */
  uint8_t auth[XPORT__AUTH_MAC];
  uint64_t tag;                   /* tag of messages to the peer: its receive tag */
  uint64_t rx_tag;                /* tag of messages from the peer: random, ours */
  fi_addr_t rx_src;               /* receives match only this source (or any) */
  /* Messages the peer sent ahead of our receives, taken off the
   * provider's unexpected queue and counted (peek_discard: claim),
   * oldest first: the next receives take them. */
  struct xport__req *claimed, *claimed_tail;
  size_t nclaimed;
  uint32_t peer_id;
  uint32_t peer_pid;              /* its process, where on this node (else 0) */
  int keepalive;                  /* heartbeats: the peer's process cannot be watched */
  long last_heard, last_sent;     /* heartbeats, xport__now_ms() */
  int ka_owed;                    /* the provider pushed the last heartbeat back */
  long ping_at;                   /* RMA probe sent, or 0 */
  int ponged;                     /* ... and answered */
  int dead;                       /* the peer cannot complete anything */
  int said_bye;                   /* closed, a goodbye went out (-1: owed) */
  int bye_owed;                   /* ... and the provider pushed it back, */
  long bye_until;                 /* ... tried until then (pay_bye) */
  int challenged;                 /* connect: answered the listener's challenge */
};

/* Its part of a context (lane->tpd). */
struct rdm_ctx {
  struct xport__rep *cep;    /* the endpoint outgoing connections use */
  struct xport__bye *byes;   /* goodbyes waiting for the peer's answer */
  struct xport__sink *sinks; /* closed connections' tags, still drained */
  size_t nsinks, stale_dropped;
  struct xport__rep *retired; /* closed endpoints kept open (retire_eps) */
  int rdm_closing;            /* the context goes: endpoints close for real */
  uint32_t next_conn_id;
  size_t recv_ahead;  /* XPORT_RECV_AHEAD: claimed messages a connection may hold, or 0 */
  int keepalive_mode; /* XPORT_KEEPALIVE: -1 auto, 0 never, 1 always */
  long keepalive_ms;  /* XPORT_KEEPALIVE_TIMEOUT: silence that means a dead peer */
  struct xport__rep *reps;   /* every endpoint open */
  struct xport__rep *probe;  /* sends the RMA probe's pings */
  int directed;       /* FI_DIRECTED_RECV: receives name their source */
  int multi_recv;     /* FI_MULTI_RECV, for control receives */
  size_t ctl_dropped; /* control messages that failed validation */
};

static inline struct rdm_conn *rconn(const xport_conn_t *conn)
{
  return (struct rdm_conn *)(void *)conn->tpd;
}

static inline struct rdm_ctx *rctx(const struct xport__lane *lane)
{
  return (struct rdm_ctx *)lane->tpd;
}

/* ---- between the RDM transport's files -------------------------------- */
#include "rdm_wire.h"
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

/* What a control message says besides its type. */
struct ctl_args {
  uint32_t src_id, dst_id;
  uint64_t cookie, tag;
  int once;                   /* 1: a few quick tries: an rdm_answer to a requester, or
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
  const struct xport__conn_data *data; /* CONNREQ: the user's, or NULL */
};

/* A closed connection's tag, drained (rdm_sink.c). */
struct xport__sink {
  struct xport__sink *next;
  struct xport__rep *rep;
  struct xport__req *req;
  uint64_t tag, peer_ctx_id;
  uint32_t id, peer_id;
  long deadline;
  int answered, hits, ending;
};

/* One end of a handshake as the transcript names it. */
struct auth_end {
  const uint8_t *nonce;
  uint64_t ctx_id, tag;
  uint32_t conn_id;
  const uint8_t *addr;
  size_t addrlen;
  const uint8_t *data; /* what its request carried (the client's), or NULL */
  size_t datalen;
};
/* rep->lingering: left open for a peer; due for a look; being looked at. */
enum { LINGER_OPEN = 1, LINGER_DUE, LINGER_LOOK };

/* rdm.c: */
int rdm_tag_ok(uint64_t tag);
uint64_t rdm_pid_ns(void);
const char *rdm_boot_id(void);
xport_conn_t *rdm_find_conn(struct xport__lane *lane, uint32_t id);
int rdm_same_node(const struct xport__ctl *m);
int rdm_in_this_process(const struct xport__ctl *m);
void rdm_watch_peer(xport_conn_t *conn, const struct xport__ctl *m);
void rdm_conn_lost(xport_conn_t *conn, int status, int dead);
void rdm_rma_probe_answered(xport_conn_t *conn);
void rdm_rma_failed(xport_conn_t *conn, int status);
int rdm_probe_ctl(struct xport__lane *lane, const struct xport__peer *to, uint32_t type,
                  const struct ctl_args *a);
void rdm_drop(xport_conn_t *conn, int status);
/* rdm_ep.c: */
size_t rdm_addr_len(const struct xport__rep *rep, const void *addr, size_t len);
struct xport__peer *rdm_peer_get(struct xport__rep *rep, const void *addr, size_t len, int *ret_p);
void rdm_peer_put(struct xport__rep *rep, struct xport__peer *peer);
void rdm_peer_reached(struct xport__rep *rep, fi_addr_t dest, int reached);
void rdm_rep_close(struct xport__rep *rep);
int rdm_rep_maybe_close(struct xport__rep *rep);
int rdm_rep_open(struct xport__lane *lane, struct fi_info *info, const char *name,
                 struct xport__rep **rep_p);
int rdm_anon_rep_open(struct xport__lane *lane, struct xport__rep **rep_p);
int rdm_dest_rep(struct xport__lane *lane, const uint8_t *addr, size_t alen,
                 struct xport__rep **rep_p);
/* rdm_ctl.c: */
int rdm_ctl_post_recv(struct xport__rep *rep, struct xport__req *req);
struct xport__req *rdm_ctl_req(struct xport__rep *rep, unsigned op);
void rdm_ctl_req_free(struct xport__lane *lane, struct xport__req *req);
struct xport__req *rdm_ctl_recv_req(struct xport__rep *rep);
void rdm_ctl_recv_free(struct xport__lane *lane, struct xport__req *req);
int rdm_ctl_send(struct xport__rep *rep, fi_addr_t dest, uint32_t type, const struct ctl_args *a);
int rdm_ctl_send_conn(xport_conn_t *conn, uint32_t type, int once);
void rdm_ctl_drop(struct xport__lane *lane, const char *why, uint32_t type, size_t len);
int rdm_bye_start(xport_conn_t *conn);
void rdm_bye_resent(xport_conn_t *conn);
void rdm_byes_expire(struct xport__lane *lane);
int rdm_byes_on(const struct xport__rep *rep);
void rdm_byes_drop(struct xport__lane *lane, struct xport__rep *rep);
void rdm_withdraw(xport_conn_t *conn);
void rdm_answer(struct xport__rep *rep, const struct xport__ctl *m, uint32_t type, int pending);
int rdm_from_named(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src);
void rdm_internal(struct xport__lane *lane, struct xport__req *req, int status,
                  const struct fi_cq_data_entry *e, fi_addr_t src);
/* rdm_sink.c: */
void rdm_sink_start(xport_conn_t *conn);
void rdm_sink_done(struct xport__lane *lane, struct xport__sink *k, int status);
int rdm_sink_answered(struct xport__rep *rep, const struct xport__ctl *m);
void rdm_sinks_expire(struct xport__lane *lane);
void rdm_sinks_drop(struct xport__lane *lane, struct xport__rep *rep);
void rdm_claims_drop(xport_conn_t *conn);
ssize_t rdm_recv_claimed(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt);
void rdm_discard_unused(struct xport__rep *rep);
/* rdm_auth.c: */
void rdm_auth_proof(const struct xport__lane *lane, int by_listener, const struct auth_end *client,
                    const struct auth_end *listener, uint8_t mac[XPORT__AUTH_MAC]);
int rdm_auth_client(xport_conn_t *conn, const struct xport__ctl *m, uint8_t mac[XPORT__AUTH_MAC]);
void rdm_on_auth(struct xport__rep *rep, const struct xport__ctl *m, size_t len, fi_addr_t src);
int rdm_on_withdraw(struct xport__rep *rep, const struct xport__ctl *m, fi_addr_t src);
/* rdm_data.c: */
extern const struct xport__data_ops rdm_data;
void rdm_ops_plain(xport_conn_t *conn);
void rdm_ops_claimed(xport_conn_t *conn);

#endif /* XPORT_TRANSPORT_RDM_H */
