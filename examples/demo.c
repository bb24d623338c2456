/* demo: two processes exchange messages over the provider the probe
 * picks (XPORT_PROVIDER=shm needs no network), and print what it picked.
 * The parent listens on 127.0.0.1 and echoes; the child connects, sends,
 * and checks every byte of the echo. */
#include <xport.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 8

static int die(const char *what, int rc)
{
  fprintf(stderr, "demo: %s: %s\n", what, xport_strerror(rc));
  exit(1);
}

/* Waits for one completion and returns it. */
static xport_completion_t next(xport_ctx_t *ctx)
{
  xport_completion_t c;
  int n;
  while ((n = xport_poll(ctx, &c, 1)) == 0)
    xport_wait(ctx, 1000);
  if (n < 0)
    die("xport_poll", n);
  if (c.status)
    die(c.hint ? c.hint : "completion", c.status);
  return c;
}

static void client(const char *addr)
{
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  char out[4096], in[4096];
  int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_connect(ctx, addr, 10000, &conn)))
    die("client", rc);
  for (int r = 0; r < ROUNDS; r++) {
    size_t len = (size_t)1 << (r + 5);
    for (size_t i = 0; i < len; i++)
      out[i] = (char)(i * 7 + r);
    xport_recv(conn, in, sizeof in, NULL, NULL);
    xport_send(conn, out, len, NULL, NULL);
    for (int k = 0; k < 2; k++) {
      xport_completion_t c = next(ctx);
      if (c.op == XPORT_OP_RECV && (c.len != len || memcmp(in, out, len))) {
        fprintf(stderr, "demo: echo of %zu bytes differs\n", len);
        exit(1);
      }
    }
  }
  printf("client: %d messages of %d to %d bytes echoed, every byte verified\n", ROUNDS, 1 << 5,
         1 << (ROUNDS + 4));
  fflush(stdout); /* the child leaves by _exit, which flushes nothing */
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
}

int main(void)
{
  xport_ctx_t *ctx;
  xport_listener_t *lst;
  xport_conn_t *conn;
  xport_caps_t caps;
  const xport_candidate_t *cands;
  char addr[128], buf[4096];
  int rc, pfd[2];

  /* The client first, before any context exists (a child must not
   * inherit one: xport(7), Processes and fork); it waits for the
   * listener's address on a pipe. */
  if (pipe(pfd)) {
    perror("demo: pipe");
    return 1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("demo: fork");
    return 1;
  }
  if (pid == 0) {
    close(pfd[1]);
    ssize_t n = read(pfd[0], addr, sizeof addr);
    if (n <= 0 || addr[n - 1] != '\0')
      _exit(1); /* the server failed first and said why */
    client(addr); /* the child uses a context of its own */
    _exit(0);
  }
  close(pfd[0]);
  if ((rc = xport_ctx_create(NULL, &ctx)))
    die("xport_ctx_create", rc);
  xport_ctx_query(ctx, &caps);
  /* The choice and its reason; a second chosen candidate is the shared
   * memory opened beside the fabric for peers on this node (XPORT_SHM). The whole table
   * is xport_info's to print. */
  int n = xport_ctx_candidates(ctx, &cands);
  for (int i = 0; i < n; i++)
    if (cands[i].verdict == XPORT_VERDICT_CHOSEN)
      printf("probe: %s %s (domain %s): %s\n",
             strcmp(cands[i].provider, caps.provider) ? "also" : "chose", cands[i].provider,
             cands[i].domain, cands[i].reason);
  printf("probe: every candidate and why: tools/xport_info (-v: every libfabric entry)\n");
  if ((rc = xport_listen(ctx, "127.0.0.1:0", &lst)))
    die("xport_listen", rc);
  xport_listener_addr(lst, addr, sizeof addr);
  printf("server: listening on %s\n", addr);
  fflush(stdout);
  if (write(pfd[1], addr, strlen(addr) + 1) != (ssize_t)(strlen(addr) + 1))
    die("write the address to the client", -XPORT_EIO);
  close(pfd[1]);
  if ((rc = xport_accept(lst, 10000, &conn)))
    die("xport_accept", rc);
  for (int r = 0; r < ROUNDS; r++) {
    xport_recv(conn, buf, sizeof buf, NULL, NULL);
    xport_completion_t c = next(ctx);
    xport_send(conn, buf, c.len, NULL, NULL);
    next(ctx);
  }
  int st;
  waitpid(pid, &st, 0);
  /* The connection's own transport: xshm for a peer on this node where the
   * probe's fabric is another (XPORT_SHM). */
  xport_caps_t over;
  xport_conn_query(conn, &over);
  xport_conn_close(conn);
  xport_listener_close(lst);
  xport_ctx_destroy(ctx);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "demo: client failed\n");
    return 1;
  }
  printf("demo: %d round trips over %s, all bytes verified\n", ROUNDS, over.provider);
  return 0;
}
