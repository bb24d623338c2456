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
 * listener accept for them).
 *
 * Under a shared key (xport(7), AUTHENTICATION) a request carries
 * CTL_F_AUTH and the client's fresh nonce; the listener's acceptance
 * carries its own fresh nonce, its address and its proof; the client
 * answers with CTL_AUTH, its proof (or, the listener's proof being wrong,
 * CTL_AUTH without one: refused). The listener's accept returns the
 * connection only once that proof came. A proof is crypto_auth (HMAC-
 * SHA-512-256) keyed with the shared key over the transcript
 * (rdm.c, auth_transcript): its direction's label, both nonces, both
 * context ids, both connection ids, both receive tags, both endpoint
 * addresses and the request's data. Each side's nonce is fresh: neither a replayed request nor a
 * replayed proof passes, and a proof made for one address is refused at
 * another (a relay). */
#ifndef XPORT_RDM_WIRE_H
#define XPORT_RDM_WIRE_H

#include <stdint.h>

#define XPORT__CTL_MAGIC 0x58505254434c3031ULL /* "XPRTCL01" */
#define XPORT__CTL_VERSION 6
#define XPORT__CTL_NONCE 32 /* XPORT__AUTH_NONCE */
#define XPORT__CTL_MAC 32   /* XPORT__AUTH_MAC */
#define XPORT__CTL_ADDR_MAX 256
#define XPORT__CTL_DATA_MAX 56 /* XPORT_CONN_DATA_MAX */

enum {
  XPORT__CTL_CONNREQ = 1, /* client -> listener: tag = the client's receive tag */
  XPORT__CTL_CONNACK,     /* listener -> client: tag = the server's receive tag */
  XPORT__CTL_CONNREJ,     /* listener -> client: refused (backlog full, closing) */
  XPORT__CTL_DISC,        /* either way: goodbye, or the answer to one */
  XPORT__CTL_KEEPALIVE,   /* either way: heartbeat */
  XPORT__CTL_PING,        /* either way: answer with a PONG (the RMA probe, rdm.c) */
  XPORT__CTL_PONG,
  XPORT__CTL_CHALLENGE,   /* listener -> client: tag = the token to ask again with */
  XPORT__CTL_AUTH         /* client -> listener: the client's proof (under a key) */
};
#define XPORT__CTL_F_AUTH 0x1u  /* flags: the sender holds a key; nonce (and mac) set */

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
  uint32_t flags;    /* XPORT__CTL_F_* */
  uint32_t zero;
  uint8_t nonce[XPORT__CTL_NONCE]; /* CONNREQ, CONNACK under a key: the sender's */
  uint8_t mac[XPORT__CTL_MAC];     /* CONNACK, AUTH under a key: the sender's proof */
  /* CONNREQ: the user's bytes that ride it (xport_connect_data), which
   * the proof under a key covers; 0 bytes otherwise. */
  uint32_t datalen;
  uint32_t zero2;
  uint8_t data[XPORT__CTL_DATA_MAX];
  /* CONNREQ: the sender's endpoint name; CONNACK under a key: the
   * listener's (its fi_getname) */
  uint8_t addr[XPORT__CTL_ADDR_MAX];
};

/* The tag of a CONNREJ that says "not this way": the requester is of
 * another node or PID namespace, or this very process, for a provider
 * that cannot serve those (node-local providers: shm). A client that has
 * another transport beside (XPORT_SHM) goes over that one (conn.c); one
 * that has not is refused. 0: refused (backlog, closing). */
#define XPORT__CTL_REJ_ELSEWHERE 1
/* The tag of a CONNREJ that says "not without a key", or "not with one":
 * one side holds a key and the other none (the client's connect fails
 * with EACCES). */
#define XPORT__CTL_REJ_AUTH 2

/* Receive tags: 62 random bits; bit 62 marks an emulated write_imm
 * (XPORT__WIMM_TAG; over shm the CQ data's upper half does instead,
 * XPORT__WIMM_MARK: profile unexpected_tag_exact), bit 63 is never set. */
#define XPORT__TAG_MASK ((UINT64_C(1) << 62) - 1)

#endif
