#define _GNU_SOURCE /* setns */
#include "harness.h"
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <arpa/inet.h>
#include <sys/stat.h>

#include <poll.h>
#include <rdma/fabric.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int xt_in_child;
static const char *config = "none";

const char *xt_config(void) { return config; }

/* Verbs needs an address with an RDMA device behind it (the QEMU guest
 * sets XPORT_TEST_HOST); everything else listens on the loopback. */
static int in_node_b; /* a server forked onto the other node (two_nodes configs) */
static int two_nodes_now;

const char *xt_host(void)
{
  const char *h = getenv("XPORT_TEST_HOST");
  if (two_nodes_now)
    return in_node_b ? "10.96.0.2" : "10.96.0.1";
  return h && *h ? h : "127.0.0.1";
}

const char *xt_listen_addr(void)
{
  static char addr[128];
  snprintf(addr, sizeof addr, "%s:0", xt_host());
  return addr;
}

struct xt_cfg {
  const char *label;
  const char *provider; /* XPORT_PROVIDER */
  int strict;
  /* XPORT_SHM: what reaches this node's peers beside the fabric. NULL:
   * nothing (off), the fabric carries everything; "auto" (the default):
   * xport's own shared memory; "libfabric": libfabric's shm. The test's
   * peers (this node) are reached over it. */
  const char *beside;
  /* Servers run on another node: a network namespace joined to the test
   * process's by a veth pair (both made here), so that the fabric carries
   * their connections though shared memory is beside it. */
  int two_nodes;
};

/* Every configuration xport targets; absent ones are skipped with why.
 * xshm+: the default (XPORT_SHM=auto); shm+: libfabric's shm beside. */
static const struct xt_cfg cfgs[] = {
  {"tcp", "tcp", 0, NULL, 0},
  {"tcp-strict", "tcp", 1, NULL, 0},
  {"tcp;ofi_rxm", "tcp;ofi_rxm", 0, NULL, 0},
  {"shm", "shm", 0, NULL, 0},
  {"xshm", "xshm", 0, NULL, 0},
  {"verbs", "verbs", 0, NULL, 0},
  {"verbs;ofi_rxm", "verbs;ofi_rxm", 0, NULL, 0},
  {"xshm+tcp", "tcp", 0, "auto", 0},
  {"shm+tcp;ofi_rxm", "tcp;ofi_rxm", 0, "libfabric", 0},
  {"xshm+verbs", "verbs", 0, "auto", 0},
  {"shm+verbs", "verbs", 0, "libfabric", 0},
  {"xshm+tcp@2nodes", "tcp", 0, "auto", 1},
};

static const struct xt_cfg *current;

const char *xt_transport(void)
{
  return current && current->beside && !current->two_nodes
             ? (strcmp(current->beside, "libfabric") ? "xshm" : "shm")
         : current                                           ? current->provider
                                                             : "";
}

/* ---- two nodes: namespaces joined by a veth pair ------------------------- */

static char ns_a[32], ns_b[32];
static int ns_orig = -1, ns_b_fd = -1;

static int ns_enter(int fd) { return fd >= 0 && setns(fd, CLONE_NEWNET) == 0 ? 0 : -1; }

static void two_nodes_end(void)
{
  char cmd[160];
  if (ns_orig >= 0) {
    ns_enter(ns_orig);
    close(ns_orig);
  }
  if (ns_b_fd >= 0)
    close(ns_b_fd);
  ns_orig = ns_b_fd = -1;
  two_nodes_now = 0;
  snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a,
           ns_b);
  if (ns_a[0] && system(cmd)) {
  }
  ns_a[0] = ns_b[0] = '\0';
}

/* Makes the two nodes and moves this process onto the first; 0, or -1
 * with why. */
static int two_nodes_begin(char *why, size_t len)
{
  char cmd[1024], path[64];
  snprintf(ns_a, sizeof ns_a, "xtA%d", (int)getpid());
  snprintf(ns_b, sizeof ns_b, "xtB%d", (int)getpid());
  if (geteuid() != 0) {
    snprintf(why, len, "another node needs root (network namespaces)");
    ns_a[0] = ns_b[0] = '\0';
    return -1;
  }
  snprintf(cmd, sizeof cmd,
           "ip netns add %s && ip netns add %s && ip link add v%s type veth peer name v%s && "
           "ip link set v%s netns %s && ip link set v%s netns %s && "
           "ip -n %s addr add 10.96.0.1/24 dev v%s && ip -n %s addr add 10.96.0.2/24 dev v%s && "
           "ip -n %s link set lo up && ip -n %s link set lo up && "
           "ip -n %s link set v%s up && ip -n %s link set v%s up",
           ns_a, ns_b, ns_a, ns_b, ns_a, ns_a, ns_b, ns_b, ns_a, ns_a, ns_b, ns_b, ns_a, ns_b, ns_a,
           ns_a, ns_b, ns_b);
  if (system(cmd)) {
    snprintf(why, len, "cannot make two network namespaces joined by a veth pair (ip netns)");
    two_nodes_end();
    return -1;
  }
  ns_orig = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  snprintf(path, sizeof path, "/run/netns/%s", ns_b);
  ns_b_fd = open(path, O_RDONLY | O_CLOEXEC);
  snprintf(path, sizeof path, "/run/netns/%s", ns_a);
  int a = open(path, O_RDONLY | O_CLOEXEC);
  int rc = ns_orig < 0 || ns_b_fd < 0 || ns_enter(a);
  if (a >= 0)
    close(a);
  if (rc) {
    snprintf(why, len, "cannot enter the namespace %s", ns_a);
    two_nodes_end();
    return -1;
  }
  two_nodes_now = 1;
  return 0;
}

static int wanted(const char *label)
{
  const char *only = getenv("XPORT_TEST_CONFIGS");
  if (!only || !*only)
    return 1;
  size_t n = strlen(label);
  for (const char *p = only; *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, label, n))
      return 1;
    if (!e)
      break;
    p = e + 1;
  }
  return 0;
}

/* Whether libfabric itself offers the provider: 0 no, 1 only with
 * FI_EP_RDM endpoints, 2 with FI_EP_MSG ones. */
static int libfabric_has(const char *prov)
{
  struct fi_info *hints = fi_allocinfo(), *list = NULL;
  int has = 0;
  hints->fabric_attr->prov_name = strdup(prov);
  if (fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &list) == 0)
    for (struct fi_info *fi = list; fi; fi = fi->next)
      has = fi->ep_attr->type == FI_EP_MSG ? 2 : has ? has : 1;
  fi_freeinfo(hints);
  fi_freeinfo(list);
  return has;
}

/* What the last probe's context said of itself. */
static xport_caps_t probed;

const xport_caps_t *xt_caps(void) { return &probed; }

/* Probes a configuration in a child, so the runner's process never holds
 * libfabric state across the forks that Check makes. */
static int available(const struct xt_cfg *c, char *why, size_t len)
{
  int p[2];
  if (pipe(p))
    return 0;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    xport_ctx_attr_t a = {.provider = c->provider, .strict = c->strict ? XPORT_ON : XPORT_OFF};
    xport_ctx_t *ctx = NULL;
    /* Warnings go to a file: the last one explains a failed listen. */
    FILE *log = tmpfile();
    setenv("XPORT_LOG", log ? "warn" : "none", 1);
    if (log)
      dup2(fileno(log), 2);
    int rc = xport_ctx_create(&a, &ctx);
    xport_ctx_t *sctx = NULL;
    if (rc == 0 && c->beside) {
      /* Both transports must be there, and the test's connections take
       * the node's one: its capabilities are what they see. */
      int fi_shm = !strcmp(c->beside, "libfabric");
      xport_ctx_attr_t sa = {.provider = fi_shm ? "shm" : "xshm", .strict = a.strict};
      const xport_candidate_t *cands;
      int nc = xport_ctx_candidates(ctx, &cands), beside = 0;
      for (int k = 0; k < nc; k++)
        beside += !strcmp(cands[k].provider, sa.provider) &&
                  cands[k].verdict == XPORT_VERDICT_CHOSEN;
      if (xport_ctx_create(&sa, &sctx) == 0 && beside)
        ;
      else {
        xport_ctx_destroy(ctx);
        xport_ctx_destroy(sctx);
        ctx = NULL, sctx = NULL;
        rc = -XPORT_ENOPROV;
      }
    }
    char msg[700], warn[480] = "";
    xport_listener_t *lst;
    /* Usable means a listener opens too, on the address tests use. */
    if (rc == 0 && (rc = xport_listen(ctx, xt_listen_addr(), &lst)) == 0)
      xport_listener_close(lst);
    if (log && ctx && rc) {
      char line[480];
      rewind(log);
      while (fgets(line, sizeof line, log))
        if (!strncmp(line, "xport: warn: ", 13))
          snprintf(warn, sizeof warn, " (%.*s)", (int)strcspn(line + 13, "\n"), line + 13);
    }
    if (rc == 0)
      snprintf(msg, sizeof msg, "ok");
    else if (ctx)
      snprintf(msg, sizeof msg, "%s opens, but xport_listen on %s fails: %s%s", c->provider,
               xt_listen_addr(), xport_strerror(rc), warn);
    else if (!libfabric_has(c->provider))
      snprintf(msg, sizeof msg, "libfabric on this machine has no %s provider", c->provider);
    else if (libfabric_has(c->provider) == 1)
      snprintf(msg, sizeof msg, "%s offers FI_EP_RDM endpoints, but xport_ctx_create says: %s",
               c->provider, xport_strerror(rc));
    else
      snprintf(msg, sizeof msg, "%s is present, but xport_ctx_create says: %s", c->provider,
               xport_strerror(rc));
    xport_caps_t caps;
    memset(&caps, 0, sizeof caps);
    if (rc == 0)
      xport_ctx_query(sctx ? sctx : ctx, &caps);
    xport_ctx_destroy(sctx);
    if (write(p[1], &caps, sizeof caps) != (ssize_t)sizeof caps ||
        write(p[1], msg, strlen(msg) + 1) < 0)
      _exit(2);
    xport_ctx_destroy(ctx);
    _exit(rc == 0 ? 0 : 1);
  }
  close(p[1]);
  char buf[700] = "";
  xport_caps_t caps;
  ssize_t n = read(p[0], &caps, sizeof caps);
  if (n == (ssize_t)sizeof caps)
    probed = caps;
  n = n == (ssize_t)sizeof caps ? read(p[0], buf, sizeof buf - 1) : -1;
  close(p[0]);
  int st = xt_reap(pid);
  snprintf(why, len, "%s", n > 0 ? buf : "probe process failed");
  return st == 0;
}

static int run_suite(const char *prog, Suite *(*make)(void), const char *label)
{
  config = label;
  SRunner *sr = srunner_create(make());
  srunner_set_fork_status(sr, CK_FORK);
  printf("=== %s on %s ===\n", prog, label);
  fflush(stdout);
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  printf("%s on %s: %d passed, %d failed\n", prog, label, srunner_ntests_run(sr) - failed,
         failed);
  srunner_free(sr);
  return failed;
}

/* As root, this run gets a /dev/shm of its own (a mount namespace of
 * its own, and a tmpfs there): the endpoint files of processes its tests
 * kill, which libfabric's shm must keep for an hour where a live peer may
 * yet map them (providers/shm.c), go with the run, and two suites side
 * by side (make -j2 check) never see each other's. Elsewhere the files
 * stay in the machine's /dev/shm, where the context each configuration
 * opens last sweeps what it may. */
static void private_dev_shm(void)
{
  if (geteuid() != 0 || unshare(CLONE_NEWNS))
    return;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
      mount("none", "/dev/shm", "tmpfs", 0, "mode=1777"))
    fprintf(stderr, "%s: no /dev/shm of its own (mount): %s\n", "harness", strerror(errno));
}

int xt_main(const char *prog, Suite *(*make)(void), int network)
{
  int failed = 0, ran = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!network)
    return run_suite(prog, make, "no provider") ? 1 : 0;
  private_dev_shm();
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    const struct xt_cfg *c = &cfgs[i];
    char why[700];
    if (!wanted(c->label)) {
      printf("SKIP: %s on %s: not in XPORT_TEST_CONFIGS\n", prog, c->label);
      continue;
    }
    setenv("XPORT_SHM", c->beside ? c->beside : "off", 1);
    current = c;
    if (c->two_nodes && two_nodes_begin(why, sizeof why)) {
      printf("SKIP: %s on %s: %s\n", prog, c->label, why);
      continue;
    }
    if (!available(c, why, sizeof why)) {
      printf("SKIP: %s on %s: %s\n", prog, c->label, why);
      if (c->two_nodes)
        two_nodes_end();
      continue;
    }
    setenv("XPORT_PROVIDER", c->provider, 1);
    setenv("XPORT_STRICT", c->strict ? "1" : "0", 1);
    failed += run_suite(prog, make, c->label);
    ran++;
    /* Tests kill processes; a context opened once more removes the
     * endpoint files they left (where the provider leaves any). */
    available(c, why, sizeof why);
    if (c->two_nodes)
      two_nodes_end();
  }
  if (!ran) {
    printf("SKIP: %s: no provider configuration available\n", prog);
    return 77;
  }
  return failed ? 1 : 0;
}

void xt_shm_name(const char *port, char *buf, size_t len)
{
  struct stat ns;
  struct in_addr a;
  XT_CHECK(stat("/proc/self/ns/net", &ns) == 0, "stat /proc/self/ns/net");
  XT_CHECK(inet_pton(AF_INET, xt_host(), &a) == 1, "host %s", xt_host());
  const uint8_t *b = (const uint8_t *)&a;
  snprintf(buf, len, "xport-%s.net%llu.a%02x%02x%02x%02x", port, (unsigned long long)ns.st_ino,
           b[0], b[1], b[2], b[3]);
}

int xt_mixed(void) { return current && current->beside; }

void xt_key_reseal(uint8_t *k, size_t len)
{
  uint32_t h = 2166136261u; /* FNV-1a over all but the checksum */
  for (size_t i = 0; i < len - 4; i++)
    h = (h ^ k[i]) * 16777619u;
  for (int i = 0; i < 4; i++)
    k[len - 4 + i] = (uint8_t)(h >> (8 * i));
}

size_t xt_key_part(xport_conn_t *conn, uint8_t *raw, size_t len)
{
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  for (size_t off = 0; off + 56 <= len;) {
    size_t total = (size_t)raw[off + 8] | (size_t)raw[off + 9] << 8;
    XT_CHECK(total >= 60 && total <= len - off, "packed key: a part of %zu bytes at %zu", total, off);
    if (!strncmp((const char *)raw + off + 40, caps.provider, 16)) {
      memmove(raw, raw + off, total);
      return total;
    }
    off += total;
  }
  XT_CHECK(0, "packed key: no part for %s", caps.provider);
  return 0;
}

void xt_check_transport(xport_conn_t *conn)
{
  xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  XT_CHECK(!strcmp(caps.provider, xt_transport()), "on %s the connection runs over %s, not %s",
           xt_config(), caps.provider, xt_transport());
}

/* Set once this process has opened a context: it may fork no more. */
static int opened;

xport_ctx_t *xt_ctx_with(const xport_ctx_attr_t *attr)
{
  opened = 1;
  xport_ctx_t *ctx = NULL;
  int rc = xport_ctx_create(attr, &ctx);
  XT_CHECK(rc == 0, "xport_ctx_create on %s: %s", config, xport_strerror(rc));
  return ctx;
}

xport_ctx_t *xt_ctx(void) { return xt_ctx_with(NULL); }

pid_t xt_fork(void)
{
  /* A child of a process that opened a context inherits what the RDMA
   * libraries open once per process (librdmacm's devices): with verbs its
   * own context then fails in ways of its own (sends refused with EAGAIN,
   * connections that never come up, seen in the Soft-RoCE guest).
   * xport(7), FORK. */
  XT_CHECK(!opened, "a fork after this process opened a context (xport(7), FORK): fork "
           "every peer first");
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  XT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    xt_in_child = 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* A parent gone before the prctl sends no signal: nothing else ends a
     * child waiting on a peer that will never come. */
    if (getppid() != parent)
      _exit(1);
  }
  return pid;
}

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int xt_next(xport_ctx_t *ctx, xport_completion_t *c, int timeout_ms)
{
  long deadline = now_ms() + timeout_ms;
  for (;;) {
    int n = xport_poll(ctx, c, 1);
    /* Every suite's failed completions: nothing transferred (xport_poll(3)). */
    XT_CHECK(n != 1 || !c->status || c->status == -XPORT_ETRUNC || c->len == 0,
             "op %d failed (%s) with len %zu, not 0", c->op, xport_strerror(c->status), c->len);
    if (n == 1)
      return 0;
    XT_CHECK(n == 0, "xport_poll: %s", xport_strerror(n));
    long left = deadline - now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    int w = xport_wait(ctx, left > 50 ? 50 : (int)left);
    XT_CHECK(w == 0 || w == -XPORT_ETIMEDOUT, "xport_wait: %s", xport_strerror(w));
  }
}

void xt_fill(void *buf, size_t len, unsigned seed)
{
  unsigned char *b = buf;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 1664525u + 1013904223u;
    b[i] = (unsigned char)(x >> 24);
  }
}

size_t xt_verify(const void *buf, size_t len, unsigned seed)
{
  const unsigned char *b = buf;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 1664525u + 1013904223u;
    if (b[i] != (unsigned char)(x >> 24))
      return i;
  }
  return len;
}

int xt_reap(pid_t pid)
{
  int st = 0;
  if (waitpid(pid, &st, 0) < 0)
    return 255;
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

pid_t xt_spawn_server(xt_listen_fn fn, void *arg, char *addr, size_t len)
{
  return xt_spawn_server_on(xt_listen_addr(), fn, arg, addr, len);
}

pid_t xt_spawn_server_on(const char *listen_addr, xt_listen_fn fn, void *arg, char *addr,
                         size_t len)
{
  int p[2];
  XT_CHECK(pipe(p) == 0, "pipe");
  pid_t pid = xt_fork();
  if (pid == 0) {
    close(p[0]);
    if (two_nodes_now) {
      /* The server's node is the other one, and so is its address. */
      int same = !strcmp(listen_addr, xt_listen_addr());
      XT_CHECK(ns_enter(ns_b_fd) == 0, "setns to the other node");
      in_node_b = 1;
      if (same)
        listen_addr = xt_listen_addr();
    }
    xport_ctx_t *ctx = xt_ctx();
    xport_listener_t *lst;
    char a[128];
    XT_OK(xport_listen(ctx, listen_addr, &lst));
    XT_OK(xport_listener_addr(lst, a, sizeof a));
    XT_CHECK(write(p[1], a, strlen(a) + 1) > 0, "write");
    close(p[1]);
    fn(ctx, lst, arg);
    xport_listener_close(lst);
    xport_ctx_destroy(ctx);
    exit(0); /* not _exit: let LeakSanitizer check the server too */
  }
  close(p[1]);
  struct pollfd pf = {.fd = p[0], .events = POLLIN};
  XT_CHECK(poll(&pf, 1, XT_SETUP_MS) == 1, "server did not start");
  ssize_t n = read(p[0], addr, len - 1);
  close(p[0]);
  XT_CHECK(n > 0, "server failed before listening");
  addr[n] = '\0';
  return pid;
}

struct pair_arg {
  xt_side_fn server;
  void *arg;
};

static void pair_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct pair_arg *pa = arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, XT_SETUP_MS, &conn));
  xt_check_transport(conn);
  if (pa->server(ctx, conn, pa->arg) != XT_CLOSED)
    XT_OK(xport_conn_close(conn));
}

pid_t xt_spawn_pair_server(xt_side_fn server, void *arg, char *addr, size_t len)
{
  struct pair_arg pa = {server, arg};
  return xt_spawn_server(pair_server, &pa, addr, len);
}

void xt_pair(xt_side_fn server, xt_side_fn client, void *arg)
{
  char addr[128];
  pid_t pid = xt_spawn_pair_server(server, arg, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, XT_SETUP_MS, &conn));
  xt_check_transport(conn);
  if (client(ctx, conn, arg) != XT_CLOSED)
    XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
  int st = xt_reap(pid);
  XT_CHECK(st == 0, "server process on %s exited with %d", config, st);
}

#define XT_STASH 64
static xport_completion_t xt_stash[XT_STASH];
static int xt_nstash;

xport_completion_t xt_wait_op(xport_ctx_t *ctx, xport_op_t op, int timeout_ms)
{
  xport_completion_t c;
  for (int i = 0; i < xt_nstash; i++)
    if (xt_stash[i].op == op) {
      c = xt_stash[i];
      memmove(&xt_stash[i], &xt_stash[i + 1], (size_t)(xt_nstash - i - 1) * sizeof c);
      xt_nstash--;
      return c;
    }
  for (;;) {
    XT_CHECK(xt_next(ctx, &c, timeout_ms) == 0, "no completion of op %d within %d ms on %s",
             op, timeout_ms, xt_config());
    if (c.op == op)
      return c;
    XT_CHECK(xt_nstash < XT_STASH, "too many unexpected completions");
    xt_stash[xt_nstash++] = c;
  }
}

void xt_stash_one(xport_ctx_t *ctx, int timeout_ms)
{
  xport_completion_t c;
  if (xt_next(ctx, &c, timeout_ms) == 0) {
    XT_CHECK(xt_nstash < XT_STASH, "too many unexpected completions");
    xt_stash[xt_nstash++] = c;
  }
}

void xt_steps_open(struct xt_steps *st)
{
  XT_CHECK(pipe(st->c2s) == 0 && pipe(st->s2c) == 0, "pipe");
}

void xt_steps_close(struct xt_steps *st)
{
  close(st->c2s[0]);
  close(st->c2s[1]);
  close(st->s2c[0]);
  close(st->s2c[1]);
}

void xt_step_put(int fd, char what)
{
  XT_CHECK(write(fd, &what, 1) == 1, "pipe write: %s", strerror(errno));
}

char xt_step_get(int fd, int timeout_ms)
{
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char what = 0;
  XT_CHECK(poll(&p, 1, timeout_ms) == 1, "the other process never took its step");
  XT_CHECK(read(fd, &what, 1) == 1, "pipe read");
  return what;
}

void xt_shm_remove_of(pid_t pid)
{
  char prefix[64];
  snprintf(prefix, sizeof prefix, "xport-%ld-", (long)pid);
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  if (!d)
    return;
  while ((e = readdir(d))) {
    char path[512];
    if (strncmp(e->d_name, prefix, strlen(prefix)))
      continue;
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    unlink(path);
  }
  closedir(d);
}
