/* Several transports in one context (XPORT_SHM): shm for peers of this
 * node, the fabric for the others, one listener and one key blob for
 * both. "Another node" is a network namespace this test makes, joined to
 * the server's by a veth pair; every process that connects runs inside
 * one of the two (nothing connects from the machine's own namespace).
 * Runs on the configurations with shm beside a fabric; the others skip. */
#define _GNU_SOURCE /* setns, unshare */
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <poll.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 20000
#define SLOT 4096
#define NCLIENT 2

static int skip_unless_mixed(const char *test)
{
  if (xt_mixed() && (!strcmp(xt_transport(), "shm") || !strcmp(xt_transport(), "xshm")))
    return 0;
  printf("SKIP: %s on %s: %s\n", test, xt_config(),
         xt_mixed() ? "its peers are on another node already (it makes its own nodes)"
                    : "one transport here (the shm+ configurations have two)");
  return 1;
}

static const char *transport_of(xport_conn_t *conn)
{
  static __thread xport_caps_t caps;
  XT_OK(xport_conn_query(conn, &caps));
  return caps.provider;
}

/* ---- two namespaces joined by a veth pair -------------------------------- */

struct nodes {
  char a[32], b[32];   /* namespace names: the server's node, the other one */
  char host_a[32];     /* the server's address, in a */
  int ok;
};

static int sh(const char *fmt, const char *x, const char *y)
{
  char cmd[512];
  snprintf(cmd, sizeof cmd, fmt, x, y, x, y, x, y);
  return system(cmd);
}

/* Makes the two nodes, or says why not (root and ip netns needed). */
static int nodes_make(struct nodes *n, const char *test)
{
  memset(n, 0, sizeof *n);
  if (getenv("XPORT_TEST_HOST") && *getenv("XPORT_TEST_HOST")) {
    /* verbs: the fabric listens only where an RDMA device is, and the
     * namespaces made here have none. */
    printf("SKIP: %s on %s: the fabric needs a device on %s; these namespaces have none\n",
           test, xt_config(), getenv("XPORT_TEST_HOST"));
    return -1;
  }
  snprintf(n->a, sizeof n->a, "xmA%d", (int)getpid());
  snprintf(n->b, sizeof n->b, "xmB%d", (int)getpid());
  snprintf(n->host_a, sizeof n->host_a, "10.97.0.1");
  if (geteuid() != 0 || sh("ip netns add %s 2>/dev/null && ip netns add %s", n->a, n->b)) {
    printf("SKIP: %s on %s: another node needs root and ip netns (iproute2)\n", test,
           xt_config());
    sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", n->a, n->b);
    return -1;
  }
  n->ok = 1;
  int rc = sh("ip link add v%s type veth peer name v%s", n->a, n->b) ||
           sh("ip link set v%s netns %s", n->a, n->a) || sh("ip link set v%s netns %s", n->b, n->b) ||
           sh("ip -n %s addr add 10.97.0.1/24 dev v%s", n->a, n->a) ||
           sh("ip -n %s addr add 10.97.0.2/24 dev v%s", n->b, n->b) ||
           sh("ip -n %s link set lo up && ip -n %s link set lo up", n->a, n->b) ||
           sh("ip -n %s link set v%s up", n->a, n->a) || sh("ip -n %s link set v%s up", n->b, n->b);
  XT_CHECK(rc == 0, "cannot join the namespaces %s and %s by a veth pair", n->a, n->b);
  return 0;
}

static void nodes_free(struct nodes *n)
{
  if (n->ok)
    sh("ip netns del %s; ip netns del %s", n->a, n->b);
}

/* Moves this (forked) process into namespace name. */
static void enter(const char *name)
{
  char path[128];
  snprintf(path, sizeof path, "/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  XT_CHECK(fd >= 0 && setns(fd, CLONE_NEWNET) == 0, "setns %s", name);
  close(fd);
}

/* ---- one server, a client on its node and one on the other --------------- */

/* Both clients at once: each takes the one key blob the server packed,
 * writes its pattern into its own slot of the server's region and reads
 * it back, sends a message; the server checks every byte of both slots
 * and which transport each client came over. */
struct mixed {
  struct xt_steps st[NCLIENT];
  int addr_pipe[2];
  const char *ns[NCLIENT];  /* namespace of each client */
  const char *want[NCLIENT]; /* transport each must take */
  char server_ns[32];
  char host[32];
  int shm_off_client;       /* the same-node client sets XPORT_SHM=off */
};

static void mixed_server(struct mixed *m)
{
  static uint8_t region[NCLIENT * SLOT];
  static uint8_t key[XPORT_RKEY_MAX_SIZE];
  char listen_at[64], addr[96];
  enter(m->server_ns);
  xport_ctx_t *ctx = xt_ctx();
  xport_listener_t *lst;
  xport_mr_t *mr;
  snprintf(listen_at, sizeof listen_at, "%s:0", m->host);
  XT_OK(xport_listen(ctx, listen_at, &lst));
  XT_OK(xport_listener_addr(lst, addr, sizeof addr));
  XT_OK(xport_mr_reg(ctx, region, sizeof region, XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ |
                                                    XPORT_ACCESS_REMOTE_WRITE, &mr));
  int klen = xport_rkey_pack(mr, 0, sizeof region, key, sizeof key);
  XT_CHECK(klen > 0, "pack: %s", xport_strerror(klen));
  XT_CHECK(write(m->addr_pipe[1], addr, strlen(addr) + 1) > 0, "write");
  xport_conn_t *conn[NCLIENT] = {0};
  uint32_t hello[NCLIENT];
  xport_completion_t c;
  /* Both connect now and hold their connection: accept both. */
  for (int i = 0; i < NCLIENT; i++)
    XT_OK(xport_accept(lst, T_MS, &conn[i]));
  for (int i = 0; i < NCLIENT; i++) {
    XT_OK(xport_recv(conn[i], &hello[i], sizeof hello[i], NULL, &hello[i]));
    XT_OK(xport_send(conn[i], key, (size_t)klen, NULL, NULL)); /* the same bytes to both */
  }
  int got = 0, sent = 0;
  while (got < NCLIENT || sent < NCLIENT) {
    XT_CHECK(xt_next(ctx, &c, T_MS) == 0, "server: %d hellos, %d keys out", got, sent);
    XT_CHECK(c.status == 0, "server: op %d: %s", c.op, xport_strerror(c.status));
    got += c.op == XPORT_OP_RECV;
    sent += c.op == XPORT_OP_SEND;
  }
  /* Each hello names its slot; the client's slot holds its pattern, and
   * it came over the transport its node calls for. */
  for (int i = 0; i < NCLIENT; i++) {
    uint32_t s = hello[i];
    XT_CHECK(s < NCLIENT, "hello %u", s);
    XT_CHECK(!strcmp(transport_of(conn[i]), m->want[s]), "client %u came over %s, not %s", s,
             transport_of(conn[i]), m->want[s]);
    size_t bad = xt_verify(region + s * SLOT, SLOT, 100 + s);
    XT_CHECK(bad == SLOT, "slot %u: byte %zu is not the client's", s, bad);
  }
  for (int i = 0; i < NCLIENT; i++)
    xt_step_put(m->st[hello[i]].s2c[1], 'B'); /* both checked: go */
  for (int i = 0; i < NCLIENT; i++)
    XT_CHECK(xt_step_get(m->st[i].c2s[0], T_MS) == 'E', "client %d did not end", i);
  for (int i = 0; i < NCLIENT; i++)
    xport_conn_close(conn[i]);
  xport_mr_dereg(mr);
  xport_listener_close(lst);
  xport_ctx_destroy(ctx);
  exit(0);
}

static void mixed_client(struct mixed *m, int slot, const char *addr)
{
  static uint8_t mem[SLOT], back[SLOT];
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  uint32_t hello = (uint32_t)slot;
  enter(m->ns[slot]);
  if (slot == 0 && m->shm_off_client)
    setenv("XPORT_SHM", "off", 1);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  xport_rkey_t *rk;
  xport_completion_t c;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_CHECK(!strcmp(transport_of(conn), m->want[slot]), "client %d over %s, not %s", slot,
           transport_of(conn), m->want[slot]);
  XT_OK(xport_recv(conn, key, sizeof key, NULL, key));
  c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "key: %s", xport_strerror(c.status));
  XT_OK(xport_rkey_unpack(conn, key, c.len, &rk));
  xt_fill(mem, SLOT, 100 + (unsigned)slot);
  XT_OK(xport_write(conn, mem, SLOT, NULL, rk, (size_t)slot * SLOT, mem));
  c = xt_wait_op(ctx, XPORT_OP_WRITE, T_MS);
  XT_CHECK(c.status == 0, "write over %s: %s", m->want[slot], xport_strerror(c.status));
  XT_OK(xport_read(conn, back, SLOT, NULL, rk, (size_t)slot * SLOT, back));
  c = xt_wait_op(ctx, XPORT_OP_READ, T_MS);
  XT_CHECK(c.status == 0, "read over %s: %s", m->want[slot], xport_strerror(c.status));
  XT_CHECK(!memcmp(mem, back, SLOT), "read back over %s differs", m->want[slot]);
  XT_OK(xport_send(conn, &hello, sizeof hello, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "hello: %s", xport_strerror(c.status));
  /* Hold the connection until the server has checked both. */
  XT_CHECK(xt_step_get(m->st[slot].s2c[0], T_MS) == 'B', "server did not check");
  xport_rkey_release(rk);
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  xt_step_put(m->st[slot].c2s[1], 'E');
  exit(0);
}

static void run_mixed(struct mixed *m)
{
  pid_t pid[1 + NCLIENT];
  char addr[96];
  for (int i = 0; i < NCLIENT; i++)
    xt_steps_open(&m->st[i]);
  XT_CHECK(pipe(m->addr_pipe) == 0, "pipe");
  pid[0] = xt_fork();
  if (pid[0] == 0)
    mixed_server(m);
  ssize_t n = read(m->addr_pipe[0], addr, sizeof addr - 1);
  XT_CHECK(n > 0, "the server did not listen");
  addr[n] = '\0';
  for (int i = 0; i < NCLIENT; i++) {
    pid[1 + i] = xt_fork();
    if (pid[1 + i] == 0)
      mixed_client(m, i, addr);
  }
  for (int i = 0; i <= NCLIENT; i++) {
    int st = xt_reap(pid[i]);
    XT_CHECK(st == 0, "%s %d exited with %d", i ? "client" : "server", i - 1, st);
  }
  for (int i = 0; i < NCLIENT; i++)
    xt_steps_close(&m->st[i]);
  close(m->addr_pipe[0]);
  close(m->addr_pipe[1]);
}

/* A client on the server's node comes over shm, one on the other node
 * over the fabric, at the same time, through one listener; the one key
 * blob the server packed serves both. */
START_TEST(one_server_both_nodes)
{
  if (skip_unless_mixed("one_server_both_nodes"))
    return;
  struct nodes n;
  if (nodes_make(&n, "one_server_both_nodes"))
    return;
  struct mixed m = {.ns = {n.a, n.b}, .want = {xt_transport(), getenv("XPORT_PROVIDER")}};
  snprintf(m.server_ns, sizeof m.server_ns, "%s", n.a);
  snprintf(m.host, sizeof m.host, "%s", n.host_a);
  run_mixed(&m);
  nodes_free(&n);
}
END_TEST

/* XPORT_SHM=off at the client: its same-node traffic really goes over the
 * fabric, to the same listener (the other client still over the fabric
 * from the other node). */
START_TEST(shm_off_uses_the_fabric)
{
  if (skip_unless_mixed("shm_off_uses_the_fabric"))
    return;
  struct nodes n;
  if (nodes_make(&n, "shm_off_uses_the_fabric"))
    return;
  const char *fab = getenv("XPORT_PROVIDER");
  struct mixed m = {.ns = {n.a, n.b}, .want = {fab, fab}, .shm_off_client = 1};
  snprintf(m.server_ns, sizeof m.server_ns, "%s", n.a);
  snprintf(m.host, sizeof m.host, "%s", n.host_a);
  run_mixed(&m);
  nodes_free(&n);
}
END_TEST

/* ---- same /dev/shm, same network namespace, another PID namespace -------- */

/* The client finds the listener's shm name, but a pid means nothing
 * across PID namespaces (shm copies by pid): the listener says "not this
 * way" in the handshake, and the connection goes over the fabric. */
static void pidns_client(const char *addr, int *res)
{
  XT_CHECK(unshare(CLONE_NEWPID) == 0, "unshare(CLONE_NEWPID)");
  pid_t pid = fork(); /* the child is pid 1 of the new namespace */
  XT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    xport_ctx_t *ctx = xt_ctx();
    xport_conn_t *conn;
    char buf[8];
    XT_OK(xport_connect(ctx, addr, T_MS, &conn));
    XT_CHECK(!strcmp(transport_of(conn), getenv("XPORT_PROVIDER")),
             "a client of another PID namespace came over %s", transport_of(conn));
    XT_OK(xport_send(conn, "pidns", 6, NULL, NULL));
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    XT_CHECK(c.status == 0 && c.len == 3 && !memcmp(buf, "ok", 3), "answer: %s",
             xport_strerror(c.status));
    xport_conn_close(conn);
    xport_ctx_destroy(ctx);
    /* Not exit(): LeakSanitizer cannot stop the world from pid 1 of a
     * PID namespace (a fatal error, exit status 1); the other processes
     * of the test are leak-checked. */
    _exit(0);
  }
  int st;
  XT_CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  *res = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void pidns_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  xport_conn_t *conn;
  char buf[8];
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_CHECK(strcmp(transport_of(conn), xt_transport()), "accepted another PID namespace over %s",
           xt_transport());
  XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0 && c.len == 6 && !memcmp(buf, "pidns", 6), "message: %s",
           xport_strerror(c.status));
  XT_OK(xport_send(conn, "ok", 3, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "answer: %s", xport_strerror(c.status));
  /* Until the client has it: its close ends the connection. */
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  xport_conn_close(conn);
}

START_TEST(other_pid_namespace_uses_the_fabric)
{
  if (skip_unless_mixed("other_pid_namespace_uses_the_fabric"))
    return;
  if (geteuid() != 0) {
    printf("SKIP: other_pid_namespace_uses_the_fabric on %s: a PID namespace needs root\n",
           xt_config());
    return;
  }
  char addr[128];
  pid_t srv = xt_spawn_server(pidns_server, NULL, addr, sizeof addr);
  pid_t cli = xt_fork();
  if (cli == 0) {
    int res = 1;
    pidns_client(addr, &res);
    _exit(res); /* its children are born in the new namespace: LeakSanitizer's too */
  }
  int st = xt_reap(cli);
  XT_CHECK(st == 0, "client exited with %d", st);
  st = xt_reap(srv);
  XT_CHECK(st == 0, "server exited with %d", st);
}
END_TEST

/* ---- one port, two addresses ---------------------------------------------- */

/* Two servers on one port of two addresses (TCP allows it): a client at
 * each address reaches the server there, over shm, never the other. */
static void named_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  const char *me = arg;
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_CHECK(!strcmp(transport_of(conn), xt_transport()), "server %s: over %s", me,
           transport_of(conn));
  XT_OK(xport_send(conn, me, 2, NULL, NULL));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "server %s: send: %s", me, xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  xport_conn_close(conn);
}

START_TEST(one_port_two_addresses)
{
  if (skip_unless_mixed("one_port_two_addresses"))
    return;
  if (getenv("XPORT_TEST_HOST") && *getenv("XPORT_TEST_HOST")) {
    printf("SKIP: one_port_two_addresses on %s: the fabric listens only on %s (verbs: no "
           "device on the loopback's addresses)\n", xt_config(), getenv("XPORT_TEST_HOST"));
    return;
  }
  char a1[128], a2[128], want[64];
  pid_t s1 = xt_spawn_server_on("127.0.0.1:0", named_server, "A", a1, sizeof a1);
  snprintf(want, sizeof want, "127.0.0.2:%s", strrchr(a1, ':') + 1);
  pid_t s2 = xt_spawn_server_on(want, named_server, "B", a2, sizeof a2);
  xport_ctx_t *ctx = xt_ctx();
  const char *addr[2] = {a2, a1}, *who[2] = {"B", "A"};
  for (int i = 0; i < 2; i++) {
    xport_conn_t *conn;
    char buf[4] = "";
    XT_OK(xport_connect(ctx, addr[i], T_MS, &conn));
    XT_OK(xport_recv(conn, buf, sizeof buf, NULL, buf));
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
    XT_CHECK(c.status == 0 && !strcmp(buf, who[i]), "%s reached server %s over %s, not %s",
             addr[i], buf, transport_of(conn), who[i]);
    XT_CHECK(!strcmp(transport_of(conn), xt_transport()), "%s over %s", addr[i],
             transport_of(conn));
    xport_conn_close(conn);
  }
  xport_ctx_destroy(ctx);
  XT_CHECK(xt_reap(s1) == 0 && xt_reap(s2) == 0, "a server failed");
}
END_TEST

/* ---- a server in its own event loop (xport_ctx_fd) ------------------------ */

#define EL_MSGS 40
#define EL_LEN 300

/* The server sleeps in poll(2) on the context's descriptor alone, as an
 * epoll-based server does, and is woken for every message of a client
 * that sends one at a time with pauses: its connection runs over shm,
 * which has no wait object of its own. */
static void loop_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  (void)arg;
  int fd = -1;
  XT_OK(xport_ctx_fd(ctx, &fd));
  XT_CHECK(fd >= 0, "no descriptor");
  xport_conn_t *conn;
  XT_OK(xport_accept(lst, T_MS, &conn));
  XT_CHECK(!strcmp(transport_of(conn), xt_transport()), "the client came over %s",
           transport_of(conn));
  char *buf = malloc(EL_LEN);
  XT_CHECK(buf, "malloc");
  XT_OK(xport_recv(conn, buf, EL_LEN, NULL, NULL));
  int got = 0, sleeps = 0;
  while (got < EL_MSGS) {
    xport_completion_t c;
    int n = 0;
    /* Polls stop at the last message: the client's goodbye may already
     * wait behind it, and is read below. */
    while (got < EL_MSGS && (n = xport_poll(ctx, &c, 1)) == 1) {
      XT_CHECK(c.op == XPORT_OP_RECV && c.status == 0 && c.len == EL_LEN,
               "message %d ended op %d: %s", got, c.op, xport_strerror(c.status));
      XT_CHECK(xt_verify(buf, EL_LEN, (unsigned)got) == EL_LEN, "message %d's bytes", got);
      got++;
      if (got < EL_MSGS)
        XT_OK(xport_recv(conn, buf, EL_LEN, NULL, NULL));
    }
    XT_CHECK(n >= 0, "poll: %s", xport_strerror(n));
    /* The documented way to sleep: xport_wait(0), then the descriptor. */
    if (got < EL_MSGS && xport_wait(ctx, 0) == -XPORT_ETIMEDOUT) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      XT_CHECK(poll(&p, 1, T_MS) == 1, "the descriptor slept through message %d", got);
      sleeps++;
    }
  }
  XT_CHECK(sleeps > 0, "the server never slept on the descriptor");
  free(buf);
  xport_completion_t c;
  XT_CHECK(xt_next(ctx, &c, T_MS) == 0 && c.op == XPORT_OP_DISCONNECT, "no goodbye");
  xport_conn_close(conn);
}

START_TEST(event_loop_served_over_shm)
{
  if (skip_unless_mixed("event_loop_served_over_shm"))
    return;
  char addr[128];
  pid_t pid = xt_spawn_server(loop_server, NULL, addr, sizeof addr);
  xport_ctx_t *ctx = xt_ctx();
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  char *buf = malloc(EL_LEN);
  XT_CHECK(buf, "malloc");
  for (int i = 0; i < EL_MSGS; i++) {
    xt_fill(buf, EL_LEN, (unsigned)i);
    XT_OK(xport_send(conn, buf, EL_LEN, NULL, NULL));
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
    XT_CHECK(c.status == 0, "send %d: %s", i, xport_strerror(c.status));
    usleep(3000); /* long enough for the server to go to sleep */
  }
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  free(buf);
  XT_CHECK(xt_reap(pid) == 0, "the server failed on %s", xt_config());
}
END_TEST

/* ---- the context's own view ----------------------------------------------- */

/* Two transports are announced where a user looks: the candidates name
 * shm as opened beside the fabric; poll, wait and the descriptor serve
 * both; XPORT_SHM=only gives a shm context. */
START_TEST(context_says_what_it_opened)
{
  if (skip_unless_mixed("context_says_what_it_opened"))
    return;
  xport_ctx_t *ctx;
  xport_caps_t caps;
  const xport_candidate_t *cands;
  XT_OK(xport_ctx_create(NULL, &ctx));
  XT_OK(xport_ctx_query(ctx, &caps));
  XT_CHECK(!strcmp(caps.provider, getenv("XPORT_PROVIDER")), "fabric %s", caps.provider);
  int n = xport_ctx_candidates(ctx, &cands), beside = 0;
  for (int i = 0; i < n; i++)
    beside += !strcmp(cands[i].provider, xt_transport()) &&
              cands[i].verdict == XPORT_VERDICT_CHOSEN && strstr(cands[i].reason, "beside");
  XT_CHECK(beside == 1, "no candidate says %s was opened beside %s", xt_transport(),
           caps.provider);
  int fd = -5;
  XT_CHECK(xport_ctx_fd(ctx, &fd) == 0 && fd >= 0 && caps.wait_fd == 1,
           "no descriptor that covers shm too");
  XT_CHECK(xport_wait(ctx, 5) == -XPORT_ETIMEDOUT, "wait on nothing");
  xport_completion_t c;
  XT_CHECK(xport_poll(ctx, &c, 1) == 0, "completions from nowhere");
  XT_OK(xport_ctx_destroy(ctx));
  char was[32];
  snprintf(was, sizeof was, "%s", getenv("XPORT_SHM"));
  setenv("XPORT_SHM", "only", 1);
  XT_OK(xport_ctx_create(NULL, &ctx));
  XT_OK(xport_ctx_query(ctx, &caps));
  XT_CHECK(!strcmp(caps.provider, "xshm"), "XPORT_SHM=only opened %s", caps.provider);
  XT_OK(xport_ctx_destroy(ctx));
  /* Spellings: a boolean's mean what they say (on: xport's own beside,
   * the default); one not understood adds no transport (a warning);
   * libfabric and xshm name which. */
  static const struct {
    const char *v, *beside;
  } sp[] = {{"off", NULL},     {"OFF", NULL},    {"0", NULL},       {"no", NULL},
            {"false", NULL},   {"bogus", NULL},  {"auto", "xshm"},  {"AUTO", "xshm"},
            {"1", "xshm"},     {"yes", "xshm"},  {"on", "xshm"},    {"xshm", "xshm"},
            {"libfabric", "shm"}};
  for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
    setenv("XPORT_SHM", sp[i].v, 1);
    XT_OK(xport_ctx_create(NULL, &ctx));
    XT_OK(xport_ctx_query(ctx, &caps));
    int nc = xport_ctx_candidates(ctx, &cands), nbeside = 0;
    const char *which = "nothing";
    for (int k = 0; k < nc; k++)
      if (cands[k].verdict == XPORT_VERDICT_CHOSEN && strstr(cands[k].reason, "beside")) {
        nbeside++;
        which = cands[k].provider;
      }
    XT_CHECK(sp[i].beside ? nbeside == 1 && !strcmp(which, sp[i].beside) : nbeside == 0,
             "XPORT_SHM=%s: %d beside (%s), expected %s", sp[i].v, nbeside, which,
             sp[i].beside ? sp[i].beside : "none");
    XT_OK(xport_ctx_destroy(ctx));
  }
  setenv("XPORT_SHM", was, 1);
}
END_TEST

/* The key blob of a context with two transports: one part each; a blob
 * damaged in either part is refused whole, and the connection's part is
 * what unpacking takes. */
static int blob_server(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  static uint8_t region[64];
  uint8_t key[XPORT_RKEY_MAX_SIZE];
  xport_mr_t *mr;
  xport_completion_t c;
  XT_OK(xport_mr_reg(ctx, region, sizeof region, XPORT_ACCESS_REMOTE_READ, &mr));
  int klen = xport_rkey_pack(mr, 0, sizeof region, key, sizeof key);
  XT_CHECK(klen == 2 * (56 + 8 + 4), "a blob of %d bytes for two transports", klen);
  XT_OK(xport_send(conn, key, (size_t)klen, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "send: %s", xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
  xport_mr_dereg(mr);
  return 0;
}

static int blob_client(xport_ctx_t *ctx, xport_conn_t *conn, void *arg)
{
  (void)arg;
  uint8_t key[XPORT_RKEY_MAX_SIZE], k[XPORT_RKEY_MAX_SIZE];
  xport_rkey_t *rk = (xport_rkey_t *)0x1;
  XT_OK(xport_recv(conn, key, sizeof key, NULL, key));
  xport_completion_t c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0, "key: %s", xport_strerror(c.status));
  size_t len = c.len;
  /* Every byte of either part, flipped: refused, output untouched. */
  for (size_t i = 0; i < len; i++) {
    memcpy(k, key, len);
    k[i] ^= 0x41;
    XT_CHECK(xport_rkey_unpack(conn, k, len, &rk) == -XPORT_EPROTO && rk == (xport_rkey_t *)0x1,
             "byte %zu of %zu flipped", i, len);
  }
  /* The fabric's part alone does not serve a connection over shm; the
   * shm part alone does. */
  size_t first = (size_t)key[8] | (size_t)key[9] << 8;
  XT_CHECK(xport_rkey_unpack(conn, key, first, &rk) == -XPORT_EPROTO, "the fabric's part");
  XT_OK(xport_rkey_unpack(conn, key + first, len - first, &rk));
  XT_OK(xport_rkey_release(rk));
  /* The parts swapped still tile: the connection's part is found. */
  memcpy(k, key + first, len - first);
  memcpy(k + len - first, key, first);
  XT_OK(xport_rkey_unpack(conn, k, len, &rk));
  XT_OK(xport_rkey_release(rk));
  /* Parts that do not tile the blob: refused. */
  XT_CHECK(xport_rkey_unpack(conn, key, len - 1, &rk) == -XPORT_EPROTO, "short by one");
  return 0;
}

START_TEST(one_blob_two_parts)
{
  if (skip_unless_mixed("one_blob_two_parts"))
    return;
  xt_pair(blob_server, blob_client, NULL);
}
END_TEST

static Suite *make(void)
{
  Suite *s = suite_create("multi");
  TCase *t = tcase_create("Transports");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, context_says_what_it_opened);
  tcase_add_test(t, one_blob_two_parts);
  tcase_add_test(t, event_loop_served_over_shm);
  tcase_add_test(t, one_port_two_addresses);
  tcase_add_test(t, one_server_both_nodes);
  tcase_add_test(t, shm_off_uses_the_fabric);
  tcase_add_test(t, other_pid_namespace_uses_the_fabric);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return xt_main("check_multi", make, 1); }
