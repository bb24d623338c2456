/* conncost: time and memory per connection, and per endpoint. Over the
 * provider the probe picks (XPORT_PROVIDER=shm, tcp, tcp;ofi_rxm, ...),
 * from one process to a listener in another.
 *
 *   bench/conncost [N]          N connections held open at once (default 200)
 *   bench/conncost N churn      N connections opened and closed one after
 *                               the other (what a long-running server sees)
 *   bench/conncost N churn keep the same, with one more connection to the
 *                               same listener held open throughout
 *
 * Prints the resident memory a context, its first endpoint and each
 * connection cost (VmRSS), beside the malloc heap (mallinfo2) and the
 * open file descriptors, so that a growth can be told apart. */
#include <xport.h>

#include <dirent.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long rss_kib(void)
{
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6))
      v = atol(line + 6);
  if (f)
    fclose(f);
  return v;
}

static long heap_kib(void)
{
  struct mallinfo2 m = mallinfo2();
  return (long)((m.uordblks + m.hblkhd) / 1024);
}

static int nfds(void)
{
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (d && readdir(d))
    n++;
  if (d)
    closedir(d);
  return n - 3; /* ., .. and the directory itself */
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The listener: accepts every connection; in churn mode closes each once
 * the client's goodbye arrives. Waits to be killed. */
static void serve(int n, int churn, int keep, int fd)
{
  xport_ctx_t *ctx;
  xport_listener_t *lst;
  xport_conn_t *conn;
  xport_completion_t c;
  char addr[128];
  if (xport_ctx_create(NULL, &ctx) || xport_listen(ctx, "127.0.0.1:0", &lst) ||
      xport_listener_addr(lst, addr, sizeof addr) || write(fd, addr, strlen(addr) + 1) < 0)
    _exit(1);
  for (int i = 0; i < n + keep; i++) {
    if (xport_accept(lst, 60000, &conn))
      _exit(1);
    if (!churn || (keep && i == 0))
      continue;
    while (xport_poll(ctx, &c, 1) == 0 || c.op != XPORT_OP_DISCONNECT)
      xport_wait(ctx, 100);
    xport_conn_close(c.conn);
  }
  pause();
  _exit(0);
}

int main(int argc, char **argv)
{
  int n = argc > 1 ? atoi(argv[1]) : 200, p[2];
  int churn = argc > 2 && !strcmp(argv[2], "churn");
  int keep = argc > 3 && !strcmp(argv[3], "keep");
  char addr[128] = "";
  xport_ctx_t *ctx;
  xport_conn_t *conn, *kept = NULL;
  xport_caps_t caps;
  if (n < 2 || pipe(p))
    return 2;
  pid_t pid = fork();
  if (pid == 0)
    serve(n, churn, keep, p[1]);
  long rss_start = rss_kib();
  if (read(p[0], addr, sizeof addr - 1) <= 0 || xport_ctx_create(NULL, &ctx)) {
    kill(pid, SIGKILL);
    return 1;
  }
  long rss_ctx = rss_kib();
  xport_ctx_query(ctx, &caps);
  int rc = xport_connect(ctx, addr, 60000, &conn); /* opens the endpoint */
  long rss_ep = rss_kib();
  if (!rc && churn && !keep)
    rc = xport_conn_close(conn);
  if (keep)
    kept = conn;
  /* Warm up (pools grow in chunks), then count. */
  int warm = churn ? n / 10 : 0;
  long r0 = 0, h0 = 0;
  int f0 = 0;
  double t0 = 0;
  for (int i = 1; i < n && !rc; i++) {
    if (i == warm + 1 || (!churn && i == 1)) {
      if (getenv("CONNCOST_SMAPS")) /* where the growth lies, mapping by mapping */
        system("cat /proc/$PPID/smaps > /tmp/conncost.smaps.0");
      r0 = rss_kib();
      h0 = heap_kib();
      f0 = nfds();
      t0 = now_s();
    }
    rc = xport_connect(ctx, addr, 60000, &conn);
    if (!rc && churn)
      rc = xport_conn_close(conn);
  }
  double t1 = now_s();
  if (getenv("CONNCOST_SMAPS"))
    system("cat /proc/$PPID/smaps > /tmp/conncost.smaps.1");
  long r1 = rss_kib(), h1 = heap_kib();
  int f1 = nfds(), counted = n - 1 - warm;
  if (rc) {
    fprintf(stderr, "conncost: connect: %s\n", xport_strerror(rc));
  } else {
    printf("%s: context %ld KiB, first endpoint and connection %ld KiB RSS\n", caps.provider,
           rss_ctx - rss_start, rss_ep - rss_ctx);
    printf("%s: %d connections %s: %.1f us, %.0f B RSS, %.0f B malloc heap, %.3f fds per "
           "connection\n", caps.provider, counted,
           churn ? (keep ? "opened and closed (one more held)" : "opened and closed")
                 : "held open",
           (t1 - t0) / counted * 1e6, (double)(r1 - r0) * 1024 / counted,
           (double)(h1 - h0) * 1024 / counted, (double)(f1 - f0) / counted);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  if (kept)
    xport_conn_close(kept);
  xport_ctx_destroy(ctx);
  return rc ? 1 : 0;
}
