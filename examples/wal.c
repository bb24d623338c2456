/*
 * wal: log replication by write-with-immediate.
 *
 *   ./examples/wal [-n RECORDS] [-w IN_FLIGHT] [--fsync] [--kill-follower F] [--check]
 *
 * A leader and three followers (forked processes). Each follower registers
 * a 1 MiB ring and exports it to the leader. The leader appends every
 * record (a header with sequence number, length and checksum, then a
 * payload of 16 to 4096 bytes) at the same offset of every follower's ring
 * with xport_write_imm, whose immediate value is that offset. A follower
 * sees the record once the receive it consumed completes (the data is in
 * place then), checks it, "persists" it (appends it to a file, with
 * fdatasync under --fsync) and acknowledges the highest sequence number it
 * has persisted without a gap. The leader commits a record once a majority
 * of the followers (2 of 3) have acknowledged it.
 *
 * Flow control: the leader never writes over a ring's bytes that its
 * follower has not persisted (it tracks each follower's acknowledgements),
 * never has more than WAL_WINDOW records unacknowledged at a follower (each
 * takes one of the receives the follower keeps posted), and never reuses its
 * own copy of a record before every write of it has completed.
 *
 * --kill-follower F (0, 1 or 2) SIGKILLs follower F after a third of the
 * records: the leader notices (an error completion or the disconnect
 * event), goes on with the other two, and at the end the parent checks
 * every byte of every record in each survivor's file, and that the killed
 * follower's file holds a correct prefix. Prints records per second and
 * the commit latency percentiles (from the record's making to its commit)
 * with at most IN_FLIGHT records uncommitted (default 64; -w 1: one at a
 * time, the latency of an idle log).
 */
#include <xport.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAL_FOLLOWERS 3
#define WAL_MAJORITY 2
#define WAL_RING (1u << 20)
#define WAL_WINDOW 64                /* records unacknowledged per follower */
#define WAL_RECVS (WAL_WINDOW + 8)   /* receives a follower keeps posted */
#define WAL_ACK_RECVS (WAL_WINDOW + 8) /* one ack per record at most */
#define WAL_ACK_SLOTS 8              /* ack send buffers at a follower */
#define WAL_MAX_PAYLOAD 4096u
#define WAL_HELLO 0x68656c6c6fu
#define WAL_FIN 0x66696eu

struct wal_header {
  uint64_t seq;
  uint32_t len; /* payload bytes */
  uint32_t sum; /* FNV-1a over seq, len and the payload */
};

/* A message between leader and follower: the leader's hello and fin, the
 * follower's key and acks. */
struct wal_msg {
  uint64_t kind; /* WAL_HELLO, WAL_FIN, or 0: an ack */
  uint64_t value; /* fin: the last record; ack: highest persisted */
  uint32_t rkey_len;
  uint8_t rkey[XPORT_RKEY_MAX_SIZE];
};
#define WAL_MSG_SHORT (2 * sizeof(uint64_t))

/* ---- records: what a record holds is a function of its number ----------- */

static uint32_t wal_payload_len(uint64_t seq)
{
  return 16 + (uint32_t)((seq * 2654435761u) >> 7) % (WAL_MAX_PAYLOAD - 15);
}

static uint8_t wal_byte(uint64_t seq, uint32_t i)
{
  return (uint8_t)(seq * 131u + i * 7u + (i >> 8) + (seq >> 8));
}

static uint32_t wal_sum(const struct wal_header *h, const uint8_t *payload)
{
  uint32_t s = 2166136261u;
  const uint8_t *p = (const uint8_t *)h;
  for (size_t i = 0; i < offsetof(struct wal_header, sum); i++)
    s = (s ^ p[i]) * 16777619u;
  for (uint32_t i = 0; i < h->len; i++)
    s = (s ^ payload[i]) * 16777619u;
  return s;
}

static size_t wal_size(uint64_t seq) /* in the ring: 8-byte aligned */
{
  return (sizeof(struct wal_header) + wal_payload_len(seq) + 7) & ~(size_t)7;
}

/* ---- common ------------------------------------------------------------- */

static const char *wal_who = "leader";
static int wal_is_leader = 1;
static pid_t wal_pids[WAL_FOLLOWERS];
static char wal_dir[256], wal_paths[WAL_FOLLOWERS][300]; /* made before any signal can come */

static void wal_cleanup(void)
{
  if (!wal_is_leader)
    return;
  for (int f = 0; f < WAL_FOLLOWERS; f++)
    if (wal_pids[f] > 0 && kill(wal_pids[f], SIGKILL) == 0)
      waitpid(wal_pids[f], NULL, 0);
  for (int f = 0; f < WAL_FOLLOWERS && wal_dir[0]; f++)
    unlink(wal_paths[f]);
  if (wal_dir[0])
    rmdir(wal_dir);
  wal_dir[0] = 0;
}

static void wal_die(const char *what, int rc)
{
  fprintf(stderr, "wal: %s: %s: %s\n", wal_who, what, xport_strerror(rc));
  wal_cleanup();
  exit(1);
}

static void wal_bad(const char *what)
{
  fprintf(stderr, "wal: %s: %s\n", wal_who, what);
  wal_cleanup();
  exit(1);
}

static uint64_t wal_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins on the completion queue (tcp and shm move data only while the
 * target polls) but yields now and then, for machines with fewer cores
 * than processes. */
static int wal_poll(xport_ctx_t *ctx, xport_completion_t *c, int max, unsigned *idle)
{
  int n = xport_poll(ctx, c, max);
  if (n < 0)
    wal_die("xport_poll", n);
  if (n == 0 && ++*idle % 64 == 0)
    sched_yield();
  if (n > 0)
    *idle = 0;
  return n;
}

#define WAL_CTX(kind, f, n) ((void *)(uintptr_t)((uint64_t)(kind) << 60 | (uint64_t)(f) << 56 | (n)))
#define WAL_KIND(u) ((unsigned)((uintptr_t)(u) >> 60))
#define WAL_F(u) ((int)(((uintptr_t)(u) >> 56) & 0xf))
#define WAL_N(u) ((uint64_t)(uintptr_t)(u) & ((1ull << 56) - 1))
enum { WAL_K_WRITE = 1, WAL_K_ACK, WAL_K_RKEY, WAL_K_SEND, WAL_K_HELLO };

/* ---- follower ------------------------------------------------------------ */

struct wal_follower {
  int id, fd, fsync;
  xport_ctx_t *ctx;
  xport_conn_t *conn;
  xport_mr_t *ring_mr;
  uint8_t *ring;
  struct wal_msg in[WAL_RECVS];   /* receives: writes with immediate data and the leader's messages */
  struct wal_msg out[WAL_ACK_SLOTS];
  int out_busy[WAL_ACK_SLOTS];
  int64_t where[WAL_WINDOW]; /* ring offset of record seq, by seq % window; -1: not here */
  uint64_t next;             /* next record to persist */
  uint64_t acked, fin;
  int hello;
};

static void wal_follower_post(struct wal_follower *w, unsigned slot)
{
  int rc = xport_recv(w->conn, &w->in[slot], sizeof w->in[slot], NULL, WAL_CTX(WAL_K_WRITE, 0, slot));
  if (rc)
    wal_die("xport_recv", rc);
}

/* Sends msg from a free ack slot; 0 when none is free yet. */
static int wal_follower_send(struct wal_follower *w, const struct wal_msg *msg, size_t len)
{
  for (unsigned s = 0; s < WAL_ACK_SLOTS; s++) {
    if (w->out_busy[s])
      continue;
    w->out[s] = *msg;
    int rc = xport_send(w->conn, &w->out[s], len, NULL, WAL_CTX(WAL_K_SEND, 0, s));
    if (rc == -XPORT_EAGAIN)
      return 0;
    if (rc)
      wal_die("xport_send", rc);
    w->out_busy[s] = 1;
    return 1;
  }
  return 0;
}

/* A record has landed at offset off: its header says which. */
static void wal_follower_landed(struct wal_follower *w, uint32_t off)
{
  if (off % 8 || off > WAL_RING - sizeof(struct wal_header))
    wal_bad("an immediate value that is no record's offset");
  const struct wal_header *h = (const struct wal_header *)(w->ring + off);
  if (h->seq < w->next || h->seq >= w->next + WAL_WINDOW || w->where[h->seq % WAL_WINDOW] >= 0)
    wal_bad("a record outside the window");
  w->where[h->seq % WAL_WINDOW] = off;
}

static void wal_follower_completion(struct wal_follower *w, const xport_completion_t *c)
{
  if (c->op == XPORT_OP_DISCONNECT)
    wal_die("the leader went away", c->status ? c->status : -XPORT_ECONNRESET);
  if (c->status)
    wal_die(c->hint ? c->hint : "completion", c->status);
  unsigned slot = (unsigned)WAL_N(c->user_ctx);
  if (c->op == XPORT_OP_SEND) {
    w->out_busy[slot] = 0;
  } else if (c->op == XPORT_OP_REMOTE_WRITE_IMM) {
    wal_follower_landed(w, c->imm);
    wal_follower_post(w, slot);
  } else if (c->op == XPORT_OP_RECV && c->len >= WAL_MSG_SHORT && w->in[slot].kind == WAL_HELLO) {
    w->hello = 1;
    wal_follower_post(w, slot);
  } else if (c->op == XPORT_OP_RECV && c->len >= WAL_MSG_SHORT && w->in[slot].kind == WAL_FIN) {
    w->fin = w->in[slot].value;
  } else {
    wal_bad("an unexpected completion");
  }
}

/* Checks and appends, in order, every record that has landed. */
static void wal_follower_persist(struct wal_follower *w)
{
  int64_t off;
  while ((off = w->where[w->next % WAL_WINDOW]) >= 0) {
    const struct wal_header *h = (const struct wal_header *)(w->ring + off);
    const uint8_t *payload = (const uint8_t *)(h + 1);
    if (h->seq != w->next || h->len != wal_payload_len(h->seq) ||
        (size_t)off + sizeof *h + h->len > WAL_RING || h->sum != wal_sum(h, payload))
      wal_bad("a record arrived damaged");
    size_t len = sizeof *h + h->len, done = 0;
    while (done < len) {
      ssize_t k = write(w->fd, (const uint8_t *)h + done, len - done);
      if (k < 0 && errno != EINTR)
        wal_bad("cannot append to the log file");
      done += k > 0 ? (size_t)k : 0;
    }
    w->where[w->next % WAL_WINDOW] = -1;
    w->next++;
  }
  if (w->next - 1 > w->acked) {
    struct wal_msg ack = {.kind = 0, .value = w->next - 1};
    if (w->fsync && fdatasync(w->fd))
      wal_bad("fdatasync");
    if (wal_follower_send(w, &ack, WAL_MSG_SHORT))
      w->acked = ack.value; /* else the next pass acknowledges it, and more */
  }
}

static int wal_follower_sends_out(const struct wal_follower *w)
{
  for (unsigned s = 0; s < WAL_ACK_SLOTS; s++)
    if (w->out_busy[s])
      return 1;
  return 0;
}

static char wal_at[80] = "127.0.0.1:0"; /* where followers listen (-H HOST) */

static void wal_follower_setup(struct wal_follower *w, int addr_pipe)
{
  xport_listener_t *lst;
  char addr[128] = "";
  int rc;
  if ((rc = xport_ctx_create(NULL, &w->ctx)) || (rc = xport_listen(w->ctx, wal_at, &lst)) ||
      (rc = xport_listener_addr(lst, addr, sizeof addr)))
    wal_die("listen", rc);
  if (write(addr_pipe, addr, sizeof addr) != (ssize_t)sizeof addr)
    wal_bad("cannot tell the leader where");
  close(addr_pipe);
  if ((rc = xport_accept(lst, 30000, &w->conn)) || (rc = xport_listener_close(lst)))
    wal_die("xport_accept", rc);
  w->ring = mmap(NULL, WAL_RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (w->ring == MAP_FAILED)
    wal_bad("out of memory");
  if ((rc = xport_mr_reg(w->ctx, w->ring, WAL_RING, XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE, &w->ring_mr)))
    wal_die("xport_mr_reg", rc);
  /* Every write with immediate data takes one of these: the leader keeps
   * at most WAL_WINDOW records unacknowledged, and each is posted again as
   * soon as its completion is read. */
  for (unsigned s = 0; s < WAL_RECVS; s++)
    wal_follower_post(w, s);
}

static void wal_follower_export(struct wal_follower *w)
{
  xport_completion_t c[8];
  unsigned idle = 0;
  while (!w->hello)
    for (int n = wal_poll(w->ctx, c, 8, &idle), k = 0; k < n; k++)
      wal_follower_completion(w, &c[k]);
  struct wal_msg key = {.kind = WAL_HELLO};
  int len = xport_rkey_pack(w->ring_mr, 0, WAL_RING, key.rkey, sizeof key.rkey);
  if (len < 0)
    wal_die("xport_rkey_pack", len);
  key.rkey_len = (uint32_t)len;
  while (!wal_follower_send(w, &key, sizeof key))
    for (int n = wal_poll(w->ctx, c, 8, &idle), k = 0; k < n; k++)
      wal_follower_completion(w, &c[k]);
}

static void wal_follower(int id, int addr_pipe, int fsync_each)
{
  struct wal_follower w = {.id = id, .fsync = fsync_each, .next = 1};
  char who[32];
  xport_completion_t c[16];
  unsigned idle = 0;
  int rc;
  snprintf(who, sizeof who, "follower %d", id);
  wal_who = who;
  if ((w.fd = open(wal_paths[id], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600)) < 0)
    wal_bad("cannot create the log file");
  for (int i = 0; i < WAL_WINDOW; i++)
    w.where[i] = -1;
  wal_follower_setup(&w, addr_pipe);
  wal_follower_export(&w);
  /* Until the leader's fin, and our last ack has left. */
  while (!w.fin || w.next - 1 < w.fin || w.acked < w.fin || wal_follower_sends_out(&w)) {
    int n = wal_poll(w.ctx, c, 16, &idle);
    for (int k = 0; k < n; k++)
      wal_follower_completion(&w, &c[k]);
    wal_follower_persist(&w);
  }
  if ((rc = xport_conn_close(w.conn)) || (rc = xport_mr_dereg(w.ring_mr)) || (rc = xport_ctx_destroy(w.ctx)))
    wal_die("teardown", rc);
  munmap(w.ring, WAL_RING);
  if (close(w.fd))
    wal_bad("cannot close the log file");
}

/* ---- leader --------------------------------------------------------------- */

struct wal_peer {
  xport_conn_t *conn;
  xport_rkey_t *rkey;
  struct wal_msg in[WAL_ACK_RECVS + 1]; /* the last one: the key */
  uint64_t sent, acked;
  int dead, closed, fin_sent;
  const char *how_lost;
};

struct wal_leader {
  xport_ctx_t *ctx;
  xport_mr_t *mr;
  uint8_t *ring; /* the leader's copy: record seq at the offset it has everywhere */
  struct wal_peer peer[WAL_FOLLOWERS];
  uint64_t n, produced, committed, retired, pos;
  uint64_t *rec_pos, *t_post, *lat;
  uint8_t *writes_out; /* writes of each record not completed yet */
  uint64_t window; /* records produced and not committed, at most */
  int kill, killed_at;
  uint64_t kill_after;
  struct wal_msg fin;
};

static void wal_leader_lose(struct wal_leader *l, int f, const char *how);

static void wal_leader_post_acks(struct wal_leader *l, int f, unsigned slot)
{
  if (l->peer[f].dead)
    return;
  int rc = xport_recv(l->peer[f].conn, &l->peer[f].in[slot], sizeof l->peer[f].in[slot], NULL,
                      WAL_CTX(slot == WAL_ACK_RECVS ? WAL_K_RKEY : WAL_K_ACK, f, slot));
  /* Acks that arrived before a loss still complete (with 0) before its
   * event (xport_conn_close(3)): the receive posted again for one is the
   * first to hear of it. */
  if (rc == -XPORT_ENOTCONN)
    wal_leader_lose(l, f, "xport_recv: not connected");
  else if (rc)
    wal_die("xport_recv", rc);
}

/* A follower is lost: the leader goes on without it. Its outstanding
 * operations still complete (each exactly once), and are counted. */
static void wal_leader_lose(struct wal_leader *l, int f, const char *how)
{
  struct wal_peer *p = &l->peer[f];
  if (p->dead)
    return;
  p->dead = 1;
  p->how_lost = how;
  printf("wal: leader: follower %d lost (%s) with %llu records acknowledged\n", f, how,
         (unsigned long long)p->acked);
  int live = 0;
  for (int g = 0; g < WAL_FOLLOWERS; g++)
    live += !l->peer[g].dead;
  if (live < WAL_MAJORITY)
    wal_bad("no majority left");
}

static void wal_leader_close(struct wal_leader *l, int f)
{
  struct wal_peer *p = &l->peer[f];
  int rc;
  if (p->closed)
    return;
  p->closed = 1;
  /* The key may go after its connection (nothing is posted with it any
   * more); xport_rkey_release(3) only asks for it before the context. */
  if ((rc = xport_rkey_release(p->rkey)) || (rc = xport_conn_close(p->conn)))
    wal_die("closing a follower's connection", rc);
}

/* Produces the next record into the leader's ring copy, if there is room:
 * its bytes must not cover a record some live follower has not persisted,
 * or whose writes have not all completed. */
static int wal_leader_produce(struct wal_leader *l)
{
  uint64_t seq = l->produced + 1, pos = l->pos, size = wal_size(seq);
  if (l->produced - l->committed >= l->window)
    return 0; /* as many in flight as asked: latency, not queueing, is measured */
  if (pos % WAL_RING + size > WAL_RING)
    pos += WAL_RING - pos % WAL_RING; /* never split a record at the wrap */
  if (l->retired < l->produced && pos + size - l->rec_pos[l->retired + 1] > WAL_RING)
    return 0;
  l->rec_pos[seq] = pos;
  l->pos = pos + size;
  struct wal_header *h = (struct wal_header *)(l->ring + pos % WAL_RING);
  uint8_t *payload = (uint8_t *)(h + 1);
  h->seq = seq;
  h->len = wal_payload_len(seq);
  for (uint32_t i = 0; i < h->len; i++)
    payload[i] = wal_byte(seq, i);
  h->sum = wal_sum(h, payload);
  l->t_post[seq] = wal_now_ns();
  l->produced = seq;
  return 1;
}

static void wal_leader_send_records(struct wal_leader *l, int f)
{
  struct wal_peer *p = &l->peer[f];
  while (!p->dead && p->sent < l->produced && p->sent + 1 - p->acked <= WAL_WINDOW) {
    uint64_t seq = p->sent + 1, off = l->rec_pos[seq] % WAL_RING;
    int rc = xport_write_imm(p->conn, l->ring + off, sizeof(struct wal_header) + wal_payload_len(seq), l->mr,
                             p->rkey, off, (uint32_t)off, WAL_CTX(WAL_K_WRITE, f, seq));
    if (rc == -XPORT_EAGAIN)
      return; /* poll, then post again */
    if (rc == -XPORT_ENOTCONN) {
      wal_leader_lose(l, f, "xport_write_imm: not connected");
      return;
    }
    if (rc)
      wal_die("xport_write_imm", rc);
    l->writes_out[seq]++;
    p->sent = seq;
  }
}

/* The records acknowledged by a majority: the WAL_MAJORITY-th highest
 * acknowledgement. A lost follower's last one still counts: it had
 * persisted those records before it went. */
static void wal_leader_commit(struct wal_leader *l)
{
  uint64_t a[WAL_FOLLOWERS];
  for (int f = 0; f < WAL_FOLLOWERS; f++)
    a[f] = l->peer[f].acked;
  for (int i = 0; i < WAL_FOLLOWERS; i++) /* sort, highest first */
    for (int j = i + 1; j < WAL_FOLLOWERS; j++)
      if (a[j] > a[i]) {
        uint64_t t = a[i];
        a[i] = a[j], a[j] = t;
      }
  uint64_t now = wal_now_ns();
  while (l->committed < a[WAL_MAJORITY - 1]) {
    l->committed++;
    l->lat[l->committed - 1] = now - l->t_post[l->committed];
  }
}

/* A record's copy may be overwritten once every write of it has completed
 * and every live follower has persisted it. */
static void wal_leader_retire(struct wal_leader *l)
{
  while (l->retired < l->produced) {
    uint64_t seq = l->retired + 1;
    if (l->writes_out[seq])
      return;
    for (int f = 0; f < WAL_FOLLOWERS; f++)
      if (!l->peer[f].dead && l->peer[f].acked < seq)
        return;
    l->retired = seq;
  }
}

static void wal_leader_ack(struct wal_leader *l, int f, const xport_completion_t *c)
{
  struct wal_peer *p = &l->peer[f];
  unsigned slot = (unsigned)WAL_N(c->user_ctx);
  const struct wal_msg *m = &p->in[slot];
  if (c->len != WAL_MSG_SHORT || m->kind != 0 || m->value > p->sent)
    wal_bad("a follower's ack makes no sense");
  if (m->value > p->acked) /* receives may complete out of order (rxm) */
    p->acked = m->value;
  wal_leader_post_acks(l, f, slot);
  wal_leader_commit(l);
}

static void wal_leader_completion(struct wal_leader *l, const xport_completion_t *c)
{
  unsigned kind = WAL_KIND(c->user_ctx);
  int f = c->op == XPORT_OP_DISCONNECT ? -1 : WAL_F(c->user_ctx);
  for (int g = 0; f < 0 && g < WAL_FOLLOWERS; g++)
    if (l->peer[g].conn == c->conn)
      f = g;
  if (f < 0)
    wal_bad("a completion of no follower's");
  struct wal_peer *p = &l->peer[f];
  if (kind == WAL_K_WRITE)
    l->writes_out[WAL_N(c->user_ctx)]--;
  /* After our fin a survivor closes: its disconnect, and the receives it
   * ends here (or our close cancels), are the expected end. */
  int ending = p->fin_sent && (c->status == -XPORT_ECONNRESET || c->status == -XPORT_ECANCELED);
  if (c->op == XPORT_OP_DISCONNECT) {
    if (!p->fin_sent)
      wal_leader_lose(l, f, "its disconnect event");
    wal_leader_close(l, f); /* after the event, the handle is ours to close */
  } else if (c->status && !ending && !p->dead) {
    wal_leader_lose(l, f, xport_strerror(c->status));
  } else if (kind == WAL_K_ACK && !c->status) {
    wal_leader_ack(l, f, c);
  }
}

static void wal_leader_kill(struct wal_leader *l)
{
  int f = l->kill;
  if (kill(wal_pids[f], SIGKILL) || waitpid(wal_pids[f], NULL, 0) != wal_pids[f])
    wal_bad("cannot kill the follower");
  wal_pids[f] = 0; /* reaped at once, so nothing takes it for alive */
  l->killed_at = (int)l->produced;
  printf("wal: leader: SIGKILLed follower %d after record %llu\n", f, (unsigned long long)l->produced);
}

static int wal_leader_done(const struct wal_leader *l)
{
  if (l->committed < l->n)
    return 0;
  for (int f = 0; f < WAL_FOLLOWERS; f++)
    if (!l->peer[f].dead && l->peer[f].acked < l->n)
      return 0;
  return 1;
}

static void wal_leader_connect(struct wal_leader *l, const char addrs[][128])
{
  xport_completion_t c[8];
  unsigned idle = 0;
  int rc;
  for (int f = 0; f < WAL_FOLLOWERS; f++) {
    struct wal_peer *p = &l->peer[f];
    if ((rc = xport_connect(l->ctx, addrs[f], 30000, &p->conn)))
      wal_die("xport_connect", rc);
    /* The key first, then the acks, in posting order; then our hello. */
    wal_leader_post_acks(l, f, WAL_ACK_RECVS);
    for (unsigned s = 0; s < WAL_ACK_RECVS; s++)
      wal_leader_post_acks(l, f, s);
    l->fin.kind = WAL_HELLO;
    if ((rc = xport_send(p->conn, &l->fin, WAL_MSG_SHORT, NULL, WAL_CTX(WAL_K_HELLO, f, 0))))
      wal_die("xport_send", rc);
  }
  for (int have = 0; have < 2 * WAL_FOLLOWERS;) /* each hello sent, each key received */
    for (int n = wal_poll(l->ctx, c, 8, &idle), k = 0; k < n; k++, have++) {
      int f = WAL_F(c[k].user_ctx);
      if (c[k].status || c[k].op == XPORT_OP_DISCONNECT)
        wal_die("a follower's key", c[k].status ? c[k].status : -XPORT_ECONNRESET);
      if (WAL_KIND(c[k].user_ctx) == WAL_K_RKEY &&
          (rc = xport_rkey_unpack(l->peer[f].conn, l->peer[f].in[WAL_ACK_RECVS].rkey,
                                  l->peer[f].in[WAL_ACK_RECVS].rkey_len, &l->peer[f].rkey)))
        wal_die("xport_rkey_unpack", rc);
    }
}

static void wal_leader_fin(struct wal_leader *l)
{
  xport_completion_t c[16];
  unsigned idle = 0;
  l->fin = (struct wal_msg){.kind = WAL_FIN, .value = l->n};
  for (;;) {
    int pending = 0;
    for (int f = 0; f < WAL_FOLLOWERS; f++) {
      struct wal_peer *p = &l->peer[f];
      if (p->dead || p->closed)
        continue;
      pending = 1;
      if (!p->fin_sent) {
        int rc = xport_send(p->conn, &l->fin, WAL_MSG_SHORT, NULL, WAL_CTX(WAL_K_SEND, f, 0));
        if (rc && rc != -XPORT_EAGAIN)
          wal_die("xport_send", rc);
        p->fin_sent = !rc;
      }
    }
    /* Then each survivor closes, and its disconnect ends our side. */
    if (!pending)
      break;
    for (int n = wal_poll(l->ctx, c, 16, &idle), k = 0; k < n; k++)
      wal_leader_completion(l, &c[k]);
  }
}

static void wal_leader_run(struct wal_leader *l)
{
  xport_completion_t c[32];
  unsigned idle = 0;
  while (!wal_leader_done(l)) {
    while (l->produced < l->n && wal_leader_produce(l))
      if (l->kill >= 0 && !l->killed_at && l->produced == l->kill_after)
        wal_leader_kill(l);
    for (int f = 0; f < WAL_FOLLOWERS; f++)
      wal_leader_send_records(l, f);
    int n = wal_poll(l->ctx, c, 32, &idle);
    for (int k = 0; k < n; k++)
      wal_leader_completion(l, &c[k]);
    wal_leader_retire(l);
  }
}

/* What the watchdog says of the leader's progress: where it stood. */
static const struct wal_leader *wal_state;

static char *wal_put(char *o, const char *s)
{
  while (*s)
    *o++ = *s++;
  return o;
}

static char *wal_put_u(char *o, uint64_t v) /* no printf in a signal handler */
{
  char d[24];
  int n = 0;
  do
    d[n++] = (char)('0' + v % 10);
  while (v /= 10);
  while (n)
    *o++ = d[--n];
  return o;
}

static void wal_watchdog(int sig) /* async-signal-safe calls only */
{
  char line[512], *o = line;
  (void)sig;
  o = wal_put(wal_put(wal_put(o, "wal: "), wal_who), ": watchdog: no end in sight");
  const struct wal_leader *l = wal_state;
  if (l) {
    o = wal_put_u(wal_put(o, " (produced "), l->produced);
    o = wal_put_u(wal_put(o, ", committed "), l->committed);
    o = wal_put_u(wal_put(o, ", retired "), l->retired);
    if (l->retired < l->produced)
      o = wal_put_u(wal_put(o, ", writes out of the oldest "), l->writes_out[l->retired + 1]);
    for (int f = 0; f < WAL_FOLLOWERS; f++) {
      o = wal_put_u(wal_put(o, "; follower "), (uint64_t)f);
      o = wal_put_u(wal_put(o, ": sent "), l->peer[f].sent);
      o = wal_put_u(wal_put(o, ", acked "), l->peer[f].acked);
      o = wal_put(o, l->peer[f].dead ? ", lost" : "");
      o = wal_put(o, l->peer[f].fin_sent ? ", fin sent" : "");
      o = wal_put(o, l->peer[f].closed ? ", closed" : "");
    }
    o = wal_put(o, ")");
  }
  *o++ = '\n';
  (void)!write(2, line, (size_t)(o - line));
  for (int f = 0; wal_is_leader && f < WAL_FOLLOWERS; f++) {
    if (wal_pids[f] > 0)
      kill(wal_pids[f], SIGKILL);
    if (wal_dir[0])
      unlink(wal_paths[f]);
  }
  if (wal_is_leader && wal_dir[0])
    rmdir(wal_dir);
  _exit(1);
}

/* ---- the parent: processes, verification, report ----------------------- */

static void wal_spawn(int addr_fds[][2], int fsync_each, unsigned watchdog_s)
{
  for (int f = 0; f < WAL_FOLLOWERS; f++) {
    if (pipe(addr_fds[f]))
      wal_bad("pipe");
    pid_t pid = fork();
    if (pid < 0)
      wal_bad("fork");
    if (pid == 0) {
      wal_is_leader = 0;
      alarm(watchdog_s);
      for (int g = 0; g <= f; g++)
        close(addr_fds[g][0]);
      wal_follower(f, addr_fds[f][1], fsync_each);
      fflush(stdout);
      _exit(0);
    }
    wal_pids[f] = pid;
    close(addr_fds[f][1]);
  }
}

/* Reads a follower's file: every record must be the one its number says,
 * byte for byte, in order. Returns the count; *torn: bytes after the last
 * whole record (only a killed follower may have them). */
static uint64_t wal_verify_file(int f, size_t *torn)
{
  FILE *fp = fopen(wal_paths[f], "rb");
  uint64_t count = 0;
  *torn = 0;
  if (!fp)
    return 0;
  static uint8_t payload[WAL_MAX_PAYLOAD];
  struct wal_header h;
  size_t got;
  while ((got = fread(&h, 1, sizeof h, fp)) == sizeof h) {
    uint64_t want = count + 1;
    if (h.seq != want || h.len != wal_payload_len(want) || fread(payload, 1, h.len, fp) != h.len) {
      *torn = sizeof h + 1; /* damaged, or cut short */
      break;
    }
    for (uint32_t i = 0; i < h.len; i++)
      if (payload[i] != wal_byte(want, i))
        *torn = sizeof h + 1;
    if (*torn || h.sum != wal_sum(&h, payload)) {
      *torn = sizeof h + 1;
      break;
    }
    count++;
  }
  if (got && got != sizeof h)
    *torn = got;
  fclose(fp);
  return count;
}

static int wal_cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void wal_report(struct wal_leader *l, double secs, const char *prov)
{
  qsort(l->lat, l->n, sizeof *l->lat, wal_cmp_u64);
  uint64_t bytes = 0;
  for (uint64_t s = 1; s <= l->n; s++)
    bytes += wal_payload_len(s);
  printf("wal: %llu records (%.1f MiB of payload) replicated to %d followers over %s, committed on %d of %d, "
         "at most %llu in flight\n",
         (unsigned long long)l->n, (double)bytes / (1 << 20), WAL_FOLLOWERS, prov, WAL_MAJORITY, WAL_FOLLOWERS,
         (unsigned long long)l->window);
  printf("wal: %.0f records/s, %.1f MiB/s; commit latency p50 %.1f us, p99 %.1f us, p999 %.1f us\n",
         (double)l->n / secs, (double)bytes / (1 << 20) / secs, (double)l->lat[(l->n - 1) / 2] / 1e3,
         (double)l->lat[(l->n - 1) * 99 / 100] / 1e3, (double)l->lat[(l->n - 1) * 999 / 1000] / 1e3);
}

/* Every survivor holds every record, the killed follower a correct prefix. */
static int wal_verify(const struct wal_leader *l, int *ok_files)
{
  int ok = 1;
  for (int f = 0; f < WAL_FOLLOWERS; f++) {
    size_t torn;
    uint64_t count = wal_verify_file(f, &torn);
    int killed = f == l->kill;
    int good = killed ? l->peer[f].dead && count >= l->peer[f].acked && count <= l->peer[f].sent
                      : !l->peer[f].dead && count == l->n && !torn;
    printf("wal: follower %d: %llu records in its file, every byte checked%s%s%s\n", f,
           (unsigned long long)count, killed ? " (killed" : "", killed && torn ? ", a torn record at the end" : "",
           killed ? ")" : "");
    if (!good)
      fprintf(stderr, "wal: follower %d: %s\n", f, killed ? "its file is not a prefix of what it acknowledged"
                                                            : "records missing or damaged");
    ok &= good;
    *ok_files += good && !killed;
  }
  return ok;
}

static void wal_usage(void)
{
  fprintf(stderr, "usage: wal [-n RECORDS] [-w IN_FLIGHT (1-%d)] [--fsync] [--kill-follower 0|1|2] "
          "[-H HOST] [--check]\n", WAL_WINDOW);
  exit(2);
}

static void wal_leader_setup(struct wal_leader *l, int addr_fds[][2])
{
  char addrs[WAL_FOLLOWERS][128];
  int rc;
  for (int f = 0; f < WAL_FOLLOWERS; f++) {
    if (read(addr_fds[f][0], addrs[f], sizeof addrs[f]) != (ssize_t)sizeof addrs[f])
      wal_bad("a follower did not start");
    close(addr_fds[f][0]);
  }
  l->rec_pos = calloc(l->n + 1, sizeof *l->rec_pos);
  l->t_post = calloc(l->n + 1, sizeof *l->t_post);
  l->lat = calloc(l->n + 1, sizeof *l->lat);
  l->writes_out = calloc(l->n + 1, 1);
  l->ring = mmap(NULL, WAL_RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!l->rec_pos || !l->t_post || !l->lat || !l->writes_out || l->ring == MAP_FAILED)
    wal_bad("out of memory");
  if ((rc = xport_ctx_create(NULL, &l->ctx)) ||
      (rc = xport_mr_reg(l->ctx, l->ring, WAL_RING, XPORT_ACCESS_LOCAL, &l->mr)))
    wal_die("setup", rc);
  wal_leader_connect(l, (const char(*)[128])addrs);
}

static void wal_leader_teardown(struct wal_leader *l)
{
  int rc;
  for (int f = 0; f < WAL_FOLLOWERS; f++)
    wal_leader_close(l, f);
  if ((rc = xport_mr_dereg(l->mr)) || (rc = xport_ctx_destroy(l->ctx)))
    wal_die("teardown", rc);
  munmap(l->ring, WAL_RING);
}

static void wal_leader_free(struct wal_leader *l) /* after the report, which reads them */
{
  free(l->rec_pos), free(l->t_post), free(l->lat), free(l->writes_out);
}

int main(int argc, char **argv)
{
  struct wal_leader l = {.n = 20000, .kill = -1, .window = WAL_WINDOW};
  int fsync_each = 0, check = 0, addr_fds[WAL_FOLLOWERS][2];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check"))
      check = 1, l.n = 3000;
    else if (!strcmp(argv[i], "--fsync"))
      fsync_each = 1;
    else if (!strcmp(argv[i], "-n") && i + 1 < argc)
      l.n = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "-w") && i + 1 < argc)
      l.window = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--kill-follower") && i + 1 < argc)
      l.kill = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-H") && i + 1 < argc) /* an RDMA NIC's address, for verbs */
      snprintf(wal_at, sizeof wal_at, strchr(argv[i + 1], ':') ? "[%s]:0" : "%s:0", argv[i + 1]), i++;
    else
      wal_usage();
  }
  if (l.n < 3 || l.n > 100000000 || l.kill < -1 || l.kill >= WAL_FOLLOWERS || l.window < 1 ||
      l.window > WAL_WINDOW)
    wal_usage();
  l.kill_after = l.n / 3;
  const char *tmp = getenv("TMPDIR");
  snprintf(wal_dir, sizeof wal_dir, "%s/xport-wal.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(wal_dir)) {
    wal_dir[0] = 0;
    wal_bad("mkdtemp");
  }
  for (int f = 0; f < WAL_FOLLOWERS; f++)
    snprintf(wal_paths[f], sizeof wal_paths[f], "%s/follower-%d.log", wal_dir, f);
  unsigned watchdog_s = 60 + (unsigned)(l.n / 1000) * (fsync_each ? 10 : 1);
  signal(SIGALRM, wal_watchdog);
  alarm(watchdog_s);
  /* Followers first: contexts do not cross fork (xport(7)). */
  wal_spawn(addr_fds, fsync_each, watchdog_s);
  wal_leader_setup(&l, addr_fds);
  wal_state = &l;
  xport_caps_t caps;
  int rc = xport_conn_query(l.peer[0].conn, &caps);
  if (rc)
    wal_die("xport_conn_query", rc);
  uint64_t t0 = wal_now_ns();
  wal_leader_run(&l);
  double secs = (double)(wal_now_ns() - t0) / 1e9;
  wal_leader_fin(&l);
  wal_leader_teardown(&l);
  int ok = 1, files = 0;
  for (int f = 0; f < WAL_FOLLOWERS; f++) {
    int st;
    if (wal_pids[f] > 0 && (waitpid(wal_pids[f], &st, 0) != wal_pids[f] || !WIFEXITED(st) || WEXITSTATUS(st)))
      ok = 0, fprintf(stderr, "wal: follower %d failed\n", f);
    wal_pids[f] = 0;
  }
  alarm(0);
  ok &= wal_verify(&l, &files);
  if (ok && !check)
    wal_report(&l, secs, caps.provider);
  if (ok)
    printf("wal: ok (%llu records committed and in all %d survivors' files, every byte checked%s; %.0f "
           "records/s)\n",
           (unsigned long long)l.n, files, l.kill >= 0 ? ", one follower killed mid-stream" : "",
           (double)l.n / secs);
  wal_leader_free(&l);
  wal_cleanup();
  return ok ? 0 : 1;
}
