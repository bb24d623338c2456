/* hello: a child process listens, the parent connects and greets it, the child answers; both
 * check every byte and close. Run ./examples/hello [HOST] (default 127.0.0.1), any provider. */
#include <xport.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define HELLO_OP(op) (1u << XPORT_OP_##op)
static const char hello_greeting[] = "hello, server", hello_answer[] = "hello, client";
static pid_t hello_child; /* in the parent: the server; never left behind */
static char hello_at[80] = "127.0.0.1:0"; /* where the server listens: HOST:0, any port */

static void hello_fail(const char *who, const char *what, int rc)
{
  fprintf(stderr, "hello: %s: %s: %s\n", who, what, xport_strerror(rc));
  if (hello_child > 0 && kill(hello_child, SIGKILL) == 0)
    waitpid(hello_child, NULL, 0); /* reaped, whatever failed */
  exit(1);
}
static void hello_watchdog(int sig) /* async-signal-safe calls only */
{
  (void)sig, (void)!write(2, "hello: watchdog: stuck for 60 s\n", 32);
  if (hello_child > 0)
    kill(hello_child, SIGKILL);
  _exit(1);
}
/* Takes completions until each op in want has come, in any order (a send's may
 * follow the answer). Only the peer's goodbye has a status: XPORT_ECONNRESET. */
static void hello_expect(xport_ctx_t *ctx, const char *who, unsigned want, const char *buf, const char *expect)
{
  while (want) {
    xport_completion_t c; int n = xport_poll(ctx, &c, 1);
    if (n == 0 && ((n = xport_wait(ctx, 100)) == 0 || n == -XPORT_ETIMEDOUT))
      continue; /* xport_wait's 0 is only a hint: poll again either way */
    if (n < 0)
      hello_fail(who, "xport_poll/xport_wait", n);
    if (!(want & 1u << c.op) || (c.status && c.op != XPORT_OP_DISCONNECT))
      hello_fail(who, c.hint ? c.hint : "unexpected completion", c.status ? c.status : -XPORT_EPROTO);
    want &= ~(1u << c.op);
    if (c.op == XPORT_OP_RECV && (c.len != strlen(expect) + 1 || memcmp(buf, expect, c.len)))
      hello_fail(who, "the message differs", -XPORT_EPROTO);
    else if (c.op == XPORT_OP_RECV)
      printf("%s: received \"%s\" (%zu bytes, verified)\n", who, buf, c.len);
  }
}

static void hello_server(int pipe_w) /* the child: tells the parent where it listens */
{
  xport_ctx_t *ctx; xport_listener_t *lst; xport_conn_t *conn; char addr[128] = "", buf[64]; int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_listen(ctx, hello_at, &lst)) ||
      (rc = xport_listener_addr(lst, addr, sizeof addr)))
    hello_fail("server", "listen", rc);
  if (write(pipe_w, addr, sizeof addr) != (ssize_t)sizeof addr)
    hello_fail("server", "pipe", -XPORT_EIO);
  if ((rc = xport_accept(lst, 30000, &conn)) || (rc = xport_recv(conn, buf, sizeof buf, NULL, NULL)))
    hello_fail("server", "accept", rc);
  hello_expect(ctx, "server", HELLO_OP(RECV), buf, hello_greeting);
  if ((rc = xport_send(conn, hello_answer, sizeof hello_answer, NULL, NULL)))
    hello_fail("server", "xport_send", rc);
  /* The client closes once it has the answer: its goodbye ends our part. */
  hello_expect(ctx, "server", HELLO_OP(SEND) | HELLO_OP(DISCONNECT), NULL, NULL);
  if ((rc = xport_conn_close(conn)) || (rc = xport_listener_close(lst)) || (rc = xport_ctx_destroy(ctx)))
    hello_fail("server", "teardown", rc);
}

int main(int argc, char **argv)
{
  xport_ctx_t *ctx; xport_conn_t *conn; xport_caps_t caps; char addr[128], buf[64]; int fds[2], rc, st;
  if (argc > 1) /* an RDMA NIC's address, say: verbs listens there */
    snprintf(hello_at, sizeof hello_at, strchr(argv[1], ':') ? "[%s]:0" : "%s:0", argv[1]);
  signal(SIGALRM, hello_watchdog), alarm(60);
  if (pipe(fds) || (hello_child = fork()) < 0) /* before any context: xport(7), fork */
    hello_fail("client", "fork", -XPORT_EIO);
  if (hello_child == 0) { /* fork cleared the alarm: the child arms its own */
    alarm(60), hello_server(fds[1]);
    fflush(stdout), _exit(0); /* _exit flushes nothing */
  }
  close(fds[1]);
  if (read(fds[0], addr, sizeof addr) != (ssize_t)sizeof addr)
    hello_fail("client", "the server did not start", -XPORT_EIO);
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_connect(ctx, addr, 30000, &conn)) ||
      (rc = xport_conn_query(conn, &caps)))
    hello_fail("client", "connect", rc);
  printf("client: connected to %s over %s\n", addr, caps.provider);
  /* The receive goes first, so that the answer always finds it posted. */
  if ((rc = xport_recv(conn, buf, sizeof buf, NULL, NULL)) ||
      (rc = xport_send(conn, hello_greeting, sizeof hello_greeting, NULL, NULL)))
    hello_fail("client", "post", rc);
  hello_expect(ctx, "client", HELLO_OP(SEND) | HELLO_OP(RECV), buf, hello_answer);
  if ((rc = xport_conn_close(conn)) || (rc = xport_ctx_destroy(ctx)))
    hello_fail("client", "teardown", rc);
  if (waitpid(hello_child, &st, 0) != hello_child || !WIFEXITED(st) || WEXITSTATUS(st))
    hello_child = 0, hello_fail("client", "the server failed", -XPORT_EIO); /* reaped */
  printf("hello: ok (one round trip over %s, every byte verified)\n", caps.provider);
  return 0;
}
