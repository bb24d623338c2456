/*
 * Internal header shared by the core (src/) and the provider profiles
 * (providers/). Tools and examples never include it.
 */
#ifndef XPORT_INT_H
#define XPORT_INT_H

#define XPORT_BUILDING 1
#include "xport.h"

#include <pthread.h>
#include <time.h>
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

#define XPORT__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define XPORT__LIKELY(x) __builtin_expect(!!(x), 1)

/* An invariant the code relies on (and a comment states), checked where
 * the library was configured with --enable-asserts (the sanitizer
 * builds): a broken one aborts with where and what. Free otherwise. */
#ifdef XPORT_ASSERTS
void xport__assert_fail(const char *what, const char *file, int line)
    __attribute__((noreturn));
#define XPORT__ASSERT(cond)                                                  \
  do {                                                                       \
    if (XPORT__UNLIKELY(!(cond)))                                            \
      xport__assert_fail(#cond, __FILE__, __LINE__);                         \
  } while (0)
#else
#define XPORT__ASSERT(cond) ((void)0)
#endif

/* Intrusive doubly linked lists (requests, connections, listeners,
 * registrations): push at the head, and unlink, through the fields named. */
#define XPORT__LIST_PUSH(head, node, next, prev)                                             \
  do {                                                                                      \
    (node)->prev = NULL;                                                                    \
    (node)->next = (head);                                                                  \
    if (head)                                                                               \
      (head)->prev = (node);                                                                \
    (head) = (node);                                                                        \
  } while (0)
/* Singly linked queues (done requests, events, backlogs): append at the
 * tail through the field named. */
#define XPORT__FIFO_PUSH(head, tail, node, next)                                             \
  do {                                                                                      \
    (node)->next = NULL;                                                                    \
    if (tail)                                                                               \
      (tail)->next = (node);                                                                \
    else                                                                                    \
      (head) = (node);                                                                      \
    (tail) = (node);                                                                        \
  } while (0)
#define XPORT__LIST_UNLINK(head, node, next, prev)                                           \
  do {                                                                                      \
    if ((node)->prev)                                                                       \
      (node)->prev->next = (node)->next;                                                    \
    else                                                                                    \
      (head) = (node)->next;                                                                \
    if ((node)->next)                                                                       \
      (node)->next->prev = (node)->prev;                                                    \
  } while (0)

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

/* ---- provider profiles (providers/) ---------------------------------- */

/*
 * What the core needs to know about a provider beyond what fi_getinfo
 * says. One instance per provider, in providers/<name>.c; the core looks
 * profiles up by libfabric's provider name and never names one itself.
 */
struct xport__profile {
  const char *name;        /* libfabric prov_name, e.g. as fi_info prints */
  int rank;                /* lower is tried first when not named */
  /* Non-NULL: used only when named in XPORT_PROVIDER, and this says why. */
  const char *explicit_only;
  /* Non-NULL: another local process, of any user, can take over a
   * connection unseen; this says how, in a warning given once per
   * process when a context opens on it (xport(7), SECURITY). */
  const char *takeover;
  /* 1: reports FI_PROGRESS_AUTO but moves nothing unless its CQ is read. */
  int manual_progress;
  /* 1: an injected send must still be completed by the provider (FI_INJECT
   * flag) rather than finished by xport on the spot (fi_inject): a send
   * slot is freed only by a completion (hardware queues), or the provider
   * queues injected sends without bound (tcp, rxm), so that only their
   * completions can bound them (xport's tx_depth). */
  int inject_needs_completion;
  /* Maps a failed completion's error to xport's code where the provider
   * reports something generic (may be NULL): 0 keeps the usual mapping. */
  int (*cq_error)(int fi_err, int prov_errno, int is_recv);
  /* Runs before libfabric is first asked anything (may be NULL): the
   * place to set the provider's own environment variables. */
  void (*preinit)(void);
  /* 1: a one-sided operation the target refuses (bad key, revoked
   * region) never completes, nor does any error come (shm). xport then
   * gives such operations a deadline (XPORT_RMA_TIMEOUT). */
  int rma_never_fails;
  /* NULL, or the most operations one connection may have outstanding
   * where the provider's own queue takes fewer than its tx size says (shm:
   * two of its 1024 command slots per one-sided operation; rxm over verbs:
   * its verbs connection to the peer). */
  size_t (*max_tx_depth)(void);
  /* 1: a message larger than its receive never completes (shm in
   * libfabric 1.17: the cross-memory copy spins for ever, the segmented
   * one stalls). xport then gives every receive room for any message, a
   * sink behind the caller's buffer, and reports the truncation itself;
   * this costs one iov element (max_iov) and bounds max_msg_size. */
  int truncation_hangs;
  /* 1: the answers an endpoint awaits from its targets (to a read, a
   * delivery-complete write, a transfer too large to go inline) are taken
   * in the order their operations were posted, whatever the target, and
   * one that never comes holds up every later one (shm in libfabric 1.17:
   * one response queue per endpoint, smr_progress_resp stops at the first
   * unanswered entry): a dead target would stall every other connection
   * of the endpoint. xport then gives each destination of outgoing
   * connections an endpoint of its own (transport/rdm_ep.c, rdm_dest_rep). */
  int answers_in_order;
  /* 1: delivery-complete is on unless the user turns it off: the
   * provider drops and re-makes, without a word, a connection whose target
   * refused a key, so only a write that waits for the target learns that
   * messages around it were lost (rxm over tcp). */
  int dc_default;
  /* 1: a send to an address the provider has no connection to costs a
   * connection attempt, and memory it keeps (rxm 1.17: megabytes for each
   * attempt that fails): a listener sends nothing to the address a request
   * names until a request has come from there (transport/rdm_ctl.c, rdm_on_connreq). */
  int answer_needs_source;
  /* mr_mode bits to drop before opening the domain where the provider
   * merely allows them (shm checks keys only with offsets). */
  uint64_t clear_mr_mode;
  /* 1: the provider must not drop its connection to a peer (AV removal,
   * endpoint close) while messages from that peer may be arriving. xport
   * then waits, after a goodbye, for the peer's answer (transport/rdm.c). */
  int close_needs_quiet;
  /* 1: two endpoints of one process share memory inside the provider, and
   * closing one leaves the other pointing at freed memory (shm in
   * libfabric 1.17 uses a same-process peer's region directly and frees
   * it with its endpoint): a connection between two contexts of one
   * process is refused. */
  int in_process_peers_unsafe;
  /* 1: a write completes only once the target's device acknowledged it
   * (RC hardware), whatever the flags: delivery-complete needs no
   * FI_DELIVERY_COMPLETE, which such a provider may not even list. */
  int writes_acked;
  /* Nonzero where the provider's listener accepts TCP sockets and waits
   * on each, without a deadline, for the connection request: the bytes of
   * its own header before the transport's greeting (tcp: struct
   * ofi_ctrl_hdr, 32; rxm over it: that and rxm's 24 of its own). xport
   * then shuts such sockets that stay unfinished (src/core/halfopen.c). */
  size_t cm_header;
  /* 1: a delivery-complete operation holds the peer's channel, and
   * nothing else to that peer can be posted until it completes (shm: up
   * to 4 KiB such operations take its one segmented-copy slot). */
  int dc_holds_peer;
  /* 1: closing an endpoint leaves it in the wait set of the CQ it was
   * bound to (rxm in libfabric 1.17: rxm_ep_close never calls
   * ofi_wait_del_fid for its inner CQ), so that the next fi_trywait on that
   * CQ calls into the freed endpoint. Where the CQ has a wait fd, xport
   * then keeps such endpoints open, retired, until the context's CQ closes
   * (transport/rdm.c). */
  int retire_eps;
  /* 1: the provider keeps unexpected messages in memory it grows without
   * bound (rxm). xport then receives control messages (untagged) into
   * multi-receive buffers, one always posted, so that none waits there:
   * where the provider supports FI_MULTI_RECV. */
  int unexpected_unbounded;
  /* 1: tagged FI_PEEK, FI_PEEK|FI_DISCARD and FI_PEEK|FI_CLAIM work and
   * complete at once, into the CQ, during the call, and a claimed message
   * is received through the context its claim marked (rxm). xport then
   * discards unexpected messages under tags no connection receives, and
   * claims and counts those a connection's peer sent ahead (rdm_sink.c). */
  int peek_discard;
  /* 1: once a peer's process is gone, the provider can no longer touch
   * the buffers of operations to it (everything to that peer went through
   * connections that died with it), though it may never report them
   * (rxm: a rendezvous send waits for ever): xport completes them then,
   * and keeps their requests until the provider or the endpoint ends
   * them. 0: only the provider's report or the endpoint's close does
   * (shm copies through the dead peer's shared memory), and xport retires
   * the endpoint. */
  int dead_peer_lets_go;
  /* Non-NULL when the provider's native atomics must not be used, and
   * why (may be NULL): xport then emulates them where it can (MSG). */
  const char *(*atomics_untrusted)(void);
  /* 1: the provider offers atomics only without ordering them against
   * other operations, and then declines to promise any order but
   * send-after-send for everything (rxm 1.17: RXM_ATOMIC_UNSUPPORTED_MSG_ORDER,
   * since it runs its atomics as messages that its own progress applies,
   * while RMA and messages still go over one ordered connection as they
   * do without atomics). xport asks for atomics so, and orders atomics
   * with nothing on any provider (xport_fetch_add(3)). */
  int atomics_unordered;
  /* 1: closing an endpoint after one of its one-sided operations failed
   * (a refused key) crashes inside the provider (rxm over verbs in
   * libfabric 1.17, in its connection teardown). When the context goes,
   * xport then leaves such an endpoint, and the objects it is bound to,
   * open: memory lost at exit rather than a crash. Nor does such an
   * endpoint reach that peer again (a new connection is refused): new
   * connections go out through a fresh endpoint. */
  int close_after_refusal_crashes;
  /* 1: reaches only processes of this node that share its /dev/shm and
   * PID namespace (shm). The one provider a context opens beside its
   * fabric for same-node peers (XPORT_SHM), and whose listeners refuse a
   * request from another node or PID namespace (transport/rdm.c). */
  int node_local;
  /* What to tell the user when the provider refuses to open an endpoint
   * (fi_enable: EINVAL) for reasons of its own (may be NULL). */
  const char *enable_hint;

  /* Providers without a connection manager whose endpoints are named
   * (shm): how a listener's host:port becomes a name, and how a name is
   * owned. All NULL for providers addressed by socket address. */
  /* any 1: the name of a listener on the port's wildcard address, which
   * a client tries after the host's own (any 0). */
  int (*listen_name)(const char *host, const char *port, int any, char *name, size_t len);
  /* Takes the name for this process; -XPORT_EADDRINUSE if a live owner
   * has it. Sets *lock_p to what release_name gives back. */
  int (*claim_name)(const char *name, int *lock_p);
  void (*release_name)(const char *name, int lock);
  /* 1 if a live endpoint owns the name. */
  int (*name_alive)(const char *name);
  /* 1 if the name's owner is this process's user (may be NULL): a
   * context with shm beside its fabric reaches only such a listener over
   * shm, and another user's over the fabric, so that a local process of
   * another user cannot take a port's connections by claiming its name. */
  int (*name_same_user)(const char *name);
  /* 1 if an endpoint of that name exists now, xport's or not (a name a
   * request says it sends from, before anything is sent there). */
  int (*name_exists)(const char *name);
  /* A fresh name for an endpoint that is no listener's (may be NULL: the
   * provider's default name), taken with claim_name like a listener's, so
   * that what a killed process leaves behind is known as xport's and
   * removed by sweep, never mistaken for another program's. */
  int (*anon_name)(char *name, size_t len);
  /* Removes what endpoints of dead owners left behind under xport's
   * names; a live owner's are left alone (may be NULL). Runs when a
   * context opens. */
  void (*sweep)(void);
  /* Cleans up what a dead peer at this address left behind (may be NULL). */
  void (*peer_gone)(const void *addr, size_t len);
  /* Non-NULL where a peer crashes if our endpoint is gone before it has
   * taken the first message we sent it (shm in libfabric 1.17: the first
   * send to a peer queues our name there, and is refused, EAGAIN, until
   * the peer's progress maps it; smr_progress_connreq dereferences the
   * failed mapping of a name whose file was unlinked). 1 if the peer at
   * this address may still take it (its process lives). xport then waits,
   * at an endpoint's close, for every such peer to take it, and where one
   * never does, leaves the endpoint open (transport/rdm_ep.c, settle_names). */
  int (*peer_may_map)(const void *addr, size_t len);
  /* Watches the process pid of this node, whose endpoint is at addr, for
   * as long as it lives (may be NULL): a provider whose senders take a
   * lock in the receiver's memory (shm) gives back the one a killed
   * receiver held, which nothing else ever would (providers/shm.c). */
  void (*peer_watch)(const void *addr, size_t len, uint32_t pid);
  /* 1 while a watched peer at addr holds that lock (may be NULL): a send
   * to it now would spin inside the provider until the peer lets go, for
   * ever if it is stopped there. xport's own messages (heartbeats,
   * probes, answers) wait for the next look instead: a poll never waits
   * on a peer. */
  int (*peer_locked)(const void *addr, size_t len);
  /* keep 1: the endpoint under name (with lock, from claim_name) has such
   * a message out, or is left open at the context's end for it: its file
   * is to outlast this process by a while, however the process ends, and
   * sweep respects that; keep 0: no longer. May be NULL. */
  void (*keep_name)(const char *name, int lock, int keep);
};

/* NULL-terminated registry, providers/registry.c. */
extern const struct xport__profile *const xport__profiles[];
const struct xport__profile *xport__profile_find(const char *prov_name);

/* ---- environment, logging, errors ------------------------------------ */

enum xport__env_id {
  XPORT__ENV_PROVIDER,
  XPORT__ENV_DOMAIN,
  XPORT__ENV_IFACE,
  XPORT__ENV_LOG,
  XPORT__ENV_STRICT,
  XPORT__ENV_PROGRESS_THREAD,
  XPORT__ENV_EAGER_SIZE,
  XPORT__ENV_PEER_TIMEOUT,
  XPORT__ENV_RMA_TIMEOUT,
  XPORT__ENV_WAIT_FD,
  XPORT__ENV_KEEPALIVE,
  XPORT__ENV_DELIVERY_COMPLETE,
  XPORT__ENV_LISTEN_BACKLOG,
  XPORT__ENV_KEEPALIVE_TIMEOUT,
  XPORT__ENV_JOB,
  XPORT__ENV_JOB_HOST,
  XPORT__ENV_JOB_TIMEOUT,
  XPORT__ENV_SHM,
  XPORT__ENV_FAULT,
  XPORT__ENV_AUTH_KEY_FILE,
  XPORT__ENV_RECV_AHEAD,
  XPORT__ENV_COUNT
};

/* The raw value of a variable, or NULL when unset or empty. */
const char *xport__env_str(enum xport__env_id id);
/* Boolean/size values; a malformed value logs a warning and gives def. */
int xport__env_bool(enum xport__env_id id, int def);
size_t xport__env_size(enum xport__env_id id, size_t def);

enum { XPORT__LOG_ERROR = 1, XPORT__LOG_WARN, XPORT__LOG_INFO, XPORT__LOG_DEBUG };
extern int xport__log_level;
void xport__log_init(const char *level); /* XPORT_LOG's value, or NULL */
void xport__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define XPORT__LOG(lvl, ...)                                                 \
  do {                                                                       \
    if (XPORT__UNLIKELY(xport__log_level >= (lvl)))                          \
      xport__log((lvl), __VA_ARGS__);                                        \
  } while (0)
#define XPORT__WARN(...) XPORT__LOG(XPORT__LOG_WARN, __VA_ARGS__)
#define XPORT__INFO(...) XPORT__LOG(XPORT__LOG_INFO, __VA_ARGS__)
#define XPORT__DEBUG(...) XPORT__LOG(XPORT__LOG_DEBUG, __VA_ARGS__)

/* auth.c: the shared key connections prove (xport(7), AUTHENTICATION),
 * and libsodium's keyed MAC and nonces for the transports' handshakes. */
#define XPORT__AUTH_KEY 32     /* the MAC key a context holds */
#define XPORT__AUTH_KEY_MIN 16 /* the least key a caller may give */
#define XPORT__AUTH_NONCE 32
#define XPORT__AUTH_MAC 32
int xport__auth_init(void);
/* The MAC key made of a caller's key bytes (at least AUTH_KEY_MIN). */
int xport__auth_key(const void *raw, size_t len, uint8_t key[XPORT__AUTH_KEY]);
/* The MAC key in the file at path, refused (logged, never its content)
 * unless a regular file of this user that nobody else may read. */
int xport__auth_key_file(const char *path, uint8_t key[XPORT__AUTH_KEY]);
void xport__auth_nonce(uint8_t nonce[XPORT__AUTH_NONCE]);
void xport__auth_draw(uint8_t key[XPORT__AUTH_KEY]); /* a fresh random key */
void xport__auth_mac(const uint8_t key[XPORT__AUTH_KEY], const void *msg, size_t len,
                     uint8_t mac[XPORT__AUTH_MAC]);
/* 1 if two proofs are equal, in time that does not depend on where they differ. */
int xport__auth_same(const uint8_t a[XPORT__AUTH_MAC], const uint8_t b[XPORT__AUTH_MAC]);
void xport__auth_wipe(void *p, size_t len);

/* Maps a libfabric return or completion code (either sign) to -XPORT_E*. */
int xport__err_from_fi(int fi_err);
/* 1 if code is 0 or the negative of one of xport's codes. */
int xport__err_known(int code);
/* A one-line hint for a failed completion, or NULL. */
const char *xport__err_hint(int code);

/* ---- objects --------------------------------------------------------- */

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
  struct xport__bounce *bounce;   /* copy path, or NULL */
  unsigned ntmp;                  /* temporary registrations */
  struct fid_mr *tmp[XPORT__IOV_MAX];
  size_t uiovcnt;                 /* user's receive iov, for copy-out */
  xport_iov_t uiov[XPORT__IOV_MAX];
  /* RDM only: 1 for a request orphaned by its connection's close or loss
   * while the provider still owns it (on ctx->zombies, status set). The
   * user sees it only once the provider lets go: its completion, a
   * confirmed cancel, or its endpoint's close. */
  unsigned zombie;
  struct xport__rep *rep;         /* control requests: their endpoint */
  struct xport__peer *peer;       /* control sends that hold a peer (refusals) */
  long posted_ms;                 /* RMA under a deadline (rma_timeout_ms) */
  uint64_t posted_seq;            /* ... and its place among them (ctx->rma_seq) */
  /* The user's half of an emulated write_imm whose write (a silent
   * request, user_ctx pointing here) is still out: it is delivered only
   * once both halves finished, with the write's error first. */
  unsigned pair;
  int pair_status;
  struct xport__detail *detail;   /* failed: the provider's text, or NULL */
  /* Atomics: the operand, the compare value and the fetched value where
   * the provider needs no registered buffers (else in the bounce slot, in
   * that order), and where the fetched value goes at the completion. */
  uint64_t atom[3];
  uint64_t *result;
  struct xport__held *held;       /* waiting on conn->held, or NULL */
  /* Sends only: XPORT__UNSIG for an unsignaled one (its success is never
   * delivered), XPORT__ORDERED for a signaled one posted while unsignaled
   * ones were out on its connection (delivered only once those posted
   * before it, tx_seq lower, are finished: xport_send_flags(3)). */
  unsigned unsig;
  uint64_t tx_seq;
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
#define XPORT__Z_ORPHAN 1u    /* zombie: the provider still owns it */
#define XPORT__Z_SHOWN 2u     /* ... yet queued for the user (zombie_show) */
#define XPORT__Z_DELIVERED 4u /* ... and delivered */

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
struct xport__shake {
  struct xport_conn *next;
  long deadline;
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
  int fail_code;                  /* why FAILED */
  /* The user closed it: what the provider cancels from now on is
   * ECANCELED; before, a cancellation means the connection broke. */
  int closing;
  int handed;                     /* returned to the application (xport__conn_link) */
  int owned;                      /* a layer above (a job) closes it, not the application */
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
  struct xport__fault_conn fault;
  struct xport__shake shake;
  struct xport__drain drain;
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
  /* 1: the provider gives it no wait object in ctx->epfd (shm), and
   * waits go in steps; 2: the application turned wait objects off
   * (XPORT_WAIT_FD=0). tick_fd: with 1, a timer in ctx->epfd that makes
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
  uint64_t rma_seq;    /* the last one's posted_seq */
  size_t eager_size;  /* copy through bounce buffers up to this size */

  int epfd;           /* joins the lanes' CQ and EQ wait fds; -1 without */
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

  struct xport_mr *mrs;

  pthread_t progress_tid;
  int progress_on;
  volatile int progress_stop;
  /* Held by the progress thread while it is inside the provider, and by
   * xport around closing endpoints, which providers do not allow while
   * another thread progresses them. Never taken on the data path. */
  pthread_mutex_t progress_lock;
  /* With the progress thread and a wait fd: an eventfd in epfd that the
   * thread makes readable when it queues work on the done list or evq,
   * which a waiter may otherwise never see (the thread took the CQ entry
   * that would have woken it). sig_set: written and not yet read. Both
   * under progress_lock. */
  int sig_fd;
  int sig_set;

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

/* ---- transports (src/transport/) -------------------------------------- */

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
  /* Makes a connection to host:port by deadline (xport__now_ms, or -1
   * for none). May block. On success *conn_p is linked (xport__conn_link),
   * perhaps lost already with its event queued; on failure nothing is
   * left. */
  int (*connect)(struct xport__lane *lane, const char *host, const char *port, long deadline,
                 xport_conn_t **conn_p);
  /* The next connection lst has made, waiting until deadline for one (0:
   * never waits). May block. As connect on success; -XPORT_ETIMEDOUT when
   * none came. */
  int (*accept)(xport_listener_t *lst, long deadline, xport_conn_t **conn_p);
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
  /* Fault injection (XPORT_FAULT drop_conn, src/core/fault.c): conn, CONNECTED,
   * is lost as if its peer had died, by the path a real loss takes (its
   * operations end with -XPORT_ECONNRESET, or 0 where the provider had
   * finished them; its disconnect event is queued), and its end reaches
   * the peer, which loses it too. Never fails; does not block. */
  void (*drop)(xport_conn_t *conn);
  /* The data path of its connections, unless it gives one another
   * (conn->ops). */
  const struct xport__data_ops *data;
  /* Ends every endpoint the transport opened, after the last connection
   * and listener closed and before the CQ closes; may be NULL. */
  void (*fini)(struct xport__lane *lane);
  /* 1: peers are watched by the clock (process checks, heartbeats): a
   * wait never sleeps past a quarter of XPORT_PEER_TIMEOUT while there
   * are connections, and runs progress when it wakes with nothing. */
  int watches_peers;
};
/* The transport for endpoints of type t, or NULL (transport/registry.c). */
const struct xport__transport *xport__transport_for(enum fi_ep_type t);

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

/* ---- internal entry points between core files ------------------------ */

/* mem.c */
int xport__reg(struct xport__lane *lane, void *buf, size_t len, uint64_t fi_access,
               struct fid_mr **mr_p);
struct xport__bounce *xport__bounce_get(struct xport__lane *lane);
/* A registered slot of XPORT__SMALL_SLOT bytes; given back by bounce_put. */
struct xport__bounce *xport__small_get(struct xport__lane *lane);
void xport__bounce_put(struct xport__lane *lane, struct xport__bounce *b);
void xport__bounce_fini(struct xport__lane *lane);
uint64_t xport__random_key(size_t key_size);
/* The registration that covers exactly [offset, offset + len) of mr:
 * the region's own for the whole of it, else one made for that range
 * (kept until mr is deregistered). */
int xport__mr_span(xport_mr_t *mr, size_t offset, size_t len, struct fid_mr **fmr_p);

/* msg.c: the post path shared by messages and RMA. begin validates,
 * takes a request and gives every element a descriptor (fiov, desc,
 * *cnt); end hands the provider's verdict back: on failure it undoes
 * begin, on success it links the request to its connection. */
int xport__post_begin(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov,
                      size_t iovcnt, void *user_ctx, struct iovec *fiov, void **desc,
                      size_t *cnt, struct xport__req **req_p);
int xport__post_end(xport_conn_t *conn, struct xport__req *req, ssize_t ret);
/* Instead of end, for a send, read or write the provider pushed back
 * (xport__pushed_back) or that must stay behind held ones (conn->held):
 * req waits on conn, in order, to be posted as h says, with h->cnt
 * elements of fiov and desc; 0, or
 * -XPORT_EAGAIN (undone) where no memory is left to keep it. */
int xport__post_hold(xport_conn_t *conn, struct xport__req *req, const struct xport__held *h,
                     const struct iovec *fiov, void *const *desc);
static inline int xport__pushed_back(ssize_t ret)
{
  /* ENOMEM: the provider's per-endpoint entry pool ran out (shm). */
  return ret == -FI_EAGAIN || ret == -FI_ENOMEM;
}
/* Posts what waits, oldest first, as far as the provider takes it. */
void xport__held_retry(xport_ctx_t *ctx);
/* Ends what waits on conn with status: the provider never had it. */
void xport__held_flush(xport_conn_t *conn, int status);
/* 0 if n more operations of op's direction fit conn's depth and the
 * context's CQ, else -XPORT_EAGAIN. */
int xport__post_room(const xport_conn_t *conn, xport_op_t op, size_t n);

/* cq.c */
/* The pool's slow half: a chunk more, and one of it taken (cq.c). */
struct xport__req *xport__req_grow(xport_ctx_t *ctx);
/* A request from the pool, or NULL where no memory is left. */
static inline struct xport__req *xport__req_get(xport_ctx_t *ctx)
{
  struct xport__req *r = ctx->free_reqs;
  if (XPORT__UNLIKELY(!r))
    return xport__req_grow(ctx);
  ctx->free_reqs = r->next;
  r->result = NULL;
  return r;
}
/* A request from the pool, ready for op on conn (NULL: no memory):
 * nothing of its last life is left but what the post sets itself. */
static inline struct xport__req *xport__req_new(xport_ctx_t *ctx, xport_conn_t *conn,
                                                xport_op_t op, void *user_ctx)
{
  struct xport__req *req = xport__req_get(ctx);
  if (XPORT__UNLIKELY(!req))
    return NULL;
  req->conn = conn;
  req->user_ctx = user_ctx;
  req->op = op;
  req->bounce = NULL;
  req->ntmp = 0;
  req->uiovcnt = 0;
  req->zombie = 0;
  req->rep = NULL;
  req->posted_ms = 0;
  req->pair = 0;
  req->detail = NULL;
  req->unsig = 0;
  return req;
}
/* Marks a request finished with status and queues it for delivery. */
void xport__req_complete(xport_ctx_t *ctx, struct xport__req *req, int status);
/* Queues the completion of a request the provider never took (inject). */
void xport__req_done_now(xport_ctx_t *ctx, struct xport__req *req);
/* Orphans a request the provider still owns (RDM): it completes with
 * status once the provider lets go of it. */
void xport__req_orphan(struct xport__req *req, int status);
/* Queues a finished request for delivery. */
void xport__done_push(xport_ctx_t *ctx, struct xport__req *req);
/* wimm.c: posts an emulated write_imm of iov (len bytes) to the peer's
 * addr under key (rma.c, once checked): both halves, or neither. */
int xport__wimm_post(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt, size_t len,
                     uint64_t addr, uint64_t key, uint32_t imm, void *user_ctx);
/* wimm.c: the write of a deferred write_imm (p, its user half) finished
 * with status: its marker goes now, or p fails with that status. Lower
 * layers reach it through ctx->wimm_write_done. */
void xport__wimm_write_done(xport_ctx_t *ctx, struct xport__req *p, int status);
/* Posts the markers that waited for room; with fail, fails them all
 * (lower layers: ctx->wimm_retry). */
void xport__wimm_retry(xport_ctx_t *ctx, int fail);
/* Drops every finished, undelivered request, parked ones too (the
 * context is going). */
void xport__done_discard(xport_ctx_t *ctx);
/* Releases a request's library-owned memory (bounce, registrations). */
void xport__req_free_mem(struct xport__lane *lane, struct xport__req *req);
/* The peer of conn is dead and the provider can no longer touch what its
 * orphaned requests hold (dead_peer_lets_go): the user sees them now;
 * the requests themselves wait for the provider or the endpoint. */
void xport__zombie_show(xport_ctx_t *ctx, xport_conn_t *conn);
/* After an endpoint closed: its zombies will never be reported. */
void xport__zombie_reclaim(struct xport__lane *lane, struct xport__rep *rep);
/* Reads the CQ until it is empty, queueing what the user must see. */
void xport__cq_drain(struct xport__lane *lane);
void xport__req_release(xport_ctx_t *ctx, struct xport__req *req);
void xport__req_fini(xport_ctx_t *ctx);
int xport__progress_start(xport_ctx_t *ctx);
void xport__progress_stop(xport_ctx_t *ctx);
/* With the progress thread on, every call into the provider is made
 * under ctx->progress_lock (recursive): not every provider survives two
 * threads progressing it (rxm). Without it, this costs one branch. */
#define XPORT__LOCK(ctx)                                                     \
  do {                                                                       \
    if (XPORT__UNLIKELY((ctx)->progress_on))                                 \
      pthread_mutex_lock(&(ctx)->progress_lock);                             \
  } while (0)
#define XPORT__UNLOCK(ctx)                                                   \
  do {                                                                       \
    if (XPORT__UNLIKELY((ctx)->progress_on))                                 \
      pthread_mutex_unlock(&(ctx)->progress_lock);                           \
  } while (0)
/* Closes a fid with the progress thread held off. */
int xport__close_fid(xport_ctx_t *ctx, struct fid *fid);
/* Leaves a fid open for the rest of the process (keep_fids), remembered
 * where a leak checker finds it: memory kept on purpose, not lost. */
void xport__fid_keep(struct fid *fid);
int xport__wait_fds(struct xport__lane *lane);

/* conn.c (the public calls) */
/* Hands lst to a layer above: see struct xport_listener (admit NULL
 * gives it back to the application). */
void xport__listener_hook(xport_listener_t *lst, int (*admit)(void *, uint64_t),
                          void (*accepted)(void *, xport_conn_t *), void *arg);
/* Accepts what the listeners a layer above owns have ready (the jobs). */
void xport__auto_accept(xport_ctx_t *ctx);
/* cq.c: one step of progress on every lane of lane's context but lane,
 * accepts for a layer above included: what a transport runs while it
 * waits in a connect or an accept, so that a peer waiting on another
 * lane is not left waiting for this one (two ranks of a job that connect
 * to each other over different transports). Never blocks; does nothing
 * when called from inside itself. With the lock held. */
void xport__progress_beside(struct xport__lane *lane);

/* link.c: connections and listeners as the context holds them */
/* A connection being made (CONNECTING), in no list yet: NULL, no memory. */
xport_conn_t *xport__conn_new(struct xport__lane *lane);
/* The connection is the application's now: on ctx->conns, handed. */
void xport__conn_link(xport_conn_t *conn);
void xport__conn_unlink(xport_conn_t *conn);
void xport__connreq_push(xport_listener_t *lst, struct xport__connreq *cr);
/* Shuts sockets on ctx's listeners' ports that have not delivered a
 * complete connection request (the provider's cm_header and greeting
 * bytes) within XPORT__GREET_MS, or sooner where descriptors run short;
 * looks at most twice a second. Called with the ctx lock held, from the
 * transport's progress. */
void xport__halfopen_watch(struct xport__lane *lane, size_t greeting);
/* 1 if a handshake with the context peer_ctx_id is under way at lst. */
int xport__listener_shaking_from(const xport_listener_t *lst, uint64_t peer_ctx_id);
/* Queues conn's disconnect event (once): it is delivered after the
 * done-list entries pushed before it and its own connection's later ones. */
void xport__evq_push(xport_ctx_t *ctx, xport_conn_t *conn, int status);
void xport__evq_remove(xport_ctx_t *ctx, xport_conn_t *conn);
/* Frees a closed connection once nothing refers to it any more. */
void xport__conn_free_if_done(xport_conn_t *conn);
/* Sets conn->peer_gone where the peer's process (on this node) ended;
 * asked when the connection broke, the first time it waits briefly for
 * the process to end (see cq.c). */
void xport__conn_check_gone(xport_conn_t *conn);

#define XPORT__SVC_DEPTH 8 /* emulated atomics outstanding per connection */
/* The kinds of atomics, as the service channel's wire names them too. */
enum { XPORT__ATOM_FADD = 1, XPORT__ATOM_CSWAP = 2, XPORT__ATOM_ADD = 3 };
/* mem.c: finds what a key of this context names: the local range it covers and
 * the region's rights; 0, or -XPORT_EACCES for no such key. */
int xport__mr_by_key(xport_ctx_t *ctx, uint64_t key, char **base_p, size_t *len_p,
                     unsigned *access_p);

/* fault.c: fault injection (XPORT_FAULT), costing the data path one test
 * of ctx->fault while off. */
struct xport__fault;
/* Reads XPORT_FAULT: 0 with its rules in *f_p (NULL where it is unset),
 * or -XPORT_EINVAL, logged, for a malformed value. */
int xport__fault_new(struct xport__fault **f_p);
/* ctx (on every lane) injects f's faults;
 * f NULL does nothing. xport__fault_fini ends them and frees f;
 * xport__fault_free frees one never attached (NULL: nothing). */
void xport__fault_attach(xport_ctx_t *ctx, struct xport__fault *f);
void xport__fault_free(struct xport__fault *f);
void xport__fault_fini(xport_ctx_t *ctx);
/* A post on conn (send, receive, write, read, atomic), with its context's
 * lock held: -XPORT_EAGAIN for one to push back (nothing done yet, nothing
 * to undo), else 0 and the post goes on. */
int xport__fault_post(xport_conn_t *conn);
/* 1 where this registration (xport_mr_reg) is to fail. */
int xport__fault_mr_reg(xport_ctx_t *ctx);
/* xport_poll and xport_wait with the faults on; poll and wait are theirs
 * without. */
int xport__fault_poll(xport_ctx_t *ctx, xport_completion_t *comps, int max,
                      int (*poll)(xport_ctx_t *, xport_completion_t *, int));
int xport__fault_wait(xport_ctx_t *ctx, int timeout_ms, int (*wait)(xport_ctx_t *, int));
/* conn is being closed: its held disconnect event goes, and its drop. */
void xport__fault_forget(xport_conn_t *conn);

/* addr.c */
int xport__addr_split(const char *addr, char *host, size_t hlen, char *port,
                      size_t plen);
/* fi_getinfo for host:port on the context's provider (flags FI_SOURCE:
 * to listen there); 0, or why not, logged. */
int xport__resolve(struct xport__lane *lane, const char *host, const char *port, uint64_t flags,
                   struct fi_info **info_p);

static inline long xport__now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static inline void xport__strlcpy(char *dst, const char *src, size_t len)
{
  size_t n = 0;
  if (src)
    for (; n + 1 < len && src[n]; n++)
      dst[n] = src[n];
  dst[n] = '\0';
}

/* Little-endian fields of xport's own formats (packed keys, service
 * channel messages): the same bytes on every host. */
static inline void xport__put16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void xport__put32(uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void xport__put64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t xport__get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t xport__get32(const uint8_t *p)
{
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static inline uint64_t xport__get64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

#endif /* XPORT_INT_H */
