/* The wire format of xport's own handshake over FI_EP_RDM endpoints
 * (rdm.c). It is internal: the test suite includes it only to play a
 * stranger that forges these messages.
 *
 * Control messages travel untagged (fi_send/fi_recv), data tagged: the
 * two never meet in one matching queue. Every message but a request
 * carries a cookie, the receiving connection's own receive tag: 62
 * random bits that only the two ends of that connection know.
 *
 * A request is queued only once its sender has shown that it receives at
 * the address it names: the listener answers a first request with a
 * challenge, a token keyed with the listener's secret over the request,
 * and queues the request that comes back with that token (a stranger
 * cannot fill the backlog with other endpoints' addresses, nor make the
 * listener accept for them). */
#ifndef XPORT_RDM_WIRE_H
#define XPORT_RDM_WIRE_H

#include <stdint.h>

#define XPORT__CTL_MAGIC 0x58505254434c3031ULL /* "XPRTCL01" */
#define XPORT__CTL_VERSION 4
#define XPORT__CTL_ADDR_MAX 256

enum {
  XPORT__CTL_CONNREQ = 1, /* client -> listener: tag = the client's receive tag */
  XPORT__CTL_CONNACK,     /* listener -> client: tag = the server's receive tag */
  XPORT__CTL_CONNREJ,     /* listener -> client: refused (backlog full, closing) */
  XPORT__CTL_DISC,        /* either way: goodbye, or the answer to one */
  XPORT__CTL_KEEPALIVE,   /* either way: heartbeat */
  XPORT__CTL_PING,        /* either way: answer with a PONG (the RMA probe, rdm.c) */
  XPORT__CTL_PONG,
  XPORT__CTL_CHALLENGE    /* listener -> client: tag = the token to ask again with */
};

struct xport__ctl {
  uint64_t magic;
  uint32_t version;
  uint32_t type;
  uint64_t ctx_id;   /* the sender's context */
  uint32_t src_id;   /* the sender's connection id */
  uint32_t dst_id;   /* the receiver's connection id (0 in a request) */
  uint64_t cookie;   /* the receiver's receive tag; in a request, 0 or the
                        listener's challenge token */
  uint64_t tag;      /* CONNREQ, CONNACK: the sender's receive tag */
  uint32_t pid;      /* the sender's process */
  uint32_t addrlen;
  uint64_t pidns;    /* the sender's PID namespace: a pid means something */
  char boot_id[40];  /* with pid: which node, for death detection */
  uint8_t addr[XPORT__CTL_ADDR_MAX]; /* CONNREQ: the sender's endpoint name */
};

/* The tag of a CONNREJ that says "not this way": the requester is of
 * another node or PID namespace, or this very process, for a provider
 * that cannot serve those (node-local providers: shm). A client that has
 * another transport beside (XPORT_SHM) goes over that one (conn.c); one
 * that has not is refused. 0: refused (backlog, closing). */
#define XPORT__CTL_REJ_ELSEWHERE 1

/* Receive tags: 62 random bits; bit 62 marks an emulated write_imm
 * (XPORT__WIMM_TAG), bit 63 is never set. */
#define XPORT__TAG_MASK ((UINT64_C(1) << 62) - 1)

#endif
