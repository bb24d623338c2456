/* Strangers on shared endpoints. Over shm and rxm many connections share
 * one libfabric endpoint that anyone who can reach it may send to. These
 * tests play a process that never ran xport's handshake: a raw libfabric
 * endpoint that guesses tags, forges and truncates control messages and
 * floods the listener; every legitimate connection must keep working
 * (bytes compared) and the server's memory must stay bounded. The
 * backlog and eager-size tests run on every configuration. */
#define _GNU_SOURCE
#include "harness.h"
#include "../src/transport/rdm_wire.h"
#include "../src/xport_int.h" /* the churn counts the server context's connections */
#include "../src/transport/rdm.h" /* the live tag test reads a connection's receive tag */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <signal.h>
#include <sodium.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime (its header is not always installed). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#define T_MS 20000

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static uint64_t rnd64(void)
{
  uint64_t v = 0;
  XT_CHECK(getrandom(&v, sizeof v, 0) == sizeof v, "getrandom");
  return v;
}

/* Bytes the process has allocated and not freed (malloc's view, or the
 * sanitizer's, whose quarantine would make RSS meaningless). */
static size_t heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

/* The configurations whose connections share RDM endpoints; the others
 * (FI_EP_MSG) give each connection its own and skip with the reason. */
static int rdm_config(const char *test)
{
  const char *c = xt_transport(); /* shm in the configurations with shm beside a fabric */
  if (!strcmp(c, "shm") || strstr(c, "ofi_rxm"))
    return 1;
  printf("SKIP: %s on %s: connections there have endpoints of their own (FI_EP_MSG); "
         "no stranger shares them\n", test, c);
  return 0;
}

/* Completions of other kinds that come first are kept for later waits:
 * the peer's answer may overtake our own send's completion (rxm). */
static void expect(xport_ctx_t *ctx, xport_completion_t *c, xport_op_t op, int status)
{
  *c = xt_wait_op(ctx, op, T_MS);
  XT_CHECK(c->status == status, "op %d status %d (%s); expected status %d", c->op, c->status,
           xport_strerror(c->status), status);
}

/* Sends a short word and waits for the send. */
static void say(xport_ctx_t *ctx, xport_conn_t *conn, const char *word)
{
  xport_completion_t c;
  int rc;
  /* A queue full for a moment (the peer's, after a flood) is no failure. */
  for (long end = now_ms() + T_MS;
       (rc = xport_send(conn, word, strlen(word) + 1, NULL, NULL)) == -XPORT_EAGAIN &&
       now_ms() < end;)
    xport_wait(ctx, 10);
  XT_OK(rc);
  expect(ctx, &c, XPORT_OP_SEND, 0);
}

/* A receive for a word the peer will say, posted before it may say it
 * (the last word before a close must find one). */
struct word {
  char buf[32];
};
static void listen_for(xport_conn_t *conn, struct word *w)
{
  memset(w->buf, 0, sizeof w->buf);
  XT_OK(xport_recv(conn, w->buf, sizeof w->buf, NULL, w));
}
static void heard(xport_ctx_t *ctx, struct word *w, const char *word)
{
  xport_completion_t c;
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_CHECK(c.user_ctx == w && !strcmp(w->buf, word), "heard '%s', expected '%s'", w->buf,
           word);
}
static void hear(xport_ctx_t *ctx, xport_conn_t *conn, const char *word)
{
  struct word w;
  listen_for(conn, &w);
  heard(ctx, &w, word);
}

/* ---- the stranger: raw libfabric, no handshake ------------------------- */

struct stranger {
  struct fi_info *info;
  struct fid_fabric *fab;
  struct fid_domain *dom;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  struct fid_mr *mr;
  void *desc;
  char *buf;           /* registered: [0, 64k) to send from, then receives */
  fi_addr_t srv;
  uint8_t name[XPORT__CTL_ADDR_MAX];
  size_t namelen;
  size_t outstanding;  /* sends posted and not completed */
  size_t heard;        /* control messages it received (refusals and the like) */
  size_t challenges;   /* of which challenges to its requests */
  size_t answers;      /* and acceptances or refusals of them */
  uint64_t token;      /* from the last challenge */
  uint64_t req_tag;    /* the receive tag its requests name */
  struct xport__ctl ack; /* the last acceptance of its request */
  struct fi_context2 rx_ctx[16];
};
#define ST_BUF (64 * 1024)
#define ST_RX 1024

/* Opens an endpoint of the same provider and puts the listener at addr
 * (host:port) into its address vector. */
static void st_open(struct stranger *s, const char *addr)
{
  memset(s, 0, sizeof *s);
  char host[128], port[16];
  const char *colon = strrchr(addr, ':');
  XT_CHECK(colon, "address %s", addr);
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  if (host[0] == '[') {
    memmove(host, host + 1, strlen(host));
    host[strcspn(host, "]")] = '\0';
  }
  int shm = !strcmp(xt_transport(), "shm");
  struct fi_info *hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(xt_transport());
  int rc = fi_getinfo(FI_VERSION(1, 17), shm ? NULL : host, shm ? NULL : port, 0, hints,
                      &s->info);
  fi_freeinfo(hints);
  XT_CHECK(rc == 0, "stranger fi_getinfo: %s", fi_strerror(-rc));
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 4096};
  struct fi_av_attr av_attr = {.type = FI_AV_UNSPEC};
  XT_CHECK(fi_fabric(s->info->fabric_attr, &s->fab, NULL) == 0, "fi_fabric");
  XT_CHECK(fi_domain(s->fab, s->info, &s->dom, NULL) == 0, "fi_domain");
  XT_CHECK(fi_cq_open(s->dom, &cq_attr, &s->cq, NULL) == 0, "fi_cq_open");
  XT_CHECK(fi_av_open(s->dom, &av_attr, &s->av, NULL) == 0, "fi_av_open");
  XT_CHECK(fi_endpoint(s->dom, s->info, &s->ep, NULL) == 0, "fi_endpoint");
  XT_CHECK(fi_ep_bind(s->ep, &s->av->fid, 0) == 0, "bind av");
  XT_CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
  XT_CHECK(fi_enable(s->ep) == 0, "fi_enable");
  s->namelen = sizeof s->name;
  XT_CHECK(fi_getname(&s->ep->fid, s->name, &s->namelen) == 0, "fi_getname");
  s->buf = aligned_alloc(4096, ST_BUF + 16 * ST_RX);
  XT_CHECK(fi_mr_reg(s->dom, s->buf, ST_BUF + 16 * ST_RX, FI_SEND | FI_RECV, 0, 0, 0, &s->mr,
                     NULL) == 0, "fi_mr_reg");
  s->desc = fi_mr_desc(s->mr);
  /* The listener's address, as xport's own clients find it. */
  if (shm) {
    char name[64];
    xt_shm_name(port, name, sizeof name);
    int n = 0;
    XT_CHECK(fi_av_insert(s->av, name, 1, &s->srv, 0, NULL) == 1, "av insert %s", name);
    (void)n;
  } else {
    XT_CHECK(fi_av_insert(s->av, s->info->dest_addr, 1, &s->srv, 0, NULL) == 1, "av insert");
  }
  /* Untagged receives take what the server answers (refusals). */
  for (int i = 0; i < 16; i++)
    XT_CHECK(fi_recv(s->ep, s->buf + ST_BUF + (size_t)i * ST_RX, ST_RX, s->desc, FI_ADDR_UNSPEC,
                     &s->rx_ctx[i]) == 0, "fi_recv");
}

/* Reads the stranger's completion queue once: receives are counted and
 * posted again, sends counted off. */
static void st_progress(struct stranger *s)
{
  struct fi_cq_tagged_entry e[16];
  void *ctxs[16];
  int failed = 0;
  ssize_t n = fi_cq_read(s->cq, e, 16);
  if (n == -FI_EAVAIL) {
    failed = 1;
    struct fi_cq_err_entry err = {0};
    if (fi_cq_readerr(s->cq, &err, 0) != 1)
      return;
    ctxs[0] = err.op_context;
    n = 1;
  } else {
    for (ssize_t i = 0; i < n; i++)
      ctxs[i] = e[i].op_context;
  }
  for (ssize_t i = 0; i < n; i++) {
    struct fi_context2 *rc = ctxs[i];
    if (rc >= s->rx_ctx && rc < s->rx_ctx + 16) {
      size_t k = (size_t)(rc - s->rx_ctx);
      const struct xport__ctl *m = (const void *)(s->buf + ST_BUF + k * ST_RX);
      s->heard++;
      if (!failed && e[i].len == sizeof *m &&
          m->magic == XPORT__CTL_MAGIC && m->cookie == s->req_tag) {
        if (m->type == XPORT__CTL_CHALLENGE) {
          s->challenges++;
          s->token = m->tag;
        } else if (m->type == XPORT__CTL_CONNACK || m->type == XPORT__CTL_CONNREJ) {
          s->answers++;
          if (m->type == XPORT__CTL_CONNACK)
            s->ack = *m;
        }
      }
      fi_recv(s->ep, s->buf + ST_BUF + k * ST_RX, ST_RX, s->desc, FI_ADDR_UNSPEC, rc);
    } else if (s->outstanding) {
      s->outstanding--;
    }
  }
}

/* Sends len bytes (already at s->buf) tagged or not, and returns once at
 * most window sends are outstanding; 0, or -1 when the server's endpoint
 * took nothing for 5 s (it is jammed). */
#define ST_WINDOW_MAX 512
static int st_post(struct stranger *s, int tagged, uint64_t tag, size_t len, size_t window)
{
  static struct fi_context2 tx_ctx[ST_WINDOW_MAX + 1];
  static size_t next;
  struct fi_context2 *txc = &tx_ctx[next++ % (ST_WINDOW_MAX + 1)];
  /* A bound only for an endpoint that stopped for good, never for a slow
   * one: a listener outside xport on a loaded machine takes seconds. */
  long end = now_ms() + T_MS;
  for (;;) {
    ssize_t r = tagged ? fi_tsend(s->ep, s->buf, len, s->desc, s->srv, tag, txc)
                       : fi_send(s->ep, s->buf, len, s->desc, s->srv, txc);
    if (r == 0)
      break;
    XT_CHECK(r == -FI_EAGAIN, "stranger send: %s", fi_strerror((int)-r));
    st_progress(s);
    if (now_ms() > end)
      return -1;
  }
  s->outstanding++;
  while (s->outstanding > window) {
    st_progress(s);
    if (now_ms() > end)
      return -1;
  }
  return 0;
}

static int st_send(struct stranger *s, int tagged, uint64_t tag, size_t len)
{
  return st_post(s, tagged, tag, len, 0);
}

static void st_close(struct stranger *s)
{
  /* rxm over verbs (libfabric 1.17) crashes closing an endpoint whose
   * connections the peer just dropped (providers/rxm.c): there the
   * stranger's endpoint goes with its process, which ends with the test. */
  if (!strcmp(xt_transport(), "verbs;ofi_rxm"))
    return;
  fi_close(&s->ep->fid);
  fi_close(&s->mr->fid);
  fi_close(&s->av->fid);
  fi_close(&s->cq->fid);
  fi_close(&s->dom->fid);
  fi_close(&s->fab->fid);
  fi_freeinfo(s->info);
  free(s->buf);
}

/* A control message as xport's own would be, with what a stranger can
 * know: the format, and its own address; not a connection's cookie. */
static int st_node; /* 1: say which node and PID namespace, as xport's own do */
static struct xport__ctl *st_ctl(struct stranger *s, uint32_t type)
{
  struct xport__ctl *m = (struct xport__ctl *)s->buf;
  memset(m, 0, sizeof *m);
  m->magic = XPORT__CTL_MAGIC;
  m->version = XPORT__CTL_VERSION;
  m->type = type;
  m->ctx_id = rnd64();
  m->pid = (uint32_t)getpid();
  if (st_node) {
    struct stat ns;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f && fgets(m->boot_id, sizeof m->boot_id, f))
      m->boot_id[strcspn(m->boot_id, "\n")] = '\0';
    if (f)
      fclose(f);
    m->pidns = stat("/proc/self/ns/pid", &ns) ? 0 : (uint64_t)ns.st_ino;
  }
  return m;
}

/* A first connection request from the stranger's own endpoint (which the
 * listener answers with a challenge). */
static int st_connreq(struct stranger *s, uint32_t src_id)
{
  struct xport__ctl *m = st_ctl(s, XPORT__CTL_CONNREQ);
  m->src_id = src_id;
  m->tag = s->req_tag = rnd64() & XPORT__TAG_MASK;
  m->addrlen = (uint32_t)s->namelen;
  memcpy(m->addr, s->name, s->namelen);
  return st_send(s, 0, 0, sizeof *m);
}

/* The whole of a request as an xport client makes it: the first, then
 * copies of it (over rxm the listener wants one that arrives named as
 * from the address the request names), or, once the listener's challenge
 * came, the same with its token (shm). ST_ANSWERED: until the listener
 * answers it (accepts or refuses); ST_TOKENED: until the request with the
 * token is sent (shm), which a loaded listener may challenge late; ST_SENT:
 * as a flood sends it, giving up on the challenge after a few copies. */
enum { ST_SENT, ST_ANSWERED, ST_TOKENED };
static int st_connect(struct stranger *s, uint32_t src_id, int wait)
{
  size_t challenges = s->challenges, answers = s->answers;
  if (st_connreq(s, src_id))
    return -1;
  struct xport__ctl req = *(struct xport__ctl *)s->buf;
  int copies = 0, tokened = 0;
  for (long end = now_ms() + T_MS; now_ms() < end;) {
    for (long again = now_ms() + 2; now_ms() < again;)
      st_progress(s);
    if (s->answers != answers)
      return 0;
    if (!tokened && s->challenges != challenges) {
      req.cookie = s->token;
      tokened = 1;
    } else if (tokened || (wait == ST_SENT && copies >= 5)) {
      if (wait != ST_ANSWERED)
        return 0;
      continue;
    }
    memcpy(s->buf, &req, sizeof req);
    if (st_send(s, 0, 0, sizeof req))
      return -1;
    copies++;
  }
  return -1;
}

/* ---- the shape of most tests ------------------------------------------- */

/* The server side: accepts the legitimate client, posts a receive, says
 * "ready", lets the stranger act (attack), accepts the stranger's own
 * request (after which the attack has been seen) and closes it; then the
 * posted receive must still be waiting, no disconnect may have come, and
 * the client's bytes must land in it. */
typedef void (*attack_check_fn)(xport_ctx_t *ctx, xport_listener_t *lst);

struct attack {
  void (*attack)(struct stranger *s); /* the stranger's part */
  attack_check_fn check;              /* more server checks after the sync (may be NULL) */
  size_t max_growth;                  /* of the server's heap over the attack (0: any) */
};

#define LEGIT_LEN 200
#define LEGIT_SEED 7

static void attacked_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{

  struct attack *a = arg;
  xport_conn_t *conn, *sc;
  xport_completion_t c;
  unsigned char *buf = calloc(1, 4096);
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_OK(xport_recv(conn, buf, 4096, NULL, buf));
  say(ctx, conn, "ready");
  size_t heap = heap_in_use();
  XT_OK(xport_accept(lst, T_MS, &sc));
  XT_OK(xport_conn_close(sc));
  size_t grew = heap_in_use() - heap;
  XT_CHECK(!a->max_growth || heap_in_use() < heap || grew < a->max_growth,
           "the server's heap grew by %zu bytes under the attack", grew);
  if (a->check)
    a->check(ctx, lst);
  /* Everything the stranger sent has been taken off the wire by now: the
   * legitimate receive must be untouched. */
  int n;
  while ((n = xport_poll(ctx, &c, 1)) == 1)
    XT_CHECK(c.conn != conn || (c.op != XPORT_OP_RECV && c.op != XPORT_OP_DISCONNECT),
             "the stranger reached the connection: op %d status %s, %zu bytes", c.op,
             xport_strerror(c.status), c.len);
  XT_CHECK(n == 0, "poll: %s", xport_strerror(n));
  say(ctx, conn, "go");
  do
    c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  while (c.conn != conn);
  XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0 && c.user_ctx == buf,
           "op %d status %s", c.op, xport_strerror(c.status));
  XT_CHECK(c.len == LEGIT_LEN && xt_verify(buf, LEGIT_LEN, LEGIT_SEED) == LEGIT_LEN,
           "the client's bytes did not arrive intact (%zu bytes)", c.len);
  say(ctx, conn, "done");
  XT_OK(xport_conn_close(conn));
  free(buf);
}

static const char *listener_addr; /* run_attack's, for attacks that open more */
static void run_attack(struct attack *a)
{
  char addr[128];
  pid_t pid = xt_spawn_server(attacked_server, a, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  xport_completion_t c;
  struct stranger s;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  hear(ctx, conn, "ready");
  st_open(&s, addr);
  listener_addr = addr;
  a->attack(&s);
  XT_CHECK(st_connect(&s, 0x5151, ST_ANSWERED) == 0, "the stranger's request was not answered");
  hear(ctx, conn, "go");
  struct word done;
  listen_for(conn, &done);
  unsigned char msg[LEGIT_LEN];
  xt_fill(msg, sizeof msg, LEGIT_SEED);
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  heard(ctx, &done, "done");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  st_close(&s);
  int status = xt_reap(pid);
  /* The server's shm endpoint may have been left open at its end, with
   * its file (the stranger, alive, had not taken its first message:
   * xport(7)); its process is gone now, and so are they. */
  if (!strcmp(xt_transport(), "shm")) {
    char name[64], path[96];
    xt_shm_name(strrchr(addr, ':') + 1, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    unlink(path);
    snprintf(path, sizeof path, "/dev/shm/%s.lock", name);
    unlink(path);
  }
  XT_CHECK(status == 0, "server failed on %s", xt_config());
}

/* ---- inject data under guessed tags ------------------------------------ */

static void inject_guesses(struct stranger *s)
{
  /* Small ids, as connection ids run; with the write_imm bit; and a few
   * random ones. Each carries bytes the client never sends. */
  for (uint64_t t = 0; t < 200; t++) {
    uint64_t tag = t < 64 ? t : t < 128 ? (t - 64) | (UINT64_C(1) << 62) : rnd64() >> 2;
    xt_fill(s->buf, LEGIT_LEN, 99);
    XT_CHECK(st_send(s, 1, tag, LEGIT_LEN) == 0, "send under tag %#llx",
             (unsigned long long)tag);
  }
}

START_TEST(stranger_injects_data)
{
  if (!rdm_config("stranger_injects_data"))
    return;
  struct attack a = {inject_guesses, NULL, 0};
  run_attack(&a);
}
END_TEST

/* ---- forge control messages -------------------------------------------- */

static void forge_control(struct stranger *s)
{
  static const uint32_t types[] = {XPORT__CTL_CONNREJ, XPORT__CTL_DISC, XPORT__CTL_KEEPALIVE,
                                   XPORT__CTL_CONNACK};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
    for (uint32_t id = 1; id <= 16; id++) {
      struct xport__ctl *m = st_ctl(s, types[k]);
      m->dst_id = id;
      m->src_id = id;
      m->cookie = id; /* a guess, as the old ids would be */
      m->tag = rnd64() & XPORT__TAG_MASK;
      XT_CHECK(st_send(s, 0, 0, sizeof *m) == 0, "forged message %u/%u", types[k], id);
    }
}

START_TEST(stranger_forges_control)
{
  if (!rdm_config("stranger_forges_control"))
    return;
  struct attack a = {forge_control, NULL, 0};
  run_attack(&a);
}
END_TEST

/* ---- short control messages -------------------------------------------- */

/* Only the start of a request: parsed with whatever an earlier message
 * left in the buffer, it would repeat the legitimate client's request. */
static void short_control(struct stranger *s)
{
  for (int i = 0; i < 24; i++) {
    struct xport__ctl *m = st_ctl(s, XPORT__CTL_CONNREQ);
    (void)m;
    XT_CHECK(st_send(s, 0, 0, 16) == 0, "short message");
  }
}

/* After the stranger's own request, no other may be waiting. */
static void no_phantom(xport_ctx_t *ctx, xport_listener_t *lst)
{
  (void)ctx;
  xport_conn_t *extra = NULL;
  int rc = xport_accept(lst, 0, &extra);
  XT_CHECK(rc == -XPORT_ETIMEDOUT, "a request nobody made was accepted (%s)",
           xport_strerror(rc));
}

START_TEST(stranger_short_control)
{
  if (!rdm_config("stranger_short_control"))
    return;
  struct attack a = {short_control, no_phantom, 0};
  run_attack(&a);
}
END_TEST

/* ---- long untagged messages -------------------------------------------- */

/* Longer than any control message, up to 64 KiB (past the eager sizes, so
 * the provider's rendezvous path too): where a longer message truncates
 * a receive, it must still end it (shm hangs on a truncated receive;
 * rxm lets go of a multi-receive buffer that a message overflows). */
static void long_control(struct stranger *s)
{
  static const size_t lens[] = {sizeof(struct xport__ctl) + 1, 1000, 4097, 20000, 65536};
  for (int i = 0; i < 60; i++) {
    size_t len = lens[i % 5];
    xt_fill(s->buf, len, (unsigned)i);
    XT_CHECK(st_send(s, 0, 0, len) == 0, "long message %d (%zu bytes)", i, len);
  }
}

START_TEST(stranger_long_control)
{
  if (!rdm_config("stranger_long_control"))
    return;
  struct attack a = {long_control, no_phantom, 0};
  run_attack(&a);
}
END_TEST

/* ---- requests in other endpoints' names -------------------------------- */

/* Requests that name an address other than the sender's: the stranger's
 * own with one byte changed (on rxm the port: a changed IP address could
 * lead out of the machine), and a second
 * endpoint's (a victim that never reads); half of them with a forged
 * token. None may reach accept: the challenge goes to the address named,
 * which never answers it, and a forged token is no token. */
static struct stranger victim;
static void spoof_requests(struct stranger *s)
{
  int shm = !strcmp(xt_transport(), "shm");
  st_open(&victim, listener_addr);
  for (uint32_t i = 0; i < 4000; i++) {
    struct xport__ctl *m = st_ctl(s, XPORT__CTL_CONNREQ);
    m->src_id = 100 + i;
    m->tag = rnd64() & XPORT__TAG_MASK;
    const struct stranger *named = i % 4 == 3 ? &victim : s;
    m->addrlen = (uint32_t)named->namelen;
    memcpy(m->addr, named->name, named->namelen);
    if (named == s) {
      size_t at = shm ? (size_t)rnd64() % (s->namelen - 1) : 2 + (size_t)(i & 1);
      if (at < s->namelen)
        m->addr[at] ^= (uint8_t)(1 + rnd64() % 255);
      if (shm && !m->addr[at])
        m->addr[at] = 'x'; /* a name, still */
    }
    if (i % 2)
      m->cookie = rnd64();
    XT_CHECK(st_send(s, 0, 0, sizeof *m) == 0, "spoofed request %u", i);
  }
}

START_TEST(stranger_spoofs_requests)
{
  if (!rdm_config("stranger_spoofs_requests"))
    return;
  /* Answering each spoofed address cost rxm a connection attempt, and
   * some 5 MB that it kept. */
  struct attack a = {spoof_requests, no_phantom, 32u << 20};
  run_attack(&a);
  st_close(&victim);
}
END_TEST

/* ---- requests in a connected client's name, with bytes after its NUL ---- */

/* shm reads a name up to its first NUL: a request that names an honest
 * client's endpoint with more bytes after it names that client to the
 * provider. Each such spelling once became an entry of its own in the
 * listener's address vector, and the listener let go of it (the refused
 * list keeps 16) with fi_av_remove, which unmapped the client's region:
 * its next send to the client, or its next poll, crashed. The stranger
 * does what any process of the user can: reads the client's names in
 * /dev/shm (this process's endpoints: xport-PID-RANDOM) and asks in each. */
#define ALIAS_REQUESTS 32
static void alias_client_names(struct stranger *s)
{
  char prefix[64];
  size_t names = 0;
  snprintf(prefix, sizeof prefix, "xport-%ld-", (long)getpid());
  DIR *d = opendir("/dev/shm");
  XT_CHECK(d, "opendir /dev/shm");
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, prefix, strlen(prefix)) ||
        (n > 5 && !strcmp(e->d_name + n - 5, ".lock")))
      continue;
    names++;
    for (uint32_t i = 0; i < ALIAS_REQUESTS; i++) {
      struct xport__ctl *m = st_ctl(s, XPORT__CTL_CONNREQ);
      m->src_id = 300 + i;
      m->tag = rnd64() & XPORT__TAG_MASK;
      /* name NUL "aNN" NUL: still a string that ends in the buffer, and a
       * different address for each request (and length, every 4th). */
      int k = snprintf((char *)m->addr, sizeof m->addr, "%s", e->d_name) + 1;
      k += snprintf((char *)m->addr + k, sizeof m->addr - (size_t)k, "a%02u%.*s", i, (int)(i % 4),
                    "xyz") + 1;
      m->addrlen = (uint32_t)k;
      XT_CHECK(st_send(s, 0, 0, sizeof *m) == 0, "aliased request %u", i);
      /* Paced, so that the listener answers each (it rations answers in
       * flight) rather than dropping most. */
      for (long again = now_ms() + 3; now_ms() < again;)
        st_progress(s);
    }
  }
  closedir(d);
  XT_CHECK(names > 0, "no endpoint of this process (%s*) in /dev/shm", prefix);
}

START_TEST(stranger_aliases_client_name)
{
  if (!rdm_config("stranger_aliases_client_name"))
    return;
  if (strcmp(xt_transport(), "shm")) {
    printf("SKIP: stranger_aliases_client_name on %s: its addresses are socket addresses, "
           "read to their length, not names ended by a NUL\n", xt_config());
    return;
  }
  struct attack a = {alias_client_names, no_phantom, 0};
  run_attack(&a);
}
END_TEST

/* ---- flood of connection requests -------------------------------------- */

static void flood_requests(struct stranger *s, uint32_t base)
{
  /* Far more than any backlog; the server never accepts them. First
   * requests (each answered by a challenge at most, and queued never),
   * then whole ones, as a client makes them, past the backlog. */
  for (uint32_t i = 0; i < 8000; i++)
    XT_CHECK(st_connreq(s, base + i) == 0, "request %u did not get through", i);
  for (uint32_t i = 0; i < 200; i++)
    XT_CHECK(st_connect(s, base + 8000 + i, ST_SENT) == 0, "whole request %u did not get through",
             i);
}

/* The server's heap is measured around three floods of requests: it may
 * grow once or twice (the provider's pools grow by large chunks), but it
 * holds a backlog of requests, not all of them: one flood at least must
 * leave it as it was. (Holding them all, 8,000 requests take megabytes.) */
#define FLOODS 3
struct flood_arg {
  size_t max_total; /* the heap may grow by this much in all */
  int pause_ms;     /* outside xport for this long as each flood begins */
};
static void flooded_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  const struct flood_arg *fa = arg;
  size_t max_total = fa ? fa->max_total : 64u << 20;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  size_t heap[FLOODS + 1];
  heap[0] = heap_in_use();
  say(ctx, conn, "ready");
  /* Serve the endpoint (without accepting) while the stranger floods. */
  for (int k = 0; k < FLOODS; k++) {
    struct word w;
    xport_completion_t c;
    listen_for(conn, &w);
    if (fa && fa->pause_ms)
      usleep(1000 * (useconds_t)fa->pause_ms);
    c = xt_wait_op(ctx, XPORT_OP_RECV, 10 * T_MS);
    XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0 && !strcmp(w.buf, "flooded"),
             "op %d status %s '%s'", c.op, xport_strerror(c.status), w.buf);
    heap[k + 1] = heap_in_use();
  }
  size_t least = SIZE_MAX, total = 0;
  char grew[160] = "";
  for (int k = 0; k < FLOODS; k++) {
    size_t g = heap[k + 1] > heap[k] ? heap[k + 1] - heap[k] : 0;
    least = g < least ? g : least;
    total += g;
    snprintf(grew + strlen(grew), sizeof grew - strlen(grew), " %zu", g);
  }
  XT_CHECK(least < 1u << 20 && total < max_total,
           "the server's heap grew by%s bytes under three floods", grew);
  (void)lst;
  hear(ctx, conn, "ping");
  say(ctx, conn, "pong");
  XT_OK(xport_conn_close(conn));
}

START_TEST(stranger_floods_requests)
{
  if (!rdm_config("stranger_floods_requests"))
    return;
  char addr[128];
  /* A small backlog, so that a few of the whole requests fill it. */
  setenv("XPORT_LISTEN_BACKLOG", "8", 1);
  pid_t pid = xt_spawn_server(flooded_server, NULL, addr, sizeof addr);
  unsetenv("XPORT_LISTEN_BACKLOG");
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  struct stranger s;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  hear(ctx, conn, "ready");
  st_open(&s, addr);
  for (uint32_t k = 0; k < FLOODS; k++) {
    flood_requests(&s, 0x10000 * (k + 1));
    say(ctx, conn, "flooded");
  }
  /* Requests past the backlog are refused, but refusals are few: a flood
   * gets some, and most of its requests go unanswered. */
  XT_CHECK(s.heard > s.challenges, "no refusal came back");
  struct word pong;
  listen_for(conn, &pong);
  say(ctx, conn, "ping");
  heard(ctx, &pong, "pong");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  st_close(&s);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- flood of messages under unused tags -------------------------------- */

/* Messages as large as rxm sends eagerly, under random tags and untagged
 * (at xport's control path) by turns, pipelined, more than the provider
 * has receive buffers: while the server is outside xport they pile up. */
static void flood_unused_tags(struct stranger *s, uint32_t base)
{
  (void)base;
  for (int i = 0; i < 2000; i++) {
    xt_fill(s->buf, 16000, (unsigned)i);
    XT_CHECK(st_post(s, i % 2 == 0, rnd64() >> 2, 16000, 256) == 0,
             "message %d did not get through", i);
  }
  XT_CHECK(st_post(s, 1, rnd64() >> 2, 16, 0) == 0, "the flood's last messages did not go");
}

START_TEST(stranger_floods_unused_tags)
{
  if (!rdm_config("stranger_floods_unused_tags"))
    return;
  if (!strcmp(xt_transport(), "shm")) {
    printf("SKIP: stranger_floods_unused_tags on shm: libfabric 1.17 shm can neither "
           "discard unexpected messages (no FI_PEEK/FI_DISCARD) nor match them with a "
           "wildcard receive safely; see xport(7), Shared endpoints and strangers\n");
    return;
  }
  char addr[128];
  /* rxm takes in what arrives between two of xport's looks (a receive
   * buffer per message) before xport can discard it: the first flood may
   * grow the heap that far, once; the next ones must not (without the
   * discarding, each grew it by some 60 MB). */
  struct flood_arg fa = {(size_t)512 << 20, 1000};
  pid_t pid = xt_spawn_server(flooded_server, &fa, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  struct stranger s;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  hear(ctx, conn, "ready");
  st_open(&s, addr);
  for (uint32_t k = 0; k < FLOODS; k++) {
    flood_unused_tags(&s, k);
    say(ctx, conn, "flooded");
  }
  struct word pong;
  listen_for(conn, &pong);
  say(ctx, conn, "ping");
  heard(ctx, &pong, "pong");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  st_close(&s);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- ordinary traffic racing a close ------------------------------------ */

#define STALE_CONNS 150
#define STALE_MSGS 10

/* Accepts connection after connection, takes the first of their messages
 * and closes: the rest arrive for a closed connection. Its heap must stay
 * put, and the last client must still get through. */
static void closing_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  size_t mid = 0;
  char buf[64];
  for (int i = 0; i < STALE_CONNS; i++) {
    xport_conn_t *conn;
    xport_completion_t c;
    XT_OK(xport_accept(lst, T_MS, &conn));
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
    do
      c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    while (c.user_ctx != buf);
    XT_CHECK(c.status == 0, "connection %d: %s", i, xport_strerror(c.status));
    XT_OK(xport_conn_close(conn));
    if (i == STALE_CONNS / 3)
      mid = heap_in_use();
  }
  size_t end = heap_in_use();
  XT_CHECK(end < mid + (2u << 20), "the server's heap grew by %zu bytes over %d closed "
           "connections' stale messages", end - mid, STALE_CONNS - STALE_CONNS / 3);
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  hear(ctx, conn, "still here");
  unsigned char big[3000];
  xt_fill(big, sizeof big, 5);
  struct word bye;
  listen_for(conn, &bye);
  XT_OK(xport_send(conn, big, sizeof big, NULL, NULL));
  xport_completion_t c;
  expect(ctx, &c, XPORT_OP_SEND, 0);
  heard(ctx, &bye, "bye");
  XT_OK(xport_conn_close(conn));
}

START_TEST(closed_connections_drain)
{
  char addr[128];
  pid_t pid = xt_spawn_server(closing_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  unsigned char msg[64];
  xt_fill(msg, sizeof msg, 3);
  for (int i = 0; i < STALE_CONNS; i++) {
    xport_conn_t *conn;
    xport_completion_t c;
    int rc = xport_connect(ctx, addr, T_MS, &conn);
    XT_CHECK(rc == 0, "connection %d of %d: %s", i + 1, STALE_CONNS, xport_strerror(rc));
    /* Some of these may meet the close already (not connected). */
    int posted = 0;
    for (int k = 0; k < STALE_MSGS; k++) {
      rc = xport_send(conn, msg, sizeof msg, NULL, NULL);
      XT_CHECK(rc == 0 || rc == -XPORT_ENOTCONN || rc == -XPORT_EAGAIN, "send: %s",
               xport_strerror(rc));
      posted += rc == 0;
    }
    /* Their completions (whatever their status) and the disconnect. */
    for (int gone = 0; !gone || posted;) {
      XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "connection %d: the server never closed", i);
      if (c.op == XPORT_OP_DISCONNECT)
        gone = 1;
      else if (c.op == XPORT_OP_SEND)
        posted--;
    }
    XT_OK(xport_conn_close(conn));
  }
  xport_conn_t *conn;
  struct word big;
  unsigned char in[3000];
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_recv(conn, in, sizeof in, NULL, &big));
  say(ctx, conn, "still here");
  xport_completion_t c;
  do
    c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  while (c.user_ctx != &big);
  XT_CHECK(c.status == 0 && c.len == sizeof in && xt_verify(in, sizeof in, 5) == sizeof in,
           "the answer is not the server's bytes (%s, %zu bytes)", xport_strerror(c.status),
           c.len);
  say(ctx, conn, "bye");
  /* The server closes after "bye": wait for it. */
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- a stranger under a live connection's tag ----------------------------
 * A stranger that knows an honest connection's receive tag (it travels in
 * the clear in the request) sends under it from its own endpoint, and the
 * honest client sends ahead of the server's receives too. The receives
 * the server then posts take the client's messages alone, in order, every
 * byte checked, and one more receive takes nothing: over rxm, with
 * XPORT_RECV_AHEAD set, the messages sent ahead were claimed for the
 * connection, and only its peer's can be. */
#define LIVE_HONEST 20
#define LIVE_STRANGE 8
#define LIVE_LEN 200

static void live_tag_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  xport_completion_t c;
  XT_OK(xport_accept(lst, T_MS, &conn));
  uint64_t tag = rconn(conn)->rx_tag;
  XT_CHECK(write(st->s2c[1], &tag, sizeof tag) == (ssize_t)sizeof tag, "tag to the test");
  /* Serving, with no receive posted, while they send, and a while after. */
  for (long end = -1; end < 0 || now_ms() < end;) {
    XT_CHECK(xport_poll(ctx, &c, 1) == 0, "a completion with no receive posted (op %d: %s)",
             c.op, xport_strerror(c.status));
    struct pollfd p = {.fd = st->c2s[0], .events = POLLIN};
    if (end < 0 && poll(&p, 1, 1) == 1) {
      XT_CHECK(xt_step_get(st->c2s[0], 0) == 'S', "protocol");
      end = now_ms() + 500;
    }
  }
  static char buf[LIVE_HONEST + 1][LIVE_LEN];
  for (int i = 0; i <= LIVE_HONEST; i++)
    XT_OK(xport_recv(conn, buf[i], LIVE_LEN, NULL, buf[i]));
  for (int i = 0; i < LIVE_HONEST; i++) {
    c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    int k = (int)(((char(*)[LIVE_LEN])c.user_ctx) - buf);
    XT_CHECK(c.status == 0 && k < LIVE_HONEST, "receive %d: %s", k, xport_strerror(c.status));
    XT_CHECK(c.len == LIVE_LEN && xt_verify(buf[k], LIVE_LEN, 500 + (unsigned)k) == LIVE_LEN,
             "receive %d holds %zu bytes that are not the client's message %d (the "
             "stranger's, or out of order)", k, c.len, k);
  }
  XT_CHECK(xt_next(ctx, &c, 500) == -XPORT_ETIMEDOUT,
           "a receive past the client's messages completed (op %d, %zu bytes): the "
           "stranger's message was delivered on the connection", c.op, c.len);
  say(ctx, conn, "done");
  /* The receive left over takes the client's last word. */
  c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0 && c.user_ctx == buf[LIVE_HONEST] && !strcmp(buf[LIVE_HONEST], "bye"),
           "the last receive: %s", xport_strerror(c.status));
  XT_OK(xport_conn_close(conn));
}

START_TEST(stranger_under_live_tag)
{
  if (!strstr(xt_transport(), "ofi_rxm")) {
    printf("SKIP: stranger_under_live_tag on %s: %s\n", xt_config(),
           strcmp(xt_transport(), "shm")
               ? "connections there have endpoints of their own (FI_EP_MSG)"
               : "shm (libfabric 1.17) matches a message from a sender outside the receiver's "
                 "address vector to any receive under its tag, and any process of the user "
                 "can write the endpoint's memory anyway (xport(7), SECURITY)");
    return;
  }
  char addr[128];
  struct xt_steps st;
  xt_steps_open(&st);
  setenv("XPORT_RECV_AHEAD", "1024", 1); /* the server claims what is sent ahead */
  pid_t pid = xt_spawn_server(live_tag_server, &st, addr, sizeof addr);
  unsetenv("XPORT_RECV_AHEAD");
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  uint64_t tag = 0;
  struct pollfd pf = {.fd = st.s2c[0], .events = POLLIN};
  XT_CHECK(poll(&pf, 1, T_MS) == 1 && read(st.s2c[0], &tag, sizeof tag) == (ssize_t)sizeof tag,
           "the server's tag");
  struct stranger s;
  st_open(&s, addr);
  memset(s.buf, 0xee, LIVE_LEN);
  for (int i = 0; i < LIVE_STRANGE; i++)
    XT_CHECK(st_send(&s, 1, tag, LIVE_LEN) == 0, "the stranger's message %d", i);
  static char out[LIVE_HONEST][LIVE_LEN];
  for (int i = 0; i < LIVE_HONEST; i++) {
    xt_fill(out[i], LIVE_LEN, 500 + (unsigned)i);
    XT_OK(xport_send(conn, out[i], LIVE_LEN, NULL, NULL));
  }
  struct word w;
  listen_for(conn, &w);
  xt_step_put(st.c2s[1], 'S');
  heard(ctx, &w, "done");
  XT_OK(xport_send(conn, "bye", 4, NULL, NULL));
  xport_completion_t c;
  for (int sent = 0; sent <= LIVE_HONEST; sent++)
    expect(ctx, &c, XPORT_OP_SEND, 0);
  int status = xt_reap(pid);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  st_close(&s);
  xt_steps_close(&st);
  XT_CHECK(status == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- a request whose acceptance could not be sent ---------------------- */

/* Serves its endpoint (the stranger's request is challenged, then queued)
 * until told that the requester's queue is full; then accepts, which
 * cannot send its acceptance there at first. */
static void jammed_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *sc;
  for (;;) {
    xport_completion_t c;
    struct pollfd p = {.fd = st->c2s[0], .events = POLLIN};
    XT_CHECK(xport_poll(ctx, &c, 1) == 0, "a completion with no connection");
    if (poll(&p, 1, 1) == 1)
      break;
  }
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'J', "protocol");
  XT_OK(xport_accept(lst, T_MS, &sc));
  XT_OK(xport_conn_close(sc));
}

START_TEST(accept_answer_failed_takes_the_retry)
{
  if (!rdm_config("accept_answer_failed_takes_the_retry"))
    return;
  if (strcmp(xt_transport(), "shm")) {
    /* rxm takes any answer at once and fails it later, as a completion. */
    printf("SKIP: accept_answer_failed_takes_the_retry on %s: only shm refuses an answer "
           "while the requester's queue is full\n", xt_transport());
    return;
  }
  char addr[128];
  struct xt_steps st;
  struct stranger a, b;
  xt_steps_open(&st);
  pid_t pid = xt_spawn_server(jammed_server, &st, addr, sizeof addr);
  st_open(&a, addr);
  st_open(&b, addr);
  /* The request with the token: only that one is queued. (Returning once
   * the copies without it were sent, as a flood does, this test asked
   * again without the token, which a listener only challenges, and failed
   * on a loaded machine where the challenge came late.) */
  XT_CHECK(st_connect(&a, 0x4a4a, ST_TOKENED) == 0, "the listener never challenged the request");
  XT_CHECK(((struct xport__ctl *)a.buf)->cookie != 0, "the request has no token");
  struct xport__ctl req = *(struct xport__ctl *)a.buf; /* with the listener's token */
  for (long end = now_ms() + 500; now_ms() < end;)
    st_progress(&a); /* the server queues it */
  /* A third endpoint fills the requester's queue, which stops reading once
   * it has taken the third's first message (shm refuses the messages of a
   * sender its peer has not mapped yet). */
  fi_addr_t to_a;
  XT_CHECK(fi_av_insert(b.av, a.name, 1, &to_a, 0, NULL) == 1, "av insert");
  memset(b.buf, 0, 16);
  size_t sent = 0;
  for (int refused = 0; refused < 1000;) {
    ssize_t r = fi_inject(b.ep, b.buf, 16, to_a);
    XT_CHECK(r == 0 || r == -FI_EAGAIN, "inject: %s", fi_strerror((int)-r));
    sent += r == 0;
    refused = r ? refused + 1 : 0;
    st_progress(&b);
    if (!sent)
      st_progress(&a);
  }
  XT_CHECK(sent > 16, "the third endpoint sent only %zu messages", sent);
  xt_step_put(st.c2s[1], 'J');
  /* Until the listener gave up sending its acceptance (2,000 tries); if
   * it is slower, the acceptance gets through, and the test proves less. */
  usleep(3000 * 1000);
  size_t answers = a.answers;
  for (long end = now_ms() + T_MS; a.answers == answers && now_ms() < end;) {
    for (long again = now_ms() + 100; now_ms() < again;)
      st_progress(&a);
    memcpy(a.buf, &req, sizeof req); /* asks again, as a client does */
    XT_CHECK(st_send(&a, 0, 0, sizeof req) == 0, "the request again");
  }
  XT_CHECK(a.answers != answers, "the listener never answered a request it failed to "
           "accept once (its retries were taken for repeats)");
  XT_CHECK(xt_reap(pid) == 0, "server failed");
  st_close(&b);
  st_close(&a);
  xt_steps_close(&st);
}
END_TEST

/* ---- backlog ------------------------------------------------------------ */

#define BACKLOG 2
#define NCLIENTS 4

/* Serves the listener's endpoint without accepting until told to close it. */
static void unaccepting_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  int fd = *(int *)arg;
  xport_completion_t c;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) == 1)
      break;
    xport_wait(ctx, 20);
    XT_CHECK(xport_poll(ctx, &c, 1) >= 0, "poll");
  }
  XT_OK(xport_listener_close(lst));
  /* The refusals go out; stay until the test is done with us. */
  char b;
  while (read(fd, &b, 1) == 1 && b != 'q')
    ;
  /* (Polling, not xport_wait: rxm's wait after a listener close is
   * another matter, fixed elsewhere.) */
  for (long end = now_ms() + 1000; now_ms() < end;) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    xport_poll(ctx, &c, 1);
  }
  /* The listener is closed already: end here, not in the harness. */
  xport_ctx_destroy(ctx);
  exit(0);
}

/* A client process: 0 when refused, 1 connected, 2 timed out, 3 else. */
static pid_t spawn_client(const char *addr)
{
  pid_t pid = xt_fork();
  if (pid)
    return pid;
  xport_ctx_t *ctx = NULL;
  if (xport_ctx_create(NULL, &ctx))
    _exit(3);
  xport_conn_t *conn;
  int rc = xport_connect(ctx, addr, T_MS, &conn);
  xport_ctx_destroy(ctx);
  _exit(rc == -XPORT_ECONNREFUSED ? 0 : rc == 0 ? 1 : rc == -XPORT_ETIMEDOUT ? 2 : 3);
}

START_TEST(backlog_refuses_and_close_refuses_pending)
{
  char addr[128];
  int p[2];
  XT_CHECK(pipe(p) == 0, "pipe");
  char bl[8];
  snprintf(bl, sizeof bl, "%d", BACKLOG);
  setenv("XPORT_LISTEN_BACKLOG", bl, 1);
  pid_t srv = xt_spawn_server(unaccepting_server, &p[0], addr, sizeof addr);
  unsetenv("XPORT_LISTEN_BACKLOG");
  close(p[0]);
  pid_t cl[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++)
    cl[i] = spawn_client(addr);
  /* Beyond the backlog: refused while the listener still listens. */
  int done[NCLIENTS] = {0};
  for (int k = 0; k < NCLIENTS - BACKLOG; k++) {
    int st;
    pid_t who = wait(&st);
    int i = 0;
    while (i < NCLIENTS && cl[i] != who)
      i++;
    XT_CHECK(i < NCLIENTS, "wait: %d", who);
    done[i] = 1;
    XT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "a client beyond the backlog ended with %d (0 refused, 1 connected, 2 timed "
             "out)", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  /* The listener closes: those waiting in its backlog are refused too. */
  XT_CHECK(write(p[1], "c", 1) == 1, "write");
  for (int i = 0; i < NCLIENTS; i++) {
    if (done[i])
      continue;
    int st = xt_reap(cl[i]);
    XT_CHECK(st == 0, "a client in the backlog ended with %d at listener close (0 refused, "
             "1 connected, 2 timed out)", st);
  }
  XT_CHECK(write(p[1], "q", 1) == 1, "write");
  close(p[1]);
  XT_CHECK(xt_reap(srv) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- eager sizes smaller than a control message ------------------------ */

static void echo_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conn;
  xport_completion_t c;
  unsigned char buf[1000];
  XT_OK(xport_accept(lst, 3 * T_MS, &conn));
  for (int i = 0; i < 3; i++) {
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
    expect(ctx, &c, XPORT_OP_RECV, 0);
    XT_CHECK(c.len == 100u * (unsigned)(i + 1) && xt_verify(buf, c.len, (unsigned)i) == c.len,
             "message %d: %zu bytes, not the client's", i, c.len);
    XT_OK(xport_send(conn, buf, c.len, NULL, NULL));
    expect(ctx, &c, XPORT_OP_SEND, 0);
  }
  XT_OK(xport_conn_close(conn));
}

START_TEST(eager_size_small_or_malformed)
{
  /* 0 and sizes below a control message; and one whose suffix would
   * wrap a 64-bit size to 0. */
  static const char *sizes[] = {"0", "1", "100", "343", "17592186044416m"};
  enum { N = sizeof sizes / sizeof sizes[0] };
  char addrs[N][128];
  pid_t pids[N];
  /* Every server is forked before this process opens a context
   * (xport(7), FORK); each reads its own size. */
  for (size_t k = 0; k < N; k++) {
    setenv("XPORT_EAGER_SIZE", sizes[k], 1);
    pids[k] = xt_spawn_server(echo_server, NULL, addrs[k], sizeof addrs[k]);
  }
  for (size_t k = 0; k < N; k++) {
    char *addr = addrs[k];
    pid_t pid = pids[k];
    setenv("XPORT_EAGER_SIZE", sizes[k], 1);
    xport_ctx_t *ctx = xt_ctx();
    xport_conn_t *conn;
    xport_completion_t c;
    unsigned char out[1000], in[1000];
    XT_OK(xport_connect(ctx, addr, T_MS, &conn));
    for (int i = 0; i < 3; i++) {
      size_t len = 100u * (unsigned)(i + 1);
      xt_fill(out, len, (unsigned)i);
      XT_OK(xport_recv(conn, in, sizeof in, NULL, NULL));
      XT_OK(xport_send(conn, out, len, NULL, NULL));
      for (int got = 0; got < 2; got++) {
        XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "XPORT_EAGER_SIZE=%s: no completion", sizes[k]);
        XT_CHECK(c.status == 0, "XPORT_EAGER_SIZE=%s: %s", sizes[k], xport_strerror(c.status));
        if (c.op == XPORT_OP_RECV)
          XT_CHECK(c.len == len && !memcmp(in, out, len), "XPORT_EAGER_SIZE=%s: echo differs",
                   sizes[k]);
      }
    }
    XT_OK(xport_conn_close(conn));
    xport_ctx_destroy(ctx);
    XT_CHECK(xt_reap(pid) == 0, "XPORT_EAGER_SIZE=%s: server failed on %s", sizes[k],
             xt_config());
  }
  unsetenv("XPORT_EAGER_SIZE");
}
END_TEST

/* ---- other users' files under a listener's name -------------------------- */

/* /dev/shm is every user's. Another user (nobody, played by a child that
 * becomes it) plants, under the names a shm listener on a port will use,
 * links to files of root's (a listener running as root followed them and
 * created or wrote the file the link names, where fs.protected_symlinks is
 * 0) or files of their own (which a root listener took for its own). The
 * listener must use none of them and leave them, and what they point to,
 * as they were: over shm alone it refuses the port (XPORT_EADDRINUSE);
 * with shm beside a fabric it listens over the fabric only, and a peer of
 * this node reaches it there. */
#define OTHER_UID 65534 /* nobody */

enum plant { PLANT_LINKS, PLANT_FILES };

struct planted {
  char dir[64];        /* root's, 0700: where the links lead */
  char port[8], name[128], shm[160], lock[160];
  char symlinks_was[8]; /* fs.protected_symlinks before, where the test set it */
};
/* In memory the runner process shares with each test's process: a failed
 * check ends the test's process at once (_exit), and the runner's
 * teardown then removes what it planted and restores the setting. */
static struct planted *planted_log;
#define PLANTED_MAX 4

static int sysctl_rw(const char *path, char *was, size_t len, const char *to)
{
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int ok = fgets(was, (int)len, f) != NULL;
  fclose(f);
  was[strcspn(was, "\n")] = '\0';
  if (!ok || !to || !strcmp(was, to))
    return ok ? 0 : -1;
  f = fopen(path, "w");
  if (!f)
    return -1;
  ok = fputs(to, f) >= 0;
  return fclose(f) == 0 && ok ? 1 : -1;
}

static void planted_remove(struct planted *pl)
{
  char path[200];
  if (pl->name[0]) {
    unlink(pl->shm);
    unlink(pl->lock);
  }
  static const char *const in_dir[] = {"created", "precious"};
  for (size_t i = 0; pl->dir[0] && i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", pl->dir, in_dir[i]);
    unlink(path);
  }
  if (pl->dir[0])
    rmdir(pl->dir);
  if (pl->symlinks_was[0]) {
    char now[8];
    sysctl_rw("/proc/sys/fs/protected_symlinks", now, sizeof now, pl->symlinks_was);
  }
  memset(pl, 0, sizeof *pl);
}

static void planted_setup(void)
{
  planted_log = mmap(NULL, PLANTED_MAX * sizeof *planted_log, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (planted_log == MAP_FAILED)
    planted_log = NULL;
}

static void planted_teardown(void)
{
  for (unsigned i = 0; planted_log && i < PLANTED_MAX; i++)
    planted_remove(&planted_log[i]);
  if (planted_log)
    munmap(planted_log, PLANTED_MAX * sizeof *planted_log);
  planted_log = NULL;
}

static int free_port(char *port, size_t len)
{
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t l = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
           getsockname(fd, (struct sockaddr *)&a, &l) == 0;
  if (fd >= 0)
    close(fd);
  snprintf(port, len, "%u", ntohs(a.sin_port));
  return ok ? 0 : -1;
}

/* The other user's part, in a child that became nobody. */
static int plant_as_other(const struct planted *pl, enum plant what)
{
  if (setgroups(0, NULL) || setgid(OTHER_UID) || setuid(OTHER_UID))
    return 77;
  if (what == PLANT_LINKS) {
    char created[100], precious[100];
    snprintf(created, sizeof created, "%s/created", pl->dir);
    snprintf(precious, sizeof precious, "%s/precious", pl->dir);
    return symlink(created, pl->lock) || symlink(precious, pl->shm) ? 1 : 0;
  }
  for (int i = 0; i < 2; i++) {
    int fd = open(i ? pl->lock : pl->shm, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0 || write(fd, "squat", 5) != 5)
      return 1;
    close(fd);
  }
  return 0;
}

struct seen {
  struct stat lock, shm, precious;
};
static void look(const struct planted *pl, struct seen *s)
{
  char precious[100];
  snprintf(precious, sizeof precious, "%s/precious", pl->dir);
  XT_CHECK(lstat(pl->lock, &s->lock) == 0 && lstat(pl->shm, &s->shm) == 0,
           "the planted %s or %s is gone", pl->lock, pl->shm);
  memset(&s->precious, 0, sizeof s->precious);
  stat(precious, &s->precious);
}

#define OTHER_LEN 300
#define OTHER_SEED 41

/* A peer of this node: connects once told to, sends its bytes and waits
 * for the word that they arrived. */
static void other_client(struct xt_steps *st, const char *addr)
{
  char go = xt_step_get(st->s2c[0], 3 * T_MS);
  if (go != 'C')
    _exit(0);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  unsigned char msg[OTHER_LEN];
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  xt_fill(msg, sizeof msg, OTHER_SEED);
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, NULL));
  xport_completion_t c;
  expect(ctx, &c, XPORT_OP_SEND, 0);
  xt_step_get(st->s2c[0], 3 * T_MS);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  _exit(0);
}

static void listen_past(enum plant what, const char *test)
{
  if (strcmp(xt_transport(), "shm")) {
    printf("SKIP: %s on %s: no shm listener here\n", test, xt_config());
    return;
  }
  if (geteuid() != 0) {
    printf("SKIP: %s on %s: only root can play another user\n", test, xt_config());
    return;
  }
  struct planted *pl = NULL;
  for (unsigned i = 0; planted_log && i < PLANTED_MAX && !pl; i++)
    if (!planted_log[i].dir[0])
      pl = &planted_log[i];
  XT_CHECK(pl, "no room to record what the test plants");
  snprintf(pl->dir, sizeof pl->dir, "/tmp/xport-other-XXXXXX");
  XT_CHECK(mkdtemp(pl->dir), "mkdtemp");
  /* Where the kernel refuses to follow another user's link in a sticky
   * directory, nobody can show that xport does not: turned off for the
   * test, and back after it. */
  char was[8];
  int set = what == PLANT_LINKS
                ? sysctl_rw("/proc/sys/fs/protected_symlinks", was, sizeof was, "0")
                : 0;
  if (set > 0)
    snprintf(pl->symlinks_was, sizeof pl->symlinks_was, "%s", was);
  if (set < 0) {
    printf("SKIP: %s on %s: fs.protected_symlinks cannot be set to 0 here\n", test,
           xt_config());
    planted_remove(pl);
    return;
  }
  char precious[100];
  snprintf(precious, sizeof precious, "%s/precious", pl->dir);
  FILE *f = fopen(precious, "w");
  XT_CHECK(f && fputs("root's", f) >= 0 && fclose(f) == 0, "%s", precious);
  XT_CHECK(free_port(pl->port, sizeof pl->port) == 0, "no free port");
  xt_shm_name(pl->port, pl->name, sizeof pl->name);
  snprintf(pl->shm, sizeof pl->shm, "/dev/shm/%s", pl->name);
  snprintf(pl->lock, sizeof pl->lock, "/dev/shm/%s.lock", pl->name);

  fflush(NULL);
  pid_t other = fork();
  XT_CHECK(other >= 0, "fork");
  if (other == 0)
    _exit(plant_as_other(pl, what));
  int status;
  XT_CHECK(waitpid(other, &status, 0) == other && WIFEXITED(status), "the other user's child");
  if (WEXITSTATUS(status) == 77) {
    printf("SKIP: %s on %s: cannot become uid %d\n", test, xt_config(), OTHER_UID);
    planted_remove(pl);
    return;
  }
  XT_CHECK(WEXITSTATUS(status) == 0, "the other user could not plant its files");
  struct seen before, after;
  look(pl, &before);
  struct stat pst;
  XT_CHECK(stat(precious, &pst) == 0, "%s", precious);
  before.precious = pst;

  char addr[64];
  snprintf(addr, sizeof addr, "%s:%s", xt_host(), pl->port);
  struct xt_steps st;
  xt_steps_open(&st);
  pid_t client = xt_fork();
  if (client == 0)
    other_client(&st, addr);

  xport_ctx_t *ctx = xt_ctx();
  xport_listener_t *lst = NULL;
  int rc = xport_listen(ctx, addr, &lst);
  look(pl, &after);
  if (xt_mixed()) {
    XT_CHECK(rc == 0, "listen on %s with another user's files under its shm name: %s", addr,
             xport_strerror(rc));
    xt_step_put(st.s2c[1], 'C');
    xport_conn_t *conn;
    unsigned char buf[OTHER_LEN + 16];
    XT_OK(xport_accept(lst, T_MS, &conn));
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    XT_CHECK(c.status == 0 && c.len == OTHER_LEN &&
             xt_verify(buf, OTHER_LEN, OTHER_SEED) == OTHER_LEN,
             "the peer's bytes did not arrive intact (%s, %zu bytes)", xport_strerror(c.status),
             c.len);
    xport_caps_t caps;
    XT_OK(xport_conn_query(conn, &caps));
    XT_CHECK(strcmp(caps.provider, "shm"), "the connection runs over shm, under a name "
             "another user's files hold");
    xt_step_put(st.s2c[1], 'D');
    XT_OK(xport_conn_close(conn));
    XT_OK(xport_listener_close(lst));
  } else {
    xt_step_put(st.s2c[1], 'X');
    XT_CHECK(rc == -XPORT_EADDRINUSE, "listen on %s over shm with another user's files under "
             "its name: %s, not %s", addr, xport_strerror(rc),
             xport_strerror(-XPORT_EADDRINUSE));
  }
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(client) == 0, "the peer failed");
  xt_steps_close(&st);

  char created[100];
  snprintf(created, sizeof created, "%s/created", pl->dir);
  XT_CHECK(access(created, F_OK) != 0, "the listener created %s through the link %s", created,
           pl->lock);
  struct stat pnow;
  XT_CHECK(stat(precious, &pnow) == 0 && pnow.st_size == before.precious.st_size &&
           pnow.st_mtim.tv_sec == before.precious.st_mtim.tv_sec &&
           pnow.st_mtim.tv_nsec == before.precious.st_mtim.tv_nsec,
           "the listener wrote %s through the link %s", precious, pl->shm);
  const struct stat *b[2] = {&before.lock, &before.shm}, *a[2] = {&after.lock, &after.shm};
  for (int i = 0; i < 2; i++)
    XT_CHECK(a[i]->st_ino == b[i]->st_ino && a[i]->st_uid == OTHER_UID &&
             a[i]->st_size == b[i]->st_size && a[i]->st_mtim.tv_sec == b[i]->st_mtim.tv_sec &&
             a[i]->st_mtim.tv_nsec == b[i]->st_mtim.tv_nsec,
             "the listener took or changed the other user's %s", i ? pl->shm : pl->lock);
  struct stat gone;
  look(pl, &after); /* and after the listener and its context are gone */
  XT_CHECK(after.lock.st_ino == before.lock.st_ino && after.shm.st_ino == before.shm.st_ino &&
           stat(pl->dir, &gone) == 0, "the other user's files went with the listener");
  planted_remove(pl);
}

START_TEST(other_users_links_refused)
{
  listen_past(PLANT_LINKS, "other_users_links_refused");
}
END_TEST

START_TEST(other_users_files_squat_name)
{
  listen_past(PLANT_FILES, "other_users_files_squat_name");
}
END_TEST

/* ---- listeners that strangers cannot stop (FI_EP_MSG) -------------------
 * Raw libfabric endpoints of the fabric's provider that send xport's
 * greeting (src/transport/msg.c's struct hello) and then do nothing. */
struct greeting {
  uint64_t magic;
  uint32_t version, flags;
  uint64_t ctx_id, cookie;
};
#define GREETING_MAGIC 0x5850525455ULL
#define GREETING_WANT_SVC 0x1u
#define GREETING_DATA 0x10u /* data follows the connection (xport_connect_data) */

/* The configurations whose listener is a FI_EP_MSG one that strangers
 * reach with a greeting; the others skip with the reason. */
static int msg_listener_config(const char *test)
{
  const char *c = xt_transport();
  if (strcmp(c, "shm") && strcmp(c, "xshm") && !strstr(c, "ofi_rxm"))
    return 1;
  printf("SKIP: %s on %s: its connections are not made by a FI_EP_MSG listener\n", test,
         xt_config());
  return 0;
}

struct greeters {
  struct fi_info *info;
  struct fid_fabric *fab;
  struct fid_domain *dom;
  struct fid_eq *eq;
  struct fid_cq *cq;
  struct fid_ep **ep;
  int *answered; /* 1 connected, -1 refused */
  size_t n, connected, held; /* accepted; not answered (in the backlog) */
};

/* The FI_EP_MSG endpoints of provider prov that reach a listener at addr
 * (host:port), as xport's own clients ask for them; fi_getinfo's code. */
static int msg_getinfo(const char *prov, const char *addr, struct fi_info **info)
{
  char host[128], port[16];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  struct fi_info *hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_MSG;
  hints->caps = FI_MSG;
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov);
  int rc = fi_getinfo(FI_VERSION(1, 17), host, port, 0, hints, info);
  fi_freeinfo(hints);
  return rc;
}

/* Opens n endpoints of provider prov that each greet addr asking for a
 * service channel, and waits until every one was answered (accepted into
 * a handshake, or refused) or none has been for two seconds: those left
 * are held in the listener's backlog. */
static void greeters_open_flags(struct greeters *g, const char *prov, const char *addr,
                                size_t n, uint32_t flags)
{
  memset(g, 0, sizeof *g);
  int rc = msg_getinfo(prov, addr, &g->info);
  XT_CHECK(rc == 0, "greeters: fi_getinfo(%s): %s", addr, fi_strerror(-rc));
  struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC, .size = 4 * n};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .size = 64};
  XT_CHECK(fi_fabric(g->info->fabric_attr, &g->fab, NULL) == 0, "fi_fabric");
  XT_CHECK(fi_eq_open(g->fab, &eq_attr, &g->eq, NULL) == 0, "fi_eq_open");
  XT_CHECK(fi_domain(g->fab, g->info, &g->dom, NULL) == 0, "fi_domain");
  XT_CHECK(fi_cq_open(g->dom, &cq_attr, &g->cq, NULL) == 0, "fi_cq_open");
  g->ep = calloc(n, sizeof *g->ep);
  g->answered = calloc(n, sizeof *g->answered);
  XT_CHECK(g->ep && g->answered, "calloc");
  g->n = n;
  struct greeting h = {GREETING_MAGIC, 2, flags, 0, 0};
  for (size_t i = 0; i < n; i++) {
    h.ctx_id = 0x6000 + i;
    XT_CHECK(fi_endpoint(g->dom, g->info, &g->ep[i], &g->answered[i]) == 0, "fi_endpoint");
    XT_CHECK(fi_ep_bind(g->ep[i], &g->eq->fid, 0) == 0, "bind eq");
    XT_CHECK(fi_ep_bind(g->ep[i], &g->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
    XT_CHECK(fi_enable(g->ep[i]) == 0, "fi_enable");
    XT_CHECK(fi_connect(g->ep[i], g->info->dest_addr, &h, sizeof h) == 0, "fi_connect %zu",
             i);
  }
  size_t left = n;
  long quiet = now_ms() + T_MS; /* the first answer may take a while on a busy machine */
  while (left && now_ms() < quiet) {
    struct {
      struct fi_eq_cm_entry e;
      uint8_t data[256];
    } ev;
    uint32_t event;
    ssize_t r = fi_eq_sread(g->eq, &event, &ev, sizeof ev, 100, 0);
    int *a = NULL, what = 0;
    if (r == -FI_EAVAIL) {
      struct fi_eq_err_entry err = {0};
      fi_eq_readerr(g->eq, &err, 0);
      a = err.fid ? err.fid->context : NULL;
      what = -1;
    } else if (r > 0 && (event == FI_CONNECTED || event == FI_SHUTDOWN)) {
      a = ev.e.fid->context;
      what = event == FI_CONNECTED ? 1 : -1;
    }
    if (a && !*a) {
      *a = what;
      left--;
      g->connected += what == 1;
      quiet = now_ms() + 2000;
    }
  }
  g->held = left;
}

static void greeters_open(struct greeters *g, const char *prov, const char *addr, size_t n)
{
  greeters_open_flags(g, prov, addr, n, GREETING_WANT_SVC);
}

static void greeters_close(struct greeters *g)
{
  for (size_t i = 0; i < g->n; i++)
    if (g->ep[i])
      fi_close(&g->ep[i]->fid);
  fi_close(&g->cq->fid);
  fi_close(&g->dom->fid);
  fi_close(&g->eq->fid);
  fi_close(&g->fab->fid);
  fi_freeinfo(g->info);
  free(g->ep);
  free(g->answered);
}

#define HONEST_LEN 300
#define HONEST_SEED 11

/* Accepts one connection (the strangers' handshakes never end, so it is
 * the honest client's) and echoes one message back. */
static void echo_once_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conn;
  xport_completion_t c;
  unsigned char buf[HONEST_LEN];
  XT_OK(xport_accept(lst, 6 * T_MS, &conn));
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, NULL));
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_CHECK(c.len == HONEST_LEN && xt_verify(buf, HONEST_LEN, HONEST_SEED) == HONEST_LEN,
           "the honest client's bytes did not arrive intact (%zu bytes)", c.len);
  XT_OK(xport_send(conn, buf, sizeof buf, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  /* Serving meanwhile, as long as the client may take to watch the
   * strangers' sockets close. */
  struct word w;
  listen_for(conn, &w);
  c = xt_wait_op(ctx, XPORT_OP_RECV, 5 * T_MS);
  XT_CHECK(c.status == 0 && c.user_ctx == &w && !strcmp(w.buf, "done"), "heard '%s' (%s)",
           w.buf, xport_strerror(c.status));
  XT_OK(xport_conn_close(conn));
}

/* The honest client: connects within its normal timeout, sends bytes and
 * gets them back; then runs then(arg) (may be NULL) while the server still
 * serves, and says "done". */
static void honest_exchange(const char *addr, void (*then)(void *arg), void *arg)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  xport_completion_t c;
  unsigned char msg[HONEST_LEN], back[HONEST_LEN];
  int rc = xport_connect(ctx, addr, T_MS, &conn);
  XT_CHECK(rc == 0, "the honest client could not connect: %s", xport_strerror(rc));
  memset(back, 0, sizeof back);
  XT_OK(xport_recv(conn, back, sizeof back, NULL, NULL));
  xt_fill(msg, sizeof msg, HONEST_SEED);
  XT_OK(xport_send(conn, msg, sizeof msg, NULL, NULL));
  expect(ctx, &c, XPORT_OP_SEND, 0);
  expect(ctx, &c, XPORT_OP_RECV, 0);
  XT_CHECK(c.len == HONEST_LEN && !memcmp(back, msg, HONEST_LEN),
           "the echo did not come back intact (%zu bytes)", c.len);
  if (then)
    then(arg);
  say(ctx, conn, "done");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
}

#define GREETERS 300

/* More strangers than the listener's backlog greet, asking for a service
 * channel, and never open it: their handshakes must not keep an honest
 * client out (xport_accept(3): one slow peer holds up no other). */
START_TEST(greeters_never_open_channel)
{
  if (!msg_listener_config("greeters_never_open_channel"))
    return;
  char addr[128];
  /* Where the harness makes fewer connections (XPORT_TEST_CONNS: the
   * emulated verbs guest), a backlog that small and three times as many
   * greeters: the same starvation, at a size the guest serves in time. */
  int n = GREETERS;
  const char *conns = getenv("XPORT_TEST_CONNS");
  if (conns && atoi(conns) > 0 && atoi(conns) < 64) {
    setenv("XPORT_LISTEN_BACKLOG", conns, 1);
    n = 3 * atoi(conns);
  }
  pid_t pid = xt_spawn_server(echo_once_server, NULL, addr, sizeof addr);
  struct greeters g;
  greeters_open(&g, xt_transport(), addr, n);
  printf("greeters_never_open_channel: of %d greeters %zu accepted, %zu unanswered\n", n,
         g.connected, g.held);
  honest_exchange(addr, NULL, NULL);
  greeters_close(&g);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

#define DATA_GREETERS 60

/* Strangers announce data with their request (as xport_connect_data's
 * does) and then send none, too little, or a data message that claims
 * more than XPORT_CONN_DATA_MAX bytes: none of theirs may be handed out,
 * and an honest client is served meanwhile. */
START_TEST(greeters_announce_data_and_lie)
{
  if (!msg_listener_config("greeters_announce_data_and_lie"))
    return;
  char addr[128];
  pid_t pid = xt_spawn_server(echo_once_server, NULL, addr, sizeof addr);
  struct greeters g;
  greeters_open_flags(&g, xt_transport(), addr, DATA_GREETERS, GREETING_DATA);
  /* The data message's layout (msg_wire.h): magic "XAUT", kind 5,
   * length, zero, then the bytes; 72 in all. */
  uint8_t lie[72] = {0};
  uint32_t w[3] = {0x54554158u, 5, 100};
  memcpy(lie, w, sizeof w);
  size_t sent = 0, big = g.info->tx_attr->inject_size >= sizeof lie;
  for (size_t i = 0; i < g.n; i++) {
    if (g.answered[i] != 1 || i % 3 == 0)
      continue; /* one in three says nothing */
    size_t len = i % 3 == 1 || !big ? 16 : sizeof lie;
    sent += fi_inject(g.ep[i], lie, len, 0) == 0;
  }
  printf("greeters_announce_data_and_lie: of %d greeters %zu accepted, %zu lied\n",
         DATA_GREETERS, g.connected, sent);
  honest_exchange(addr, NULL, NULL);
  greeters_close(&g);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- half-open connections ----------------------------------------------
 * Plain sockets that connect to a listener's port and send nothing, or a
 * few bytes of a request, and stay: each holds a descriptor of the
 * server's until it is closed. */
#define HALFOPEN 400
#define HALFOPEN_NOFILE 256 /* the server's descriptor limit: fewer than HALFOPEN */

/* The configurations whose fabric listener is reached over TCP sockets
 * from this namespace; the others skip with the reason. With shm beside
 * the fabric, a server out of descriptors crashes in libfabric 1.17
 * (SIGSEGV, with or without xport's watch; not yet traced). */
static int tcp_listener_config(const char *test)
{
  const char *c = xt_config();
  if (strstr(c, "tcp") && (!xt_mixed() || !strcmp(xt_transport(), "xshm")))
    return 1;
  printf("SKIP: %s on %s: %s\n", test, c,
         xt_mixed() ? "a server with shm beside crashes in libfabric when out of descriptors"
                    : "no listener takes TCP sockets");
  return 0;
}

static void fd_limited_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct rlimit rl;
  XT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
  rl.rlim_cur = HALFOPEN_NOFILE;
  XT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
  echo_once_server(ctx, lst, arg);
}

struct halfopen {
  int fd[HALFOPEN];
  int up[HALFOPEN]; /* connected when the honest client was through */
};

/* Opens HALFOPEN sockets to addr without waiting (the server's kernel
 * queues only so many); one in four sends 10 bytes of a request once
 * connected. */
static void halfopen_open(struct halfopen *h, const char *addr)
{
  char host[128], port[16];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  if (host[0] == '[') { /* [v6] */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  XT_CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo %s", addr);
  for (int i = 0; i < HALFOPEN; i++) {
    h->fd[i] = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    XT_CHECK(h->fd[i] >= 0, "socket");
    int rc = connect(h->fd[i], ai->ai_addr, ai->ai_addrlen);
    XT_CHECK(rc == 0 || errno == EINPROGRESS, "connect: %s", strerror(errno));
  }
  freeaddrinfo(ai);
  /* Connected, most of them, within a moment. */
  for (long end = now_ms() + 2000; now_ms() < end;) {
    int all = 1;
    for (int i = 0; i < HALFOPEN; i++) {
      struct pollfd p = {.fd = h->fd[i], .events = POLLOUT};
      if (h->up[i])
        continue;
      int err = 0;
      socklen_t len = sizeof err;
      if (poll(&p, 1, 0) == 1 && !getsockopt(h->fd[i], SOL_SOCKET, SO_ERROR, &err, &len) &&
          !err && (p.revents & POLLOUT)) {
        h->up[i] = 1;
        if (i % 4 == 1)
          XT_CHECK(send(h->fd[i], "\x03\x01\0\0garbag", 10, MSG_NOSIGNAL) == 10, "send");
      } else {
        all = 0;
      }
    }
    if (all)
      break;
    usleep(10 * 1000);
  }
}

/* Every socket that was connected is closed by the server in time:
 * its read sees the end of the stream, or a reset. */
static void halfopen_closed(void *arg)
{
  struct halfopen *h = arg;
  int left = 0, up = 0;
  for (int i = 0; i < HALFOPEN; i++)
    up += h->up[i];
  long end = now_ms() + 60000; /* the server's deadline is a few seconds */
  do {
    left = 0;
    for (int i = 0; i < HALFOPEN; i++) {
      if (!h->up[i] || h->fd[i] < 0)
        continue;
      char b[16];
      ssize_t r = recv(h->fd[i], b, sizeof b, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        close(h->fd[i]);
        h->fd[i] = -1;
      } else {
        left++;
      }
    }
    if (left)
      usleep(50 * 1000);
  } while (left && now_ms() < end);
  printf("half-open: %d of %d sockets connected; %d left open by the server\n", up, HALFOPEN,
         left);
  XT_CHECK(up > 0 && !left, "%d of the %d connected half-open sockets were never closed", left,
           up);
}

static void halfopen_close(struct halfopen *h)
{
  for (int i = 0; i < HALFOPEN; i++)
    if (h->fd[i] >= 0)
      close(h->fd[i]);
}

/* More silent sockets than the server has descriptors: an honest client
 * still gets through, and the server closes the silent ones within its
 * deadline. */
START_TEST(halfopen_sockets_expire)
{
  if (!tcp_listener_config("halfopen_sockets_expire"))
    return;
  char addr[128];
  pid_t pid = xt_spawn_server(fd_limited_server, NULL, addr, sizeof addr);
  struct halfopen h;
  memset(&h, 0, sizeof h);
  halfopen_open(&h, addr);
  honest_exchange(addr, halfopen_closed, &h);
  halfopen_close(&h);
  XT_CHECK(xt_reap(pid) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- garbage connections ----------------------------------------------- */
#define GARBAGE 2000

/* Opens GARBAGE connections to addr one after another, each sending 64
 * random bytes and closing; exits when done (or killed). */
static pid_t spawn_garbage(const char *addr)
{
  pid_t pid = xt_fork();
  if (pid)
    return pid;
  char host[128], port[16];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, port, &hints, &ai))
    _exit(3);
  for (int i = 0; i < GARBAGE; i++) {
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0)
      _exit(3);
    uint8_t junk[64];
    for (size_t k = 0; k < sizeof junk; k += 8) {
      uint64_t r = rnd64();
      memcpy(junk + k, &r, 8);
    }
    if (!connect(fd, ai->ai_addr, ai->ai_addrlen))
      (void)!send(fd, junk, sizeof junk, MSG_NOSIGNAL);
    close(fd);
  }
  freeaddrinfo(ai);
  _exit(0);
}

/* Garbage connections, many a second, while an honest client connects:
 * it gets through within its normal timeout and its bytes compare. */
START_TEST(garbage_connections_flood)
{
  if (!tcp_listener_config("garbage_connections_flood"))
    return;
  char addr[128];
  pid_t srv = xt_spawn_server(echo_once_server, NULL, addr, sizeof addr);
  pid_t junk = spawn_garbage(addr);
  usleep(200 * 1000); /* the flood is under way */
  honest_exchange(addr, NULL, NULL);
  kill(junk, SIGKILL);
  xt_reap(junk);
  XT_CHECK(xt_reap(srv) == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- a replayed handshake under a key (xport(7), AUTHENTICATION) ------- */

/* The shared key, as the server's file holds it and as a key holder
 * makes its MAC key of it (src/util/auth.c): written here from the documented
 * format, the way any implementation of the wire would. */
static const char replay_key[] = "the job's shared key: 32 bytes..";

static void replay_mac_key(uint8_t k[crypto_auth_KEYBYTES])
{
  static const char what[] = "xport connection key v1";
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, crypto_auth_KEYBYTES);
  crypto_generichash_update(&st, (const unsigned char *)what, sizeof what);
  crypto_generichash_update(&st, (const unsigned char *)replay_key, strlen(replay_key));
  crypto_generichash_final(&st, k, crypto_auth_KEYBYTES);
}

/* A proof over the transcript of rdm_wire.h: the label, then the client's
 * end and the listener's, each nonce, ctx id, tag, conn id, address, and
 * the data its request carried (the listener's: none). */
static void replay_proof(int by_listener, const struct xport__ctl *req,
                         const struct xport__ctl *ack, uint8_t mac[crypto_auth_BYTES])
{
  static const char label[2][32] = {"xport rdm 6: the client's proof",
                                    "xport rdm 6: the listener's"};
  uint8_t t[32 + 2 * (XPORT__CTL_NONCE + 28 + XPORT__CTL_ADDR_MAX + XPORT__CTL_DATA_MAX)], *p = t,
                                                                                        k[32];
  memcpy(p, label[by_listener], 32);
  p += 32;
  for (int i = 0; i < 2; i++) {
    const struct xport__ctl *m = i ? ack : req;
    uint64_t v[2] = {m->ctx_id, i ? m->tag : req->tag};
    uint32_t w[2] = {m->src_id, m->addrlen};
    memcpy(p, m->nonce, XPORT__CTL_NONCE);
    memcpy(p + XPORT__CTL_NONCE, v, 16); /* little-endian hosts: the wire's order */
    memcpy(p + XPORT__CTL_NONCE + 16, w, 8);
    p += XPORT__CTL_NONCE + 24;
    memcpy(p, m->addr, m->addrlen);
    p += m->addrlen;
    uint32_t dlen = i ? 0 : m->datalen;
    memcpy(p, &dlen, 4);
    memcpy(p + 4, m->data, dlen);
    p += 4 + dlen;
  }
  replay_mac_key(k);
  crypto_auth(mac, t, (size_t)(p - t), k);
}

/* The whole of a client's handshake under the key, from the stranger's
 * raw endpoint: its request (and the challenge's answer), the listener's
 * acceptance, whose proof it checks, and its own proof. What it sent is
 * left in *req and *proof: what an eavesdropper would have captured. */
static void keyed_handshake(struct stranger *s, uint32_t src_id, struct xport__ctl *req,
                            struct xport__ctl *proof)
{
  size_t challenges = s->challenges, answers = s->answers;
  struct xport__ctl *m = st_ctl(s, XPORT__CTL_CONNREQ);
  m->src_id = src_id;
  m->tag = s->req_tag = rnd64() & XPORT__TAG_MASK;
  m->addrlen = (uint32_t)s->namelen;
  memcpy(m->addr, s->name, s->namelen);
  m->flags = XPORT__CTL_F_AUTH;
  randombytes_buf(m->nonce, sizeof m->nonce);
  *req = *m;
  for (long end = now_ms() + T_MS; s->answers == answers;) {
    XT_CHECK(now_ms() < end, "the listener never answered the keyed request");
    if (s->challenges != challenges && !req->cookie)
      req->cookie = s->token;
    memcpy(s->buf, req, sizeof *req);
    XT_CHECK(st_send(s, 0, 0, sizeof *req) == 0, "request");
    for (long again = now_ms() + 20; now_ms() < again && s->answers == answers;)
      st_progress(s);
  }
  const struct xport__ctl *ack = &s->ack;
  uint8_t mac[crypto_auth_BYTES];
  XT_CHECK(ack->type == XPORT__CTL_CONNACK && (ack->flags & XPORT__CTL_F_AUTH),
           "the listener answered type %u flags %#x", ack->type, ack->flags);
  replay_proof(1, req, ack, mac);
  XT_CHECK(!memcmp(mac, ack->mac, sizeof mac), "the listener's proof does not hold");
  replay_proof(0, req, ack, mac);
  m = st_ctl(s, XPORT__CTL_AUTH);
  m->ctx_id = req->ctx_id;
  m->src_id = src_id;
  m->dst_id = ack->src_id;
  m->cookie = ack->tag;
  m->flags = XPORT__CTL_F_AUTH;
  memcpy(m->mac, mac, sizeof mac);
  *proof = *m;
  XT_CHECK(st_send(s, 0, 0, sizeof *m) == 0, "proof");
}

static void replay_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  /* The key holder's handshake is accepted. */
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == 'h', "step");
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_OK(xport_conn_close(conn));
  xt_step_put(st->s2c[1], 'k');
  /* The replays: nothing is accepted while they run, nor after; the
   * honest client says so before it connects, so that a connection
   * accepted before that step is a replay's. */
  int rc;
  for (;;) {
    rc = xport_accept(lst, 100, &conn);
    XT_CHECK(rc == 0 || rc == -XPORT_ETIMEDOUT, "accept: %s", xport_strerror(rc));
    struct pollfd pf = {.fd = st->c2s[0], .events = POLLIN};
    XT_CHECK(rc || poll(&pf, 1, 0) == 1, "a replayed handshake was accepted");
    if (poll(&pf, 1, 0) == 1)
      break;
  }
  XT_CHECK(xt_step_get(st->c2s[0], 0) == 'c', "step");
  if (rc)
    XT_OK(xport_accept(lst, T_MS, &conn)); /* an honest client still gets in */
  hear(ctx, conn, "after the replays");
  say(ctx, conn, "still serving");
  XT_OK(xport_conn_close(conn));
}

/* The replay tests' listener: a server under the key (replay_server) in
 * a file of its own, whose path is left in kpath. */
static pid_t replay_start(struct xt_steps *st, char *kpath, size_t klen, char *addr, size_t alen)
{
  XT_CHECK(sodium_init() >= 0, "sodium_init");
  snprintf(kpath, klen, "/tmp/xport-replay-key-%ld", (long)getpid());
  int fd = open(kpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  XT_CHECK(fd >= 0 && write(fd, replay_key, strlen(replay_key)) > 0, "key file");
  close(fd);
  xt_steps_open(st);
  setenv("XPORT_AUTH_KEY_FILE", kpath, 1);
  pid_t pid = xt_spawn_server(replay_server, st, addr, alen);
  unsetenv("XPORT_AUTH_KEY_FILE");
  return pid;
}

/* After the replays, the listener serves an honest client, bytes compared. */
static void replay_honest(struct xt_steps *st, const char *addr)
{
  xt_step_put(st->c2s[1], 'c');
  xport_ctx_attr_t attr = {0};
  attr.auth_key = replay_key;
  attr.auth_key_len = strlen(replay_key);
  xport_ctx_t *ctx = xt_ctx_with(&attr);
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  struct word w;
  listen_for(conn, &w);
  say(ctx, conn, "after the replays");
  heard(ctx, &w, "still serving");
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
}

static void replay_end(pid_t pid, const char *kpath, struct xt_steps *st)
{
  int status = xt_reap(pid);
  unlink(kpath);
  xt_steps_close(st);
  XT_CHECK(status == 0, "server failed on %s", xt_config());
}

START_TEST(replayed_handshake_refused)
{
  if (strcmp(xt_transport(), "shm") && !strstr(xt_transport(), "ofi_rxm")) {
    printf("SKIP: replayed_handshake_refused on %s: the attacker here speaks the RDM "
           "handshake (replayed_msg_handshake_refused speaks the MSG one)\n", xt_config());
    return;
  }
  struct xt_steps st;
  char addr[128], kpath[64];
  pid_t pid = replay_start(&st, kpath, sizeof kpath, addr, sizeof addr);
  /* A key holder's handshake, as an eavesdropper records it. */
  struct stranger holder, attacker;
  struct xport__ctl req, proof;
  st_open(&holder, addr);
  xt_step_put(st.c2s[1], 'h');
  keyed_handshake(&holder, 0x4242, &req, &proof);
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'k', "the key holder was not accepted");
  /* The attacker, without the key, from an endpoint of its own: the
   * recorded request again, verbatim, then as from its own address and
   * with another connection id (the listener drops a repeated one); then
   * the recorded proof, addressed to the handshake the listener opened.
   * Its nonce is new: the old proof does not hold. */
  st_open(&attacker, addr);
  memcpy(attacker.buf, &req, sizeof req);
  XT_CHECK(st_send(&attacker, 0, 0, sizeof req) == 0, "verbatim request");
  memcpy(attacker.buf, &proof, sizeof proof);
  XT_CHECK(st_send(&attacker, 0, 0, sizeof proof) == 0, "verbatim proof");
  struct xport__ctl r = req;
  r.src_id = 0x4343;
  r.cookie = 0;
  r.addrlen = (uint32_t)attacker.namelen;
  memset(r.addr, 0, sizeof r.addr);
  memcpy(r.addr, attacker.name, attacker.namelen);
  size_t challenges = attacker.challenges, answers = attacker.answers;
  attacker.req_tag = r.tag;
  for (long end = now_ms() + T_MS; attacker.answers == answers;) {
    XT_CHECK(now_ms() < end, "the listener never answered the replayed request");
    if (attacker.challenges != challenges && !r.cookie)
      r.cookie = attacker.token;
    memcpy(attacker.buf, &r, sizeof r);
    XT_CHECK(st_send(&attacker, 0, 0, sizeof r) == 0, "replayed request");
    for (long again = now_ms() + 20; now_ms() < again && attacker.answers == answers;)
      st_progress(&attacker);
  }
  XT_CHECK(attacker.ack.type == XPORT__CTL_CONNACK, "the replayed request was refused outright");
  struct xport__ctl p = proof;
  p.src_id = r.src_id;
  p.dst_id = attacker.ack.src_id;
  p.cookie = attacker.ack.tag;
  memcpy(attacker.buf, &p, sizeof p);
  XT_CHECK(st_send(&attacker, 0, 0, sizeof p) == 0, "replayed proof");
  for (long again = now_ms() + 500; now_ms() < again;)
    st_progress(&attacker);
  replay_honest(&st, addr);
  st_close(&attacker);
  st_close(&holder);
  replay_end(pid, kpath, &st);
}
END_TEST

/* ---- a replayed handshake over MSG (msg_wire.h) --------------------------
 * A raw FI_EP_MSG endpoint of the fabric's provider that speaks the MSG
 * handshake under a key as an implementation of the wire from its
 * documentation would: the greeting in the connection's data, then
 *   0 magic "XAUT"  4 kind  8 nonce[32]  40 proof[32]
 * as the connection's first messages (HELLO, the listener's ANSWER, PROOF). */
#define GREETING_AUTH 0x4u
#define MSG_AUTH_MAGIC 0x54554158u /* "XAUT", little-endian */
#define MSG_AUTH_LEN 72
enum { MSG_AUTH_HELLO = 1, MSG_AUTH_ANSWER, MSG_AUTH_PROOF };

struct msg_peer {
  struct fi_info *info;
  struct fid_fabric *fab;
  struct fid_domain *dom;
  struct fid_eq *eq;
  struct fid_cq *cq;
  struct fid_ep *ep;
  struct fid_mr *mr;
  void *desc;
  uint8_t *buf;            /* [0, 128) to send from, [128, 256) to receive into */
  uint64_t listener_id;    /* from the acceptance's greeting */
  uint64_t cookie;
  struct fi_context2 rx_ctx, tx_ctx;
  ssize_t rx_len;          /* -2 until the receive completed, -1 if it failed */
  int tx_done;             /* 1 the last send completed, -1 failed */
};

/* The proof of msg_wire.h: the MAC over the direction's label, both
 * nonces, both context ids and the service channel's cookie. */
static void msg_proof(int by_listener, const uint8_t *client_nonce, const uint8_t *listener_nonce,
                      uint64_t client_id, uint64_t listener_id, uint64_t cookie,
                      uint8_t mac[crypto_auth_BYTES])
{
  static const char label[2][32] = {"xport msg 1: the client's proof",
                                    "xport msg 1: the listener's"};
  uint8_t t[32 + 64 + 24], k[crypto_auth_KEYBYTES];
  uint64_t ids[3] = {client_id, listener_id, cookie}; /* little-endian hosts: the wire's order */
  memcpy(t, label[by_listener], 32);
  memcpy(t + 32, client_nonce, 32);
  memcpy(t + 64, listener_nonce, 32);
  memcpy(t + 96, ids, sizeof ids);
  replay_mac_key(k);
  crypto_auth(mac, t, sizeof t, k);
}

/* Reads p's queue until ctx completed (a receive that completes while a
 * send is awaited is kept); the receive's length, 0 for a send, or -1
 * when it failed or never came within ms. */
static ssize_t mp_wait(struct msg_peer *p, void *ctx, long ms)
{
  for (long end = now_ms() + ms;;) {
    if (ctx == &p->rx_ctx && p->rx_len != -2)
      return p->rx_len;
    if (ctx == &p->tx_ctx && p->tx_done)
      return p->tx_done > 0 ? 0 : -1;
    if (now_ms() > end)
      return -1;
    struct fi_cq_data_entry e;
    ssize_t n = fi_cq_read(p->cq, &e, 1);
    void *done = n == 1 ? e.op_context : NULL;
    int ok = n == 1;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      if (fi_cq_readerr(p->cq, &err, 0) == 1)
        done = err.op_context;
    }
    if (done == &p->rx_ctx)
      p->rx_len = ok ? (ssize_t)e.len : -1;
    else if (done == &p->tx_ctx)
      p->tx_done = ok ? 1 : -1;
    else if (n != 1) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

/* Greets the listener at addr with h (a receive for its first message
 * posted before); 0 once connected, the listener's greeting read, or -1. */
static int mp_open(struct msg_peer *p, const char *addr, const struct greeting *h)
{
  memset(p, 0, sizeof *p);
  p->rx_len = -2;
  int rc = msg_getinfo(xt_transport(), addr, &p->info);
  XT_CHECK(rc == 0, "fi_getinfo(%s): %s", addr, fi_strerror(-rc));
  struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC, .size = 16};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .size = 16};
  XT_CHECK(fi_fabric(p->info->fabric_attr, &p->fab, NULL) == 0, "fi_fabric");
  XT_CHECK(fi_eq_open(p->fab, &eq_attr, &p->eq, NULL) == 0, "fi_eq_open");
  XT_CHECK(fi_domain(p->fab, p->info, &p->dom, NULL) == 0, "fi_domain");
  XT_CHECK(fi_cq_open(p->dom, &cq_attr, &p->cq, NULL) == 0, "fi_cq_open");
  XT_CHECK(fi_endpoint(p->dom, p->info, &p->ep, NULL) == 0, "fi_endpoint");
  XT_CHECK(fi_ep_bind(p->ep, &p->eq->fid, 0) == 0, "bind eq");
  XT_CHECK(fi_ep_bind(p->ep, &p->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
  XT_CHECK(fi_enable(p->ep) == 0, "fi_enable");
  p->buf = aligned_alloc(4096, 4096);
  XT_CHECK(p->buf && fi_mr_reg(p->dom, p->buf, 4096, FI_SEND | FI_RECV, 0, 0, 0, &p->mr,
                               NULL) == 0, "fi_mr_reg");
  p->desc = fi_mr_desc(p->mr);
  XT_CHECK(fi_recv(p->ep, p->buf + 128, 128, p->desc, 0, &p->rx_ctx) == 0, "fi_recv");
  XT_CHECK(fi_connect(p->ep, p->info->dest_addr, h, sizeof *h) == 0, "fi_connect");
  for (long end = now_ms() + T_MS; now_ms() < end;) {
    struct {
      struct fi_eq_cm_entry e;
      uint8_t data[256];
    } ev;
    uint32_t event;
    ssize_t r = fi_eq_sread(p->eq, &event, &ev, sizeof ev, 100, 0);
    if (r == -FI_EAVAIL) {
      struct fi_eq_err_entry err = {0};
      fi_eq_readerr(p->eq, &err, 0);
      return -1;
    }
    if (r > 0 && event == FI_SHUTDOWN)
      return -1;
    if (r > 0 && event == FI_CONNECTED) {
      struct greeting g;
      XT_CHECK((size_t)r >= sizeof ev.e + sizeof g, "an acceptance without a greeting");
      memcpy(&g, ev.data, sizeof g);
      XT_CHECK(g.magic == GREETING_MAGIC && (g.flags & GREETING_AUTH),
               "the acceptance's greeting (flags %#x) does not say the listener holds a key",
               g.flags);
      p->listener_id = g.ctx_id;
      p->cookie = g.cookie;
      return 0;
    }
  }
  return -1;
}

/* Sends one handshake message; 0 once it completed, or -1. */
static int mp_send(struct msg_peer *p, const uint8_t m[MSG_AUTH_LEN])
{
  memcpy(p->buf, m, MSG_AUTH_LEN);
  p->tx_done = 0;
  if (fi_send(p->ep, p->buf, MSG_AUTH_LEN, p->desc, 0, &p->tx_ctx))
    return -1;
  return (int)mp_wait(p, &p->tx_ctx, T_MS);
}

/* 1 once the listener has ended the connection (within ms). */
static int mp_ended(struct msg_peer *p, long ms)
{
  for (long end = now_ms() + ms; now_ms() < end;) {
    struct fi_eq_cm_entry e;
    uint32_t event;
    ssize_t r = fi_eq_sread(p->eq, &event, &e, sizeof e, 10, 0);
    if (r == -FI_EAVAIL) {
      struct fi_eq_err_entry err = {0};
      fi_eq_readerr(p->eq, &err, 0);
      return 1;
    }
    if (r > 0 && event == FI_SHUTDOWN)
      return 1;
    struct fi_cq_data_entry ce; /* the provider sees the close as it reads */
    if (fi_cq_read(p->cq, &ce, 1) == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(p->cq, &err, 0);
    }
  }
  return 0;
}

static void mp_close(struct msg_peer *p)
{
  fi_close(&p->ep->fid);
  fi_close(&p->mr->fid);
  fi_close(&p->cq->fid);
  fi_close(&p->dom->fid);
  fi_close(&p->eq->fid);
  fi_close(&p->fab->fid);
  fi_freeinfo(p->info);
  free(p->buf);
}

static void auth_msg(uint8_t m[MSG_AUTH_LEN], uint32_t kind, const uint8_t *nonce,
                     const uint8_t *proof)
{
  uint32_t magic = MSG_AUTH_MAGIC;
  memset(m, 0, MSG_AUTH_LEN);
  memcpy(m, &magic, 4);
  memcpy(m + 4, &kind, 4);
  if (nonce)
    memcpy(m + 8, nonce, 32);
  if (proof)
    memcpy(m + 40, proof, 32);
}

/* A key holder's handshake over a FI_EP_MSG listener is recorded and
 * replayed by a peer without the key, from a connection of its own: the
 * same greeting, its nonce and its proof, verbatim. The listener's nonce
 * is fresh, the recorded proof does not hold for it, and the listener
 * ends that connection and never accepts it; an honest client still gets
 * in. */
START_TEST(replayed_msg_handshake_refused)
{
  if (!msg_listener_config("replayed_msg_handshake_refused"))
    return;
  struct xt_steps st;
  char addr[128], kpath[64];
  pid_t pid = replay_start(&st, kpath, sizeof kpath, addr, sizeof addr);
  /* The key holder, as an eavesdropper records it. */
  struct greeting h = {GREETING_MAGIC, 2, GREETING_AUTH, rnd64(), 0};
  uint8_t nonce[32], hello[MSG_AUTH_LEN], answer[MSG_AUTH_LEN], proof[MSG_AUTH_LEN];
  uint8_t mac[crypto_auth_BYTES];
  randombytes_buf(nonce, sizeof nonce);
  auth_msg(hello, MSG_AUTH_HELLO, nonce, NULL);
  struct msg_peer holder, attacker;
  xt_step_put(st.c2s[1], 'h');
  XT_CHECK(mp_open(&holder, addr, &h) == 0, "the key holder's greeting was refused");
  XT_CHECK(mp_send(&holder, hello) == 0, "the key holder's nonce");
  XT_CHECK(mp_wait(&holder, &holder.rx_ctx, T_MS) == MSG_AUTH_LEN, "no answer to the nonce");
  memcpy(answer, holder.buf + 128, sizeof answer);
  uint32_t kind;
  memcpy(&kind, answer + 4, 4);
  XT_CHECK(kind == MSG_AUTH_ANSWER, "the listener answered kind %u", kind);
  msg_proof(1, nonce, answer + 8, h.ctx_id, holder.listener_id, holder.cookie, mac);
  XT_CHECK(!memcmp(mac, answer + 40, sizeof mac), "the listener's proof does not hold");
  msg_proof(0, nonce, answer + 8, h.ctx_id, holder.listener_id, holder.cookie, mac);
  auth_msg(proof, MSG_AUTH_PROOF, NULL, mac);
  XT_CHECK(mp_send(&holder, proof) == 0, "the key holder's proof");
  XT_CHECK(xt_step_get(st.s2c[0], T_MS) == 'k', "the key holder was not accepted");
  /* The replay: the listener answers with a nonce of its own, and the
   * recorded proof, which was for the old one, ends the connection. */
  XT_CHECK(mp_open(&attacker, addr, &h) == 0, "the replayed greeting was refused outright");
  XT_CHECK(mp_send(&attacker, hello) == 0, "the replayed nonce");
  XT_CHECK(mp_wait(&attacker, &attacker.rx_ctx, T_MS) == MSG_AUTH_LEN,
           "no answer to the replayed nonce");
  XT_CHECK(memcmp(attacker.buf + 128 + 8, answer + 8, 32),
           "the listener answered the replay with the nonce it gave the key holder");
  mp_send(&attacker, proof); /* the listener may have ended it already */
  XT_CHECK(mp_ended(&attacker, T_MS), "the listener kept the connection of a replayed proof");
  replay_honest(&st, addr);
  mp_close(&attacker);
  mp_close(&holder);
  replay_end(pid, kpath, &st);
}
END_TEST

/* ---- churn ----------------------------------------------------------------
 * One server; client processes connect for a bounded time, a few at once,
 * each exchanging verified data of random sizes (messages both ways, a
 * write to the server's region read back, a fetch-add) and leaving; some
 * are SIGKILLed at random while they do, and strangers come and go among
 * them (garbage and half-open TCP sockets, greetings that never go on, raw
 * RDM endpoints with forged, short and misdirected messages and requests
 * left half made). The server must go on serving: every client that was
 * not killed finishes with its bytes compared, every byte a client was
 * told was delivered (a send or write that completed with 0) reaches the
 * server intact, and once the churn is over the server's descriptors and
 * heap come back to where they were after a warm-up, with no connection
 * left in its context. The choices come from a seed that the test prints;
 * XPORT_TEST_CHURN_SEED repeats them, XPORT_TEST_CHURN_SECONDS (10) and
 * XPORT_TEST_CHURN_CLIENTS (4 at once) size the run. */
#define CH_SLOT (4u << 20)        /* a connection's region, which its client writes */
#define CH_REGION (CH_SLOT + 64u) /* and the atomic word after it */
#define CH_MAX_MSG (3u << 20)     /* past every provider's eager size (rxm: 16 KiB) */
#define CH_MAGIC 0x4348524eu
#define CH_BUF (sizeof(struct ch_hdr) + CH_MAX_MSG)

enum { CH_HELLO = 1, CH_ECHO, CH_ECHO_BACK, CH_CHECK, CH_ATOM, CH_BYE, CH_ACK };

struct ch_hdr {
  uint32_t magic, type;
  uint64_t seed, len, off, arg;
};

static uint64_t ch_rand(uint64_t *s)
{
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int ch_env(const char *name, int def)
{
  const char *v = getenv(name);
  return v && atoi(v) > 0 ? atoi(v) : def;
}

static long ch_fds(void)
{
  long n = 0;
  DIR *d = opendir("/proc/self/fd");
  XT_CHECK(d, "opendir /proc/self/fd");
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* What each descriptor is (sockets with their TCP state and peer port),
 * for the message of a check that failed. */
static void ch_fd_list(char *out, size_t len)
{
  DIR *d = opendir("/proc/self/fd");
  size_t at = 0;
  out[0] = '\0';
  for (struct dirent *e; d && (e = readdir(d)) && at + 80 < len;) {
    char path[300], what[256] = "", line[512];
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, what, sizeof what - 1);
    what[n > 0 ? n : 0] = '\0';
    unsigned long ino;
    char state[48] = "";
    if (sscanf(what, "socket:[%lu]", &ino) == 1)
      for (int v6 = 0; v6 < 2 && !state[0]; v6++) {
        FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
        while (f && fgets(line, sizeof line, f)) {
          char local[64], remote[64];
          unsigned st;
          unsigned long i;
          if (sscanf(line, "%*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local, remote, &st, &i) ==
                  4 &&
              i == ino) {
            snprintf(state, sizeof state, " tcp %s->%s st %02x", strchr(local, ':') + 1,
                     strchr(remote, ':') + 1, st);
            break;
          }
        }
        if (f)
          fclose(f);
      }
    at += (size_t)snprintf(out + at, len - at, " %s=%s%s", e->d_name, what, state);
  }
  if (d)
    closedir(d);
}

/* ---- the server ---- */

struct ch_conn {
  struct ch_conn *next;
  xport_conn_t *conn;
  unsigned char *rx, *tx, *region;
  xport_mr_t *mr;
  int rx_out, tx_out; /* posted, not completed: the buffer is xport's */
  int closed, bye, pending;
  struct ch_hdr req; /* answered once tx is free (pending) */
  uint64_t verified; /* bytes of the client's compared */
};

struct ch_stats {
  long accepted, finished, dropped, held;
  size_t held_bytes;
  long fds0, fds1;
  size_t heap0, heap1;
  uint64_t verified;
};

struct ch_server {
  struct xt_steps *steps;
  xport_ctx_t *ctx;
  struct ch_conn *conns;
  unsigned access;
  size_t held_bytes; /* buffers of closed connections that xport still holds */
  struct ch_stats st;
  char fds0_list[4096]; /* the descriptors at the baseline, for a failure's message */
};

static void ch_maybe_free(struct ch_server *S, struct ch_conn *k)
{
  if (!k->closed || k->rx_out || k->tx_out)
    return;
  for (struct ch_conn **pp = &S->conns; *pp; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  free(k);
}

static void ch_close(struct ch_server *S, struct ch_conn *k)
{
  if (k->closed)
    return;
  k->closed = 1;
  XT_OK(xport_conn_close(k->conn));
  /* Deregistered at once: the key dies with the connection, and no
   * operation of the server's own uses the region. */
  XT_OK(xport_mr_dereg(k->mr));
  free(k->region);
  k->mr = NULL;
  k->region = NULL;
  S->st.dropped += !k->bye;
  if (k->rx_out)
    S->held_bytes += CH_BUF;
  else
    free(k->rx);
  if (k->tx_out)
    S->held_bytes += CH_BUF;
  else
    free(k->tx);
  ch_maybe_free(S, k);
}

static void ch_reply(struct ch_server *S, struct ch_conn *k)
{
  struct ch_hdr *h = (struct ch_hdr *)k->tx;
  size_t len = sizeof *h;
  if (k->req.type == CH_HELLO)
    len += k->req.len; /* in tx already, with the key */
  else
    memset(h, 0, sizeof *h);
  h->magic = CH_MAGIC;
  h->type = k->req.type == CH_HELLO ? CH_HELLO : CH_ACK;
  if (k->req.type == CH_ECHO) {
    h->type = CH_ECHO_BACK;
    h->seed = k->req.seed ^ 0x5eed;
    h->len = k->req.arg; /* the answer's length, the client's choice */
    xt_fill(k->tx + sizeof *h, h->len, (unsigned)h->seed);
    len += h->len;
  }
  int rc = xport_send(k->conn, k->tx, len, NULL, k);
  if (rc == -XPORT_EAGAIN)
    return; /* pending: again at the next turn */
  if (rc) {
    XT_CHECK(rc == -XPORT_ENOTCONN || rc == -XPORT_ECONNRESET, "reply: %s", xport_strerror(rc));
    ch_close(S, k);
    return;
  }
  k->pending = 0;
  k->tx_out = 1;
}

static int ch_post_rx(struct ch_server *S, struct ch_conn *k)
{
  int rc = xport_recv(k->conn, k->rx, CH_BUF, NULL, k);
  if (rc) {
    XT_CHECK(rc == -XPORT_ENOTCONN || rc == -XPORT_ECONNRESET, "recv: %s", xport_strerror(rc));
    ch_close(S, k);
    return -1;
  }
  k->rx_out = 1;
  return 0;
}

static void ch_accepted(struct ch_server *S, xport_conn_t *conn)
{
  struct ch_conn *k = calloc(1, sizeof *k);
  XT_CHECK(k, "calloc");
  k->conn = conn;
  k->rx = malloc(CH_BUF);
  k->tx = malloc(CH_BUF);
  k->region = aligned_alloc(4096, (CH_REGION + 4095u) & ~4095u) /* a multiple of the alignment */;
  XT_CHECK(k->rx && k->tx && k->region, "malloc");
  memset(k->region, 0, CH_REGION);
  k->next = S->conns;
  S->conns = k;
  S->st.accepted++;
  XT_OK(xport_mr_reg(S->ctx, k->region, CH_REGION, S->access, &k->mr));
  struct ch_hdr *h = (struct ch_hdr *)k->tx;
  memset(h, 0, sizeof *h);
  int klen = xport_rkey_pack(k->mr, 0, CH_REGION, k->tx + sizeof *h, XPORT_RKEY_MAX_SIZE);
  XT_CHECK(klen > 0, "xport_rkey_pack: %s", xport_strerror(klen));
  if (ch_post_rx(S, k))
    return;
  h->magic = CH_MAGIC;
  h->type = CH_HELLO;
  h->len = (uint64_t)klen;
  k->req = *h;
  k->pending = 1;
  ch_reply(S, k);
}

/* A request is checked against what its client says it sent: a wrong byte
 * fails the server, and with it the test. */
static void ch_request(struct ch_server *S, struct ch_conn *k, size_t len)
{
  struct ch_hdr h;
  XT_CHECK(len >= sizeof h, "a request of %zu bytes", len);
  memcpy(&h, k->rx, sizeof h);
  XT_CHECK(h.magic == CH_MAGIC, "a request without the magic");
  switch (h.type) {
  case CH_ECHO:
    XT_CHECK(h.len == len - sizeof h && h.arg <= CH_MAX_MSG &&
                 xt_verify(k->rx + sizeof h, h.len, (unsigned)h.seed) == h.len,
             "a message of %zu bytes (said %llu) differs from its client's at byte %zu", len,
             (unsigned long long)h.len,
             xt_verify(k->rx + sizeof h, len - sizeof h, (unsigned)h.seed));
    k->verified += h.len;
    break;
  case CH_CHECK:
    XT_CHECK(h.off <= CH_SLOT && h.len <= CH_SLOT - h.off &&
                 xt_verify(k->region + h.off, h.len, (unsigned)h.seed) == h.len,
             "a write of %llu bytes at %llu differs from its client's at byte %zu",
             (unsigned long long)h.len, (unsigned long long)h.off,
             h.off <= CH_SLOT && h.len <= CH_SLOT - h.off
                 ? xt_verify(k->region + h.off, h.len, (unsigned)h.seed)
                 : 0);
    k->verified += h.len;
    break;
  case CH_ATOM: {
    uint64_t v = __atomic_load_n((uint64_t *)(void *)(k->region + CH_SLOT), __ATOMIC_SEQ_CST);
    XT_CHECK(v == h.arg, "the atomic word holds %llu, its client says %llu", (unsigned long long)v,
             (unsigned long long)h.arg);
    break;
  }
  case CH_BYE:
    XT_CHECK(h.arg == k->verified,
             "a client was told %llu bytes were delivered; %llu arrived intact",
             (unsigned long long)h.arg, (unsigned long long)k->verified);
    k->bye = 1;
    S->st.finished++;
    S->st.verified += k->verified;
    break;
  default:
    XT_CHECK(0, "a request of type %u", h.type);
  }
  if (h.type != CH_BYE && ch_post_rx(S, k))
    return;
  k->req = h;
  k->pending = 1;
  if (!k->tx_out)
    ch_reply(S, k);
}

static void ch_completion(struct ch_server *S, const xport_completion_t *c)
{
  struct ch_conn *k = c->user_ctx;
  XT_CHECK(!c->status || c->len == 0, "op %d failed (%s) with len %zu", c->op,
           xport_strerror(c->status), c->len);
  switch (c->op) {
  case XPORT_OP_DISCONNECT:
    for (k = S->conns; k && (k->closed || k->conn != c->conn); k = k->next)
      ;
    XT_CHECK(k, "a disconnect event for no open connection");
    ch_close(S, k);
    return;
  case XPORT_OP_RECV:
    XT_CHECK(k && k->rx_out, "a receive completion for no receive");
    k->rx_out = 0;
    if (k->closed) {
      S->held_bytes -= CH_BUF;
      free(k->rx);
      ch_maybe_free(S, k);
    } else if (c->status) {
      ch_close(S, k);
    } else {
      ch_request(S, k, c->len);
    }
    return;
  case XPORT_OP_SEND:
    XT_CHECK(k && k->tx_out, "a send completion for no send");
    k->tx_out = 0;
    if (k->closed) {
      S->held_bytes -= CH_BUF;
      free(k->tx);
      ch_maybe_free(S, k);
    } else if (c->status) {
      ch_close(S, k);
    } else if (k->pending) {
      ch_reply(S, k);
    } else if (k->bye) {
      ch_close(S, k); /* its client had everything */
    }
    return;
  default:
    XT_CHECK(0, "a completion of op %d, which the server never posts", c->op);
  }
}

/* One turn: accepts what waits, takes completions, sends owed replies. */
static void ch_turn(struct ch_server *S, xport_listener_t *lst)
{
  xport_conn_t *conn;
  xport_completion_t c;
  int rc;
  while ((rc = xport_accept(lst, 0, &conn)) == 0)
    ch_accepted(S, conn);
  XT_CHECK(rc == -XPORT_ETIMEDOUT, "accept: %s", xport_strerror(rc));
  /* One at a time: a connection closed for an error completion gets no
   * disconnect event after (xport_conn_close(3)), while one taken in the
   * same batch would still come. */
  int n = 0, got;
  while (n < 16 && (got = xport_poll(S->ctx, &c, 1)) == 1) {
    ch_completion(S, &c);
    n++;
  }
  XT_CHECK(got >= 0, "poll: %s", xport_strerror(got));
  for (struct ch_conn *k = S->conns, *next; k; k = next) {
    next = k->next;
    if (!k->closed && k->pending && !k->tx_out)
      ch_reply(S, k);
  }
  if (n == 0) {
    int w = xport_wait(S->ctx, 5);
    XT_CHECK(w == 0 || w == -XPORT_ETIMEDOUT, "wait: %s", xport_strerror(w));
  }
}

static int ch_open_conns(const struct ch_server *S)
{
  int n = 0;
  for (const struct ch_conn *k = S->conns; k; k = k->next)
    n += !k->closed;
  return n;
}

/* Connections of the context's, not closed, on every lane. */
static int ch_ctx_conns(const xport_ctx_t *ctx)
{
  int n = 0;
  for (unsigned l = 0; l < ctx->nlanes; l++)
    for (const xport_conn_t *c = ctx->lanes[l]->conns; c; c = c->next)
      n++;
  return n;
}

/* The heap may end this much above its level after the warm-up. The
 * warm-up ran the same mix at the same concurrency, so the pools that grow
 * by chunks and never shrink (xport's requests and bounce buffers, the
 * providers' buffer pools) have reached their size; what remains is their
 * chunk size and malloc's fragmentation, well under a MiB. A leak of one
 * connection's buffers (2 x 3 MiB), or of its region, is far above it; so
 * are the 16 KiB per connection that a lost rxm or shm peer entry costs
 * over the dozens of connections a run makes. */
#define CH_HEAP_TOL ((size_t)1 << 20)
/* Descriptors: none per connection may stay. */
#define CH_FD_TOL 0

static void ch_measure(struct ch_server *S, long *fds, size_t *heap)
{
  *fds = ch_fds();
  *heap = heap_in_use() - S->held_bytes;
}

/* The server's state stays reachable to its exit: buffers xport may still
 * hold hang from it (LeakSanitizer checks the server too). */
static struct ch_server *volatile churn_state;

static void churn_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct ch_server *S = churn_state = calloc(1, sizeof *S);
  XT_CHECK(S, "calloc");
  S->steps = arg;
  S->ctx = ctx;
  xport_caps_t caps;
  XT_OK(xport_ctx_query(ctx, &caps));
  S->access = XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE |
              (caps.atomics != XPORT_SUPPORT_NONE ? XPORT_ACCESS_REMOTE_ATOMIC : 0);
  for (;;) {
    struct pollfd p = {.fd = S->steps->c2s[0], .events = POLLIN};
    ch_turn(S, lst);
    if (poll(&p, 1, 0) != 1)
      continue;
    char what = xt_step_get(S->steps->c2s[0], T_MS);
    if (what == 'B') {
      /* The warm-up's clients are gone: where the churn must come back to. */
      for (long end = now_ms() + 3 * T_MS; ch_open_conns(S) && now_ms() < end;)
        ch_turn(S, lst);
      XT_CHECK(!ch_open_conns(S), "%d connections of the warm-up still open", ch_open_conns(S));
      for (long end = now_ms() + 1000; now_ms() < end;)
        ch_turn(S, lst);
      ch_measure(S, &S->st.fds0, &S->st.heap0);
      ch_fd_list(S->fds0_list, sizeof S->fds0_list);
      xt_step_put(S->steps->s2c[1], 'b');
    } else if (what == 'E') {
      break;
    }
  }
  /* Settle: serve until everything the churn left is let go, or for a
   * minute (half-open sockets go after 5 s, lost peers within
   * XPORT_PEER_TIMEOUT, a closed connection's drain within 4 x that). */
  long fds;
  size_t heap;
  for (long end = now_ms() + 3 * T_MS;;) {
    for (long turn = now_ms() + 200; now_ms() < turn;)
      ch_turn(S, lst);
    ch_measure(S, &fds, &heap);
    if ((!ch_open_conns(S) && !ch_ctx_conns(ctx) && fds <= S->st.fds0 + CH_FD_TOL &&
         heap <= S->st.heap0 + CH_HEAP_TOL) ||
        now_ms() > end)
      break;
  }
  S->st.fds1 = fds;
  S->st.heap1 = heap;
  S->st.held_bytes = S->held_bytes;
  for (const struct ch_conn *k = S->conns; k; k = k->next)
    S->st.held++;
  XT_CHECK(write(S->steps->s2c[1], &S->st, sizeof S->st) == (ssize_t)sizeof S->st, "write");
  XT_CHECK(!ch_open_conns(S), "%d connections still open after the churn", ch_open_conns(S));
  XT_CHECK(!ch_ctx_conns(ctx), "the context holds %d connections after the churn",
           ch_ctx_conns(ctx));
  char fdl[4096];
  ch_fd_list(fdl, sizeof fdl);
  XT_CHECK(fds <= S->st.fds0 + CH_FD_TOL,
           "the server holds %ld descriptors, %ld before the churn:%s; before:%s", fds,
           S->st.fds0, fdl, S->fds0_list);
  XT_CHECK(heap <= S->st.heap0 + CH_HEAP_TOL,
           "the server's heap grew by %zu bytes over the churn (%zu bytes more are buffers "
           "xport still holds)",
           heap - S->st.heap0, S->held_bytes);
  /* Buffers xport still holds (operations to a dead shm peer end only
   * with the listener: xport(7)) stay allocated; the harness closes the
   * listener and the context next. */
  if (!S->conns) {
    churn_state = NULL;
    free(S);
  }
}

/* ---- the clients ---- */

/* Waits for one completion of each op in want (a bit per op), each with 0;
 * returns the length the receive among them got. */
static struct ch_hdr ch_last; /* the client's last request, for its failures */
static size_t ch_collect(xport_ctx_t *ctx, unsigned want)
{
  size_t len = 0;
  while (want) {
    xport_completion_t c;
    XT_CHECK(xt_next(ctx, &c, 3 * T_MS) == 0,
             "client %d: nothing completed in %d ms (waiting for ops %#x, after request %u "
             "of %llu bytes)",
             (int)getpid(), 3 * T_MS, want, ch_last.type, (unsigned long long)ch_last.len);
    XT_CHECK(c.op != XPORT_OP_DISCONNECT && c.status == 0,
             "client %d: op %d: %s (%s): the server stopped serving", (int)getpid(), c.op,
             xport_strerror(c.status), c.detail ? c.detail : "");
    XT_CHECK(want & (1u << c.op), "client: an unexpected completion of op %d", c.op);
    want &= ~(1u << c.op);
    if (c.op == XPORT_OP_RECV)
      len = c.len;
  }
  return len;
}

static size_t ch_size(uint64_t *r, size_t max)
{
  uint64_t p = ch_rand(r) % 100, v = ch_rand(r);
  size_t len = p < 50   ? 1 + v % 4096
               : p < 80 ? 4096 + v % (256u << 10)
                        : (256u << 10) + v % (CH_MAX_MSG - (256u << 10) + 1);
  return len < max ? len : max;
}

/* Sends a request (with payload bytes of seed at tx + header) and takes
 * its answer into rx; together with a write where wbuf is set. */
static const struct ch_hdr *ch_ask(xport_ctx_t *ctx, xport_conn_t *conn, unsigned char *tx,
                                   unsigned char *rx, uint32_t type, uint64_t seed, size_t len,
                                   uint64_t off, uint64_t arg, unsigned want)
{
  struct ch_hdr *h = (struct ch_hdr *)tx;
  *h = (struct ch_hdr){CH_MAGIC, type, seed, len, off, arg};
  ch_last = *h;
  size_t payload = type == CH_ECHO ? len : 0;
  XT_OK(xport_recv(conn, rx, CH_BUF, NULL, rx));
  XT_OK(xport_send(conn, tx, sizeof *h + payload, NULL, tx));
  size_t got = ch_collect(ctx, want | 1u << XPORT_OP_SEND | 1u << XPORT_OP_RECV);
  const struct ch_hdr *a = (const struct ch_hdr *)rx;
  uint32_t expect = type == CH_ECHO ? CH_ECHO_BACK : CH_ACK;
  XT_CHECK(got >= sizeof *a && a->magic == CH_MAGIC && a->type == expect,
           "client: answer of %zu bytes, type %u, to request %u", got, got >= 8 ? a->type : 0,
           type);
  return a;
}

static void churn_client(const char *addr, int up_fd, uint64_t seed, int rounds)
{
  uint64_t r = seed;
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  int rc = xport_connect(ctx, addr, 3 * T_MS, &conn);
  XT_CHECK(rc == 0, "client %d: connect: %s", (int)getpid(), xport_strerror(rc));
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  size_t max = caps.max_msg_size - sizeof(struct ch_hdr), max_back = max;
  /* OPEN: a server's message of over 4 KiB to a shm client that dies
   * before taking it holds back the answers to every later such message of
   * the listener's endpoint, to every other client, for ever (libfabric
   * 1.17's smr_progress_resp stops at a dead peer's busy answer; see
   * xport(7), Providers): the server then never has another large send
   * complete. Until xport frees that queue, the server answers shm clients
   * inline; XPORT_TEST_CHURN_BIG_REPLIES=1 shows the hang. */
  if (!strcmp(caps.provider, "shm") && !getenv("XPORT_TEST_CHURN_BIG_REPLIES"))
    max_back = 4096 - sizeof(struct ch_hdr);
  unsigned char *tx = malloc(CH_BUF), *rx = malloc(CH_BUF), *wb = malloc(CH_SLOT),
                *rb = malloc(CH_SLOT);
  XT_CHECK(tx && rx && wb && rb, "malloc");
  XT_OK(xport_recv(conn, rx, CH_BUF, NULL, rx));
  size_t got = ch_collect(ctx, 1u << XPORT_OP_RECV);
  const struct ch_hdr *hello = (const struct ch_hdr *)rx;
  XT_CHECK(got >= sizeof *hello && hello->type == CH_HELLO && hello->len == got - sizeof *hello,
           "client: no hello");
  xport_rkey_t *rkey;
  XT_OK(xport_rkey_unpack(conn, rx + sizeof *hello, hello->len, &rkey));
  /* Connected: from now on the test may kill it. */
  pid_t me = getpid();
  XT_CHECK(write(up_fd, &me, sizeof me) == (ssize_t)sizeof me, "write");
  uint64_t word = 0, told = 0;
  for (int i = 0; i < rounds; i++) {
    uint64_t kind = ch_rand(&r) % (caps.atomics != XPORT_SUPPORT_NONE ? 3 : 2);
    uint32_t s = (uint32_t)ch_rand(&r);
    if (kind == 0) {
      size_t len = ch_size(&r, max), back = ch_size(&r, max_back);
      xt_fill(tx + sizeof(struct ch_hdr), len, s);
      const struct ch_hdr *a = ch_ask(ctx, conn, tx, rx, CH_ECHO, s, len, 0, back, 0);
      told += len;
      XT_CHECK(a->len == back && xt_verify(rx + sizeof *a, back, s ^ 0x5eed) == back,
               "client: the server's answer of %zu bytes differs", back);
    } else if (kind == 1) {
      size_t len = ch_size(&r, CH_SLOT), off = ch_rand(&r) % (CH_SLOT - len + 1);
      xt_fill(wb, len, s);
      /* The check follows the write on the connection: the server sees the
       * write's data by the time it has the message (xport(7)). */
      XT_OK(xport_write(conn, wb, len, NULL, rkey, off, wb));
      ch_ask(ctx, conn, tx, rx, CH_CHECK, s, len, off, 0, 1u << XPORT_OP_WRITE);
      told += len;
      memset(rb, 0, len);
      XT_OK(xport_read(conn, rb, len, NULL, rkey, off, rb));
      ch_collect(ctx, 1u << XPORT_OP_READ);
      XT_CHECK(xt_verify(rb, len, s) == len, "client: read back %zu bytes at %zu: differ at %zu",
               len, off, xt_verify(rb, len, s));
    } else {
      uint64_t old = ~0ull, add = ch_rand(&r) >> 8;
      XT_OK(xport_fetch_add(conn, &old, add, rkey, CH_SLOT, &old));
      ch_collect(ctx, 1u << XPORT_OP_ATOMIC);
      XT_CHECK(old == word, "client: fetch-add found %llu, not %llu", (unsigned long long)old,
               (unsigned long long)word);
      word += add;
      ch_ask(ctx, conn, tx, rx, CH_ATOM, 0, 0, 0, word, 0);
    }
  }
  const struct ch_hdr *a = ch_ask(ctx, conn, tx, rx, CH_BYE, 0, 0, 0, told, 0);
  (void)a;
  XT_OK(xport_rkey_release(rkey));
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  free(tx);
  free(rx);
  free(wb);
  free(rb);
  exit(0);
}

/* ---- the strangers ---- */

enum { CH_GARBAGE, CH_HALFOPEN, CH_GREETER, CH_RDM, CH_XSHM, CH_KINDS };

static int ch_tcp_connect(const char *addr)
{
  char host[128], port[16];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, port, &hints, &ai))
    return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

/* Which strangers reach this configuration's listener: TCP sockets where
 * its fabric listens on a TCP port, greetings where that is a FI_EP_MSG
 * listener, raw endpoints where connections share RDM ones. */
static int ch_kind_applies(int kind)
{
  const char *fabric = getenv("XPORT_PROVIDER"), *t = xt_transport();
  switch (kind) {
  case CH_GARBAGE:
  case CH_HALFOPEN:
    return fabric && !strncmp(fabric, "tcp", 3);
  case CH_GREETER:
    return fabric && !strchr(fabric, ';') && strcmp(fabric, "shm") && strcmp(fabric, "xshm");
  case CH_XSHM:
    return !strcmp(t, "xshm");
  default:
    return !strcmp(t, "shm") || strstr(t, "ofi_rxm");
  }
}

static void churn_stranger(const char *addr, int kind, uint64_t r)
{
  if (kind == CH_GARBAGE) {
    for (int i = 0, n = 5 + (int)(ch_rand(&r) % 20); i < n; i++) {
      int fd = ch_tcp_connect(addr);
      uint8_t junk[64];
      for (size_t k = 0; k < sizeof junk; k += 8) {
        uint64_t v = ch_rand(&r);
        memcpy(junk + k, &v, 8);
      }
      if (fd >= 0)
        (void)!send(fd, junk, 1 + ch_rand(&r) % sizeof junk, MSG_NOSIGNAL);
      if (fd >= 0)
        close(fd);
    }
  } else if (kind == CH_HALFOPEN) {
    for (int i = 0, n = 1 + (int)(ch_rand(&r) % 8); i < n; i++) {
      int fd = ch_tcp_connect(addr); /* left open until the process ends */
      if (fd >= 0 && ch_rand(&r) % 2)
        (void)!send(fd, "\x03\x01\0\0garbag", 10, MSG_NOSIGNAL);
    }
    usleep((useconds_t)(ch_rand(&r) % 7000) * 1000);
  } else if (kind == CH_XSHM) {
    /* xshm's listener socket (abstract: user, host, port): junk, or
     * nothing at all, then gone. */
    const char *colon = strrchr(addr, ':');
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "xport-xshm.%u.%.*s.%s",
                     (unsigned)geteuid(), (int)(colon - addr), addr, colon + 1);
    for (int i = 0, k = 1 + (int)(ch_rand(&r) % 6); i < k; i++) {
      int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      if (fd >= 0 && !connect(fd, (struct sockaddr *)&sa,
                              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) &&
          ch_rand(&r) % 2) {
        uint8_t junk[96];
        for (size_t q = 0; q < sizeof junk; q += 8) {
          uint64_t v = ch_rand(&r);
          memcpy(junk + q, &v, 8);
        }
        (void)!send(fd, junk, 1 + ch_rand(&r) % sizeof junk, MSG_NOSIGNAL);
      }
      usleep((useconds_t)(ch_rand(&r) % 500) * 1000);
      if (fd >= 0)
        close(fd);
    }
  } else if (kind == CH_GREETER) {
    struct greeters g;
    greeters_open(&g, getenv("XPORT_PROVIDER"), addr, 1 + ch_rand(&r) % 3);
    usleep((useconds_t)(ch_rand(&r) % 3000) * 1000);
  } else {
    struct stranger s;
    st_open(&s, addr);
    int shm = !strcmp(xt_transport(), "shm");
    switch (ch_rand(&r) % 5) {
    case 0:
      forge_control(&s);
      break;
    case 1:
      short_control(&s);
      break;
    case 2:
      /* Not on shm: what no receive takes stays in its endpoint's queue
       * there, and a few such strangers stop the listener (xport(7),
       * Shared endpoints and strangers). */
      if (!shm)
        inject_guesses(&s);
      break;
    case 3: /* a request left half made */
      XT_CHECK(st_connreq(&s, 0x7000 + (uint32_t)(ch_rand(&r) % 1000)) == 0, "request");
      break;
    default: /* a whole one, accepted, and then nothing */
      st_node = ch_rand(&r) % 2;
      st_connect(&s, 0x8000 + (uint32_t)(ch_rand(&r) % 1000), ST_ANSWERED);
      break;
    }
    for (long end = now_ms() + (long)(ch_rand(&r) % 1000); now_ms() < end;)
      st_progress(&s);
    /* shm's endpoint leaves its files unless closed; over rxm it vanishes
     * with its process, as a crashed one does. */
    if (shm)
      st_close(&s);
  }
  _exit(0);
}

/* ---- the test's process: spawns, kills and reaps ---- */

#define CH_PROCS 4096
struct ch_proc {
  pid_t pid;
  int stranger;
  int doomed;   /* to be killed, once connected */
  long kill_at; /* 0: not yet; -1: killed */
};

struct ch_run {
  const char *addr;
  int up[2]; /* clients say here that they are connected */
  uint64_t r;
  struct ch_proc p[CH_PROCS];
  pid_t srv;
  int srv_status; /* -1 while it runs */
  int n, live_clients, live_strangers;
  int clients, killed, survived, strangers, failed;
  char why[512];
};

static void ch_spawn(struct ch_run *R, int stranger, int kind)
{
  XT_CHECK(R->n < CH_PROCS, "too many processes");
  uint64_t seed = ch_rand(&R->r);
  int rounds = 4 + (int)(ch_rand(&R->r) % 16);
  int doomed = !stranger && ch_rand(&R->r) % 4 == 0;
  pid_t pid = xt_fork();
  if (pid == 0) {
    if (stranger)
      churn_stranger(R->addr, kind, seed);
    churn_client(R->addr, R->up[1], seed, rounds);
  }
  R->p[R->n++] = (struct ch_proc){pid, stranger, doomed, 0};
  if (stranger) {
    R->live_strangers++;
    R->strangers++;
  } else {
    R->live_clients++;
    R->clients++;
  }
}

/* Kills what is due and reaps what ended; returns the processes left. */
static int ch_reap(struct ch_run *R)
{
  long now = now_ms();
  pid_t up;
  /* A doomed client dies within 150 ms of connecting: in the middle of its
   * exchange mostly, sometimes before or after. */
  while (read(R->up[0], &up, sizeof up) == (ssize_t)sizeof up)
    for (int i = 0; i < R->n; i++)
      if (R->p[i].pid == up && R->p[i].doomed && !R->p[i].kill_at)
        R->p[i].kill_at = now + (long)(ch_rand(&R->r) % 150);
  for (int i = 0; i < R->n; i++)
    if (R->p[i].pid > 0 && R->p[i].kill_at > 0 && now >= R->p[i].kill_at) {
      kill(R->p[i].pid, SIGKILL);
      R->p[i].kill_at = -1;
    }
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    int i = 0;
    while (i < R->n && R->p[i].pid != pid)
      i++;
    if (pid == R->srv)
      R->srv_status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    if (i == R->n)
      continue;
    struct ch_proc *p = &R->p[i];
    p->pid = -pid;
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0, code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (p->stranger) {
      R->live_strangers--;
      continue;
    }
    R->live_clients--;
    if (p->kill_at < 0 && sig == SIGKILL) {
      R->killed++;
      xt_shm_remove_of(pid);
    } else if (sig || code) {
      R->failed++;
      snprintf(R->why, sizeof R->why, "client %d ended with %s %d", (int)pid,
               sig ? "signal" : "status", sig ? sig : code);
    } else {
      R->survived++;
    }
  }
  return R->live_clients + R->live_strangers;
}

static void ch_stop_all(struct ch_run *R)
{
  for (int i = 0; i < R->n; i++)
    if (R->p[i].pid > 0) {
      kill(R->p[i].pid, SIGKILL);
      R->p[i].kill_at = -1;
    }
  for (long end = now_ms() + T_MS; ch_reap(R) && now_ms() < end;)
    usleep(10 * 1000);
}

/* Churns for ms milliseconds: clients (conc at once) and strangers. */
static void ch_churn(struct ch_run *R, long ms, int conc, const int *kinds, int nkinds)
{
  long end = now_ms() + ms, next_stranger = now_ms();
  while (now_ms() < end && !R->failed) {
    while (R->live_clients < conc)
      ch_spawn(R, 0, 0);
    if (nkinds && now_ms() >= next_stranger && R->live_strangers < 4) {
      ch_spawn(R, 1, kinds[ch_rand(&R->r) % (uint64_t)nkinds]);
      next_stranger = now_ms() + 100 + (long)(ch_rand(&R->r) % 400);
    }
    ch_reap(R);
    usleep(5 * 1000);
  }
  /* The clients' own waits are bounded (3 x T_MS each); strangers' too. */
  for (long stop = now_ms() + 10 * T_MS; ch_reap(R) && now_ms() < stop;)
    usleep(10 * 1000);
}

START_TEST(churn_server_keeps_serving)
{
  /* OPEN, found by this test: over shm the server crashed inside
   * libfabric (SIGSEGV in fi_cq_readfrom under xport_wait, seeds 775344959
   * and 472075803), and once found a client's write of 5257 bytes missing
   * when the message sent after it arrived (seed 472075803 on shm+tcp).
   * The crash, read from libfabric 1.17's shm: smr_progress_sar_list goes
   * on with a segmented transfer of a peer that died mid-way, reading the
   * answer slot in that peer's region, which fi_av_remove unmapped once
   * xport let the dead peer go; segmented transfers happen at all because
   * smr_cma_check against a peer already dead turns cross-memory attach
   * off for the endpoint and for every peer that maps it afterwards
   * (xport(7), Connections over reliable-datagram endpoints). With
   * FI_SHM_DISABLE_CMA=1 the warm-up alone left a killed client's
   * connection open on the server. Until xport's own shared-memory
   * transport replaces libfabric's, the churn runs there only where
   * asked. */
  if (!strcmp(xt_transport(), "shm") && !getenv("XPORT_TEST_CHURN_SHM")) {
    printf("SKIP: churn_server_keeps_serving on %s: over shm it crashed the server inside "
           "libfabric and lost a write before the message after it, in several runs (open); "
           "XPORT_TEST_CHURN_SHM=1 runs it\n", xt_config());
    return;
  }
  /* Not xport's to fix: libfabric 1.17's rxm over verbs answers a finished
   * rendezvous read on its connection's endpoint even when that connection
   * went with its dead client (rxm_rndv_send_rd_done: fi_send on the freed
   * msg_ep), and the server died of SIGSEGV inside xport_poll (seed
   * 362175575); xport(7), Providers. */
  if (!strcmp(xt_transport(), "verbs;ofi_rxm") && !getenv("XPORT_TEST_CHURN_VERBS_RXM")) {
    printf("SKIP: churn_server_keeps_serving on %s: libfabric 1.17's rxm over verbs crashes the "
           "server when a client dies mid-rendezvous (rxm_rndv_send_rd_done sends on the freed "
           "connection); XPORT_TEST_CHURN_VERBS_RXM=1 runs it\n", xt_config());
    return;
  }
  int secs = ch_env("XPORT_TEST_CHURN_SECONDS", 10), conc = ch_env("XPORT_TEST_CHURN_CLIENTS", 4);
  uint64_t seed = getenv("XPORT_TEST_CHURN_SEED")
                      ? strtoull(getenv("XPORT_TEST_CHURN_SEED"), NULL, 0)
                      : rnd64() % 1000000000;
  int kinds[CH_KINDS], nkinds = 0;
  for (int k = 0; k < CH_KINDS; k++)
    if (ch_kind_applies(k))
      kinds[nkinds++] = k;
  printf("churn on %s: seed %llu (XPORT_TEST_CHURN_SEED), %d s, %d clients at once, %d kinds "
         "of stranger\n",
         xt_config(), (unsigned long long)seed, secs, conc, nkinds);
  struct ch_run *R = calloc(1, sizeof *R);
  XT_CHECK(R, "calloc");
  R->r = seed;
  XT_CHECK(pipe2(R->up, O_NONBLOCK) == 0, "pipe");
  char addr[128];
  struct xt_steps st;
  xt_steps_open(&st);
  /* A stranger that finished a handshake without saying which node it
   * runs on is known gone only by its silence, after
   * XPORT_KEEPALIVE_TIMEOUT (30 s by default): shorter here, so that the
   * settle is. */
  setenv("XPORT_KEEPALIVE_TIMEOUT", "4000", 1);
  R->srv = xt_spawn_server(churn_server, &st, addr, sizeof addr);
  R->srv_status = -1;
  unsetenv("XPORT_KEEPALIVE_TIMEOUT");
  R->addr = addr;
  long t0 = now_ms(), t_warm = 0, t_churn = 0;
  /* The warm-up: the same mix for a while, then the level to come back to. */
  ch_churn(R, 3000, conc, kinds, nkinds);
  if (!R->failed && ch_reap(R)) {
    R->failed++;
    snprintf(R->why, sizeof R->why, "processes of the warm-up still running");
  }
  if (!R->failed) {
    /* Not xt_step_get, which would end the test with the processes
     * running: a server that never answers fails the run below. */
    struct pollfd p = {.fd = st.s2c[0], .events = POLLIN};
    char b = 0;
    xt_step_put(st.c2s[1], 'B');
    if (poll(&p, 1, 6 * T_MS) != 1 || read(st.s2c[0], &b, 1) != 1 || b != 'b')
      R->failed++;
  }
  int warm = R->clients;
  t_warm = now_ms() - t0;
  if (!R->failed)
    ch_churn(R, 1000L * secs, conc, kinds, nkinds);
  int left = ch_reap(R);
  t_churn = now_ms() - t0 - t_warm;
  ch_stop_all(R);
  struct ch_stats ss = {0};
  int got = 0;
  if (!R->failed && !left && R->srv_status < 0) {
    xt_step_put(st.c2s[1], 'E');
    struct pollfd p = {.fd = st.s2c[0], .events = POLLIN};
    got = poll(&p, 1, 6 * T_MS) == 1 && read(st.s2c[0], &ss, sizeof ss) == (ssize_t)sizeof ss;
  }
  /* A server that failed has ended by itself; one that did not answer is
   * stopped here. */
  int sst = R->srv_status, stopped = 0;
  if (sst < 0 && !got) {
    kill(R->srv, SIGKILL);
    stopped = 1;
  }
  if (sst < 0)
    sst = xt_reap(R->srv);
  xt_steps_close(&st);
  close(R->up[0]);
  close(R->up[1]);
  printf("churn on %s: %d clients (%d in the warm-up), %d killed, %d finished; %d strangers; "
         "%ld ms warm-up, %ld ms churn, %ld ms settle\n",
         xt_config(), R->clients, warm, R->killed, R->survived, R->strangers, t_warm, t_churn,
         now_ms() - t0 - t_warm - t_churn);
  if (got)
    printf("churn on %s: server: %ld accepted, %ld finished, %ld dropped, %llu bytes compared; "
           "descriptors %ld -> %ld, heap %zu -> %zu; %ld connections' buffers (%zu bytes) still "
           "xport's\n",
           xt_config(), ss.accepted, ss.finished, ss.dropped, (unsigned long long)ss.verified,
           ss.fds0, ss.fds1, ss.heap0, ss.heap1, ss.held, ss.held_bytes);
  XT_CHECK(stopped || sst == 0, "seed %llu: the server ended with %d (its check, if it "
           "failed one, is above)", (unsigned long long)seed, sst);
  XT_CHECK(!R->failed, "seed %llu: %s", (unsigned long long)seed,
           R->why[0] ? R->why : "the server took no baseline");
  XT_CHECK(!left, "seed %llu: %d processes still running after the churn", (unsigned long long)seed,
           left);
  XT_CHECK(got, "seed %llu: the server never reported after the churn", (unsigned long long)seed);
  /* Every client that was not killed finished, and the server saw it
   * finish; a client killed after its goodbye counts as either. */
  XT_CHECK(ss.finished >= R->survived && ss.finished <= R->survived + R->killed,
           "seed %llu: %ld clients finished at the server, %d at their end (%d killed)",
           (unsigned long long)seed, ss.finished, R->survived, R->killed);
  XT_CHECK(R->survived > 0 && R->clients >= 2 * conc, "seed %llu: only %d clients finished",
           (unsigned long long)seed, R->survived);
  free(R);
}
END_TEST

/* ---- a killed client's descriptors -------------------------------------- */

#define RV_LEN (1u << 20) /* past rxm's eager size: a rendezvous the client never takes */

/* Serves one client that leaves in order, then one that is killed while
 * a large send to it is under way; once the server has closed that
 * connection, its descriptors are back where the first one left them. */
static void rendezvous_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn;
  xport_completion_t c;
  /* Static: the provider may hold it past this function (see the end). */
  static unsigned char big[RV_LEN];
  xt_fill(big, RV_LEN, 3);
  XT_OK(xport_accept(lst, T_MS, &conn));
  say(ctx, conn, "hi");
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  XT_OK(xport_conn_close(conn));
  for (long end = now_ms() + 1000; now_ms() < end;)
    xt_stash_one(ctx, 10);
  long fds0 = ch_fds();
  xt_step_put(st->s2c[1], 'W');
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_OK(xport_send(conn, big, RV_LEN, NULL, big));
  xt_step_put(st->s2c[1], 'S'); /* the test kills the client now */
  do
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "the killed client's connection never ended");
  while (c.op != XPORT_OP_DISCONNECT);
  XT_OK(xport_conn_close(conn));
  /* Its descriptors go within a few peer checks; the send may stay the
   * provider's (xport(7)), and its completion, if it comes, is no matter. */
  long fds = ch_fds();
  for (long end = now_ms() + 2 * T_MS; fds > fds0 && now_ms() < end; fds = ch_fds())
    xt_stash_one(ctx, 10);
  char fdl[4096];
  ch_fd_list(fdl, sizeof fdl);
  XT_CHECK(fds <= fds0, "the server holds %ld descriptors after the killed client, %ld before "
           "it:%s", fds, fds0, fdl);
  /* The send's buffer stays: the provider may hold it until the listener
   * closes, which the harness does after we return. */
}

/* A client that connects and then waits, taking nothing, to be killed. */
static void doomed_client(const char *addr, struct xt_steps *st, int leave)
{
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  if (leave) {
    hear(ctx, conn, "hi");
    XT_OK(xport_conn_close(conn));
    xport_ctx_destroy(ctx);
    exit(0);
  }
  (void)st;
  for (;;)
    xport_wait(ctx, 100); /* killed here */
}

START_TEST(killed_client_leaves_no_descriptor)
{
  char addr[128];
  struct xt_steps st;
  xt_steps_open(&st);
  pid_t srv = xt_spawn_server(rendezvous_server, &st, addr, sizeof addr);
  pid_t w = xt_fork();
  if (w == 0)
    doomed_client(addr, &st, 1);
  XT_CHECK(xt_reap(w) == 0, "the first client failed");
  XT_CHECK(xt_step_get(st.s2c[0], 3 * T_MS) == 'W', "protocol");
  pid_t d = xt_fork();
  if (d == 0)
    doomed_client(addr, &st, 0);
  char step = xt_step_get(st.s2c[0], 3 * T_MS);
  kill(d, SIGKILL);
  xt_reap(d);
  xt_shm_remove_of(d);
  XT_CHECK(step == 'S', "protocol");
  XT_CHECK(xt_reap(srv) == 0, "server failed on %s (its check is above)", xt_config());
  xt_steps_close(&st);
}
END_TEST


static Suite *make_suite(void)
{
  Suite *s = suite_create("stranger");
  TCase *st = tcase_create("Strangers");
  tcase_set_timeout(st, 180);
  tcase_add_test(st, stranger_injects_data);
  tcase_add_test(st, stranger_forges_control);
  tcase_add_test(st, stranger_short_control);
  tcase_add_test(st, stranger_long_control);
  tcase_add_test(st, stranger_spoofs_requests);
  tcase_add_test(st, stranger_aliases_client_name);
  tcase_add_test(st, stranger_floods_requests);
  tcase_add_test(st, stranger_floods_unused_tags);
  tcase_add_test(st, stranger_under_live_tag);
  tcase_add_test(st, closed_connections_drain);
  suite_add_tcase(s, st);

  TCase *other = tcase_create("OtherUsers");
  tcase_set_timeout(other, 120);
  tcase_add_unchecked_fixture(other, planted_setup, planted_teardown);
  tcase_add_test(other, other_users_links_refused);
  tcase_add_test(other, other_users_files_squat_name);
  suite_add_tcase(s, other);

  TCase *lim = tcase_create("Limits");
  tcase_set_timeout(lim, 120);
  tcase_add_test(lim, backlog_refuses_and_close_refuses_pending);
  tcase_add_test(lim, accept_answer_failed_takes_the_retry);
  tcase_add_test(lim, eager_size_small_or_malformed);
  suite_add_tcase(s, lim);

  TCase *lis = tcase_create("Listeners");
  tcase_set_timeout(lis, 240);
  tcase_add_test(lis, greeters_never_open_channel);
  tcase_add_test(lis, greeters_announce_data_and_lie);
  tcase_add_test(lis, halfopen_sockets_expire);
  tcase_add_test(lis, garbage_connections_flood);
  suite_add_tcase(s, lis);

  TCase *auth = tcase_create("Auth");
  tcase_set_timeout(auth, 120);
  tcase_add_test(auth, replayed_handshake_refused);
  tcase_add_test(auth, replayed_msg_handshake_refused);
  suite_add_tcase(s, auth);
  TCase *churn = tcase_create("Churn");
  /* The churn, a warm-up, the clients' bounded waits and the settle. */
  tcase_set_timeout(churn, 300 + 2 * ch_env("XPORT_TEST_CHURN_SECONDS", 10));
  tcase_add_test(churn, churn_server_keeps_serving);
  suite_add_tcase(s, churn);

  TCase *killed = tcase_create("Killed");
  tcase_set_timeout(killed, 240);
  tcase_add_test(killed, killed_client_leaves_no_descriptor);
  suite_add_tcase(s, killed);
  return s;
}

int main(void)
{
  return xt_main("check_stranger", make_suite, 1);
}
