/* Half-open connections on a listener's port. A provider that speaks
 * TCP (libfabric 1.17's tcp, and rxm over it) accepts every socket that
 * reaches its listener and then waits, without a deadline, for the
 * connection request to arrive on it: each such socket holds a descriptor
 * of this process, and once a stranger's silent sockets (socket() and
 * connect(), nothing sent, or a few bytes) take the last descriptor, the
 * provider's accept fails and honest clients wait in the kernel's queue
 * until they time out.
 *
 * The provider's sockets are its own, but the process's descriptor table
 * is not: a socket bound to a listener's port that is not the listening
 * one, and that has received fewer bytes than any complete request of
 * the provider (its cm_header plus the transport's greeting), is a
 * request still unfinished. One unfinished for XPORT__GREET_MS, or the
 * oldest where descriptors run short, is shut down: the provider then
 * reads the end of its stream, drops the request and closes the socket
 * itself, so that nothing it holds is pulled from under it. Finished
 * connections have received their request and are never touched. */
#include "xport_int.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h> /* tcp_info with tcpi_bytes_received */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* tcpi_state values (the kernel's net/tcp_states.h; netinet/tcp.h, which
 * names them, and linux/tcp.h, whose tcp_info is the complete one, clash). */
#define ST_ESTABLISHED 1
#define ST_CLOSE_WAIT 8

/* How often the descriptor table is looked at, while listeners are open. */
#define WATCH_EVERY_MS 500
/* Where descriptors run short, the deadline of an unfinished request: an
 * honest client's arrives with its connection, in a round trip, while the
 * sockets of a flood would otherwise pass through one deadline's worth at
 * a time, with honest clients queued behind them in the kernel. */
#define PRESSED_MS 1000

struct unfinished {
  int fd;
  unsigned age_ms;
};

static int by_age_desc(const void *a, const void *b)
{
  const struct unfinished *x = a, *y = b;
  return x->age_ms < y->age_ms ? 1 : x->age_ms > y->age_ms ? -1 : 0;
}

/* The port of a "host:port" or "[v6]:port" listener address, or 0. */
static unsigned listener_port(const xport_listener_t *lst)
{
  const char *colon = strrchr(lst->addr, ':');
  return colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
}

static int port_listened(struct xport__lane *lane, unsigned port)
{
  for (const xport_listener_t *l = lane->listeners; l; l = l->next)
    if (!l->closing && listener_port(l) == port)
      return 1;
  return 0;
}

/* 1, with its age, if fd is an unfinished request on one of ctx's listeners. */
static int unfinished(struct xport__lane *lane, int fd, size_t min_bytes, unsigned *age_p)
{
  union {
    struct sockaddr sa;
    struct sockaddr_in s4;
    struct sockaddr_in6 s6;
  } name;
  socklen_t len = sizeof name;
  if (getsockname(fd, &name.sa, &len))
    return 0; /* not a socket */
  unsigned port;
  if (name.sa.sa_family == AF_INET)
    port = ntohs(name.s4.sin_port);
  else if (name.sa.sa_family == AF_INET6)
    port = ntohs(name.s6.sin6_port);
  else
    return 0;
  if (!port_listened(lane, port))
    return 0;
  int listening = 0;
  len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) || listening)
    return 0;
  struct tcp_info ti;
  memset(&ti, 0, sizeof ti);
  len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
      len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
    return 0;
  if (ti.tcpi_state != ST_ESTABLISHED && ti.tcpi_state != ST_CLOSE_WAIT)
    return 0;
  if (ti.tcpi_bytes_received >= min_bytes)
    return 0;
  /* Since the last byte came, or since the connection was made. */
  *age_p = ti.tcpi_last_data_recv;
  return 1;
}

void xport__halfopen_watch(struct xport__lane *lane, size_t greeting)
{
  if (!lane->prof || !lane->prof->cm_header || !lane->listeners)
    return;
  long now = xport__now_ms();
  if (now < lane->halfopen_at)
    return;
  lane->halfopen_at = now + WATCH_EVERY_MS;
  /* The look itself takes a descriptor: one is held for it, since it
   * matters most when there are none left. */
  if (lane->halfopen_spare < 0)
    lane->halfopen_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  DIR *d = opendir("/proc/self/fd");
  if (!d && errno == EMFILE && lane->halfopen_spare >= 0) {
    close(lane->halfopen_spare);
    lane->halfopen_spare = -1;
    d = opendir("/proc/self/fd");
  }
  if (!d)
    return;
  size_t min_bytes = lane->prof->cm_header + greeting;
  struct unfinished *u = NULL;
  size_t nu = 0, cap = 0, nfds = 0, nshut = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    int fd = atoi(e->d_name);
    nfds++;
    unsigned age;
    if (fd == dirfd(d) || !unfinished(lane, fd, min_bytes, &age))
      continue;
    if (age >= XPORT__GREET_MS) {
      shutdown(fd, SHUT_RDWR);
      nshut++;
      continue;
    }
    if (nu == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      struct unfinished *grown = realloc(u, ncap * sizeof *u);
      if (!grown)
        continue; /* this one waits for its deadline */
      u = grown;
      cap = ncap;
    }
    u[nu++] = (struct unfinished){fd, age};
  }
  closedir(d);
  if (lane->halfopen_spare < 0) /* given up for the look: taken again */
    lane->halfopen_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  /* Descriptors about to run out: the oldest unfinished go now, so that
   * the provider can accept the honest clients queued behind them. */
  struct rlimit rl;
  size_t open_after = nfds - nshut, spare = 0;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
    size_t reserve = rl.rlim_cur / 8 > 16 ? rl.rlim_cur / 8 : 16;
    if (open_after + reserve > rl.rlim_cur)
      spare = open_after + reserve - rl.rlim_cur;
  }
  if (spare && nu) {
    qsort(u, nu, sizeof *u, by_age_desc);
    for (size_t i = 0; i < nu && (i < spare || u[i].age_ms >= PRESSED_MS); i++, nshut++)
      shutdown(u[i].fd, SHUT_RDWR);
  }
  free(u);
  if (nshut)
    XPORT__DEBUG("%zu connections on a listener's port unfinished: shut", nshut);
}
