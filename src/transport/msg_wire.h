/* The wire format of the MSG transport (msg.c): the greeting in a
 * connection's private data and the service channel's messages. It is
 * internal: the fuzz targets (test/fuzz/) include it to build and check
 * these messages.
 *
 * Service channel wire (little-endian, both directions):
 *   request  0 magic "XATQ"  4 kind (1 fetch-add, 2 cswap, 3 add)
 *            8 sequence  12 zero  16 key  24 address  32 operand  40 compare
 *   answer   0 magic "XATA"  4 status (0 or -XPORT_E*)
 *            8 sequence  12 zero  16 old value
 */
#ifndef XPORT_MSG_WIRE_H
#define XPORT_MSG_WIRE_H

#include <stdint.h>

/* What both sides send in the connection's private data. A connection
 * request without it (a port scanner, another program) is rejected. */
#define HELLO_MAGIC 0x5850525455ULL /* "XPRTU" */
#define HELLO_VERSION 2
#define HELLO_WANT_SVC 0x1u /* request: the client would make a service channel */
#define HELLO_SVC 0x2u      /* request: this is that channel, for cookie */
#define HELLO_AUTH 0x4u     /* request, accept: the sender holds a key */
#define HELLO_AUTH_REJ 0x8u /* a rejection's data: a key on one side only */
#define HELLO_DATA 0x10u    /* request: an AUTH_DATA message follows (xport_connect_data) */
struct xport__hello {
  uint64_t magic;
  uint32_t version;
  uint32_t flags;
  uint64_t ctx_id; /* owner of the remote keys this side will pack */
  /* accept: nonzero asks the client for a service channel naming it;
   * a service channel's request: the cookie its accept gave */
  uint64_t cookie;
  /* The sender's process, and where a pid means it (its PID namespace,
   * the node's boot id): a peer on this node watches it, so that an
   * operation lost with the connection is known to have lost its target
   * rather than been refused (peer_gone). An optional tail: a greeting
   * that ends before it is whole names no process. */
  uint32_t pid;
  uint32_t zero;
  uint64_t pidns;
  char boot_id[40];
};

/* Under a key (xport(7), AUTHENTICATION), the first messages on a
 * connection are xport's, into receives it posted before the connection
 * was made; no message of the user's is taken before they end, and the
 * listener's accept returns the connection only once the client proved
 * the key:
 *   0 magic "XAUT"  4 kind  8 nonce[32]  40 proof[32]    (AUTH_LEN bytes)
 *   client -> listener  AUTH_HELLO   its fresh nonce
 *   listener -> client  AUTH_ANSWER  its fresh nonce, its proof
 *   client -> listener  AUTH_PROOF   its proof, or AUTH_REFUSE (the
 *                                    listener's proof was wrong)
 * A proof is crypto_auth (HMAC-SHA-512-256) over its direction's label,
 * both nonces, both context ids and the service channel's cookie. */
#define AUTH_MAGIC 0x54554158u /* "XAUT" */
#define AUTH_LEN 72
enum { AUTH_HELLO = 1, AUTH_ANSWER, AUTH_PROOF, AUTH_REFUSE, AUTH_DATA };

/* A client whose request said HELLO_DATA sends, once connected (and past
 * the proofs under a key), one message of AUTH_LEN bytes in that format:
 *   0 magic "XAUT"  4 AUTH_DATA  8 length (at most 56)  12 zero  16 data
 * into a receive the listener posted before it accepted; its accept
 * returns the connection only once it came. The connection's private
 * data has no room for it on verbs (56 bytes, less rdma_cm's header). */
#define AUTH_DATA_AT 16

#define ATOM_REQ_MAGIC 0x51544158u /* "XATQ" */
#define ATOM_ANS_MAGIC 0x41544158u /* "XATA" */
#define ATOM_REQ_LEN 48
#define ATOM_ANS_LEN 24

#endif
