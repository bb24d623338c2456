/* threadrate: message rate with a context per thread (xport(7), THREADS),
 * over the provider the probe picks (XPORT_PROVIDER=..., XPORT_SHM=...).
 *
 *   bench/threadrate [-s SIZE] [-t SECONDS] T...   one run per thread count T
 *
 * For each T, a server process runs T threads, each with its own context,
 * listener and connection, and keeps WINDOW receives posted; this process
 * runs T threads, each with its own context connected to one of them,
 * streaming SIZE-byte sends with WINDOW outstanding for SECONDS. Printed:
 * the messages per second the T receivers took, in all and per thread.
 * A benchmark: it asserts nothing; on a machine with fewer cores than 2T
 * the threads share them. */
#include <xport.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_T 64
#define WINDOW 64

static size_t size = 8;
static double seconds = 2.0;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rc)
{
  fprintf(stderr, "threadrate: %s: %s\n", what, xport_strerror(rc));
  exit(1);
}

struct side {
  int fd;                /* server: the pipe its address goes to */
  char addr[128];        /* client: the server thread it connects to */
  unsigned long long n;  /* server: messages received */
  double secs;           /* server: from the first to the last */
};

static void *server(void *arg)
{
  struct side *S = arg;
  xport_ctx_t *ctx;
  xport_listener_t *lst;
  xport_conn_t *conn;
  char a[128], line[160];
  int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_listen(ctx, "127.0.0.1:0", &lst)) ||
      (rc = xport_listener_addr(lst, a, sizeof a)))
    die("server set-up", rc);
  int len = snprintf(line, sizeof line, "%s\n", a);
  if (write(S->fd, line, (size_t)len) != len)
    exit(1);
  if ((rc = xport_accept(lst, 30000, &conn)))
    die("accept", rc);
  char *buf = malloc(WINDOW * (size ? size : 1));
  for (int i = 0; i < WINDOW; i++)
    if ((rc = xport_recv(conn, buf + i * size, size, NULL, (void *)(uintptr_t)i)))
      die("recv", rc);
  xport_completion_t c[32];
  double first = 0, last = 0;
  for (int done = 0; !done;) {
    int n = xport_poll(ctx, c, 32);
    if (n < 0)
      die("poll", n);
    for (int i = 0; i < n; i++) {
      if (c[i].op != XPORT_OP_RECV || c[i].status) {
        done = 1; /* the client closed: its disconnect, or the receives it ended */
        continue;
      }
      if (!S->n++)
        first = now_s();
      last = now_s();
      uintptr_t slot = (uintptr_t)c[i].user_ctx;
      rc = xport_recv(conn, buf + slot * size, size, NULL, c[i].user_ctx);
      if (rc == -XPORT_ENOTCONN)
        done = 1; /* the client went, and its disconnect is on its way */
      else if (rc)
        die("recv", rc);
    }
  }
  S->secs = last - first;
  xport_conn_close(conn);
  xport_listener_close(lst);
  xport_ctx_destroy(ctx);
  free(buf);
  return NULL;
}

static void *client(void *arg)
{
  struct side *S = arg;
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  int rc;
  if ((rc = xport_ctx_create(NULL, &ctx)) || (rc = xport_connect(ctx, S->addr, 30000, &conn)))
    die("client set-up", rc);
  char *buf = calloc(1, size ? size : 1);
  xport_completion_t c[32];
  int out = 0;
  for (double end = now_s() + seconds; now_s() < end || out;) {
    while (out < WINDOW && now_s() < end && (rc = xport_send(conn, buf, size, NULL, NULL)) == 0)
      out++;
    if (rc && rc != -XPORT_EAGAIN)
      die("send", rc);
    int n = xport_poll(ctx, c, 32);
    if (n < 0)
      die("poll", n);
    for (int i = 0; i < n; i++) {
      if (c[i].status)
        die("send completion", c[i].status);
      out--;
    }
  }
  xport_conn_close(conn);
  xport_ctx_destroy(ctx);
  free(buf);
  return NULL;
}

static void run(int t)
{
  int p[2], q[2];
  if (pipe(p) || pipe(q))
    exit(1);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    close(q[0]);
    struct side S[MAX_T];
    pthread_t th[MAX_T];
    for (int i = 0; i < t; i++) {
      S[i] = (struct side){.fd = p[1]};
      pthread_create(&th[i], NULL, server, &S[i]);
    }
    unsigned long long n = 0;
    double secs = 0;
    for (int i = 0; i < t; i++) {
      pthread_join(th[i], NULL);
      n += S[i].n;
      secs = S[i].secs > secs ? S[i].secs : secs;
    }
    char line[128];
    int len = snprintf(line, sizeof line, "%llu %.6f\n", n, secs);
    if (write(q[1], line, (size_t)len) != len)
      _exit(1);
    _exit(0);
  }
  close(p[1]);
  close(q[1]);
  FILE *f = fdopen(p[0], "r");
  struct side S[MAX_T];
  pthread_t th[MAX_T];
  for (int i = 0; i < t; i++) {
    S[i] = (struct side){.fd = -1};
    if (!fgets(S[i].addr, sizeof S[i].addr, f))
      exit(1);
    S[i].addr[strcspn(S[i].addr, "\n")] = '\0';
  }
  fclose(f);
  for (int i = 0; i < t; i++)
    pthread_create(&th[i], NULL, client, &S[i]);
  for (int i = 0; i < t; i++)
    pthread_join(th[i], NULL);
  FILE *g = fdopen(q[0], "r");
  unsigned long long n = 0;
  double secs = 0;
  if (fscanf(g, "%llu %lf", &n, &secs) != 2 || secs <= 0) {
    fprintf(stderr, "threadrate: the server reported nothing\n");
    exit(1);
  }
  fclose(g);
  int status;
  waitpid(pid, &status, 0);
  printf("%2d thread%s %zu B: %10.0f messages/s in all, %10.0f per thread\n", t,
         t == 1 ? " " : "s", size, n / secs, n / secs / t);
  fflush(stdout);
}

int main(int argc, char **argv)
{
  int o;
  while ((o = getopt(argc, argv, "s:t:")) != -1) {
    if (o == 's')
      size = strtoul(optarg, NULL, 0);
    else if (o == 't')
      seconds = atof(optarg);
    else
      return 2;
  }
  if (optind == argc) {
    fprintf(stderr, "usage: threadrate [-s SIZE] [-t SECONDS] THREADS...\n");
    return 2;
  }
  for (int i = optind; i < argc; i++) {
    int t = atoi(argv[i]);
    if (t < 1 || t > MAX_T)
      return 2;
    run(t);
  }
  return 0;
}
