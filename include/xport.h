/*
 * xport: a portable transport layer for HPC codes.
 *
 * The one public header. No libfabric type appears here, so applications
 * build without libfabric's headers and the library may change providers
 * without breaking them. The man pages (xport(7), one page per function)
 * are the reference; the comments here say only what a caller must keep
 * in mind while reading a prototype.
 */
#ifndef XPORT_H
#define XPORT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(XPORT_BUILDING)
#define XPORT_API __attribute__((visibility("default")))
#else
#define XPORT_API
#endif

#define XPORT_VERSION_MAJOR 0
#define XPORT_VERSION_MINOR 1

/*
 * Error codes. Calls return 0 (or a count) on success and -XPORT_Exxx on
 * failure; completions carry the same codes in their status. The first
 * group has the values of <errno.h>; codes of xport's own start at 256.
 */
#define XPORT_ERRNO_MAP(X)                                                   \
  X(EPERM, EPERM, "operation not permitted")                                 \
  X(ENOENT, ENOENT, "no such entry")                                         \
  X(EIO, EIO, "input/output error in the provider")                          \
  X(EAGAIN, EAGAIN, "queue full: poll for completions, then post again")     \
  X(ENOMEM, ENOMEM, "out of memory (or locked-memory limit reached)")        \
  X(EACCES, EACCES, "access denied: the memory region's rights, or authentication") \
  X(EBUSY, EBUSY, "object still has live children or operations")           \
  X(ENODEV, ENODEV, "no such device")                                        \
  X(EINVAL, EINVAL, "invalid argument")                                      \
  X(ERANGE, ERANGE, "address range outside the memory region")              \
  X(ENOSYS, ENOSYS, "not supported by this provider")                        \
  X(EMSGSIZE, EMSGSIZE, "message larger than the provider allows")          \
  X(EPROTO, EPROTO, "malformed, foreign or unexpected data")                 \
  X(EADDRINUSE, EADDRINUSE, "address already in use")                        \
  X(EADDRNOTAVAIL, EADDRNOTAVAIL, "address not available")                   \
  X(ECONNRESET, ECONNRESET, "connection reset: the peer closed or died")     \
  X(ENOTCONN, ENOTCONN, "not connected")                                     \
  X(ETIMEDOUT, ETIMEDOUT, "timed out")                                       \
  X(ECONNREFUSED, ECONNREFUSED, "connection refused")                        \
  X(EHOSTUNREACH, EHOSTUNREACH, "host unreachable")                          \
  X(ECANCELED, ECANCELED, "operation canceled")                              \
  X(ENOPROV, 256, "no usable provider")                                      \
  X(ETRUNC, 257, "receive buffer too small: message truncated")             \
  X(EPROVIDER, 258, "provider error (see the log line, or the completion's detail)")

enum xport_errno {
#define XPORT__ERRNO_ENUM(name, value, msg) XPORT_##name = (value),
  XPORT_ERRNO_MAP(XPORT__ERRNO_ENUM)
#undef XPORT__ERRNO_ENUM
};

/* Accepts a code with either sign; never returns NULL. */
XPORT_API const char *xport_strerror(int code);

/* Opaque handles. */
typedef struct xport_ctx xport_ctx_t;
typedef struct xport_listener xport_listener_t;
typedef struct xport_conn xport_conn_t;
typedef struct xport_mr xport_mr_t;

/* A setting left XPORT_UNSET falls back to the environment, then the default. */
typedef enum { XPORT_UNSET = 0, XPORT_OFF = 1, XPORT_ON = 2 } xport_switch_t;

typedef struct xport_ctx_attr {
  const char *provider; /* ordered, comma-separated; leading '^' excludes */
  const char *domain;   /* device, e.g. "mlx5_0", "rxe0"; NULL: any */
  const char *iface;    /* network interface; NULL: any */
  xport_switch_t strict;          /* act as if every obligation applied */
  xport_switch_t progress_thread; /* drive progress while the caller is away */
  /* A wait fd for xport_wait/xport_ctx_fd; off saves a syscall or two per
   * completion on some providers (tcp) for callers that only poll. */
  xport_switch_t wait_fd;
  /* A write completes only once its data has reached the target (as on
   * verbs RC), not as soon as the transport took it: see xport(7). */
  xport_switch_t delivery_complete;
  /* A shared secret of at least 16 bytes (NULL: XPORT_AUTH_KEY_FILE, else
   * none): every connection then proves knowledge of it both ways before
   * it is made, and one without it is refused (xport(7), AUTHENTICATION).
   * Copied at creation; the caller may wipe it afterwards. */
  const void *auth_key;
  size_t auth_key_len;
} xport_ctx_attr_t;

typedef enum { XPORT_EP_MSG = 1, XPORT_EP_RDM = 2 } xport_ep_type_t;
typedef enum {
  XPORT_SUPPORT_NONE = 0,
  XPORT_SUPPORT_EMULATED = 1,
  XPORT_SUPPORT_NATIVE = 2
} xport_support_t;
typedef enum { XPORT_PROGRESS_AUTO = 1, XPORT_PROGRESS_MANUAL = 2 } xport_progress_t;
/* Where a context's authentication key came from (xport_caps_t.auth). */
typedef enum {
  XPORT_AUTH_OFF = 0,  /* no key: connections are not authenticated */
  XPORT_AUTH_ATTR = 1, /* xport_ctx_attr_t.auth_key */
  XPORT_AUTH_FILE = 2, /* the file XPORT_AUTH_KEY_FILE names */
  XPORT_AUTH_JOB = 3   /* the job's, from its launcher (xport_job_init(3)) */
} xport_auth_t;

/* Memory-registration obligations of the provider (xport_caps_t.mr_mode). */
#define XPORT_MR_LOCAL 0x1u     /* local buffers must be registered */
#define XPORT_MR_VIRT_ADDR 0x2u /* RMA addresses are virtual addresses */
#define XPORT_MR_PROV_KEY 0x4u  /* the provider chooses keys */
#define XPORT_MR_ENDPOINT 0x8u  /* regions bind to endpoints */
#define XPORT_MR_RAW 0x10u      /* keys are opaque byte strings */

/* The normalized capability record of the provider a context chose. */
typedef struct xport_caps {
  char provider[32];
  char fabric[64];
  char domain[64];
  xport_ep_type_t ep_type;
  size_t max_msg_size;
  size_t inject_size;
  size_t max_iov;       /* iov entries one post may carry */
  size_t tx_depth;      /* sends, writes, reads outstanding per connection (EAGAIN beyond) */
  size_t rx_depth;      /* receives outstanding per connection (EAGAIN beyond) */
  unsigned imm_bits;    /* immediate-data width xport guarantees: 32 */
  unsigned wire_imm_bytes; /* what the provider carries: 4 or 8 */
  xport_support_t rma;
  xport_support_t write_imm; /* none: xport_write_imm returns ENOSYS */
  xport_support_t atomics;
  unsigned mr_mode;     /* XPORT_MR_* obligations in force */
  int wait_fd;          /* 1: xport_ctx_fd() gives a pollable descriptor */
  xport_progress_t progress;
  int strict;
  int progress_thread;
  int delivery_complete; /* 1: a write's completion means the target has the data */
  xport_auth_t auth;     /* connections prove a shared key (never shown) */
} xport_caps_t;

typedef enum {
  XPORT_VERDICT_CHOSEN = 1,
  XPORT_VERDICT_USABLE = 2, /* ranked after the chosen one; not opened */
  XPORT_VERDICT_REJECTED = 3
} xport_verdict_t;

/* One fi_getinfo candidate as the probe judged it, in rank order. */
typedef struct xport_candidate {
  char provider[32];
  char fabric[64];
  char domain[64];
  xport_ep_type_t ep_type;
  xport_verdict_t verdict;
  char reason[160];
} xport_candidate_t;

XPORT_API int xport_ctx_create(const xport_ctx_attr_t *attr, xport_ctx_t **ctx_p);
/* Tears down every listener, connection and region still open. */
XPORT_API int xport_ctx_destroy(xport_ctx_t *ctx);
XPORT_API int xport_ctx_query(const xport_ctx_t *ctx, xport_caps_t *caps_p);
/* Returns the number of candidates; the array lives as long as ctx. */
XPORT_API int xport_ctx_candidates(const xport_ctx_t *ctx,
                                   const xport_candidate_t **cands_p);
XPORT_API int xport_ctx_fd(xport_ctx_t *ctx, int *fd_p);

/* Addresses are "host:port", "[v6addr]:port" or "name:port"; port 0 binds
 * an ephemeral port that xport_listener_addr() then reports. */
XPORT_API int xport_listen(xport_ctx_t *ctx, const char *addr,
                           xport_listener_t **lst_p);
XPORT_API int xport_listener_addr(const xport_listener_t *lst, char *buf,
                                  size_t len);
XPORT_API int xport_listener_close(xport_listener_t *lst);
/* timeout_ms < 0 waits forever. */
XPORT_API int xport_accept(xport_listener_t *lst, int timeout_ms,
                           xport_conn_t **conn_p);
XPORT_API int xport_connect(xport_ctx_t *ctx, const char *addr, int timeout_ms,
                            xport_conn_t **conn_p);
/* Up to XPORT_CONN_DATA_MAX bytes of the caller's ride the connection
 * request, as rdma_cm's private data; the accepting side reads them with
 * xport_conn_peer before it receives anything. */
#define XPORT_CONN_DATA_MAX 56
XPORT_API int xport_connect_data(xport_ctx_t *ctx, const char *addr, const void *data,
                                 size_t len, int timeout_ms, xport_conn_t **conn_p);
/* Outstanding operations complete with -XPORT_ECANCELED; the handle stays
 * valid until the last of its completions has been polled. */
XPORT_API int xport_conn_close(xport_conn_t *conn);
/* The capabilities of the transport conn runs on (caps.provider names it:
 * "shm" for a peer on this node where XPORT_SHM let the context open shm). */
XPORT_API int xport_conn_query(const xport_conn_t *conn, xport_caps_t *caps_p);
/* Who is at the other end of a connection (xport_conn_peer(3)). */
typedef struct xport_peer {
  /* Where the peer is, as this side's transport sees it: "host:port" (an
   * IPv6 host in brackets) over a network fabric, "local:PID" for a
   * process of this node over shared memory; "" where unknown. */
  char addr[128];
  /* What the peer sent with its connection request (xport_connect_data):
   * on the accepting side only, else 0 bytes. */
  size_t data_len;
  unsigned char data[XPORT_CONN_DATA_MAX];
} xport_peer_t;
XPORT_API int xport_conn_peer(const xport_conn_t *conn, xport_peer_t *peer_p);
/* A deadline for conn's operations: outstanding sends, writes, reads and
 * atomics of which none ends for timeout_ms lose the connection, and fail
 * with XPORT_ETIMEDOUT. 0: none (XPORT_OP_TIMEOUT sets the default). */
XPORT_API int xport_conn_timeout(xport_conn_t *conn, int timeout_ms);

/* Access rights of a registered region. */
#define XPORT_ACCESS_LOCAL 0x1u        /* send, receive, local side of RMA */
#define XPORT_ACCESS_REMOTE_READ 0x2u
#define XPORT_ACCESS_REMOTE_WRITE 0x4u
/* 64-bit remote atomics (xport_fetch_add(3)); on native providers the
 * provider then also accepts remote writes to the range. */
#define XPORT_ACCESS_REMOTE_ATOMIC 0x8u

XPORT_API int xport_mr_reg(xport_ctx_t *ctx, void *buf, size_t len,
                           unsigned access, xport_mr_t **mr_p);
XPORT_API int xport_mr_dereg(xport_mr_t *mr);

/* A gather/scatter element; mr may be NULL (xport then handles it). */
typedef struct xport_iov {
  void *base;
  size_t len;
  xport_mr_t *mr;
} xport_iov_t;

/* Posts are non-blocking: the buffer belongs to xport until its
 * completion. mr may be NULL. A failed post posts nothing. */
XPORT_API int xport_send(xport_conn_t *conn, const void *buf, size_t len,
                         xport_mr_t *mr, void *user_ctx);
/* XPORT_SEND_UNSIGNALED: no completion unless the send fails; a send of
 * at most caps.inject_size bytes is copied before it returns, a longer one
 * is known finished once a later signaled send on conn has completed
 * (xport_send_flags(3)). */
#define XPORT_SEND_UNSIGNALED 0x1u
XPORT_API int xport_send_flags(xport_conn_t *conn, const void *buf, size_t len,
                               xport_mr_t *mr, unsigned flags, void *user_ctx);
XPORT_API int xport_send_imm(xport_conn_t *conn, const void *buf, size_t len,
                             xport_mr_t *mr, uint32_t imm, void *user_ctx);
XPORT_API int xport_sendv(xport_conn_t *conn, const xport_iov_t *iov,
                          size_t iovcnt, void *user_ctx);
XPORT_API int xport_recv(xport_conn_t *conn, void *buf, size_t len,
                         xport_mr_t *mr, void *user_ctx);
XPORT_API int xport_recvv(xport_conn_t *conn, const xport_iov_t *iov,
                          size_t iovcnt, void *user_ctx);
/* Posts a receive to ctx's shared pool, which any of its connections may
 * take: its completion names the connection (xport_recv_shared(3)). A
 * connection on which the application posts a receive of its own leaves
 * the pool. */
XPORT_API int xport_recv_shared(xport_ctx_t *ctx, void *buf, size_t len,
                                xport_mr_t *mr, void *user_ctx);

/* ---- one-sided operations (RMA) ---------------------------------------
 * A region is exported by packing a remote key for it (or a sub-range),
 * sending the bytes to the peer by any means, and unpacking them there
 * against the connection to the exporter. Offsets are relative to the
 * packed range; xport turns them into what the provider wants. */
typedef struct xport_rkey xport_rkey_t;

#define XPORT_RKEY_MAX_SIZE 256 /* a packed key never exceeds this */

/* Returns the packed size (a count) on success. A sub-range gets a
 * registration of its own (the exporter's provider enforces it), released
 * with mr, which revokes every key packed from it. */
XPORT_API int xport_rkey_pack(xport_mr_t *mr, size_t offset, size_t len,
                              void *buf, size_t buflen);
XPORT_API int xport_rkey_unpack(xport_conn_t *conn, const void *buf, size_t len,
                                xport_rkey_t **rkey_p);
XPORT_API int xport_rkey_release(xport_rkey_t *rkey);

/* The target's CPU is not involved; its data is visible once the write's
 * completion, or a later message on the same connection, is seen there. */
XPORT_API int xport_write(xport_conn_t *conn, const void *buf, size_t len,
                          xport_mr_t *mr, const xport_rkey_t *rkey,
                          size_t offset, void *user_ctx);
/* Also consumes one receive posted at the target, which completes as
 * XPORT_OP_REMOTE_WRITE_IMM with imm, once the data is in place. */
XPORT_API int xport_write_imm(xport_conn_t *conn, const void *buf, size_t len,
                              xport_mr_t *mr, const xport_rkey_t *rkey,
                              size_t offset, uint32_t imm, void *user_ctx);
XPORT_API int xport_writev(xport_conn_t *conn, const xport_iov_t *iov,
                           size_t iovcnt, const xport_rkey_t *rkey,
                           size_t offset, void *user_ctx);
XPORT_API int xport_read(xport_conn_t *conn, void *buf, size_t len,
                         xport_mr_t *mr, const xport_rkey_t *rkey,
                         size_t offset, void *user_ctx);
XPORT_API int xport_readv(xport_conn_t *conn, const xport_iov_t *iov,
                          size_t iovcnt, const xport_rkey_t *rkey,
                          size_t offset, void *user_ctx);

/* ---- remote atomics ----------------------------------------------------
 * On the 8-byte-aligned 64-bit word at offset of a key packed with
 * XPORT_ACCESS_REMOTE_ATOMIC. The word's value before the operation lands
 * in *result, in host byte order, by the completion (XPORT_OP_ATOMIC);
 * result belongs to xport until then. Native or emulated per provider
 * (xport_caps_t.atomics): the target must be polling on some providers. */
XPORT_API int xport_fetch_add(xport_conn_t *conn, uint64_t *result, uint64_t add,
                              const xport_rkey_t *rkey, size_t offset, void *user_ctx);
/* Stores swap if the word equals compare; *result is the old value
 * either way (equal to compare: the swap happened). */
XPORT_API int xport_cswap(xport_conn_t *conn, uint64_t *result, uint64_t compare,
                          uint64_t swap, const xport_rkey_t *rkey, size_t offset,
                          void *user_ctx);
/* Adds without fetching. */
XPORT_API int xport_atomic_add(xport_conn_t *conn, uint64_t add, const xport_rkey_t *rkey,
                               size_t offset, void *user_ctx);

typedef enum {
  XPORT_OP_SEND = 1,
  XPORT_OP_RECV = 2,
  XPORT_OP_DISCONNECT = 3, /* an event: the connection is gone */
  XPORT_OP_WRITE = 4,      /* xport_write, xport_write_imm, xport_writev */
  XPORT_OP_READ = 5,
  XPORT_OP_REMOTE_WRITE_IMM = 6, /* a receive consumed by the peer's write_imm */
  XPORT_OP_ATOMIC = 7      /* xport_fetch_add, xport_cswap, xport_atomic_add */
} xport_op_t;

#define XPORT_COMP_IMM 0x1u /* imm holds immediate data */

typedef struct xport_completion {
  xport_op_t op;
  int status;           /* 0 or -XPORT_Exxx */
  unsigned flags;       /* XPORT_COMP_* */
  uint32_t imm;
  size_t len;           /* bytes received (receives) or sent */
  void *user_ctx;
  xport_conn_t *conn;
  const char *detail;   /* provider's text on error; valid until next poll */
  const char *hint;     /* one line on the likely cause, or NULL */
} xport_completion_t;

/* Drives progress and returns up to max completions (0 when none). */
XPORT_API int xport_poll(xport_ctx_t *ctx, xport_completion_t *comps, int max);
/* Sleeps until a completion may be ready: 0, or -XPORT_ETIMEDOUT. */
XPORT_API int xport_wait(xport_ctx_t *ctx, int timeout_ms);

/* ---- jobs: wire-up through the launcher (xport_job(3)) ------------------
 * Under mpirun or srun --mpi=pmix, every rank joins with xport_job_init
 * (collective); connections are made on demand, one per pair of ranks,
 * and belong to the job: xport_job_fini (collective) closes them. Built
 * without PMIx, xport_job_init returns -XPORT_ENOSYS. */
typedef struct xport_job xport_job_t;

XPORT_API int xport_job_init(xport_ctx_t *ctx, xport_job_t **job_p);
/* Return the rank (0 ... size-1) and the size, or a negative code. */
XPORT_API int xport_job_rank(const xport_job_t *job);
XPORT_API int xport_job_size(const xport_job_t *job);
/* The peer must make progress (any call on its context) for a new
 * connection to be made; do not close what this returns. */
XPORT_API int xport_job_conn(xport_job_t *job, int rank, xport_conn_t **conn_p);
/* The rank at the other end of conn, or -XPORT_ENOENT. */
XPORT_API int xport_job_peer(const xport_job_t *job, const xport_conn_t *conn);
XPORT_API int xport_job_barrier(xport_job_t *job);
XPORT_API int xport_job_fini(xport_job_t *job);

/* The XPORT_* environment variables, declared once in the library. */
typedef struct xport_env_var {
  const char *name;
  const char *type;
  const char *def;
  const char *help;
} xport_env_var_t;

/* Returns the number of variables; the array is static. */
XPORT_API int xport_env_list(const xport_env_var_t **vars_p);

#ifdef __cplusplus
}
#endif
#endif /* XPORT_H */
