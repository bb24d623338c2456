/* The MSG transport's private state (transport/msg.c): what it keeps in
 * a context and a connection. Only the transport's own files include it
 * (and white-box tests). */
#ifndef XPORT_TRANSPORT_MSG_H
#define XPORT_TRANSPORT_MSG_H

#include "../xport_int.h"

/* Its part of a connection (conn->tpd). */
struct msg_conn {
  /* Under a key (ctx->auth_on): the client's nonce until the listener's
   * answer; on the listener's side, the proof the client owes, until it
   * comes (then the connection is accepted). Wiped once used. */
  uint8_t auth[XPORT__AUTH_MAC];
  /* Under a key: where the handshake's messages stand (AUTH_*), and
   * xport's sends and receives on the endpoint. */
  int auth_state;
  struct xport__req *auth_out;
  /* With emulated atomics (atomic.c): the service channel, a second
   * endpoint to the same peer that carries the requests and answers, so
   * that they never take the user's receives. */
  struct fid_ep *svc;
  int svc_state;              /* 0 none, 1 connecting, 2 connected, -1 failed */
  int svc_accepted;           /* passive side: the client's channel was accepted */
  uint64_t svc_cookie;        /* pairs it with this connection at the listener */
  struct xport__req *svc_out; /* its receives and messages posted */
  uint32_t atom_seq;          /* numbers requests; answers name theirs */
  size_t natom;               /* emulated atomics awaiting their answer */
  /* The peer shut the service channel down at this time (0: not): the
   * connection ends with its own endpoint, or once nothing on it has
   * completed for XPORT_PEER_TIMEOUT (svc_gone_check). */
  long svc_gone_at;
  /* An operation failed on its endpoint, which the provider then takes
   * down without a word on the EQ (verbs: the QP is in error): it is lost
   * at the next EQ dispatch. */
  int broken;
  /* Its peer's address (xport_conn_peer), noted while the endpoint is
   * there: a lost connection's goes with it. "" until known. */
  char peer[64];
};

/* Its part of a context (lane->tpd). */
struct msg_ctx {
  int nbroken;      /* connections marked broken since the last dispatch */
  size_t nsvc_gone; /* connections with svc_gone_at set */
};

static inline struct msg_conn *mconn(const xport_conn_t *conn)
{
  return (struct msg_conn *)(void *)conn->tpd;
}

static inline struct msg_ctx *mctx(const struct xport__lane *lane)
{
  return (struct msg_ctx *)lane->tpd;
}

/* ---- between the MSG transport's files -------------------------------- */
/* A channel's receives: the peer's requests (as many as it may have
 * outstanding) and the answers to ours. */
#define SVC_RX (2 * XPORT__SVC_DEPTH)

/* A connection's proof of the key, where it stands (msg_auth.c). */
enum {
  AS_NONE = 0,    /* no key: nothing to prove */
  AS_WAIT_HELLO,  /* listener: the client's nonce is awaited */
  AS_WAIT_PROOF,  /* listener: its answer went, the client's proof is awaited */
  AS_WAIT_ANSWER, /* client: the listener's nonce and proof are awaited */
  AS_DONE,        /* the peer proved the key */
  AS_FAILED       /* it did not, or the handshake broke */
};

/* msg.c: */
void msg_progress(struct xport__lane *lane);
/* msg_svc.c: */
int msg_svc_open(xport_conn_t *conn, struct fi_info *info);
void msg_svc_lost(xport_conn_t *conn, int status);
void msg_svc_close(xport_conn_t *conn);
int msg_atomic(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t key,
               uint64_t addr);
/* msg_auth.c: */
int msg_auth_post_recv(xport_conn_t *conn, struct xport__req *req);
int msg_auth_send(xport_conn_t *conn, unsigned kind, const uint8_t *nonce, const uint8_t *mac);
int msg_data_send(xport_conn_t *conn, const struct xport__conn_data *data);
void msg_auth_end_reqs(xport_conn_t *conn);
int msg_wait_auth(xport_conn_t *conn, long deadline);

#endif /* XPORT_TRANSPORT_MSG_H */
