/* The objects: registrations, requests, connections, listeners, lanes and
 * contexts, and the limits they are built with. */
#ifndef XPORT_CORE_OBJECTS_H
#define XPORT_CORE_OBJECTS_H

#include "../../providers/profile.h"
#include "../util/auth.h"
#include <pthread.h>
#include <sys/uio.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#define XPORT__FI_VERSION FI_VERSION(1, 17)
#define XPORT__IOV_MAX 4     /* iov entries xport itself tracks per post */
#define XPORT__CQ_BATCH 32   /* CQ entries read per fi_cq_read */
#define XPORT__EQ_EVERY 64   /* polls between two EQ reads (or RDM checks), busy or idle */
#define XPORT__BACKLOG_DEFAULT 128 /* listen backlog (XPORT_LISTEN_BACKLOG) */
#define XPORT__RECV_AHEAD_BAD 1024 /* XPORT_RECV_AHEAD set, but not to a count */
/* How long a socket on a listener's port may take to deliver its
 * connection request (src/core/halfopen.c): a client sends it as it connects. */
#define XPORT__GREET_MS 5000
#define XPORT__EAGER_MAX (UINT64_C(1) << 20) /* XPORT_EAGER_SIZE is clamped to it */
#define XPORT__CTL_SLOT 512 /* the least bounce slot: one RDM control message */
#define XPORT__LANES_MAX 2  /* transport instances in a context: a fabric, shm beside */


/* The kinds of atomics, as the service channel's wire names them too. */
enum { XPORT__ATOM_FADD = 1, XPORT__ATOM_CSWAP = 2, XPORT__ATOM_ADD = 3 };

/* Request kinds of xport's own, next to the public xport_op_t values. */
#define XPORT__OP_SILENT 100   /* internal half of an emulated write_imm */
#define XPORT__OP_CTL_SEND 101 /* RDM control message out (transport/rdm_ctl.c) */
#define XPORT__OP_CTL_RECV 102 /* RDM control receive */
#define XPORT__OP_SINK 103     /* RDM receive draining a closed connection's tag */
#define XPORT__OP_PEEK 104     /* RDM look into the unexpected queue (FI_PEEK) */
#define XPORT__OP_SVC_SEND 105 /* MSG service channel: a message out (atomic.c) */
#define XPORT__OP_SVC_RECV 106 /* MSG service channel: a receive */
/* Tag bit of the message that completes an emulated write-with-immediate
 * over RDM: the tag, not the CQ data, carries the marker there, because
 * some RDM providers have only 4 bytes of CQ data (verbs;ofi_rxm). */
#define XPORT__WIMM_TAG (UINT64_C(1) << 62)
#define XPORT__ADDR_MAX 256
/* Upper half of 8-byte CQ data marking the message that completes an
 * emulated write-with-immediate over MSG endpoints (see rma.c). */
#define XPORT__WIMM_MARK UINT64_C(0x57494d4d) /* "WIMM" */

/* A registration of exactly one packed range of a region, with the
 * region's remote rights: the exporter's provider then refuses whatever
 * lies outside it, whatever the key's bytes say (rma.c). Closed with its
 * region, which revokes every key packed from it. */
struct xport__span {
  struct xport__span *next;
  struct fid_mr *mr;
  size_t offset, len;
};
/* Distinct packed ranges one region may hold (each one a registration). */
#define XPORT__SPANS_MAX 1024

struct xport_mr {
  xport_ctx_t *ctx;
  struct xport__lane *lane;     /* the transport instance it is registered with */
  struct fid_mr *mr;
  void *desc;
  char *base;
  size_t len;
  unsigned access;
  struct xport__span *spans;    /* packed sub-ranges */
  size_t nspans;
  /* The same memory registered with the context's second lane (shm
   * beside the fabric), owned by this one; NULL where there is none. */
  struct xport_mr *sub;
  struct xport_mr *next, *prev; /* ctx->mrs (the application's, not subs) */
};

/* A pre-registered copy buffer, for providers that need FI_MR_LOCAL. */
struct xport__bounce {
  struct xport__bounce *next;
  char *buf;
  void *desc;
  int small;        /* a small slot (XPORT__SMALL_SLOT bytes), of its own pool */
};
#define XPORT__SMALL_SLOT 64

struct xport__bounce_chunk {
  struct xport__bounce_chunk *next;
  struct fid_mr *mr;
  char *mem;
  struct xport__bounce *slots;
};

/*
 * One posted operation. op_context handed to libfabric points at fictx,
 * which must stay first. Requests are pooled per context; posting takes
 * one, delivering its completion returns it.
 */
struct xport__req {
  struct fi_context2 fictx;
  struct xport__req *next;        /* free list or done list */
  struct xport__req *cprev, *cnext; /* conn's outstanding list */
  xport_conn_t *conn;
  void *user_ctx;
  xport_op_t op;
  int status;   /* for done-list entries */
  unsigned flags;
  uint32_t imm;
  size_t len;
  /* From bounce to tmp: what a post does not set itself, reset by
   * xport__req_new as one block (a few wide stores, not one per field). */
  struct xport__bounce *bounce;   /* copy path, or NULL */
  /* RDM only: 1 for a request orphaned by its connection's close or loss
   * while the provider still owns it (on ctx->zombies, status set). The
   * user sees it only once the provider lets go: its completion, a
   * confirmed cancel, or its endpoint's close. */
  unsigned zombie;
  unsigned ntmp;                  /* temporary registrations */
  struct xport__rep *rep;         /* control requests: their endpoint */
  long posted_ms;                 /* RMA under a deadline (rma_timeout_ms) */
  struct xport__detail *detail;   /* failed: the provider's text, or NULL */
  size_t uiovcnt;                 /* user's receive iov, for copy-out */
  /* The user's half of an emulated write_imm whose write (a silent
   * request, user_ctx pointing here) is still out: it is delivered only
   * once both halves finished, with the write's error first. */
  unsigned pair;
  /* A receive lent from the context's shared pool (pair has
   * XPORT__POOLED): its entry, which goes back to the pool where the
   * receive ends with its connection instead of a message. */
  struct xport__pent *pent;
  /* Sends only: XPORT__UNSIG for an unsignaled one (its success is never
   * delivered), XPORT__ORDERED for a signaled one posted while unsignaled
   * ones were out on its connection (delivered only once those posted
   * before it, tx_seq lower, are finished: xport_send_flags(3)). */
  unsigned unsig;
  struct fid_mr *tmp[XPORT__IOV_MAX];
  xport_iov_t uiov[XPORT__IOV_MAX];
  struct xport__peer *peer;       /* control sends that hold a peer (refusals) */
  uint64_t posted_seq;            /* RMA under a deadline: its place among them (ctx->dl.rma_seq) */
  int pair_status;                /* an emulated write_imm's (pair) */
  /* Atomics: the operand, the compare value and the fetched value where
   * the provider needs no registered buffers (else in the bounce slot, in
   * that order), and where the fetched value goes at the completion. */
  uint64_t atom[3];
  uint64_t *result;
  struct xport__held *held;       /* waiting on conn->held, or NULL */
  uint64_t tx_seq;                /* sends: their order (unsig) */
  /* xport's own requests (op >= XPORT__OP_CTL_SEND): what their owner
   * does with their completion (e its entry, a data entry made of the
   * error entry where status is not 0; src its sender where the CQ says,
   * else FI_ADDR_NOTAVAIL). The completion code names no owner. */
  void (*on_done)(struct xport__lane *lane, struct xport__req *req, int status,
                  const struct fi_cq_data_entry *e, fi_addr_t src);
};

/* A post the provider pushed back (EAGAIN: shm holds a peer's channel
 * while a read is served, or its queue toward the peer is full), or one
 * behind such a post on its connection: it waits there, in order, counted
 * as posted, and goes at a later poll (xport__held_retry). Made only on
 * that slow path; it holds what the provider call needs. */
struct xport__held {
  unsigned kind;                  /* XPORT__H_* */
  uint64_t flags;
  size_t cnt;
  struct iovec iov[XPORT__IOV_MAX];
  void *desc[XPORT__IOV_MAX];
  uint64_t data;                  /* remote CQ data */
  struct fi_rma_iov rma;          /* reads and writes */
};
#define XPORT__UNSIG 1u
#define XPORT__ORDERED 2u
#define XPORT__H_SEND 1  /* the transport's send */
#define XPORT__H_MARK 2  /* the transport's marker (an emulated write_imm's) */
#define XPORT__H_READ 3  /* the transport's read */
#define XPORT__H_WRITE 4 /* the transport's write */

/* The provider's text of one failed completion. It belongs to its request
 * until delivered, then to ctx->shown until the next xport_poll, so that
 * no later error (read by the progress thread, say) overwrites it. */
struct xport__detail {
  struct xport__detail *next;
  char text[];
};
#define XPORT__PAIR_WAIT 1u /* the silent half is outstanding */
#define XPORT__PAIR_HELD 2u /* this half finished and waits for it */
/* Not posted yet: the marker goes only once the write succeeded
 * (rma_never_fails: shm answers no refused write, and a small one
 * completes at once unless delivery-complete; the target must not see
 * XPORT_OP_REMOTE_WRITE_IMM for data that never landed). */
#define XPORT__PAIR_DEFER 4u
/* Not a pair: a receive lent from the shared pool (req->pent). It shares
 * the field so that the delivery's quick path, which tests pair, passes
 * it to the general one at no cost of its own. */
#define XPORT__POOLED 8u
#define XPORT__Z_ORPHAN 1u    /* zombie: the provider still owns it */
#define XPORT__Z_SHOWN 2u     /* ... yet queued for the user (zombie_show) */
#define XPORT__Z_DELIVERED 4u /* ... and delivered */
#define XPORT__Z_POOL 8u      /* lent from the pool: no longer held against the event */

struct xport__req_chunk {
  struct xport__req_chunk *next;
  struct xport__req reqs[];
};

enum xport__conn_state {
  XPORT__CONN_CONNECTING = 1,
  XPORT__CONN_CONNECTED,
  XPORT__CONN_FAILED,       /* connect or accept failed */
  XPORT__CONN_DISCONNECTED, /* the peer went away; handle still open */
  XPORT__CONN_CLOSED        /* the user closed it; freed with its last req */
};

/* The parts of a connection that one module of the core keeps. */

/* The peer's process, where it can be watched (same node only). */
struct xport__proc {
  int pidfd; /* else -1 (MSG too) */
  /* It is known to have ended (its pidfd, or its heartbeats stopped): a
   * one-sided operation that failed with the connection says so in its
   * hint instead of blaming the key. */
  int gone;
  int waited; /* ... and xport__conn_check_gone waited for it once */
};

/* What the peer did lately, for the transports' liveness checks. */
struct xport__heard {
  unsigned msg;           /* a message arrived since the transport last looked */
  size_t done, done_seen; /* operations ended, and at the transport's last look */
};

/* Requests orphaned by the connection's close or loss that the provider
 * still owns (cq.c xport__req_orphan). */
struct xport__orphans {
  size_t n;
  /* ... of which receives not yet queued for the user: cancelled, they
   * come back at once, and the disconnect event waits for them. */
  size_t recvs;
};

/* Unsignaled sends whose end the user has not seen (cq.c unsig_*): the
 * provider's still (posted, held or orphaned), or failed and not yet
 * delivered (failing of them); and the numbering of sends while there
 * are any. fail_seq: 1 + the number of the first one whose failure was
 * delivered (0: none), with its status, which every signaled send
 * numbered after it takes (cq.c unsig_vouch). */
struct xport__unsig {
  size_t out, failing;
  uint64_t seq, fail_seq;
  int fail_status;
};

/* Posts waiting for the provider's room (cq.c held_*), oldest first
 * (through next), and the connection's place on ctx->holding while there
 * are any. */
struct xport__holdq {
  struct xport__req *head, *tail;
  struct xport_conn *next, *prev;
};

/* Its deadline (xport_conn_timeout): ms, 0 for none; whether the last
 * look found operations outstanding (watching), the count of its ended
 * operations (heard.done) then, and since when it has stood there (cq.c
 * deadlines_check). */
struct xport__deadline {
  long ms;
  int watching;
  size_t done_seen;
  long since;
};

/* Its disconnect event (link.c evq_*). */
struct xport__event {
  int queued;              /* waiting in ctx->evq */
  int status;
  uint64_t after;          /* done-list entries before the event (ctx->done_in) */
  struct xport_conn *next;
};

/* XPORT_FAULT drop_conn (src/core/fault.c): posts counted, and the count
 * reached (it is lost at the context's next call). */
struct xport__fault_conn {
  unsigned long posts;
  int drop;
};

/* A listener's handshake under way (lst->shaking, until accept returns
 * the connection), and its deadline. */
/* Bytes of the user's that ride a connection request (xport_connect_data). */
struct xport__conn_data {
  size_t len;
  uint8_t bytes[XPORT_CONN_DATA_MAX];
};

struct xport__shake {
  struct xport_conn *next;
  long deadline;
  /* The connecting side: what its request carries, until the connect
   * ends (then none). The accepting side: what the peer's carried, once
   * the handshake has it (xport_conn_peer). */
  struct xport__conn_data data;
  /* The accepting side: the peer's data is announced and not yet in
   * (MSG: it comes in a message of xport's after the connection). */
  int data_due;
};

/* Its share of the context's shared receive pool (core/pool.c): the
 * pool's receives lent to it and still posted; own, the application has
 * posted a receive of its own on it, and the pool lends it no more; in,
 * it counts among the pool's connections (ctx->pool.nconns); took, the
 * messages it took, up to lend (xport__pool_cap); wanting, it is on
 * ctx->pool.want, through next, for more. */
struct xport__pool_conn {
  unsigned lent, took;
  int own;
  int in;
  int wanting;
  struct xport_conn *next;
};

/* Its place on lane->draining: closed, while the provider still owns
 * some of its operations (RDM). */
struct xport__drain {
  struct xport_conn *next, *prev;
};

struct xport_conn {
  xport_ctx_t *ctx;
  struct xport__lane *lane;       /* the transport instance it runs on */
  /* Its data path: the posts reach the provider only through it. */
  const struct xport__data_ops *ops;
  struct fid_ep *ep;              /* MSG: its own; RDM: its rep's */
  uint64_t peer_ctx_id;           /* the peer context's id, from the hello */
  uint32_t id;
  enum xport__conn_state state;
  int fail_code;                  /* why FAILED; -XPORT_ETIMEDOUT: its deadline lost it */
  /* The user closed it: what the provider cancels from now on is
   * ECANCELED; before, a cancellation means the connection broke. */
  int closing;
  struct {
    int handed;                   /* returned to the application (xport__conn_link) */
    int owned;                    /* a layer above (a job) closes it, not the application */
  } app;
  /* The peer has shown that it holds the connection: the client, by
   * completing its connect (the acceptance reached it); the listener's
   * side, by a message the client sent once it had connected. Until then
   * an accepted connection may be one its client gave up on (a connect
   * that timed out) and will hear of only later (a goodbye, a shutdown). */
  int peer_holds;
  /* The transport still refers to it (RDM: attached to its endpoint):
   * closed, it is freed only once the transport lets go. */
  int attached;
  size_t nreqs;                   /* posted and not yet delivered */
  /* Posted and not yet reported by the provider, against caps.tx_depth
   * (sends, writes, reads) and caps.rx_depth (receives). */
  size_t ntx, nrx;
  /* Emulated write_imms whose marker waits for their write (PAIR_DEFER):
   * sends on the connection wait too (EAGAIN), to stay behind them. */
  size_t wimm_deferred;
  struct xport__req *out;         /* outstanding (posted) requests */
  struct xport__unsig unsig;
  struct xport__holdq hq;
  struct xport__orphans orphans;
  struct xport__proc proc;
  struct xport__heard heard;
  struct xport__event ev;
  struct xport__deadline dl;
  struct xport__fault_conn fault;
  struct xport__shake shake;
  struct xport__drain drain;
  struct xport__pool_conn pool;
  struct xport_conn *next, *prev; /* lane->conns */
  /* Its transport's part (struct xport__transport conn_size bytes). */
  _Alignas(16) unsigned char tpd[];
};

struct xport__ctl; /* rdm_wire.h */

struct xport__connreq {
  struct xport__connreq *next;
  struct fi_info *info;          /* MSG */
  uint64_t peer_ctx_id;
  int want_svc;                  /* MSG: the client would make a service channel */
  int want_data;                 /* MSG: its data follows the connection (HELLO_DATA) */
  uint32_t peer_pid;             /* MSG: the client's process, on this node; else 0 */
  struct xport__ctl *ctl;        /* RDM: the request as received */
};

/* An unpacked remote key, bound to the connection it was unpacked on. */
struct xport_rkey {
  struct xport__lane *lane; /* its connection's: it may outlive the connection */
  const xport_conn_t *conn;
  uint64_t addr;   /* remote address of the packed range's start */
  uint64_t len;
  uint64_t key;
  unsigned access;
  int mapped;      /* key came from fi_mr_map_raw */
};

struct xport_listener {
  xport_ctx_t *ctx;
  struct xport__lane *lane;       /* the transport instance it listens on */
  struct fid_pep *pep;            /* MSG */
  struct xport__rep *rep;         /* RDM */
  struct xport__connreq *pending, *pending_tail;
  size_t npending, backlog;       /* requests waiting, and how many may */
  int refusing;                   /* the backlog overflowed (logged once) */
  int closing;                    /* being closed: what comes now is refused */
  /* MSG: requests answered whose handshake goes on (accept) */
  xport_conn_t *shaking;
  size_t nshaking;
  /* A layer above (the job layer) may own a listener: then it accepts in
   * the background, wherever the context makes progress, asking admit
   * first (0 refuses the request: its peer's connect fails) and handing
   * each connection to accepted. NULL: the application accepts. */
  int (*admit)(void *arg, uint64_t peer_ctx_id);
  void (*accepted)(void *arg, xport_conn_t *conn);
  void *hook_arg;
  char addr[96];
  /* The same host:port on the context's second lane (shm beside the
   * fabric), owned by this one; NULL where there is none. */
  struct xport_listener *sub;
  void *tpd;                      /* a transport's own state (xshm) */
  struct xport_listener *next, *prev; /* lane->listeners */
};

/*
 * A transport instance of a context: one provider's fabric, domain, CQ
 * and EQ, the transport that makes connections over it (and its private
 * state), and what is kept per CQ and per domain (the posted count,
 * registered copy buffers). A connection belongs to one lane.
 */
struct xport__lane {
  xport_ctx_t *ctx; /* the context it belongs to */
  unsigned index;   /* in ctx->lanes */
  struct xport_conn *conns;          /* its connections (the application's) */
  struct xport_listener *listeners;  /* and listeners, subs included */
  struct fi_info *info; /* the chosen candidate, as opened */
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_eq *eq;
  struct fid_cq *cq;
  const struct xport__profile *prof;
  xport_caps_t caps;
  int need_local_mr;  /* FI_MR_LOCAL, or strict mode */
  int prov_key;       /* the provider chooses keys */
  int virt_addr;      /* RMA addresses are virtual addresses */
  int raw_keys;       /* FI_MR_RAW */
  /* write_imm: 1 consumes a receive natively (FI_RX_CQ_DATA), 0 emulated
   * (the marker in a tag bit over RDM, in 8-byte CQ data over MSG), -1
   * impossible (a MSG provider with 4-byte CQ data and no FI_RX_CQ_DATA)
   * and refused with ENOSYS. */
  int native_wimm;
  /* caps.atomics is EMULATED: MSG connections get a service channel and
   * the target's xport applies the operations (atomic.c). */
  int atom_emulated;
  size_t cq_entry_size; /* fi_cq_tagged_entry over RDM, else fi_cq_data_entry */
  int quick_inject;   /* small sends finish at post (fi_inject) */
  /* How connections are made and kept (src/transport/): the core reaches
   * it only through this table. */
  const struct xport__transport *tp;
  void *tpd; /* its part of the context (ctx_size bytes) */
  int keep_fids;      /* an endpoint was left open (close_after_refusal_crashes,
                         settle_names) */
  long rma_timeout_ms; /* 0, or the deadline of one-sided operations */
  /* FI_DELIVERY_COMPLETE where delivery-complete is on and the provider
   * needs the flag for it, else 0: the flags of every write. */
  uint64_t write_flags;
  long last_check;
  long halfopen_at;           /* the next look for half-open requests */
  int halfopen_spare;         /* a descriptor held for that look, or -1 */
  struct xport__req *zombies; /* RDM: orphaned, still owned by the provider */
  int reap;                   /* RDM: a zombie finished; housekeeping detaches */
  /* RDM: closed connections whose operations the provider still owns;
   * they keep their peer in the address vector until those finish. */
  struct xport_conn *draining;
  size_t bounce_size; /* a bounce slot: eager_size, or a control message if larger */
  int source;         /* RDM: FI_SOURCE, completions name their sender */
  /* Operations the provider holds, each owing one CQ entry, and the most
   * allowed: the CQ's size less room for xport's control traffic. A CQ
   * that overflows breaks every queue pair on it (verbs). */
  size_t nposted, max_posted;
  /* truncation_hangs: address space (reserved, not committed) that takes
   * what does not fit a receive; never read. */
  void *sink;
  size_t sink_len;
  int cq_fd, eq_fd;   /* the CQ's and EQ's wait fds, or -1 */
  /* 1: the provider gives it no wait object in ctx->wake.epfd (shm), and
   * waits go in steps; 2: the application turned wait objects off
   * (XPORT_WAIT_FD=0). tick_fd: with 1, a timer in ctx->wake.epfd that makes
   * the context's descriptor readable every millisecond, once the
   * application asked for it (xport_ctx_fd), or -1. */
  int no_wait;
  int tick_fd;
  unsigned eq_skip;   /* empty polls since the EQ was last read */
  /* Control messages the provider pushed back and that go again (RDM
   * goodbyes): held posts wait while there are any, so that a stream of
   * data cannot take every slot the peer frees. */
  size_t ctl_owed;
  /* Connections whose heartbeat the provider pushed back: it goes again
   * at every poll, right after the CQ read that may have freed the
   * channel, before the caller can post again and take it (shm: a stream
   * of reads to a peer holds its channel nearly all the time, and the
   * peer, hearing nothing, would take the caller for dead). */
  size_t ka_owed;

  struct xport__bounce *free_bounce;
  struct xport__bounce_chunk *bounce_chunks;
  struct xport__bounce *free_small;   /* service channels' messages */
  struct xport__bounce_chunk *small_chunks;
};

/* One receive of the shared pool (xport_recv_shared): waiting in the
 * pool, or lent (req->pent); made in chunks, kept for reuse. */
struct xport__pent {
  struct xport__pent *next;
  xport_iov_t iov;
  void *user_ctx;
};
struct xport__pent_chunk {
  struct xport__pent_chunk *next;
  struct xport__pent ents[];
};

/* The context's shared receive pool (api/pool.c posts, core/pool.c takes
 * back). Its receives are lent to connections, at most lend at a time
 * each, and posted there as ordinary receives: no provider's shared
 * receive context names the connection a message came from (xport(7),
 * "Posting and completing"). free: not lent, oldest first;
 * total: posted and not yet completed, lent or not; nconns: connections
 * in the pool (xport__pool_cap shares total among them); spare: entries
 * to reuse; want: connections that may take more, in turn; on: the
 * application has used the pool, and new connections join it; feed:
 * lends what it can (api/pool.c, the way back up). */
struct xport__pool {
  struct xport__pent *free, *free_tail, *spare;
  struct xport__pent_chunk *chunks;
  size_t total, nconns;
  struct xport_conn *want, *want_tail;
  unsigned lend;
  int on;
  void (*feed)(xport_ctx_t *ctx);
};

struct xport_ctx {
  /* Its transport instances: the fabric's first, then, with XPORT_SHM,
   * the node-local provider's for peers on this node. A connection runs
   * on one (conn->lane); a listener and a registration hold a part on
   * each (their sub). poll_turn says which xport_poll reads first;
   * in_beside, that the lanes beside a blocked one are being served
   * (xport__progress_beside). */
  struct xport__lane *lanes[XPORT__LANES_MAX];
  unsigned nlanes;
  unsigned poll_turn;
  int in_beside;
  xport_candidate_t *cands;
  int ncands;

  uint64_t id;        /* random; names this context in hellos and keys */
  /* Connections prove this key both ways (xport(7), AUTHENTICATION);
   * auth_on 0: none, connections are not authenticated. Never logged. */
  int auth_on;
  uint8_t auth_key[XPORT__AUTH_KEY];
  /* The ways back up that lower layers call, set by the layers above:
   * accepting for listeners a layer above owns (conn.c, once one is
   * hooked), and a deferred write_imm's marker (rma.c, at creation). */
  void (*auto_accept)(xport_ctx_t *ctx);
  void (*wimm_write_done)(xport_ctx_t *ctx, struct xport__req *p, int status);
  void (*wimm_retry)(xport_ctx_t *ctx, int fail);
  long peer_check_ms; /* XPORT_PEER_TIMEOUT: a dead peer is noticed within it */
  /* Deadlines (xport_conn_timeout(3)): op_ms, every new connection's
   * (XPORT_OP_TIMEOUT); min_ms, the shortest set yet, 0 for none:
   * housekeeping looks at them, and waits wake to, within a quarter of
   * it; checked, when it last did; tick_fd, the timer in wake.epfd that
   * wakes a sleeper on xport_ctx_fd for them, or -1; rma_seq, the last
   * operation's posted_seq. */
  struct {
    long op_ms, min_ms, checked;
    int tick_fd;
    uint64_t rma_seq;
  } dl;
  size_t eager_size;  /* copy through bounce buffers up to this size */

  int nhooked;        /* listeners that accept in the background (admit set) */
  int accept_due;     /* a request reached such a listener */
  int in_auto;        /* xport__auto_accept is running: no recursion */

  struct xport__req *free_reqs;
  struct xport__req_chunk *req_chunks;
  struct xport__req *done, *done_tail; /* completed, not yet delivered */
  /* Signaled sends finished before unsignaled ones posted ahead of them
   * on their connection (XPORT__ORDERED): they wait here (sig_wait), through next. */
  struct xport__req *sig_wait;
  /* Entries ever pushed to and taken from the done list: a disconnect
   * event waits only for those pushed before it (its connection's ended
   * operations), not for a list that a busy CQ keeps refilling. */
  uint64_t done_in, done_out;
  /* Deferred write_imm markers the provider refused for now (EAGAIN), in
   * order; posted again by housekeeping. */
  struct xport__req *wimm_wait, *wimm_wait_tail;
  struct xport_conn *evq, *evq_tail;   /* disconnect events to deliver */
  struct xport_conn *holding;          /* connections with held posts */
  struct xport__pool pool;

  struct xport_mr *mrs;

  pthread_t progress_tid;
  int progress_on;
  volatile int progress_stop;
  /* Held by the progress thread while it is inside the provider, and by
   * xport around closing endpoints, which providers do not allow while
   * another thread progresses them. Never taken on the data path. */
  pthread_mutex_t progress_lock;
  /* What wakes a sleeper on xport_ctx_fd or in xport_wait, -1 where
   * not made:
   * - epfd joins the lanes' CQ and EQ wait fds and the timers below;
   * - nap_fd, a one-shot timer made by xport_ctx_fd: xport_wait arms it
   *   for the next look it wants (a peer check, a provider that keeps
   *   work of its own), which a sleeper on the descriptor would otherwise
   *   miss;
   * - sig_fd, with the progress thread: an eventfd that the thread makes
   *   readable when it queues work on the done list or evq, which a
   *   waiter may otherwise never see (the thread took the CQ entry that
   *   would have woken it); sig_set: written and not yet read. Both
   *   under progress_lock. */
  struct {
    int epfd, nap_fd, sig_fd, sig_set;
  } wake;

  struct xport__detail *shown; /* details delivered by the last xport_poll */
  /* XPORT_FAULT (src/core/fault.c): its rules and what it holds, for
   * every lane; NULL when off, which is all that the posts and xport_poll
   * test. */
  struct xport__fault *fault;
};

/*
 * The data path of a connection (msg.c, rma.c, cq.c): the only calls that
 * carry the user's operations to the provider. A transport sets a
 * connection's table when it makes the connection, and may swap it for
 * another as the connection's state changes, so that the posts test
 * nothing of the transport's. Each is called with the lock held, on a
 * connection that passed every check, makes one provider call and returns
 * its code: 0, pushed back (xport__pushed_back: the core holds the post),
 * or an error; nothing is posted where it fails. req's fictx is the
 * operation's context.
 */
struct xport__data_ops {
  /* Sends iov[0, cnt) (req->len bytes; a descriptor for each element),
   * flags FI_INJECT (copied before it returns) and FI_REMOTE_CQ_DATA
   * (data goes with it) as asked. */
  ssize_t (*send)(xport_conn_t *conn, struct xport__req *req, struct iovec *iov, void **desc,
                  size_t cnt, uint64_t flags, uint64_t data);
  /* Sends len bytes that the provider copies at once and never reports
   * (fi_inject): finished where it returns 0. -FI_ENOSYS where it cannot. */
  ssize_t (*inject)(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                    uint32_t imm);
  /* Posts receive req into iov[0, cnt); the array has room for one more
   * element behind them (the truncation sink, truncation_hangs). */
  ssize_t (*recv)(xport_conn_t *conn, struct xport__req *req, struct iovec *iov, void **desc,
                  size_t cnt);
  /* Sends the message that completes an emulated write-with-immediate
   * carrying req->imm, with flags besides FI_REMOTE_CQ_DATA. */
  ssize_t (*marker)(xport_conn_t *conn, struct xport__req *req, uint64_t flags);
  /* 1 if e, a receive's entry with FI_REMOTE_CQ_DATA, is such a marker:
   * it completes an XPORT_OP_REMOTE_WRITE_IMM. */
  int (*is_marker)(const struct fi_cq_data_entry *e);
  /* Reads the peer's [addr, addr + req->len) under key into iov[0, cnt). */
  ssize_t (*read)(xport_conn_t *conn, struct xport__req *req, struct iovec *iov, void **desc,
                  size_t cnt, uint64_t addr, uint64_t key);
  /* Writes iov[0, cnt) (req->len bytes; 0 with an immediate alone) to the
   * peer's addr under key, with flags FI_DELIVERY_COMPLETE and
   * FI_REMOTE_CQ_DATA (data goes with it) as asked. */
  ssize_t (*write)(xport_conn_t *conn, struct xport__req *req, struct iovec *iov, void **desc,
                   size_t cnt, uint64_t addr, uint64_t key, uint64_t flags, uint64_t data);
  /* A native 64-bit atomic of kind XPORT__ATOM_* on the peer's word at
   * addr under key: operand v[0], compare value v[1], the old value to
   * v[2]; desc their registration, or NULL. */
  ssize_t (*atomic)(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t *v,
                    void *desc, uint64_t addr, uint64_t key);
};

#endif /* XPORT_CORE_OBJECTS_H */
