/* conncost: time and memory per connection. N connections from one
 * process to a listener in another, over the provider the probe picks
 * (XPORT_PROVIDER=shm, tcp, ...).
 *
 *   bench/conncost [N]          (default 200)
 */
#include <xport.h>

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

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
  int n = argc > 1 ? atoi(argv[1]) : 200, p[2];
  char addr[128] = "";
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  xport_caps_t caps;
  if (n < 2 || pipe(p))
    return 2;
  pid_t pid = fork();
  if (pid == 0) { /* the listener: accepts them all, then waits to be killed */
    xport_listener_t *lst;
    if (xport_ctx_create(NULL, &ctx) || xport_listen(ctx, "127.0.0.1:0", &lst) ||
        xport_listener_addr(lst, addr, sizeof addr) || write(p[1], addr, strlen(addr) + 1) < 0)
      _exit(1);
    for (int i = 0; i < n; i++)
      if (xport_accept(lst, 60000, &conn))
        _exit(1);
    pause();
    _exit(0);
  }
  if (read(p[0], addr, sizeof addr - 1) <= 0 || xport_ctx_create(NULL, &ctx)) {
    kill(pid, SIGKILL);
    return 1;
  }
  xport_ctx_query(ctx, &caps);
  /* The first connection opens the endpoint; count the rest. */
  int rc = xport_connect(ctx, addr, 60000, &conn);
  long r0 = rss_kib();
  double t0 = now_s();
  for (int i = 1; i < n && !rc; i++)
    rc = xport_connect(ctx, addr, 60000, &conn);
  double t1 = now_s();
  long r1 = rss_kib();
  if (rc)
    fprintf(stderr, "conncost: connect: %s\n", xport_strerror(rc));
  else
    printf("%s: %d connections: %.1f us and %.2f KiB RSS per connection\n", caps.provider, n,
           (t1 - t0) / (n - 1) * 1e6, (double)(r1 - r0) / (n - 1));
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  xport_ctx_destroy(ctx);
  return rc ? 1 : 0;
}
