/* xshm: xport's own shared-memory transport, for peers on this node,
 * with no libfabric provider behind it (xshm.c). Its shared layout is
 * what two processes agree on; everything a peer writes there is read as
 * data that may be garbage. */
#ifndef XPORT_TRANSPORT_XSHM_H
#define XPORT_TRANSPORT_XSHM_H

#include "../xport_int.h"

#include <sys/types.h>
#include <sys/uio.h>

#define XSHM_MAGIC 0x4d485358u /* "XSHM" */
#define XSHM_VERSION 3
#define XSHM_RING (256u * 1024)  /* bytes of one direction's ring */
#define XSHM_EAGER 8192u         /* longer messages are read from the sender (CMA) */
#define XSHM_INJECT 4096u        /* caps.inject_size */
#define XSHM_IOV 4               /* scatter elements per post */
#define XSHM_RXQ 256             /* receives posted per connection */
#define XSHM_RNDV 256            /* long sends out per connection */
#define XSHM_KEYS 4096           /* registrations per context a peer may target */
#define XSHM_DEPTH 256           /* tx and rx depth per connection */

/* A record in a ring: this header, then its payload, 16-byte aligned. */
struct xshm_rec {
  uint32_t len;  /* MSG: the payload's bytes; RNDV: the message's */
  uint16_t type; /* XSHM_R_* */
  uint16_t niov; /* RNDV: the sender's scatter elements that follow */
  uint32_t imm;  /* with XSHM_F_IMM */
  uint32_t flags;
};
enum { XSHM_R_MSG = 1, XSHM_R_RNDV, XSHM_R_WIMM, XSHM_R_WRAP, XSHM_R_FRAG };
#define XSHM_F_IMM 1u
#define XSHM_F_LAST 2u /* FRAG: the message's last piece */

/* One direction. A record is published by its header's first word
 * (len, type, niov), stored last: a type of 0 is no record yet, and the
 * producer writes that empty header where its next record will go before
 * it publishes one, so the consumer polls the one line it reads anyway
 * and never mistakes what a lap before left there for a record. The
 * consumer owns head (given back in batches, so the producer reads it
 * only when its ring looks full) and rndv_done (the long messages it has
 * copied out of the sender); each flag is on a line that is written
 * only when someone sleeps, so that reading it per record costs nothing. */
struct xshm_ring {
  /* The producer sleeps until room comes (a long message in pieces): the
   * consumer rings it when it gives back room. */
  _Alignas(64) uint32_t want_room;
  _Alignas(64) uint64_t head;
  uint64_t rndv_done;
  /* The consumer sleeps (xport_wait): whoever publishes something for it
   * here (a record, a control record, rndv_done) writes its eventfd. */
  _Alignas(64) uint32_t armed;
  _Alignas(64) uint8_t data[XSHM_RING];
};
#define XSHM_HEAD_BATCH (XSHM_RING / 4) /* room the consumer gives back at once */

/* A control record (atomics: their requests and answers), in a ring of
 * its own so that it never waits behind a message no receive has taken
 * yet. Each side has at most XSHM_ATOM requests out, so a ring of twice
 * as many slots always has room for its answers. */
#define XSHM_ATOM XPORT__SVC_DEPTH /* as the service channel's */
#define XSHM_CSLOTS (2 * XSHM_ATOM)
struct xshm_ctl {
  uint32_t type; /* XSHM_C_* */
  int32_t status; /* ANSWER: 0, or an xport code */
  uint64_t token; /* the request's, echoed by its answer */
  uint64_t kind, key, addr, operand, compare; /* REQUEST; ANSWER: operand is the old value */
};
enum { XSHM_C_REQUEST = 1, XSHM_C_ANSWER };
struct xshm_cring {
  _Alignas(64) uint64_t tail;
  _Alignas(64) uint64_t head;
  _Alignas(64) struct xshm_ctl slot[XSHM_CSLOTS];
};

/* A connection's segment (a memfd the client makes and hands over):
 * ring[s] and ctl[s] carry side s's messages and control records (0: the
 * client, 1: the listener's side); closed[s] is set by side s when it
 * closes. */
struct xshm_seg {
  uint32_t magic, version;
  uint32_t closed[2];
  /* Side s can read the other's memory (cross-memory attach, probed at
   * the handshake): only then does the other send long messages where
   * they lie (RNDV); else in pieces through the ring (FRAG). */
  uint32_t can_read[2];
  _Alignas(64) struct xshm_ring ring[2];
  struct xshm_cring ctl[2];
};

/* A context's registrations that peers may target (a memfd it hands to
 * each peer, mapped read-only there). key 0: a free slot; a key names its
 * slot in its low bits. */
struct xshm_key {
  uint64_t key, base, len;
  uint32_t access, pad;
};
#define XSHM_SLOT_BITS 12
_Static_assert((1u << XSHM_SLOT_BITS) == XSHM_KEYS, "a key's slot bits cover the table");

/* The handshake on the listener's socket (SOCK_SEQPACKET), with the
 * segment's and the key table's descriptors alongside. */
struct xshm_hello {
  uint32_t magic;
  uint16_t version, kind; /* XSHM_H_* */
  uint64_t ctx_id;
  uint32_t pid;    /* the sender's pid as it sees itself */
  uint32_t status; /* XSHM_H_REFUSE: why, an xport code */
  uint64_t seg_size;
  uint64_t canary; /* an address of the sender's where the peer's probe reads */
  /* Under a context key (XSHM_HF_AUTH): the sender's nonce (HELLO,
   * WELCOME) and its proof (WELCOME, PROOF), which the other end checks
   * before it goes on; READY ends a keyed handshake. */
  uint32_t flags, pad;
  uint8_t nonce[XPORT__AUTH_NONCE];
  uint8_t mac[XPORT__AUTH_MAC];
  /* HELLO: the user's bytes that ride the request (xport_connect_data),
   * which the proofs under a key cover (the whole hello). */
  uint32_t datalen, pad2;
  uint8_t data[XPORT_CONN_DATA_MAX];
};
enum { XSHM_H_HELLO = 1, XSHM_H_WELCOME, XSHM_H_REFUSE, XSHM_H_PROOF, XSHM_H_READY };
#define XSHM_HF_AUTH 1u

/* A connection's private part (struct xport__transport conn_size). */
struct xshm_rx {
  struct xport__req *req;
  struct iovec iov[XSHM_IOV];
  size_t cnt, len;
};

struct xshm_conn {
  int sock;
  int side; /* 0: the client, 1: the listener's side */
  pid_t peer_pid;
  int releasing;
  struct xshm_seg *seg;
  const struct xshm_key *peer_keys;
  uint64_t out_tail, in_head; /* where our next record goes, and the peer's we take */
  uint64_t head_seen;         /* the peer's head as we last read it */
  uint64_t head_given;        /* the head we last gave back */
  struct xshm_rx rx[XSHM_RXQ];
  unsigned rx_head, rx_tail;
  struct xport__req *rndv[XSHM_RNDV];
  uint64_t rndv_posted, rndv_seen;
  uint64_t ctl_tail, ctl_head; /* our copies, as out_tail and in_head */
  unsigned natom;              /* atomics out (at most XSHM_ATOM) */
  uint32_t atom_seq;
  int peer_efd; /* the peer's doorbell for this connection (an eventfd it handed over) */
  int my_efd;   /* ours, handed over: a peer can drain only its own connection's */
  int cma;      /* this side may read and write the peer's memory */
  int gone;     /* its socket ended: its pid may be another process's now */
  /* A long message in pieces (no cross-memory attach), going out: the
   * sends behind it wait (EAGAIN, held by the core) until it is. */
  struct {
    struct xport__req *req;
    struct iovec iov[XSHM_IOV];
    size_t cnt, total, off;
    uint32_t imm;
    int with_imm;
  } fout;
  /* ... and coming in: into the oldest receive, at in_off. */
  int fin;
  size_t fin_off;
  /* Ended by a refused one-sided operation (its initiator's check, or the
   * target gone): lost at the next run of the rings, once the operation
   * that found it has been posted. */
  int doomed;
};

static inline struct xshm_conn *xc(const xport_conn_t *conn)
{
  return (struct xshm_conn *)(void *)conn->tpd;
}

#endif /* XPORT_TRANSPORT_XSHM_H */
