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
#include <rdma/fi_rma.h>

#define XPORT__FI_VERSION FI_VERSION(1, 17)
#define XPORT__IOV_MAX 4     /* iov entries xport itself tracks per post */
#define XPORT__CQ_BATCH 32   /* CQ entries read per fi_cq_read */
#define XPORT__MAX_CANDS 64
#define XPORT__EQ_EVERY 16   /* empty polls between two EQ reads */

#define XPORT__UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Request kinds of xport's own, next to the public xport_op_t values. */
#define XPORT__OP_SILENT 100 /* internal half of an emulated write_imm */
/* Upper half of 8-byte CQ data marking the message that completes an
 * emulated write-with-immediate (see rma.c). */
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
  /* 1: reports FI_PROGRESS_AUTO but moves nothing unless its CQ is read. */
  int manual_progress;
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
  XPORT__ENV_COUNT
};

/* The raw value of a variable, or NULL when unset or empty. */
const char *xport__env_str(enum xport__env_id id);
/* Boolean/size values; a malformed value logs a warning and gives def. */
int xport__env_bool(enum xport__env_id id, int def);
size_t xport__env_size(enum xport__env_id id, size_t def);

enum { XPORT__LOG_ERROR = 1, XPORT__LOG_WARN, XPORT__LOG_INFO, XPORT__LOG_DEBUG };
extern int xport__log_level;
void xport__log_init(void);
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

/* Maps a libfabric return or completion code (either sign) to -XPORT_E*. */
int xport__err_from_fi(int fi_err);
/* A one-line hint for a failed completion, or NULL. */
const char *xport__err_hint(int code);

/* ---- objects --------------------------------------------------------- */

struct xport_mr {
  xport_ctx_t *ctx;
  struct fid_mr *mr;
  void *desc;
  char *base;
  size_t len;
  unsigned access;
  struct xport_mr *next, *prev; /* ctx->mrs */
};

/* A pre-registered copy buffer, for providers that need FI_MR_LOCAL. */
struct xport__bounce {
  struct xport__bounce *next;
  char *buf;
  void *desc;
};

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
};

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

struct xport_conn {
  xport_ctx_t *ctx;
  struct fid_ep *ep;
  uint64_t peer_ctx_id;          /* the peer context's id, from the hello */
  enum xport__conn_state state;
  int fail_code;                 /* why FAILED */
  size_t nreqs;                  /* posted and not yet delivered */
  struct xport__req *out;        /* outstanding (posted) requests */
  int ev_queued;                 /* disconnect event waiting in ctx->evq */
  int ev_status;
  struct xport_conn *ev_next;
  struct xport_conn *next, *prev; /* ctx->conns */
};

struct xport__connreq {
  struct xport__connreq *next;
  struct fi_info *info;
  uint64_t peer_ctx_id;
};

/* An unpacked remote key, bound to the connection it was unpacked on. */
struct xport_rkey {
  const xport_conn_t *conn;
  uint64_t addr;   /* remote address of the packed range's start */
  uint64_t len;
  uint64_t key;
  unsigned access;
  int mapped;      /* key came from fi_mr_map_raw */
};

struct xport_listener {
  xport_ctx_t *ctx;
  struct fid_pep *pep;
  struct xport__connreq *pending, *pending_tail;
  char addr[96];
  struct xport_listener *next, *prev; /* ctx->listeners */
};

struct xport_ctx {
  struct fi_info *info; /* the chosen candidate, as opened */
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_eq *eq;
  struct fid_cq *cq;
  const struct xport__profile *prof;
  xport_caps_t caps;
  xport_candidate_t *cands;
  int ncands;

  uint64_t id;        /* random; names this context in hellos and keys */
  int need_local_mr;  /* FI_MR_LOCAL, or strict mode */
  int prov_key;       /* the provider chooses keys */
  int virt_addr;      /* RMA addresses are virtual addresses */
  int raw_keys;       /* FI_MR_RAW */
  int native_wimm;    /* write_imm consumes a receive natively (FI_RX_CQ_DATA) */
  size_t eager_size;  /* copy through bounce buffers up to this size */

  int epfd;           /* joins the CQ and EQ wait fds; -1 without */
  unsigned eq_skip;   /* empty polls since the EQ was last read */

  struct xport__req *free_reqs;
  struct xport__req_chunk *req_chunks;
  struct xport__req *done, *done_tail; /* completed, not yet delivered */
  struct xport_conn *evq, *evq_tail;   /* disconnect events to deliver */

  struct xport__bounce *free_bounce;
  struct xport__bounce_chunk *bounce_chunks;

  struct xport_conn *conns;
  struct xport_listener *listeners;
  struct xport_mr *mrs;

  pthread_t progress_tid;
  int progress_on;
  volatile int progress_stop;

  char detail[256]; /* provider text of the last error completion */
};

/* ---- internal entry points between core files ------------------------ */

/* mem.c */
int xport__reg(xport_ctx_t *ctx, void *buf, size_t len, uint64_t fi_access,
               struct fid_mr **mr_p);
struct xport__bounce *xport__bounce_get(xport_ctx_t *ctx);
void xport__bounce_put(xport_ctx_t *ctx, struct xport__bounce *b);
void xport__bounce_fini(xport_ctx_t *ctx);
uint64_t xport__random_key(size_t key_size);

/* msg.c: the post path shared by messages and RMA. begin validates,
 * takes a request and gives every element a descriptor (fiov, desc,
 * *cnt); end hands the provider's verdict back: on failure it undoes
 * begin, on success it links the request to its connection. */
int xport__post_begin(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov,
                      size_t iovcnt, void *user_ctx, struct iovec *fiov, void **desc,
                      size_t *cnt, struct xport__req **req_p);
int xport__post_end(xport_conn_t *conn, struct xport__req *req, ssize_t ret);

/* cq.c */
struct xport__req *xport__req_get(xport_ctx_t *ctx);
/* Marks a request finished with status and queues it for delivery. */
void xport__req_complete(xport_ctx_t *ctx, struct xport__req *req, int status);
void xport__req_release(xport_ctx_t *ctx, struct xport__req *req);
void xport__req_fini(xport_ctx_t *ctx);
void xport__cq_drain(xport_ctx_t *ctx);
int xport__progress_start(xport_ctx_t *ctx);
void xport__progress_stop(xport_ctx_t *ctx);
int xport__wait_fds(xport_ctx_t *ctx);

/* conn.c */
void xport__eq_dispatch(xport_ctx_t *ctx);
void xport__conn_free_if_done(xport_conn_t *conn);
int xport__wait_eq(xport_ctx_t *ctx, int timeout_ms);

/* addr.c */
int xport__addr_split(const char *addr, char *host, size_t hlen, char *port,
                      size_t plen);

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

#endif /* XPORT_INT_H */
