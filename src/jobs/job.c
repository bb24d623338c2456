/*
 * The job layer: wire-up through the launcher's PMIx server (mpirun,
 * srun --mpi=pmix). Each rank listens, publishes its listener's address
 * and its context's id, and fences; connections are then made on demand,
 * one per pair of ranks. It sits on top of the core: it uses the public
 * API, and one hook of the core's listeners (xport__listener_hook), by
 * which the job's listener accepts in the background wherever the
 * context makes progress.
 *
 * One connection per pair, whichever side asks first, without a third
 * party: a rank asks its peer by connecting to it. Two that ask each
 * other at once both connect; the lower rank's connection wins. The
 * lower rank refuses the higher's request while its own is on the way
 * (admit), the higher accepts the lower's always, and a higher rank whose
 * request was refused waits for the lower's connection, which the
 * refusal promises. A request is weighed when it is accepted, under the
 * context's lock, as a rank decides to connect: the two cannot cross.
 *
 * A connection is the pair's only once both ends hold it. The client
 * holds its connect's result; but a connect that timed out gave up on a
 * request the peer may still accept (a peer busy past the timeout accepts
 * it later, and hears that the client left only after that), so an
 * accepted connection is kept on trial: handed out once the client has
 * shown it holds it (conn->peer_holds), forgotten if it is lost before,
 * which lets the client's next request in.
 */
#include "xport_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef XPORT_HAVE_PMIX
#include <pmix.h>
#endif

#define JOB_KEY "xport.addr" /* then the generation: .0, .1, ... */
#define JOB_VALUE_MAX 160

static int jobs_live; /* a process is in one job at a time */

struct job_peer {
  char addr[96];         /* its listener, as it published it */
  uint64_t ctx_id;       /* its context, as it published it */
  xport_conn_t *conn;    /* the pair's connection, once made (on trial until peer_holds) */
  int connecting;        /* this rank's connect to it is under way */
  int handed;            /* xport_job_conn returned conn: it stays, lost or not */
};

struct xport_job {
  xport_ctx_t *ctx;
  xport_listener_t *lst;
  int rank, size;
  long timeout_ms;
  struct job_peer *peers;
  char key[32];          /* this join's PMIx key */
#ifdef XPORT_HAVE_PMIX
  pmix_proc_t me;
#endif
};

static void job_keep(xport_job_t *job, int r, xport_conn_t *conn)
{
  conn->app.owned = 1;
  job->peers[r].conn = conn;
}

/* 1 if rank r's connection is one its peer gave up on before it held it
 * (an accepted connection lost on trial). */
static int job_abandoned(const xport_job_t *job, int r)
{
  const struct job_peer *p = &job->peers[r];
  return p->conn && !p->handed && !p->conn->peer_holds &&
         p->conn->state != XPORT__CONN_CONNECTED;
}

/* Lets go of rank r's connection, never handed out. */
static void job_forget(xport_job_t *job, int r)
{
  xport_conn_t *conn = job->peers[r].conn;
  XPORT__INFO("job: rank %d gave up on the connection this rank accepted from it; a new one "
              "is made", r);
  job->peers[r].conn = NULL;
  conn->app.owned = 0;
  xport_conn_close(conn);
}

/* A handshake with that context is under way at either half of the
 * job's listener. Used with and without PMIx: xport_job_conn weighs it. */
static int shaking_at(const xport_listener_t *lst, uint64_t ctx_id)
{
  const struct xport__transport *tp = lst->lane->tp;
  return tp->shaking_from ? tp->shaking_from(lst, ctx_id)
                          : xport__listener_shaking_from(lst, ctx_id);
}

static int shaking_from(const xport_job_t *job, uint64_t ctx_id)
{
  return shaking_at(job->lst, ctx_id) || (job->lst->sub && shaking_at(job->lst->sub, ctx_id));
}

#ifdef XPORT_HAVE_PMIX /* the hooks of the job's listener, set by job_join */

static int rank_of(const xport_job_t *job, uint64_t ctx_id)
{
  for (int r = 0; r < job->size; r++)
    if (r != job->rank && job->peers[r].ctx_id == ctx_id)
      return r;
  return -1;
}

/* Under the context's lock, from the core's accept: a request from a
 * rank is weighed as it is accepted. */
static int job_admit(void *arg, uint64_t peer_ctx_id)
{
  xport_job_t *job = arg;
  int r = rank_of(job, peer_ctx_id);
  if (r < 0) {
    XPORT__INFO("job: refused a connection from a context that is no rank of this job");
    return 0;
  }
  struct job_peer *p = &job->peers[r];
  /* One per pair: not while one is made already (one on trial is, until
   * it is lost), or being accepted, or, for a higher rank, while this
   * rank's own is on its way. */
  if ((p->conn && !job_abandoned(job, r)) || shaking_from(job, peer_ctx_id) ||
      (p->connecting && r > job->rank))
    return 0;
  return 1;
}

static void job_accepted(void *arg, xport_conn_t *conn)
{
  xport_job_t *job = arg;
  int r = rank_of(job, conn->peer_ctx_id);
  if (r >= 0 && job_abandoned(job, r))
    job_forget(job, r); /* admitted in its place */
  if (r < 0 || job->peers[r].conn) {
    /* Cannot be, by admit; a second connection would only mislead. */
    xport_conn_close(conn);
    return;
  }
  job_keep(job, r, conn);
}
#endif

/* One step of the context's progress that delivers nothing: what it
 * reads waits for the application's xport_poll. The CQ is read too, as
 * providers with manual progress (tcp) move data only then: a message
 * this rank sent before a fence must reach its peer during the fence.
 * Under the lock. */
static void job_progress(xport_ctx_t *ctx)
{
  /* Every lane: peers on this node (XPORT_SHM) are accepted there. */
  for (unsigned l = 0; l < ctx->nlanes; l++) {
    xport__cq_drain(ctx->lanes[l]);
    ctx->lanes[l]->tp->progress(ctx->lanes[l]);
  }
  xport__auto_accept(ctx);
}


static void job_nap(xport_ctx_t *ctx)
{
  struct timespec ts = {0, 500 * 1000};
  XPORT__UNLOCK(ctx);
  nanosleep(&ts, NULL);
  XPORT__LOCK(ctx);
  job_progress(ctx);
}

XPORT_API int xport_job_rank(const xport_job_t *job)
{
  return job ? job->rank : -XPORT_EINVAL;
}

XPORT_API int xport_job_size(const xport_job_t *job)
{
  return job ? job->size : -XPORT_EINVAL;
}

XPORT_API int xport_job_peer(const xport_job_t *job, const xport_conn_t *conn)
{
  if (!job || !conn)
    return -XPORT_EINVAL;
  int rank = -XPORT_ENOENT;
  XPORT__LOCK(job->ctx); /* the progress thread may be accepting */
  for (int r = 0; r < job->size && rank < 0; r++)
    if (job->peers && job->peers[r].conn == conn)
      rank = r;
  XPORT__UNLOCK(job->ctx);
  return rank;
}

#define JOB_RETRY_MS 20
XPORT_API int xport_job_conn(xport_job_t *job, int rank, xport_conn_t **conn_p)
{
  if (!job || !conn_p)
    return -XPORT_EINVAL;
  if (rank < 0 || rank >= job->size || rank == job->rank) {
    XPORT__INFO("job: rank %d: no such peer (rank %d of %d)", rank, job->rank, job->size);
    return -XPORT_EINVAL;
  }
  xport_ctx_t *ctx = job->ctx;
  struct job_peer *p = &job->peers[rank];
  long deadline = xport__now_ms() + job->timeout_ms;
  int ret = -XPORT_ETIMEDOUT;

  XPORT__LOCK(ctx);
  /* Requests that already came in are weighed before this rank asks. */
  job_progress(ctx);
  xport__auto_accept(ctx);
  while (!(p->conn && (p->handed || p->conn->peer_holds)) && xport__now_ms() < deadline) {
    if (job_abandoned(job, rank)) {
      job_forget(job, rank);
      continue;
    }
    if (p->conn) {
      job_nap(ctx); /* accepted, on trial: the client's word, or its loss */
      continue;
    }
    if (shaking_from(job, p->ctx_id)) {
      job_nap(ctx); /* the peer's request is being accepted */
      continue;
    }
    p->connecting = 1;
    XPORT__UNLOCK(ctx);
    xport_conn_t *conn = NULL;
    long left = deadline - xport__now_ms();
    ret = xport_connect(ctx, p->addr, left > 0 ? (int)left : 0, &conn);
    XPORT__LOCK(ctx);
    p->connecting = 0;
    if (!ret && conn->peer_ctx_id != p->ctx_id) {
      XPORT__WARN("job: %s answered for rank %d, but as another context", p->addr, rank);
      xport_conn_close(conn);
      ret = -XPORT_EPROTO;
      break;
    }
    if (!ret) {
      /* One accepted meanwhile, still on trial, is one the peer gave up
       * on: it accepted this request, so it holds no other. */
      if (p->conn && !p->conn->peer_holds && !p->handed)
        job_forget(job, rank);
      if (p->conn)
        xport_conn_close(conn); /* the lower rank's connection came first */
      else
        job_keep(job, rank, conn);
      break;
    }
    if (ret != -XPORT_ECONNREFUSED)
      break;
    /* Refused: the peer's own connection is on its way (it is the lower
     * rank), or a request of ours that we gave up on is still in its
     * accept; both end soon. Ask again, pacing the requests. */
    long until = xport__now_ms() + JOB_RETRY_MS;
    while (!p->conn && xport__now_ms() < until)
      job_nap(ctx);
  }
  xport_conn_t *conn = p->conn && (p->handed || p->conn->peer_holds) ? p->conn : NULL;
  if (conn && !p->handed) {
    p->handed = 1;
    xport__pool_join(conn); /* the application's now, as from xport_accept */
  }
  XPORT__UNLOCK(ctx);
  if (!conn) {
    if (ret == -XPORT_ECONNREFUSED)
      ret = -XPORT_ETIMEDOUT;
    XPORT__WARN("job: no connection to rank %d (%s): %s", rank, p->addr, xport_strerror(ret));
    return ret;
  }
  *conn_p = conn;
  return 0;
}

/* Closes what job opened; free ends it. */
static void job_close(xport_job_t *job)
{
  /* First no more accepts (the progress thread may run them), then the
   * connections, then the listener. */
  if (job->lst) {
    XPORT__LOCK(job->ctx);
    xport__listener_hook(job->lst, NULL, NULL, NULL);
    XPORT__UNLOCK(job->ctx);
  }
  for (int r = 0; job->peers && r < job->size; r++)
    if (job->peers[r].conn) {
      job->peers[r].conn->app.owned = 0;
      xport_conn_close(job->peers[r].conn);
    }
  if (job->lst)
    xport_listener_close(job->lst);
  free(job->peers);
  job->peers = NULL;
}

#ifdef XPORT_HAVE_PMIX

static int err_from_pmix(pmix_status_t st)
{
  switch (st) {
  case PMIX_SUCCESS:
    return 0;
  case PMIX_ERR_TIMEOUT:
    return -XPORT_ETIMEDOUT;
  case PMIX_ERR_NOMEM:
    return -XPORT_ENOMEM;
  case PMIX_ERR_NOT_FOUND:
    return -XPORT_ENOENT;
  case PMIX_ERR_UNREACH:
    return -XPORT_ENOENT;
  default:
    return -XPORT_EIO;
  }
}

/* The host this rank publishes: XPORT_JOB_HOST, or the address of the
 * network the context's provider opened, or the loopback address (a
 * provider without IP addresses: shm, one node). */
static void job_host(xport_ctx_t *ctx, char *host, size_t len)
{
  const char *env = xport__env_str(XPORT__ENV_JOB_HOST);
  const struct fi_info *info = ctx->lanes[0]->info;
  snprintf(host, len, "127.0.0.1");
  if (env) {
    snprintf(host, len, "%s", env);
  } else if (info && info->src_addr && info->addr_format == FI_SOCKADDR_IN) {
    const struct sockaddr_in *sin = info->src_addr;
    if (sin->sin_addr.s_addr != htonl(INADDR_ANY))
      inet_ntop(AF_INET, &sin->sin_addr, host, (socklen_t)len);
  } else if (info && info->src_addr && info->addr_format == FI_SOCKADDR_IN6) {
    const struct sockaddr_in6 *sin6 = info->src_addr;
    char a[INET6_ADDRSTRLEN];
    if (!IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr) && !IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr) &&
        inet_ntop(AF_INET6, &sin6->sin6_addr, a, sizeof a))
      snprintf(host, len, "[%s]", a);
  }
}

struct fence_wait {
  volatile int done;
  pmix_status_t status;
};

static void fence_done(pmix_status_t status, void *cbdata)
{
  struct fence_wait *w = cbdata;
  w->status = status;
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
}

/* A fence that lets the context go on meanwhile: a peer still connecting
 * to this rank must be accepted, or the fence would wait for it forever. */
static int job_fence(xport_job_t *job, int collect)
{
  struct fence_wait w = {0, PMIX_SUCCESS};
  pmix_info_t info;
  bool flag = true;
  size_t ninfo = 0;
  PMIX_INFO_CONSTRUCT(&info);
  if (collect) {
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
    ninfo = 1;
  }
  pmix_status_t st = PMIx_Fence_nb(NULL, 0, ninfo ? &info : NULL, ninfo, fence_done, &w);
  if (st == PMIX_OPERATION_SUCCEEDED)
    return 0;
  if (st != PMIX_SUCCESS)
    return err_from_pmix(st);
  xport_ctx_t *ctx = job->ctx;
  long deadline = xport__now_ms() + job->timeout_ms;
  XPORT__LOCK(ctx);
  while (!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) && xport__now_ms() < deadline)
    job_nap(ctx);
  XPORT__UNLOCK(ctx);
  if (!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) {
    /* The callback still owns w: wait for it however long, or the fence
     * writes into a stack frame that is gone. The launcher ends a job
     * whose rank died, and with it this wait. */
    XPORT__WARN("job: the fence has taken more than %ld ms (XPORT_JOB_TIMEOUT); a rank is "
                "missing or stuck", job->timeout_ms);
    while (!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) {
      XPORT__LOCK(ctx);
      job_nap(ctx);
      XPORT__UNLOCK(ctx);
    }
  }
  if (w.status != PMIX_SUCCESS)
    XPORT__WARN("job: PMIx fence: %s", PMIx_Error_string(w.status));
  return err_from_pmix(w.status);
}

/* The job's key (xport(7), AUTHENTICATION): rank 0, whose context holds
 * no key of its own, draws one and hands it to the ranks through the
 * launcher, whose server serves only the job's processes; a context of no
 * key and no connection or listener yet takes it, before it listens. The
 * job's connections then prove it, and a process outside the job, which
 * cannot read it, is refused (it could otherwise claim a rank's context
 * id, which travels in the clear). Ranks whose contexts hold a key of
 * their own (one file for the job: mpirun -x XPORT_AUTH_KEY_FILE) keep
 * it: rank 0 then draws none. One fence more. */
static int job_take_key(xport_job_t *job)
{
  xport_ctx_t *ctx = job->ctx;
  char name[sizeof job->key + 8];
  snprintf(name, sizeof name, "%s.auth", job->key);
  uint8_t key[XPORT__AUTH_KEY];
  pmix_status_t st = PMIX_SUCCESS;
  int have = 0;
  if (job->rank == 0 && !ctx->auth_on) {
    xport__auth_draw(key);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)key;
    v.data.bo.size = sizeof key;
    st = PMIx_Put(PMIX_GLOBAL, name, &v);
    if (st == PMIX_SUCCESS)
      st = PMIx_Commit();
    have = 1;
  }
  int ret = st == PMIX_SUCCESS ? job_fence(job, 1) : err_from_pmix(st);
  if (st != PMIX_SUCCESS)
    XPORT__WARN("job: PMIx_Put of the job's key: %s", PMIx_Error_string(st));
  if (ret)
    have = 0;
  else if (job->rank != 0) {
    pmix_proc_t proc;
    pmix_value_t *v = NULL;
    pmix_info_t opt;
    bool yes = true;
    PMIX_INFO_CONSTRUCT(&opt);
    PMIX_INFO_LOAD(&opt, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    PMIX_PROC_LOAD(&proc, job->me.nspace, 0);
    st = PMIx_Get(&proc, name, &opt, 1, &v);
    if (st == PMIX_SUCCESS && v && v->type == PMIX_BYTE_OBJECT && v->data.bo.bytes &&
        v->data.bo.size == sizeof key) {
      memcpy(key, v->data.bo.bytes, sizeof key);
      have = 1;
    } else if (st == PMIX_SUCCESS) {
      XPORT__WARN("job: rank 0's key is malformed");
      ret = -XPORT_EPROTO;
    }
    if (v) {
      if (v->type == PMIX_BYTE_OBJECT && v->data.bo.bytes)
        xport__auth_wipe(v->data.bo.bytes, v->data.bo.size);
      PMIX_VALUE_RELEASE(v);
    }
  }
  if (have && ctx->auth_on) {
    XPORT__WARN("job: this rank's context holds a key of its own and rank 0's none: the job's "
                "connections will fail authentication (give every rank the same key, or none)");
  } else if (have) {
    /* Nothing makes a connection or a listener meanwhile: this thread
     * is the caller's. */
    int busy = 0;
    XPORT__LOCK(ctx);
    for (unsigned l = 0; l < ctx->nlanes; l++)
      busy |= ctx->lanes[l]->conns || ctx->lanes[l]->listeners;
    if (!busy) {
      ctx->auth_on = 1;
      for (unsigned l = 0; l < ctx->nlanes; l++)
        ctx->lanes[l]->caps.auth = XPORT_AUTH_JOB;
      memcpy(ctx->auth_key, key, sizeof key);
    }
    XPORT__UNLOCK(ctx);
    if (busy)
      XPORT__WARN("job: the context has connections or listeners already: it takes no key "
                  "from the job, whose connections will fail authentication (join the job "
                  "first)");
  }
  xport__auth_wipe(key, sizeof key);
  return ret;
}

static int job_publish(xport_job_t *job)
{
  char host[80], value[JOB_VALUE_MAX], addr[96];
  job_host(job->ctx, host, sizeof host);
  snprintf(addr, sizeof addr, "%s:0", host);
  int ret = xport_listen(job->ctx, addr, &job->lst);
  if (ret) {
    XPORT__WARN("job: cannot listen at %s: %s (set XPORT_JOB_HOST)", addr, xport_strerror(ret));
    return ret;
  }
  if ((ret = xport_listener_addr(job->lst, addr, sizeof addr)) < 0)
    return ret;
  snprintf(value, sizeof value, "%016llx %s", (unsigned long long)job->ctx->id, addr);
  pmix_value_t v;
  PMIX_VALUE_CONSTRUCT(&v);
  v.type = PMIX_STRING;
  v.data.string = value;
  pmix_status_t st = PMIx_Put(PMIX_GLOBAL, job->key, &v);
  if (st == PMIX_SUCCESS)
    st = PMIx_Commit();
  if (st != PMIX_SUCCESS) {
    XPORT__WARN("job: PMIx_Put: %s", PMIx_Error_string(st));
    return err_from_pmix(st);
  }
  return 0;
}

static int job_lookup(xport_job_t *job)
{
  for (int r = 0; r < job->size; r++) {
    if (r == job->rank)
      continue;
    pmix_proc_t proc;
    pmix_value_t *v = NULL;
    PMIX_PROC_LOAD(&proc, job->me.nspace, (pmix_rank_t)r);
    pmix_status_t st = PMIx_Get(&proc, job->key, NULL, 0, &v);
    unsigned long long id = 0;
    int ok = st == PMIX_SUCCESS && v && v->type == PMIX_STRING && v->data.string &&
             sscanf(v->data.string, "%llx %95s", &id, job->peers[r].addr) == 2 && id;
    if (v)
      PMIX_VALUE_RELEASE(v);
    if (!ok) {
      XPORT__WARN("job: rank %d published no xport address (%s): is it an xport job rank?", r,
                  st == PMIX_SUCCESS ? "malformed" : PMIx_Error_string(st));
      return st == PMIX_SUCCESS ? -XPORT_EPROTO : err_from_pmix(st);
    }
    job->peers[r].ctx_id = id;
  }
  return 0;
}

static int job_size(xport_job_t *job)
{
  pmix_proc_t wild;
  pmix_value_t *v = NULL;
  PMIX_PROC_LOAD(&wild, job->me.nspace, PMIX_RANK_WILDCARD);
  pmix_status_t st = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v);
  if (st != PMIX_SUCCESS || !v || v->type != PMIX_UINT32 || !v->data.uint32 ||
      v->data.uint32 > 1u << 20) {
    if (v)
      PMIX_VALUE_RELEASE(v);
    XPORT__WARN("job: the launcher gave no job size (%s)", PMIx_Error_string(st));
    return st == PMIX_SUCCESS ? -XPORT_EPROTO : err_from_pmix(st);
  }
  job->size = (int)v->data.uint32;
  PMIX_VALUE_RELEASE(v);
  return 0;
}

/* PMIx is joined once per process and left when the process ends (or
 * libxport is unloaded): a PMIx client finalized and initialized again
 * is not one the launcher serves reliably. Jobs follow one another, each
 * under a key of its own (the ranks join in the same order, so the
 * generations agree), so that no rank reads a peer's address from a
 * join before. */
static int pmix_up;
static pmix_proc_t pmix_me;
static unsigned job_generation;

__attribute__((destructor)) static void pmix_leave_at_exit(void)
{
  if (pmix_up)
    PMIx_Finalize(NULL, 0);
  pmix_up = 0;
}

static int job_join(xport_job_t *job)
{
  if (!pmix_up) {
    pmix_status_t st = PMIx_Init(&pmix_me, NULL, 0);
    if (st != PMIX_SUCCESS)
      return 1; /* no launcher */
    pmix_up = 1;
  }
  job->me = pmix_me;
  job->rank = (int)job->me.rank;
  snprintf(job->key, sizeof job->key, "%s.%u", JOB_KEY, job_generation++);
  int ret = job_size(job);
  if (!ret && job->rank >= job->size)
    ret = -XPORT_EPROTO;
  if (!ret && !(job->peers = calloc((size_t)job->size, sizeof *job->peers)))
    ret = -XPORT_ENOMEM;
  if (!ret && job->size > 1)
    ret = job_take_key(job);
  if (!ret)
    ret = job_publish(job);
  if (!ret)
    ret = job_fence(job, 1);
  if (!ret)
    ret = job_lookup(job);
  if (!ret) {
    XPORT__LOCK(job->ctx);
    xport__listener_hook(job->lst, job_admit, job_accepted, job);
    XPORT__UNLOCK(job->ctx);
  }
  return ret;
}

#else /* no PMIx */

static int job_join(xport_job_t *job)
{
  (void)job;
  return 1;
}

static int job_fence(xport_job_t *job, int collect)
{
  (void)job;
  (void)collect;
  return 0;
}

#endif

/* What a PMIx launcher sets in its ranks' environment. */
static void say_missing(void)
{
  static const char *vars[] = {"PMIX_NAMESPACE", "PMIX_RANK", "PMIX_SERVER_URI41",
                               "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2"};
  char missing[160] = "";
  int have_uri = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    if (i >= 2) {
      have_uri |= getenv(vars[i]) != NULL;
      continue;
    }
    if (!getenv(vars[i]))
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
               *missing ? ", " : "", vars[i]);
  }
  if (!have_uri)
    snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%sPMIX_SERVER_URI*",
             *missing ? ", " : "");
  XPORT__WARN("job: XPORT_JOB=pmix, but no PMIx launcher started this process (%s: %s); "
               "run it under mpirun or srun --mpi=pmix",
               *missing ? "unset" : "set, but its server did not answer", missing);
}

XPORT_API int xport_job_init(xport_ctx_t *ctx, xport_job_t **job_p)
{
  if (!ctx || !job_p)
    return -XPORT_EINVAL;
  const char *mode = xport__env_str(XPORT__ENV_JOB);
  if (!mode)
    mode = "auto";
  if (strcmp(mode, "auto") && strcmp(mode, "pmix") && strcmp(mode, "single")) {
    XPORT__WARN("job: XPORT_JOB=%s: expected auto, pmix or single", mode);
    return -XPORT_EINVAL;
  }
#ifndef XPORT_HAVE_PMIX
  if (strcmp(mode, "single")) {
    XPORT__WARN("job: this libxport was built without PMIx (libpmix-dev): it cannot join a "
                 "launcher's job; XPORT_JOB=single gives a job of one rank");
    return -XPORT_ENOSYS;
  }
#endif
  /* The ranks of a job are processes: one job at a time in each, or
   * two jobs' collectives could pair up across them. */
  if (jobs_live) {
    XPORT__WARN("job: this process is in a job already: xport_job_fini it first");
    return -XPORT_EBUSY;
  }
  xport_job_t *job = calloc(1, sizeof *job);
  if (!job)
    return -XPORT_ENOMEM;
  job->ctx = ctx;
  job->timeout_ms = (long)xport__env_size(XPORT__ENV_JOB_TIMEOUT, 60000);
  job->size = 1;
  int ret = strcmp(mode, "single") ? job_join(job) : 1;
  if (ret == 1) {
    if (!strcmp(mode, "pmix")) {
      say_missing();
      ret = -XPORT_ENOENT;
    } else {
      ret = 0; /* a job of one rank */
      job->rank = 0;
      job->size = 1;
    }
  }
  if (ret) {
    job_close(job);
    free(job);
    return ret;
  }
  jobs_live = 1;
  *job_p = job;
  return 0;
}

XPORT_API int xport_job_barrier(xport_job_t *job)
{
  if (!job)
    return -XPORT_EINVAL;
  return job->size > 1 ? job_fence(job, 0) : 0;
}

/* Collective, as MPI_Finalize: no rank closes its connections while a
 * peer may still be using them. */
XPORT_API int xport_job_fini(xport_job_t *job)
{
  if (!job)
    return -XPORT_EINVAL;
  int ret = job->size > 1 ? job_fence(job, 0) : 0;
  job_close(job);
  free(job);
  jobs_live = 0;
  return ret;
}
