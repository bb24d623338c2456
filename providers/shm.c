/* shm: processes of one node, FI_EP_RDM only. Endpoints are files in
 * /dev/shm named after the endpoint; xport names a listener's endpoint
 * "xport-PORT.netINO.aADDR" after the address it was given (and its
 * network namespace; no ADDR for the wildcard), and every other endpoint
 * "xport-PID-RANDOM", and guards each name with a lock file held for the
 * owner's life: starting a second endpoint under a live name unlinks the
 * owner's file (libfabric 1.17), and a killed process leaves its files,
 * which the lock tells from a live owner's (shm_sweep). /dev/shm is every
 * user's: a name whose files are links or another user's is never taken
 * (own_open, claim). */
#define _GNU_SOURCE /* process_vm_readv */
#include "xport_int.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm/"
#define SHM_PREFIX "fi_shm://"

/* Whether a resolved address belongs to this node. */
static int is_local(const struct sockaddr *sa)
{
  struct ifaddrs *ifs, *i;
  int local = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    uint32_t a = ntohl(in->sin_addr.s_addr);
    if (a == INADDR_ANY || (a >> 24) == 127)
      return 1;
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) || IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
      return 1;
  }
  if (getifaddrs(&ifs))
    return 0;
  for (i = ifs; i && !local; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family)
      continue;
    if (sa->sa_family == AF_INET)
      local = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
              ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
    else
      local = !memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                      &((const struct sockaddr_in6 *)sa)->sin6_addr, sizeof(struct in6_addr));
  }
  freeifaddrs(ifs);
  return local;
}

/* Whether a resolved address is the wildcard. */
static int is_wildcard(const struct sockaddr *sa)
{
  if (sa->sa_family == AF_INET)
    return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* The rule: "xport-PORT.netINO.aADDR", INO the network namespace's, ADDR
 * the host's address in hex; "xport-PORT.netINO" for the wildcard (any
 * set, or a wildcard host). shm reaches only this node, so the host must
 * be one of its addresses (or the wildcard, or a name for either: its
 * first such address), and a listener then answers to its address as a
 * TCP socket bound there would, and one on the wildcard to every address
 * of the node: a client looks for the address's name first, then the
 * wildcard's. Ports are per network namespace, /dev/shm is not:
 * processes in two namespaces that share it may both listen on one
 * port, and a host that is local in one may be another node's address
 * in the other. A host that does not resolve, or that is another node,
 * is refused. */
static int shm_listen_name(const char *host, const char *port, int any, char *name, size_t len)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *r;
  char a[2 + 2 * 16 + 1] = "";
  if (getaddrinfo(host, NULL, &hints, &res))
    return -XPORT_EADDRNOTAVAIL;
  for (r = res; r && !is_local(r->ai_addr); r = r->ai_next)
    ;
  if (r && !any && !is_wildcard(r->ai_addr)) {
    const uint8_t *b = r->ai_family == AF_INET
                           ? (const uint8_t *)&((const struct sockaddr_in *)r->ai_addr)->sin_addr
                           : (const uint8_t *)&((const struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
    size_t n = r->ai_family == AF_INET ? 4 : 16;
    a[0] = '.', a[1] = 'a';
    for (size_t k = 0; k < n; k++)
      snprintf(a + 2 + 2 * k, 3, "%02x", b[k]);
  }
  int local = r != NULL;
  freeaddrinfo(res);
  if (!local)
    return -XPORT_EADDRNOTAVAIL;
  struct stat ns;
  unsigned long long ino = stat("/proc/self/ns/net", &ns) == 0 ? (unsigned long long)ns.st_ino : 0;
  int n = snprintf(name, len, "xport-%s.net%llu%s", port, ino, a);
  return n > 0 && (size_t)n < len ? 0 : -XPORT_EINVAL;
}

static void lock_path(const char *name, char *path, size_t len)
{
  snprintf(path, len, SHM_DIR "%s.lock", name);
}

/* What is at a name in /dev/shm that xport must not use as its own; NULL
 * for a regular file of this user. */
static const char *not_ours(const struct stat *st)
{
  return S_ISLNK(st->st_mode)      ? "a symbolic link"
         : !S_ISREG(st->st_mode)   ? "no regular file"
         : st->st_uid != geteuid() ? "another user's file"
                                   : NULL;
}

/* /dev/shm is every user's: another may plant, under a name xport will
 * use, a link (which, followed, makes a root process create or write the
 * file it points to, where fs.protected_symlinks is 0) or a file of their
 * own (whose content they control). xport opens its files there without
 * following links and without blocking (on a FIFO), and uses only a
 * regular file of its own user. The descriptor, or -XPORT_EADDRINUSE
 * where the name holds something else (what, in *why), or another failure. */
static int own_open(const char *path, int flags, const char **why)
{
  struct stat st;
  *why = "unreadable";
  int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    if (lstat(path, &st) == 0 && (*why = not_ours(&st)))
      return -XPORT_EADDRINUSE;
    return xport__err_from_fi(-e);
  }
  if (fstat(fd, &st) == 0 && !(*why = not_ours(&st)))
    return fd;
  close(fd);
  return -XPORT_EADDRINUSE;
}

/* 1 where nothing, or a regular file of this user, is at path. */
static int own_or_none(const char *path, const char **why)
{
  struct stat st;
  *why = "unreadable";
  if (lstat(path, &st))
    return errno == ENOENT;
  return !(*why = not_ours(&st));
}

/* A name that another user's file or a link holds is never taken (nor
 * what is there touched): the caller is told, and the user with quiet 0. */
static int refuse(const char *path, const char *why, const char *name, int quiet)
{
  if (!quiet)
    XPORT__WARN("shm: %s is %s: the name %s is not used (remove it, or listen on another "
                "port)", path, why, name);
  return -XPORT_EADDRINUSE;
}

static void own_track(const char *name, int add);

/* How many times, a millisecond apart, a claim tries a lock held by
 * someone: a sweep holds a fresh name's lock for the instant it takes to
 * judge it, and must not make the name look taken. */
#define CLAIM_TRIES 20

static int claim(const char *name, int *lock_p, int quiet)
{
  char path[512], ep[512];
  const char *why;
  lock_path(name, path, sizeof path);
  snprintf(ep, sizeof ep, SHM_DIR "%s", name);
  for (int held = 0;;) {
    int fd = own_open(path, O_RDWR | O_CREAT, &why);
    if (fd < 0)
      return fd == -XPORT_EADDRINUSE ? refuse(path, why, name, quiet) : fd;
    if (flock(fd, LOCK_EX | LOCK_NB)) {
      close(fd);
      /* A sweep (shm_sweep: another context opening, in this process or
       * another) may hold it, and unlink it, meanwhile; a live owner
       * holds it still after these tries. */
      if (++held < CLAIM_TRIES) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        continue;
      }
      return -XPORT_EADDRINUSE; /* a live process holds it */
    }
    /* The file may have been unlinked by its previous owner between our
     * open and lock: then lock the new one. */
    struct stat a, b;
    if (fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_ino == b.st_ino) {
      /* An endpoint file left by an owner that died goes; one that is not
       * ours stays, and so does the name: shm would map it as ours. */
      if (!own_or_none(ep, &why)) {
        unlink(path); /* ours, and locked: as shm_release_name does */
        close(fd);
        return refuse(ep, why, name, quiet);
      }
      unlink(ep);
      *lock_p = fd;
      return 0;
    }
    close(fd);
  }
}

static int shm_claim_name(const char *name, int *lock_p)
{
  int ret = claim(name, lock_p, 0);
  if (!ret)
    own_track(name, 1);
  return ret;
}

static void shm_release_name(const char *name, int lock)
{
  char path[512];
  own_track(name, 0);
  lock_path(name, path, sizeof path);
  unlink(path); /* while still holding the lock: see the inode check above */
  if (lock >= 0)
    close(lock);
}

static int shm_name_alive(const char *name)
{
  char path[512];
  lock_path(name, path, sizeof path);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return 0;
  int alive = flock(fd, LOCK_SH | LOCK_NB) != 0;
  close(fd);
  return alive;
}

static int shm_name_same_user(const char *name)
{
  char path[512];
  struct stat st;
  lock_path(name, path, sizeof path);
  return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
}

static int shm_name_exists(const char *name)
{
  char path[512];
  struct stat st;
  /* shm's own names carry a scheme that its files do not. */
  static const char *const schemes[] = {"fi_shm://", "fi_ns://"};
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if (!strncmp(name, schemes[i], strlen(schemes[i])))
      name += strlen(schemes[i]);
  if (!name[0] || strchr(name, '/') || strlen(name) > 255)
    return 0;
  snprintf(path, sizeof path, SHM_DIR "%s", name);
  return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* An endpoint with a message a live peer has yet to take (peer_may_map)
 * must keep its file however its process ends (exit, a kill, or a context
 * that leaves it open): while it has one, and for an hour after, its lock
 * file's time lies that far ahead, and sweep leaves a lock file from the
 * future alone. Once every such peer has taken it, the time is now again. */
#define SHM_KEEP_S 3600
static void shm_keep_name(const char *name, int lock, int keep)
{
  (void)name;
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec += keep ? SHM_KEEP_S : 0;
  t[1] = t[0];
  if (lock >= 0)
    futimens(lock, t);
}

/* "xport-PID-RANDOM": the pid is for people reading /dev/shm; whether
 * the owner lives is told by its lock (claim_name), which works across PID
 * namespaces and never mistakes a reused pid for the owner. */
static int shm_anon_name(char *name, size_t len)
{
  int n = snprintf(name, len, "xport-%ld-%016llx", (long)getpid(),
                   (unsigned long long)xport__random_key(8));
  return n > 0 && (size_t)n < len ? 0 : -XPORT_EINVAL;
}

/* Every xport endpoint file has a lock file whose lock its owner holds
 * for as long as it lives: a lock that can be taken means the owner is
 * gone, and both files go (the order shm_release_name keeps). Files of
 * other programs and of other users (whose lock files we cannot open)
 * are never touched. */
static void shm_sweep(void)
{
  DIR *d = opendir(SHM_DIR);
  struct dirent *e;
  int removed = 0;
  if (!d)
    return;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "xport-", 6) || n < 6 + 5 || strcmp(e->d_name + n - 5, ".lock") ||
        n - 5 >= XPORT__ADDR_MAX)
      continue;
    char name[XPORT__ADDR_MAX], path[512], ep[512];
    memcpy(name, e->d_name, n - 5);
    name[n - 5] = '\0';
    lock_path(name, path, sizeof path);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
      continue;
    struct stat a, b;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && lstat(path, &b) == 0 &&
        a.st_ino == b.st_ino && S_ISREG(a.st_mode) && a.st_uid == geteuid() &&
        a.st_mtime <= time(NULL)) {
      const char *why;
      snprintf(ep, sizeof ep, SHM_DIR "%s", name);
      if (own_or_none(ep, &why))
        unlink(ep);
      unlink(path); /* while holding the lock, as shm_release_name does */
      removed++;
    }
    close(fd);
  }
  closedir(d);
  if (removed)
    XPORT__INFO("shm: removed the files of %d endpoints whose processes are gone", removed);
}

/* The endpoint name in a peer's address, without shm's scheme; NULL
 * where the address holds none. */
static const char *peer_name(const void *addr, size_t len, char *name, size_t size)
{
  if (!len || len > size)
    return NULL;
  memcpy(name, addr, len);
  name[len - 1] = '\0';
  return strncmp(name, SHM_PREFIX, strlen(SHM_PREFIX)) ? name : name + strlen(SHM_PREFIX);
}

/* Whether the owner of an anonymous name (they start with its pid) lives. */
static int pid_alive(const char *n)
{
  long pid = strtol(n, NULL, 10);
  return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/* A dead peer's endpoint file stays in /dev/shm: remove it, when its
 * owner is really gone. */
static void shm_peer_gone(const void *addr, size_t len)
{
  char name[XPORT__ADDR_MAX], path[512];
  const char *n = peer_name(addr, len, name, sizeof name);
  if (!n)
    return;
  if (!strncmp(n, "xport-", 6)) {
    /* Claiming the name of a dead listener removes its endpoint file;
     * releasing it removes the lock file. A live owner keeps both. */
    int lock;
    if (claim(n, &lock, 1) == 0)
      shm_release_name(n, lock);
    return;
  }
  if (strtol(n, NULL, 10) <= 0 || pid_alive(n))
    return; /* not a name that says its owner */
  snprintf(path, sizeof path, SHM_DIR "%s", n);
  unlink(path);
}

/* A peer whose process is gone never takes our name: its lock tells for
 * xport's names, the pid for others' (a name that is no pid is taken as
 * alive while its file is there). */
static int shm_peer_may_map(const void *addr, size_t len)
{
  char name[XPORT__ADDR_MAX];
  const char *n = peer_name(addr, len, name, sizeof name);
  if (!n)
    return 0;
  if (!strncmp(n, "xport-", 6))
    return shm_name_alive(n);
  return strtol(n, NULL, 10) > 0 ? pid_alive(n) : shm_name_exists(n);
}

/* ---- a dead peer's region lock ----------------------------------------
 *
 * libfabric 1.17's shm serialises every sender to an endpoint with a
 * spinlock that lives in the receiver's region (smr_generic_sendmsg,
 * smr_generic_rma, smr_generic_atomic), and the receiver holds the same
 * lock while its progress serves its command queue, copies of large
 * messages included. A receiver killed there leaves it taken for ever:
 * the next send to it spins inside the provider, where no check of xport's
 * ever runs (a streaming sender hung in about 1 run in 12). So while this
 * process watches shm peers, a thread of its own sleeps on their pidfds,
 * and when one dies gives back the lock its region holds: nothing else
 * ever can, and nothing lives on that region any more.
 *
 * A sender killed inside its send leaves the lock of the receiver's own
 * region taken the same way, and then the receiver spins in its own
 * progress (fi_cq_read) for ever: wal --kill-follower hung its leader in
 * about 1 run in 30 under load. That lock is shared with live senders and
 * with this process's own progress, and records no holder: after a
 * peer's death the thread frees one only where, for STUCK_MS, it is never
 * seen free and nothing in the region's head moves (own_unstick_all). */

/* offsetof(struct smr_region, lock) in libfabric 1.17 (include/ofi_shm.h:
 * version, resv, flags, pid, cma_cap_peer, cma_cap_self, base_addr); the
 * lock is glibc's pthread_spinlock_t, 1 when free. */
#define REGION_LOCK_OFFSET 24
/* SMR_VERSION of that layout, the region's first byte: a region of
 * another layout is never written. */
#define REGION_VERSION 4
/* The layout above is 1.17's (v1.17.0 and v1.17.1 alike); a libfabric of
 * another release is never written into, and a peer that dies holding
 * its lock there hangs its senders as before (said at info). */
static int region_layout_known(void)
{
#if defined(__x86_64__) && defined(__GLIBC__)
  /* glibc's x86-64 spinlock: 1 free, 0 or less taken; checked, not
   * assumed (other libcs and machines count the other way). */
  static int spin_ok = -1;
  if (spin_ok < 0) {
    pthread_spinlock_t t;
    int ok = sizeof t == sizeof(int) && !pthread_spin_init(&t, PTHREAD_PROCESS_PRIVATE);
    ok = ok && *(volatile int *)&t == 1 && !pthread_spin_lock(&t) && *(volatile int *)&t <= 0;
    ok = ok && !pthread_spin_unlock(&t) && *(volatile int *)&t == 1;
    spin_ok = ok;
  }
  uint32_t v = fi_version();
  return spin_ok && FI_MAJOR(v) == 1 && FI_MINOR(v) == 17;
#else
  return 0;
#endif
}
#define WATCH_MAX 256

struct region_watch {
  int pidfd;
  ino_t ino;                     /* the region's file, as it was when watched */
  const uint8_t *head;           /* its first bytes, mapped read-only, or NULL */
  char path[XPORT__ADDR_MAX + 16];
};
#define HEAD_LEN (REGION_LOCK_OFFSET + sizeof(int))

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct region_watch watches[WATCH_MAX];
static int nwatches;
static int watch_efd = -1; /* wakes the thread for a new watch */
static pid_t watch_owner;  /* the process that started the thread (not a fork's child) */

/* This process's own endpoints (the names it claimed), whose locks a
 * sender that dies may hold; a fork's child starts with none (own_forked).
 * Under watch_mu. */
#define OWN_MAX 256
static char owns[OWN_MAX][XPORT__ADDR_MAX];
static int nowns;
/* How long a lock of our own must stay taken, never seen free and the
 * region's counters still, after a peer died, to be taken for the dead
 * one's. A live holder lets go within microseconds, unless it is stopped
 * (a debugger, SIGSTOP) or is this process's progress copying one huge
 * message by cross-memory attach (seconds for tens of GB); the looks are
 * counted too, so that a watcher that slept through the time does not
 * decide. */
#define STUCK_MS 5000
#define STUCK_LOOKS 1000
/* struct smr_region of 1.17 up to sar_cnt: pid at 4 (written last when
 * the region is made), cmd_cnt at 48, sar_cnt at 56. */
#define REGION_PID_OFFSET 4
#define REGION_CMD_CNT_OFFSET 48
#define REGION_SAR_CNT_OFFSET 56
#define OWN_HEAD_LEN 64

/* A fork's child: the parent's watcher may have held the mutex at the
 * fork, and the parent's endpoints are not the child's. */
static void own_forked(void)
{
  pthread_mutex_init(&watch_mu, NULL);
  nowns = 0;
}

static void own_atfork(void)
{
  pthread_atfork(NULL, NULL, own_forked);
}

/* Adds (add 1) or removes an endpoint of this process's own. */
static void own_track(const char *name, int add)
{
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, own_atfork);
  pthread_mutex_lock(&watch_mu);
  int i = 0;
  if (add) {
    if (nowns < OWN_MAX && strlen(name) < sizeof owns[nowns]) {
      snprintf(owns[nowns], sizeof owns[nowns], "%s", name);
      nowns++;
    } else {
      XPORT__INFO("shm: endpoint %s is not watched: a peer that dies inside a send to it "
                  "would hang it inside libfabric", name);
    }
  } else {
    while (i < nowns && strcmp(owns[i], name))
      i++;
    if (i < nowns)
      memmove(owns[i], owns[--nowns], sizeof owns[i]);
  }
  pthread_mutex_unlock(&watch_mu);
}

/* The first len bytes of the region file at path, mapped with prot (never
 * a link, nor another user's file), where it is the file ino (any, 0) and
 * holds that many; NULL otherwise. */
static void *head_map(const char *path, size_t len, int prot, ino_t ino)
{
  struct stat st;
  const char *why;
  void *m = MAP_FAILED;
  int fd = own_open(path, prot & PROT_WRITE ? O_RDWR : O_RDONLY, &why);
  if (fd < 0)
    return NULL;
  if (fstat(fd, &st) == 0 && (!ino || st.st_ino == ino) && st.st_size >= (off_t)len)
    m = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? NULL : m;
}

/* Frees the lock of the dead peer's region through a mapping of the
 * thread's own: libfabric may unmap its own at any moment (the endpoint's
 * close). A file that is gone, or is another region by now, is left. */
static void region_unlock(const struct region_watch *w)
{
  uint8_t *m = head_map(w->path, HEAD_LEN, PROT_READ | PROT_WRITE, w->ino);
  if (!m)
    return;
  int *lock = (int *)(m + REGION_LOCK_OFFSET);
  if (*(const volatile uint8_t *)m == REGION_VERSION && __atomic_load_n(lock, __ATOMIC_ACQUIRE) != 1) {
    __atomic_store_n(lock, 1, __ATOMIC_RELEASE);
    XPORT__INFO("shm: a peer died holding its region's lock: released");
  }
  munmap(m, HEAD_LEN);
}

/* 1 if the lock at *lock is seen free in a burst of looks: one free look
 * clears a dead sender, whose lock would never be free again. */
static int lock_free_now(const int *lock)
{
  for (int i = 0; i < 64; i++)
    if (__atomic_load_n(lock, __ATOMIC_ACQUIRE) == 1)
      return 1;
  return 0;
}

/* Whether name is still one of this process's endpoints: its lock file
 * is held until it leaves the table, so the file mapped is still ours. */
static int own_still(const char *name)
{
  int still = 0;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < nowns && !still; i++)
    still = !strcmp(owns[i], name);
  pthread_mutex_unlock(&watch_mu);
  return still;
}

struct own_look {
  uint8_t *head; /* OWN_HEAD_LEN bytes of the region, mapped read-write */
  int lock;      /* the lock's value when the window began */
  size_t cmd_cnt, sar_cnt;
  long since;
  int looks;
  char name[XPORT__ADDR_MAX];
};

static int *own_lock(const struct own_look *o)
{
  return (int *)(o->head + REGION_LOCK_OFFSET);
}

/* Starts (again) the window in which o's lock must stay still. */
static void own_look_restart(struct own_look *o)
{
  o->lock = __atomic_load_n(own_lock(o), __ATOMIC_ACQUIRE);
  o->cmd_cnt = __atomic_load_n((const size_t *)(o->head + REGION_CMD_CNT_OFFSET), __ATOMIC_RELAXED);
  o->sar_cnt = __atomic_load_n((const size_t *)(o->head + REGION_SAR_CNT_OFFSET), __ATOMIC_RELAXED);
  o->since = xport__now_ms();
  o->looks = 0;
}

/* 1 while o looks held by a dead sender: never seen free, and nothing in
 * its head moved since the window began (a change starts it again). */
static int own_look_still(struct own_look *o)
{
  if (lock_free_now(own_lock(o)))
    return 0;
  if (__atomic_load_n(own_lock(o), __ATOMIC_ACQUIRE) != o->lock ||
      __atomic_load_n((const size_t *)(o->head + REGION_CMD_CNT_OFFSET), __ATOMIC_RELAXED) !=
          o->cmd_cnt ||
      __atomic_load_n((const size_t *)(o->head + REGION_SAR_CNT_OFFSET), __ATOMIC_RELAXED) !=
          o->sar_cnt)
    own_look_restart(o);
  o->looks++;
  return 1;
}

/* Maps the head of our region name, if it is one of 1.17's made by this
 * process and its lock is taken now; 0 when there is nothing to watch. */
static int own_look_open(struct own_look *o, const char *name)
{
  char path[XPORT__ADDR_MAX + 16];
  snprintf(path, sizeof path, SHM_DIR "%.*s", XPORT__ADDR_MAX - 1, name);
  uint8_t *m = head_map(path, OWN_HEAD_LEN, PROT_READ | PROT_WRITE, 0);
  if (!m)
    return 0; /* not made yet (the name is claimed first), or gone */
  o->head = m;
  snprintf(o->name, sizeof o->name, "%.*s", XPORT__ADDR_MAX - 1, name);
  if (*(volatile uint8_t *)m != REGION_VERSION ||
      *(volatile int *)(o->head + REGION_PID_OFFSET) != (int)getpid() || lock_free_now(own_lock(o))) {
    munmap(m, OWN_HEAD_LEN);
    return 0;
  }
  own_look_restart(o);
  return 1;
}

/* After a peer's death, this process's own regions whose locks are
 * taken, watched together: one that stays still for STUCK_MS and
 * STUCK_LOOKS looks was held by the dead sender, and is freed (from the
 * very value seen, so that a holder that came meanwhile keeps it). What
 * the sender had half done stays: an inject or segment buffer of the
 * region it had taken is lost to it (libfabric keeps no record). */
static void own_unstick_all(void)
{
  static struct own_look looks[OWN_MAX];
  char names[OWN_MAX][XPORT__ADDR_MAX];
  int n = 0, k = 0;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < nowns; i++)
    memcpy(names[n++], owns[i], XPORT__ADDR_MAX);
  pthread_mutex_unlock(&watch_mu);
  for (int i = 0; i < n; i++)
    k += own_look_open(&looks[k], names[i]);
  long t0 = xport__now_ms();
  while (k) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    for (int i = 0; i < k; i++) {
      struct own_look *o = &looks[i];
      int still = own_look_still(o);
      if (still && o->looks >= STUCK_LOOKS && xport__now_ms() - o->since >= STUCK_MS &&
          own_still(o->name) && *(volatile int *)(o->head + REGION_PID_OFFSET) == (int)getpid()) {
        int v = o->lock;
        if (__atomic_compare_exchange_n(own_lock(o), &v, 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
          XPORT__WARN("shm: a peer died inside a send to endpoint %s and left its lock taken "
                      "(libfabric 1.17): freed %ld ms after the death; a buffer the sender took "
                      "there may be lost to the endpoint", o->name, xport__now_ms() - t0);
        still = 0;
      }
      if (!still) {
        munmap(o->head, OWN_HEAD_LEN);
        looks[i--] = looks[--k];
      }
    }
  }
}

static void *region_watcher(void *arg)
{
  (void)arg;
  for (;;) {
    struct pollfd p[WATCH_MAX + 1];
    int n = 1;
    p[0] = (struct pollfd){.fd = watch_efd, .events = POLLIN};
    pthread_mutex_lock(&watch_mu);
    for (int i = 0; i < nwatches; i++, n++) {
      p[n] = (struct pollfd){.fd = watches[i].pidfd, .events = POLLIN};
    }
    pthread_mutex_unlock(&watch_mu);
    if (poll(p, (nfds_t)n, -1) <= 0)
      continue;
    uint64_t v;
    if ((p[0].revents & POLLIN) && read(watch_efd, &v, sizeof v) < 0)
      continue;
    int died = 0;
    for (int i = 1; i < n; i++) {
      if (!p[i].revents)
        continue;
      struct region_watch w = {.pidfd = -1};
      pthread_mutex_lock(&watch_mu);
      for (int j = 0; j < nwatches; j++)
        if (watches[j].pidfd == p[i].fd) {
          w = watches[j];
          watches[j] = watches[--nwatches];
          break;
        }
      pthread_mutex_unlock(&watch_mu);
      if (w.pidfd >= 0) {
        region_unlock(&w);
        close(w.pidfd);
        if (w.head)
          munmap((void *)w.head, HEAD_LEN);
        died = 1;
      }
    }
    if (died)
      own_unstick_all(); /* once for every death of this wake */
  }
  return NULL;
}

/* Starts the thread, once per process (a fork's child starts its own). */
static int watcher_start(void)
{
  if (watch_owner == getpid())
    return 0;
  nwatches = 0; /* a child's copy of its parent's watches is not its own */
  watch_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (watch_efd < 0)
    return -1;
  pthread_t tid;
  pthread_attr_t attr;
  sigset_t all, old;
  sigfillset(&all);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals stay its own */
  int ret = pthread_create(&tid, &attr, region_watcher, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (ret) {
    close(watch_efd);
    watch_efd = -1;
    return -1;
  }
  watch_owner = getpid();
  return 0;
}

/* Watches the process pid, whose endpoint is at addr, until it dies. */
static void shm_peer_watch(const void *addr, size_t len, uint32_t pid)
{
  char name[XPORT__ADDR_MAX];
  struct region_watch w;
  struct stat st;
  const char *n = peer_name(addr, len, name, sizeof name);
  if (!n)
    return;
  snprintf(w.path, sizeof w.path, SHM_DIR "%s", n);
  if (stat(w.path, &st))
    return;
  w.ino = st.st_ino;
  pthread_mutex_lock(&watch_mu);
  int known = 0;
  for (int i = 0; i < nwatches && watch_owner == getpid(); i++)
    known |= watches[i].ino == st.st_ino;
  int pidfd = -1;
#ifdef SYS_pidfd_open
  if (!known && nwatches < WATCH_MAX && region_layout_known() && !watcher_start())
    pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#endif
  if (pidfd >= 0) {
    w.pidfd = pidfd;
    w.head = head_map(w.path, HEAD_LEN, PROT_READ, w.ino);
    watches[nwatches++] = w;
    uint64_t one = 1;
    if (write(watch_efd, &one, sizeof one) < 0)
      XPORT__DEBUG("shm: the region watcher was not woken");
  } else if (!known) {
    XPORT__INFO("shm: a peer's region is not watched: if it dies holding its lock, sends "
                "to it hang inside libfabric");
  }
  pthread_mutex_unlock(&watch_mu);
}

/* Whether the watched peer at addr holds its region's lock right now
 * (read through the watch's own read-only mapping; a peer not watched,
 * or of another layout, is taken as free). */
static int shm_peer_locked(const void *addr, size_t len)
{
  char name[XPORT__ADDR_MAX], path[XPORT__ADDR_MAX + 16];
  const char *n = peer_name(addr, len, name, sizeof name);
  if (!n)
    return 0;
  snprintf(path, sizeof path, SHM_DIR "%s", n);
  int locked = 0;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < nwatches && watch_owner == getpid(); i++)
    if (watches[i].head && !strcmp(watches[i].path, path)) {
      const uint8_t *h = watches[i].head;
      locked = *(const volatile uint8_t *)h == REGION_VERSION &&
               __atomic_load_n((const int *)(h + REGION_LOCK_OFFSET), __ATOMIC_ACQUIRE) != 1;
      break;
    }
  pthread_mutex_unlock(&watch_mu);
  return locked;
}

/* Cross-memory attach copies large messages in one step, but needs the
 * right to ptrace the peer. Where Yama or a seccomp filter forbids it,
 * say so and make shm use its copy path from the start, rather than
 * failing on the first large message. */
static void shm_preinit(void)
{
  if (getenv("FI_SHM_DISABLE_CMA"))
    return;
  int scope = 0;
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (f) {
    if (fscanf(f, "%d", &scope) != 1)
      scope = 0;
    fclose(f);
  }
  char probe = 1, copy = 0;
  struct iovec local = {&copy, 1}, remote = {&probe, 1};
  int self_ok = process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1;
  int allowed = self_ok && (scope == 0 || (scope < 3 && geteuid() == 0));
  if (allowed)
    return;
  setenv("FI_SHM_DISABLE_CMA", "1", 0);
  XPORT__INFO("shm: cross-memory attach is not permitted here (%s); large messages "
              "use shm's copy path", self_ok ? "ptrace_scope forbids it" : "process_vm_readv "
              "fails");
}

/* A peer's command queue has 1024 slots, and a one-sided operation takes
 * two (libfabric 1.17, smr_generic_rma): at this depth the provider takes
 * a connection's posts (none waiting in xport, conn->held) unless a read
 * or another connection holds that peer's channel. */
static size_t shm_tx_depth(void) { return 512; }

const struct xport__profile xport__profile_shm = {
  .name = "shm",
  .hung_keeps_buffers = 1,
  .rank = 40,
  .explicit_only = NULL,
  .manual_progress = 1,
  .preinit = shm_preinit,
  .rma_never_fails = 1,
  /* A delivery-complete write or message of up to 4 KiB takes the peer's
   * one segmented-copy slot, and shm refuses anything else to that peer
   * (EAGAIN) until it completes; an empty one never arrives. */
  .dc_holds_peer = 1,
  /* fi_av_remove unmaps the peer's region from the endpoint
   * (smr_unmap_from_endpoint), but commands that peer already queued are
   * still processed, and answered into its region, on the next progress:
   * a peer still writing when its connection closes (or the context goes)
   * crashed the process inside fi_cq_read. */
  .close_needs_quiet = 1,
  /* smr_progress_resp takes its endpoint's response queue in order and
   * stops at the first entry still busy: a dead target's never clears. */
  .answers_in_order = 1,
  /* smr_map_to_region takes a same-process peer's region from the
   * process's list of endpoints instead of mapping it, and the peer's
   * close frees it: the other context's next send (its goodbye, at the
   * latest) crashed. */
  .in_process_peers_unsafe = 1,
  .node_local = 1,
  .max_tx_depth = shm_tx_depth,
  .truncation_hangs = 1,
  /* Measured: 6 clients each sending a write_imm every 5 messages to a
   * server with 2 receives posted per connection lost 40% of the
   * write_imms' messages (under the tag bit), none of the others. */
  .unexpected_tag_exact = 1,
  /* With virtual addresses and CMA shm checks no key or bound. */
  .clear_mr_mode = FI_MR_VIRT_ADDR,
  .listen_name = shm_listen_name,
  .claim_name = shm_claim_name,
  .release_name = shm_release_name,
  .name_alive = shm_name_alive,
  .name_exists = shm_name_exists,
  .name_same_user = shm_name_same_user,
  .anon_name = shm_anon_name,
  .sweep = shm_sweep,
  .peer_gone = shm_peer_gone,
  .peer_may_map = shm_peer_may_map,
  .peer_watch = shm_peer_watch,
  .peer_locked = shm_peer_locked,
  .keep_name = shm_keep_name,
};
