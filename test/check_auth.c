/* Who may connect: a context under a shared key (xport_ctx_attr_t.auth_key,
 * XPORT_AUTH_KEY_FILE) makes and takes only connections whose peer proved
 * the same key (xport(7), AUTHENTICATION). The servers here take their key
 * from a file and the clients from the attribute: the same bytes either
 * way. Every refusal is checked on both sides: the client's code, and a
 * listener that returns nothing from xport_accept, says why in its log and
 * then serves an honest client, bytes compared both ways. */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 20000
#define MSG_LEN 300

static const char key_a[] = "the job's shared key: 32 bytes..";
static const char key_b[] = "another key, of just as many b..";

/* A key file of mode mode holding key (NULL: none); its path in path. */
static void key_file(char *path, size_t len, const char *key, mode_t mode)
{
  snprintf(path, len, "/tmp/xport-auth-test-%ld-XXXXXX", (long)getpid());
  int fd = mkstemp(path);
  XT_CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
  if (key)
    XT_CHECK(write(fd, key, strlen(key)) == (ssize_t)strlen(key), "write");
  XT_CHECK(fchmod(fd, mode) == 0, "fchmod");
  close(fd);
}

static xport_ctx_t *ctx_keyed(const char *key)
{
  xport_ctx_attr_t attr = {0};
  attr.auth_key = key;
  attr.auth_key_len = key ? strlen(key) : 0;
  return xt_ctx_with(&attr);
}

/* Exchanges MSG_LEN bytes each way, each side checking the other's. */
static void exchange(xport_ctx_t *ctx, xport_conn_t *conn, unsigned mine, unsigned theirs)
{
  unsigned char out[MSG_LEN], in[MSG_LEN];
  xport_completion_t c;
  memset(in, 0, sizeof in);
  xt_fill(out, sizeof out, mine);
  XT_OK(xport_recv(conn, in, sizeof in, NULL, in));
  XT_OK(xport_send(conn, out, sizeof out, NULL, NULL));
  c = xt_wait_op(ctx, XPORT_OP_SEND, T_MS);
  XT_CHECK(c.status == 0, "send: %s", xport_strerror(c.status));
  c = xt_wait_op(ctx, XPORT_OP_RECV, T_MS);
  XT_CHECK(c.status == 0 && c.len == MSG_LEN && xt_verify(in, MSG_LEN, theirs) == MSG_LEN,
           "receive: %s, %zu bytes, not the peer's", xport_strerror(c.status), c.len);
}

/* The honest client names itself with this much data, which only a
 * listener that proved the key gets (and, on shm and rxm, the proofs
 * cover). */
#define HONEST_DATA 20

/* The honest client's data, as the server sees it. */
static void check_honest_data(xport_conn_t *conn)
{
  xport_peer_t peer;
  unsigned char want[HONEST_DATA];
  xt_fill(want, sizeof want, 9);
  XT_OK(xport_conn_peer(conn, &peer));
  XT_CHECK(peer.data_len == HONEST_DATA && !memcmp(peer.data, want, sizeof want),
           "the honest client's data: %zu bytes, %s", peer.data_len,
           peer.data_len == HONEST_DATA ? "not those it sent" : "expected 20");
}

/* ---- the server: refusals, then an honest client ------------------------- */

/* What the client tells the server through the steps pipe. */
#define STEP_REFUSED 'r' /* an attempt of mine was refused: nothing may be accepted */
#define STEP_HONEST 'h'  /* an honest connect comes now */

struct plan {
  struct xt_steps st;
  const char *log;   /* where the server's log goes (XPORT_LOG=info) */
  const char *needle; /* what that log must say after the refusals (NULL: nothing) */
};

static void auth_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct plan *p = arg;
  xport_conn_t *conn;
  int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  XT_CHECK(fd >= 0 && dup2(fd, 2) == 2, "log file %s", p->log);
  close(fd);
  /* A listener moves handshakes on only while it is inside xport (RDM):
   * it accepts in short turns, and looks at the pipe between them. */
  for (long idle = 0;; idle += 100) {
    int rc = xport_accept(lst, 100, &conn);
    XT_CHECK(rc == 0 || rc == -XPORT_ETIMEDOUT, "accept: %d (%s)", rc, xport_strerror(rc));
    struct pollfd pf = {.fd = p->st.c2s[0], .events = POLLIN};
    XT_CHECK(idle < 300000, "the client never came");
    if (rc && poll(&pf, 1, 0) != 1)
      continue;
    /* The honest client says so before it connects: only it is accepted. */
    char step = xt_step_get(p->st.c2s[0], 0);
    XT_CHECK(rc || step == STEP_HONEST, "accepted a refused client (step %c)", step);
    if (rc == 0) {
      check_honest_data(conn);
      exchange(ctx, conn, 2, 1);
      XT_OK(xport_conn_close(conn));
      break;
    }
    if (step == STEP_REFUSED) {
      /* The refused one's handshake has ended at the client: it must not
       * be waiting here to be accepted, now or a moment later. */
      rc = xport_accept(lst, 50, &conn);
      XT_CHECK(rc == -XPORT_ETIMEDOUT, "accept after a refused attempt: %d (%s)", rc,
               xport_strerror(rc));
      xt_step_put(p->st.s2c[1], 'k');
      continue;
    }
    XT_CHECK(step == STEP_HONEST, "step %c", step);
    XT_OK(xport_accept(lst, T_MS, &conn));
    check_honest_data(conn);
    exchange(ctx, conn, 2, 1);
    XT_OK(xport_conn_close(conn));
    break;
  }
  if (p->needle) {
    fflush(stderr);
    FILE *f = fopen(p->log, "r");
    char line[512];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
      found |= strstr(line, p->needle) != NULL;
    if (f)
      fclose(f);
    XT_CHECK(found, "the listener's log does not say '%s'", p->needle);
  }
}

/* Spawns the server with server_key in a key file (NULL: none) and its
 * log at info level into a file of its own. */
static pid_t spawn_keyed(const char *server_key, struct plan *p, char *addr, size_t len,
                         char *kpath, size_t klen)
{
  static char log[64];
  snprintf(log, sizeof log, "/tmp/xport-auth-log-%ld", (long)getpid());
  p->log = log;
  xt_steps_open(&p->st);
  kpath[0] = '\0';
  if (server_key) {
    key_file(kpath, klen, server_key, 0600);
    setenv("XPORT_AUTH_KEY_FILE", kpath, 1);
  }
  setenv("XPORT_LOG", "info", 1);
  pid_t pid = xt_spawn_server(auth_server, p, addr, len);
  unsetenv("XPORT_LOG");
  unsetenv("XPORT_AUTH_KEY_FILE");
  return pid;
}

static void finish(pid_t pid, struct plan *p, const char *kpath)
{
  int st = xt_reap(pid);
  if (kpath[0])
    unlink(kpath);
  unlink(p->log);
  xt_steps_close(&p->st);
  XT_CHECK(st == 0, "server failed on %s", xt_config());
}

/* One refused attempt with client_key (NULL: none): code expected. */
static void refused_once(struct plan *p, const char *addr, const char *client_key, int expected)
{
  xport_ctx_t *ctx = ctx_keyed(client_key);
  xport_conn_t *conn = NULL;
  int rc = xport_connect(ctx, addr, T_MS, &conn);
  XT_CHECK(rc == expected, "connect: %d (%s), expected %d (%s)", rc, xport_strerror(rc),
           expected, xport_strerror(expected));
  XT_CHECK(conn == NULL, "a failed connect wrote its output");
  xport_ctx_destroy(ctx);
  xt_step_put(p->st.c2s[1], STEP_REFUSED);
  XT_CHECK(xt_step_get(p->st.s2c[0], 60000) == 'k', "server step");
}

static void honest(struct plan *p, const char *addr, const char *key)
{
  xport_ctx_t *ctx = ctx_keyed(key);
  xport_conn_t *conn;
  unsigned char data[HONEST_DATA];
  xt_fill(data, sizeof data, 9);
  xt_step_put(p->st.c2s[1], STEP_HONEST);
  XT_OK(xport_connect_data(ctx, addr, data, sizeof data, T_MS, &conn));
  exchange(ctx, conn, 1, 2);
  XT_OK(xport_conn_close(conn));
  xport_ctx_destroy(ctx);
}

/* A refusal of the client (client_key) by the server (server_key), then
 * an honest client with honest_key. */
static void refusal_case(const char *server_key, const char *client_key, const char *honest_key,
                         const char *needle)
{
  struct plan p = {.needle = needle};
  char addr[128], kpath[128];
  pid_t pid = spawn_keyed(server_key, &p, addr, sizeof addr, kpath, sizeof kpath);
  refused_once(&p, addr, client_key, -XPORT_EACCES);
  honest(&p, addr, honest_key);
  finish(pid, &p, kpath);
}

START_TEST(same_key_connects)
{
  struct plan p = {0};
  char addr[128], kpath[128];
  pid_t pid = spawn_keyed(key_a, &p, addr, sizeof addr, kpath, sizeof kpath);
  honest(&p, addr, key_a);
  finish(pid, &p, kpath);
}
END_TEST

START_TEST(no_key_refused_by_keyed_listener)
{
  refusal_case(key_a, NULL, key_a, "authentication failed");
}
END_TEST

START_TEST(key_refused_by_listener_without)
{
  refusal_case(NULL, key_a, NULL, "this listener has none");
}
END_TEST

START_TEST(wrong_key_refused)
{
  refusal_case(key_a, key_b, key_a, "authentication failed");
}
END_TEST

/* A listener keeps serving after many failed attempts: key guessing. */
START_TEST(listener_serves_after_fifty_failures)
{
  struct plan p = {.needle = "authentication failed"};
  char addr[128], kpath[128], guess[40];
  pid_t pid = spawn_keyed(key_a, &p, addr, sizeof addr, kpath, sizeof kpath);
  for (int i = 0; i < 50; i++) {
    snprintf(guess, sizeof guess, "guess number %02d of the shared key", i);
    refused_once(&p, addr, guess, -XPORT_EACCES);
  }
  honest(&p, addr, key_a);
  finish(pid, &p, kpath);
}
END_TEST

/* A client that closes as soon as it has connected, before the listener's
 * accept took the connection (its goodbye may come before): the listener
 * returns it with its disconnect event, or not at all, and serves on. */
static void closed_server(xport_ctx_t *ctx, xport_listener_t *lst, void *arg)
{
  struct xt_steps *st = arg;
  xport_conn_t *conn = NULL, *got = NULL;
  struct pollfd pf = {.fd = st->c2s[0], .events = POLLIN};
  for (long idle = 0; poll(&pf, 1, 0) != 1; idle += 100) {
    XT_CHECK(idle < 300000, "the client never came");
    int rc = xport_accept(lst, 100, &conn);
    XT_CHECK(rc == 0 || rc == -XPORT_ETIMEDOUT, "accept: %s", xport_strerror(rc));
    XT_CHECK(rc || !got, "two connections from one connect");
    if (!rc)
      got = conn;
  }
  XT_CHECK(xt_step_get(st->c2s[0], 0) == 'x', "step");
  if (!got && xport_accept(lst, 2000, &conn) == 0)
    got = conn;
  if (got) {
    xport_completion_t c = xt_wait_op(ctx, XPORT_OP_DISCONNECT, T_MS);
    XT_CHECK(c.op == XPORT_OP_DISCONNECT && c.conn == got,
             "the closed connection's disconnect event never came");
    XT_OK(xport_conn_close(got));
  }
  xt_step_put(st->s2c[1], 'k');
  XT_CHECK(xt_step_get(st->c2s[0], T_MS) == STEP_HONEST, "step");
  XT_OK(xport_accept(lst, T_MS, &conn));
  exchange(ctx, conn, 2, 1);
  XT_OK(xport_conn_close(conn));
}

START_TEST(closed_before_accept)
{
  struct xt_steps st;
  char addr[128], kpath[128];
  xt_steps_open(&st);
  key_file(kpath, sizeof kpath, key_a, 0600);
  setenv("XPORT_AUTH_KEY_FILE", kpath, 1);
  pid_t pid = xt_spawn_server(closed_server, &st, addr, sizeof addr);
  unsetenv("XPORT_AUTH_KEY_FILE");
  xport_ctx_t *ctx = ctx_keyed(key_a);
  xport_conn_t *conn;
  XT_OK(xport_connect(ctx, addr, T_MS, &conn));
  XT_OK(xport_conn_close(conn));
  xt_step_put(st.c2s[1], 'x');
  XT_CHECK(xt_step_get(st.s2c[0], 60000) == 'k', "server step");
  xport_conn_t *c2;
  xt_step_put(st.c2s[1], STEP_HONEST);
  XT_OK(xport_connect(ctx, addr, T_MS, &c2));
  exchange(ctx, c2, 1, 2);
  XT_OK(xport_conn_close(c2));
  xport_ctx_destroy(ctx);
  int status = xt_reap(pid);
  unlink(kpath);
  xt_steps_close(&st);
  XT_CHECK(status == 0, "server failed on %s", xt_config());
}
END_TEST

/* ---- where the key comes from -------------------------------------------- */

static int create_with_file(const char *path)
{
  xport_ctx_t *ctx = NULL;
  setenv("XPORT_AUTH_KEY_FILE", path, 1);
  int rc = xport_ctx_create(NULL, &ctx);
  unsetenv("XPORT_AUTH_KEY_FILE");
  if (!rc) {
    xport_caps_t caps;
    XT_OK(xport_ctx_query(ctx, &caps));
    XT_CHECK(caps.auth == XPORT_AUTH_FILE, "caps.auth %d", caps.auth);
    xport_ctx_destroy(ctx);
  }
  XT_CHECK(rc || ctx, "a context created without its output");
  return rc;
}

START_TEST(key_file_must_be_private)
{
  char path[128];
  key_file(path, sizeof path, key_a, 0600);
  XT_OK(create_with_file(path));
  /* Readable by group, or by others: the key is no secret. */
  XT_CHECK(chmod(path, 0640) == 0, "chmod");
  XT_CHECK(create_with_file(path) == -XPORT_EACCES, "a group-readable key file was taken");
  XT_CHECK(chmod(path, 0604) == 0, "chmod");
  XT_CHECK(create_with_file(path) == -XPORT_EACCES, "a world-readable key file was taken");
  /* Another user's file. */
  XT_CHECK(chmod(path, 0600) == 0, "chmod");
  if (geteuid() == 0) {
    XT_CHECK(chown(path, 65534, 65534) == 0, "chown");
    XT_CHECK(create_with_file(path) == -XPORT_EACCES, "another user's key file was taken");
  } else {
    printf("SKIP: key_file_must_be_private: another user's file needs root to make\n");
  }
  unlink(path);
  /* Too short a key, a directory, nothing there. */
  key_file(path, sizeof path, "short", 0600);
  XT_CHECK(create_with_file(path) == -XPORT_EINVAL, "a 5-byte key was taken");
  unlink(path);
  XT_CHECK(create_with_file("/tmp") == -XPORT_EINVAL, "a directory was taken");
  XT_CHECK(create_with_file("/tmp/xport-auth-no-such-file") == -XPORT_ENOENT, "no file");
  /* The attribute: too short, or a length without bytes. */
  xport_ctx_attr_t attr = {0};
  xport_ctx_t *ctx = NULL;
  attr.auth_key = "short";
  attr.auth_key_len = 5;
  XT_CHECK(xport_ctx_create(&attr, &ctx) == -XPORT_EINVAL && !ctx, "a 5-byte key was taken");
  attr.auth_key = NULL;
  attr.auth_key_len = 32;
  XT_CHECK(xport_ctx_create(&attr, &ctx) == -XPORT_EINVAL && !ctx, "a NULL key was taken");
}
END_TEST

static Suite *make(void)
{
  Suite *s = suite_create("auth");
  TCase *tc = tcase_create("Auth");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, same_key_connects);
  tcase_add_test(tc, no_key_refused_by_keyed_listener);
  tcase_add_test(tc, key_refused_by_listener_without);
  tcase_add_test(tc, wrong_key_refused);
  tcase_add_test(tc, listener_serves_after_fifty_failures);
  tcase_add_test(tc, closed_before_accept);
  tcase_add_test(tc, key_file_must_be_private);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return xt_main("check_auth", make, 1); }
