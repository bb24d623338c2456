/* xshm: xport's own shared-memory transport for peers on this node
 * (XPORT_PROVIDER=xshm), beside libfabric rather than through it.
 *
 * - A connection is a segment of two single-producer rings, one per
 *   direction (a memfd the client makes and hands over on the listener's
 *   Unix socket, with nothing left in /dev/shm, and gone when both ends
 *   unmap it). A ring per connection, not one per receiver shared by all
 *   its senders: a sender stopped or killed half-way through a record
 *   holds up its own connection only.
 * - A message up to XSHM_EAGER bytes is copied into the ring and out into
 *   the receive it matches; a longer one sends only where it lies, and the
 *   receiver copies it out of the sender with process_vm_readv (cross-
 *   memory attach: one copy, the sender's CPU idle). One-sided reads and
 *   writes are the same calls from the initiator; the target's CPU never
 *   runs. A write-with-immediate is the write, then a record that consumes
 *   the target's receive.
 * - A message waits in the ring until a receive takes it: a sender ahead
 *   of the receiver fills its ring and is pushed back (EAGAIN, held by the
 *   core), and no memory of the receiver grows.
 * - The receiver reads every field a peer wrote as data that may be
 *   garbage: a bad record ends that connection, never a read or write
 *   outside the ring or the receive's buffer.
 * - The listener's Unix socket (abstract, so of this network namespace
 *   only) tells each end who the other is (SO_PEERCRED): another user, or
 *   another PID namespace, is refused. The socket stays open as the
 *   connection's life line: the peer's close or death ends it (EOF).
 * - The lane presents libfabric objects of its own (a CQ whose read runs
 *   the rings, a domain whose registrations go into a key table that
 *   peers map read-only and check before they touch this process's
 *   memory), so that the core runs on it unchanged. */
#define _GNU_SOURCE
#include "xshm.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- private parts ------------------------------------------------------ */

struct xshm_done {
  struct fi_cq_data_entry e;
  int err; /* FI_E* (positive), or 0 */
};

struct xshm_lane {
  /* The connections' doorbells (eventfds) and their sockets (a peer that
   * closes or dies makes its socket readable, event data the connection):
   * lane->cq_fd, in the context's set. */
  int epfd;
  int armed; /* its connections' rings are armed: the next read disarms */
  struct fid_fabric fabric;
  struct fid_domain domain;
  struct fid_cq cq;
  struct xshm_done *q; /* finished operations the core has yet to read */
  unsigned qsize, qhead, qtail;
  int keys_fd;
  struct xshm_key *keys;
  unsigned keys_next;
  uint32_t next_conn_id;
  long looked_ms; /* when housekeeping last looked at the sockets */
  int look_now;   /* a socket woke a sleeper: the next housekeeping looks */
};

/* Housekeeping looks at the connections' sockets (a peer's close or
 * death) and a job's listener at most this often: a look is a system call
 * per socket, and a process spinning in xport_poll runs housekeeping every
 * few microseconds (every XPORT__EQ_EVERY polls). */
#define XSHM_LOOK_MS 10

static struct xshm_lane *xl(const struct xport__lane *lane)
{
  return lane->tpd;
}

static void xshm_lost(xport_conn_t *conn, int status);

/* ---- the completion queue the core reads -------------------------------- */

static void done_push(struct xport__lane *lane, struct xport__req *req, size_t len,
                      uint64_t flags, uint64_t data, int err)
{
  struct xshm_lane *x = xl(lane);
  /* Room for every operation posted: the core never has more out than
   * max_posted, which the queue's size exceeds. */
  struct xshm_done *d = &x->q[x->qtail++ % x->qsize];
  d->e.op_context = &req->fictx;
  d->e.flags = flags;
  d->e.len = len;
  d->e.buf = NULL;
  d->e.data = data;
  d->err = err;
}

/* Orders a store before a later load (the doorbell's Dekker handshake:
 * one side publishes and looks at the other's flag, the other sets its
 * flag and looks at what was published). ThreadSanitizer models no
 * fences: there, a sequentially consistent read-modify-write, which is a
 * full barrier as well. */
static inline void full_fence(void)
{
#if defined(__SANITIZE_THREAD__)
  static uint32_t barrier;
  __atomic_fetch_add(&barrier, 0, __ATOMIC_SEQ_CST);
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static void rings_run(struct xport__lane *lane);
static int frag_pump(xport_conn_t *conn);
static size_t rec_size(size_t payload);
static int rec_load(const uint8_t *p, struct xshm_rec *h);

/* Back from a sleep: the doorbell read empty, the rings disarmed. */
static void disarm(struct xport__lane *lane)
{
  struct xshm_lane *x = xl(lane);
  uint64_t n;
  for (xport_conn_t *conn = lane->conns; conn; conn = conn->next)
    if (xc(conn)->seg) {
      if (read(xc(conn)->my_efd, &n, sizeof n) < 0) {
        /* EAGAIN: not rung */
      }
      __atomic_store_n(&xc(conn)->seg->ring[!xc(conn)->side].armed, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&xc(conn)->seg->ring[xc(conn)->side].want_room, 0, __ATOMIC_RELAXED);
    }
  x->armed = 0;
}

/* fi_trywait: arms every connection's incoming ring, then looks once more
 * for what would not ring (FI_SUCCESS: sleep on the doorbell). */
static int fab_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{
  (void)fids, (void)count;
  struct xport__lane *lane = fabric->fid.context;
  struct xshm_lane *x = xl(lane);
  if (x->qhead != x->qtail || x->look_now)
    return -FI_EAGAIN;
  /* A connected peer's socket that is readable: it closed or died, which
   * rings no doorbell. Housekeeping looks at once, not at its next turn. */
  struct epoll_event ev[8];
  int n = epoll_wait(x->epfd, ev, 8, 0);
  for (int i = 0; i < n; i++) {
    xport_conn_t *conn = ev[i].data.ptr;
    if (conn && conn->state == XPORT__CONN_CONNECTED) {
      x->look_now = 1;
      return -FI_EAGAIN;
    }
  }
  x->armed = 1;
  for (xport_conn_t *conn = lane->conns; conn; conn = conn->next)
    if (xc(conn)->seg)
      __atomic_store_n(&xc(conn)->seg->ring[!xc(conn)->side].armed, 1, __ATOMIC_RELAXED);
  full_fence();
  for (xport_conn_t *conn = lane->conns; conn; conn = conn->next) {
    struct xshm_conn *c = xc(conn);
    if (!c->seg)
      continue;
    struct xshm_seg *g = c->seg;
    /* A long message in pieces waits for room: asked for (the consumer
     * rings when it takes a record), then looked at once more. */
    if (c->fout.req) {
      struct xshm_ring *o = &g->ring[c->side];
      __atomic_store_n(&o->want_room, 1, __ATOMIC_RELAXED);
      full_fence();
      uint64_t used = c->out_tail - __atomic_load_n(&o->head, __ATOMIC_ACQUIRE);
      if (used <= XSHM_RING - rec_size(XSHM_EAGER) * 2)
        return -FI_EAGAIN;
    }
    /* Control records: work only where their answers have room (a peer
     * that takes none of them gets none, and wakes nothing). */
    uint64_t ctl_used = c->ctl_tail - __atomic_load_n(&g->ctl[c->side].head, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&g->ctl[!c->side].tail, __ATOMIC_ACQUIRE) != c->ctl_head &&
        ctl_used < XSHM_CSLOTS)
      return -FI_EAGAIN;
    struct xshm_rec next;
    if ((c->rx_head != c->rx_tail &&
         rec_load(g->ring[!c->side].data + c->in_head % XSHM_RING, &next)) ||
        (c->rndv_seen != c->rndv_posted &&
         __atomic_load_n(&g->ring[c->side].rndv_done, __ATOMIC_ACQUIRE) != c->rndv_seen))
      return -FI_EAGAIN;
  }
  return FI_SUCCESS;
}

static struct fi_ops_fabric fab_ops = {.size = sizeof(struct fi_ops_fabric),
                                       .trywait = fab_trywait};

static ssize_t cq_read(struct fid_cq *cq, void *buf, size_t count)
{
  struct xport__lane *lane = cq->fid.context;
  struct xshm_lane *x = xl(lane);
  if (XPORT__UNLIKELY(x->armed))
    disarm(lane);
  if (x->qhead == x->qtail)
    rings_run(lane);
  struct fi_cq_data_entry *out = buf;
  size_t n = 0;
  while (n < count && x->qhead != x->qtail && !x->q[x->qhead % x->qsize].err)
    out[n++] = x->q[x->qhead++ % x->qsize].e;
  if (n)
    return (ssize_t)n;
  return x->qhead != x->qtail ? -FI_EAVAIL : -FI_EAGAIN;
}

static ssize_t cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src)
{
  (void)src;
  return cq_read(cq, buf, count);
}

static ssize_t cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{
  (void)flags;
  struct xshm_lane *x = xl(cq->fid.context);
  if (x->qhead == x->qtail || !x->q[x->qhead % x->qsize].err)
    return -FI_EAGAIN;
  struct xshm_done *d = &x->q[x->qhead++ % x->qsize];
  memset(buf, 0, sizeof *buf);
  buf->op_context = d->e.op_context;
  buf->flags = d->e.flags;
  buf->len = d->e.len;
  buf->err = d->err;
  buf->prov_errno = d->err;
  return 1;
}

static ssize_t cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond,
                        int timeout)
{
  (void)cq, (void)buf, (void)count, (void)cond, (void)timeout;
  return -FI_ENOSYS;
}

static ssize_t cq_sreadfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src,
                            const void *cond, int timeout)
{
  (void)src;
  return cq_sread(cq, buf, count, cond, timeout);
}

static int cq_signal(struct fid_cq *cq)
{
  (void)cq;
  return 0;
}

static const char *cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                               char *buf, size_t len)
{
  (void)cq, (void)err_data;
  snprintf(buf, len, "xshm: %s", fi_strerror(prov_errno));
  return buf;
}

static int fid_noop_close(struct fid *fid)
{
  (void)fid;
  return 0;
}

static int fid_no_control(struct fid *fid, int command, void *arg)
{
  (void)fid, (void)command, (void)arg;
  return -FI_ENOSYS;
}

static struct fi_ops obj_ops = {.size = sizeof(struct fi_ops), .close = fid_noop_close,
                                .control = fid_no_control};
static struct fi_ops_cq cq_ops = {.size = sizeof(struct fi_ops_cq),
                                  .read = cq_read,
                                  .readfrom = cq_readfrom,
                                  .readerr = cq_readerr,
                                  .sread = cq_sread,
                                  .sreadfrom = cq_sreadfrom,
                                  .signal = cq_signal,
                                  .strerror = cq_strerror};

/* ---- registrations: the key table peers check ---------------------------- */

struct xshm_mr {
  struct fid_mr mr;
  struct xport__lane *lane;
  unsigned slot;
};

static int mr_close(struct fid *fid)
{
  struct xshm_mr *m = (struct xshm_mr *)(void *)fid;
  struct xshm_lane *x = xl(m->lane);
  /* Peers that check from now on find no key; one already past its check
   * races the deregistration, as an RDMA in flight does. (A context being
   * destroyed has unmapped its table already.) */
  if (x->keys)
    __atomic_store_n(&x->keys[m->slot].key, 0, __ATOMIC_RELEASE);
  free(m);
  return 0;
}

static struct fi_ops mr_fid_ops = {.size = sizeof(struct fi_ops), .close = mr_close,
                                   .control = fid_no_control};

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
                  uint64_t requested_key, uint64_t flags, struct fid_mr **mr_p, void *context)
{
  (void)offset, (void)requested_key, (void)flags;
  struct xport__lane *lane = fid->context;
  struct xshm_lane *x = xl(lane);
  unsigned slot = XSHM_KEYS;
  for (unsigned i = 0; i < XSHM_KEYS; i++) {
    unsigned s = (x->keys_next + i) % XSHM_KEYS;
    if (!x->keys[s].key) {
      slot = s;
      break;
    }
  }
  if (slot == XSHM_KEYS)
    return -FI_ENOSPC;
  struct xshm_mr *m = calloc(1, sizeof *m);
  if (!m)
    return -FI_ENOMEM;
  x->keys_next = slot + 1;
  uint64_t gen;
  do
    gen = xport__random_key(8) >> XSHM_SLOT_BITS;
  while (!gen);
  struct xshm_key *k = &x->keys[slot];
  k->base = (uintptr_t)buf;
  k->len = len;
  /* Nothing until xport says what it grants (xshm_mr_access). */
  (void)access;
  k->access = 0;
  __atomic_store_n(&k->key, gen << XSHM_SLOT_BITS | slot, __ATOMIC_RELEASE);
  m->lane = lane;
  m->slot = slot;
  m->mr.fid.fclass = FI_CLASS_MR;
  m->mr.fid.context = context;
  m->mr.fid.ops = &mr_fid_ops;
  m->mr.key = k->key;
  *mr_p = &m->mr;
  return 0;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access,
                   uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr_p,
                   void *context)
{
  if (count != 1)
    return -FI_EINVAL;
  return mr_reg(fid, iov->iov_base, iov->iov_len, access, offset, requested_key, flags, mr_p,
                context);
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                      struct fid_mr **mr_p)
{
  return mr_regv(fid, attr->mr_iov, attr->iov_count, attr->access, attr->offset,
                 attr->requested_key, flags, mr_p, attr->context);
}

/* The registration's rights as xport grants them: an atomic-only one
 * lends itself to neither read nor write (libfabric's access bits, which
 * the table got, cannot say so). */
static void xshm_mr_access(struct fid_mr *fmr, unsigned access)
{
  struct xshm_mr *m = (struct xshm_mr *)(void *)fmr;
  struct xshm_lane *x = xl(m->lane);
  if (x->keys)
    __atomic_store_n(&x->keys[m->slot].access, access & XPORT__ACCESS_REMOTE, __ATOMIC_RELEASE);
}

static struct fi_ops_mr mr_ops = {.size = sizeof(struct fi_ops_mr),
                                  .reg = mr_reg,
                                  .regv = mr_regv,
                                  .regattr = mr_regattr};

/* The peer's registration that key names, if [addr, addr + len) lies in
 * it and it grants what is asked (XPORT_ACCESS_REMOTE_READ or _WRITE). */
static int key_ok(const xport_conn_t *conn, uint64_t key, uint64_t addr, size_t len,
                  uint32_t want)
{
  const struct xshm_key *k = &xc(conn)->peer_keys[key & (XSHM_KEYS - 1)];
  if (!key || __atomic_load_n(&k->key, __ATOMIC_ACQUIRE) != key)
    return 0;
  uint64_t base = k->base, klen = k->len;
  uint32_t access = k->access;
  return (access & want) == want && addr >= base && len <= klen && addr - base <= klen - len;
}

/* ---- the rings -------------------------------------------------------------- */

/* After something is published for conn's peer: its doorbell, where it
 * sleeps. The fence orders our publication before our look at its flag,
 * as its arming is ordered before its look at our tail (trywait). */
static inline void ring_bell(const xport_conn_t *conn)
{
  const struct xshm_conn *c = xc(conn);
  full_fence();
  if (XPORT__UNLIKELY(__atomic_load_n(&c->seg->ring[c->side].armed, __ATOMIC_RELAXED))) {
    uint64_t one = 1;
    if (write(c->peer_efd, &one, sizeof one) < 0) {
      /* Full (it has been rung 2^64 times unread) or gone: nothing to add. */
    }
  }
}

static size_t rec_size(size_t payload)
{
  return sizeof(struct xshm_rec) + ((payload + 15) & ~(size_t)15);
}

/* A record's header at p: the rest, then its first word with release (the
 * record's publication). */
static void rec_store(uint8_t *p, const struct xshm_rec *h)
{
  uint64_t w;
  memcpy(p + 8, (const uint8_t *)h + 8, sizeof *h - 8);
  memcpy(&w, h, sizeof w);
  __atomic_store_n((uint64_t *)(void *)p, w, __ATOMIC_RELEASE);
}

/* The header at p: 1 if a record is there (its type not 0), else 0. */
static int rec_load(const uint8_t *p, struct xshm_rec *h)
{
  uint64_t w = __atomic_load_n((const uint64_t *)(const void *)p, __ATOMIC_ACQUIRE);
  memcpy(h, &w, sizeof w);
  if (!h->type)
    return 0;
  memcpy((uint8_t *)h + 8, p + 8, sizeof *h - 8);
  return 1;
}

/* Empty: the header where the producer's next record will go. */
static inline void rec_clear(uint8_t *p)
{
  __atomic_store_n((uint64_t *)(void *)p, 0, __ATOMIC_RELAXED);
}

/* Room for a record of payload bytes at the tail of conn's outgoing ring
 * (and for the empty header after it): its offset, with a wrap record
 * published before it where it would not fit before the end;
 * -FI_EAGAIN where the ring is full, -FI_ECONNRESET where the peer's head
 * makes no sense. The peer's head is read only where the ring looks full
 * by the one last read. */
static ssize_t ring_reserve(xport_conn_t *conn, size_t payload, uint64_t *tail_p)
{
  struct xshm_conn *c = xc(conn);
  struct xshm_ring *r = &c->seg->ring[c->side];
  uint64_t tail = c->out_tail;
  size_t need = rec_size(payload), off = tail % XSHM_RING;
  size_t wrap = off + need > XSHM_RING ? XSHM_RING - off : 0;
  uint64_t end = tail + wrap + need + sizeof(struct xshm_rec);
  if (XPORT__UNLIKELY(end - c->head_seen > XSHM_RING)) {
    uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    if (head - c->head_seen > tail - c->head_seen) {
      c->doomed = 1; /* a head the peer wrote that makes no sense: the connection ends */
      return -FI_ECONNRESET;
    }
    c->head_seen = head;
    if (end - head > XSHM_RING)
      return -FI_EAGAIN;
  }
  if (wrap) {
    struct xshm_rec w = {.type = XSHM_R_WRAP};
    rec_clear(r->data);
    rec_store(r->data + off, &w);
    tail += wrap;
    c->out_tail = tail;
  }
  *tail_p = tail;
  return (ssize_t)(tail % XSHM_RING);
}

/* Publishes the record h whose payload is written at tail: the empty
 * header after it first, then its own. */
static void ring_publish(xport_conn_t *conn, uint64_t tail, size_t payload,
                         const struct xshm_rec *h)
{
  struct xshm_conn *c = xc(conn);
  uint8_t *data = c->seg->ring[c->side].data;
  c->out_tail = tail + rec_size(payload);
  rec_clear(data + c->out_tail % XSHM_RING);
  rec_store(data + tail % XSHM_RING, h);
  ring_bell(conn);
}

/* The consumer took conn's records up to head: room goes back to the
 * producer in batches, and at once to one asleep for it. */
static inline void ring_taken(xport_conn_t *conn, struct xshm_ring *r, uint64_t head)
{
  struct xshm_conn *c = xc(conn);
  c->in_head = head;
  if (XPORT__LIKELY(head - c->head_given < XSHM_HEAD_BATCH))
    return;
  c->head_given = head;
  __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
  full_fence(); /* our head before its flag, as its flag before its look at our head */
  if (__atomic_load_n(&r->want_room, __ATOMIC_RELAXED))
    ring_bell(conn);
}

/* Copies iov (total bytes) into a MSG record: 0, or -FI_EAGAIN. */
static ssize_t put_msg(xport_conn_t *conn, const struct iovec *iov, size_t cnt, size_t total,
                       int with_imm, uint32_t imm)
{
  uint64_t tail;
  ssize_t off = ring_reserve(conn, total, &tail);
  if (off < 0)
    return off;
  uint8_t *p = xc(conn)->seg->ring[xc(conn)->side].data + off;
  struct xshm_rec h = {.len = (uint32_t)total, .type = XSHM_R_MSG,
                       .imm = imm, .flags = with_imm ? XSHM_F_IMM : 0};
  size_t at = sizeof h;
  for (size_t i = 0; i < cnt; i++) {
    memcpy(p + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  ring_publish(conn, tail, total, &h);
  return 0;
}

static size_t iov_sum(const struct iovec *iov, size_t cnt)
{
  size_t t = 0;
  for (size_t i = 0; i < cnt; i++)
    t += iov[i].iov_len;
  return t;
}

/* A receive's buffer, trimmed to len bytes, into out[]: its count. */
static size_t iov_trim(const struct iovec *iov, size_t cnt, size_t len, struct iovec *out)
{
  size_t n = 0;
  for (size_t i = 0; i < cnt && len; i++) {
    size_t l = iov[i].iov_len < len ? iov[i].iov_len : len;
    out[n].iov_base = iov[i].iov_base;
    out[n++].iov_len = l;
    len -= l;
  }
  return n;
}

/* Takes conn's next incoming record into its oldest receive, if both are
 * there: 1 if one was taken, 0 if not, -1 if the ring is corrupt. */
static int take_one(struct xport__lane *lane, xport_conn_t *conn)
{
  struct xshm_conn *c = xc(conn);
  struct xshm_ring *r = &c->seg->ring[!c->side];
  uint64_t head = c->in_head;
  size_t off = head % XSHM_RING;
  struct xshm_rec h;
  if (!rec_load(r->data + off, &h))
    return 0;
  if (h.type == XSHM_R_WRAP) {
    if (!off)
      return -1; /* a wrap where a record always fits */
    ring_taken(conn, r, head + (XSHM_RING - off));
    return 1;
  }
  if (c->rx_head == c->rx_tail)
    return 0; /* it waits for a receive */
  struct xshm_rx *rx = &c->rx[c->rx_head % XSHM_RXQ];
  size_t payload = h.type == XSHM_R_MSG || h.type == XSHM_R_FRAG ? h.len
                   : h.type == XSHM_R_RNDV                      ? (size_t)h.niov * 16
                                                                : 0;
  if ((h.type != XSHM_R_MSG && h.type != XSHM_R_RNDV && h.type != XSHM_R_WIMM &&
       h.type != XSHM_R_FRAG) ||
      (c->fin && h.type != XSHM_R_FRAG) || /* a message inside another's pieces */
      ((h.type == XSHM_R_MSG || h.type == XSHM_R_FRAG) && h.len > XSHM_EAGER) ||
      (h.type == XSHM_R_RNDV && (h.niov == 0 || h.niov > XSHM_IOV)) ||
      off + rec_size(payload) > XSHM_RING)
    return -1;
  const uint8_t *p = r->data + off + sizeof h;
  uint64_t flags = FI_RECV | FI_MSG, data = 0;
  size_t len = 0;
  int err = 0;
  if (h.flags & XSHM_F_IMM) {
    flags |= FI_REMOTE_CQ_DATA;
    data = h.imm;
  }
  if (h.type == XSHM_R_FRAG) {
    /* A piece at fin_off of the receive's buffer, what of it fits. */
    size_t at = 0, skip = c->fin_off, left = h.len;
    for (size_t i = 0; i < rx->cnt && left && skip < rx->len; i++) {
      size_t l = rx->iov[i].iov_len;
      if (skip >= l) {
        skip -= l;
        continue;
      }
      size_t take = l - skip < left ? l - skip : left;
      memcpy((char *)rx->iov[i].iov_base + skip, p + at, take);
      at += take;
      left -= take;
      skip = 0;
    }
    if (__builtin_add_overflow(c->fin_off, (size_t)h.len, &c->fin_off))
      return -1;
    ring_taken(conn, r, head + rec_size(payload));
    if (!(h.flags & XSHM_F_LAST)) {
      c->fin = 1;
      return 1; /* the receive waits for the rest */
    }
    len = c->fin_off;
    c->fin = 0;
    c->fin_off = 0;
    c->rx_head++;
    if (len > rx->len)
      err = FI_ETRUNC;
    done_push(lane, rx->req, err ? rx->len : len, flags, data, err);
    return 1;
  }
  if (h.type == XSHM_R_MSG) {
    len = h.len;
    size_t left = len < rx->len ? len : rx->len, at = 0;
    for (size_t i = 0; i < rx->cnt && left; i++) {
      size_t l = rx->iov[i].iov_len < left ? rx->iov[i].iov_len : left;
      memcpy(rx->iov[i].iov_base, p + at, l);
      at += l;
      left -= l;
    }
  } else if (h.type == XSHM_R_RNDV) {
    struct iovec remote[XSHM_IOV], local[XSHM_IOV];
    size_t total = 0;
    for (unsigned i = 0; i < h.niov; i++) {
      uint64_t a, l;
      memcpy(&a, p + 16 * i, 8);
      memcpy(&l, p + 16 * i + 8, 8);
      if (__builtin_add_overflow(total, l, &total))
        return -1;
      remote[i].iov_base = (void *)(uintptr_t)a;
      remote[i].iov_len = l;
    }
    if (total != h.len)
      return -1; /* a length its scatter list does not add up to */
    len = total;
    size_t want = total < rx->len ? total : rx->len;
    size_t nl = iov_trim(rx->iov, rx->cnt, want, local);
    size_t nr = iov_trim(remote, h.niov, want, remote);
    /* A peer whose socket ended may have given its pid to another process. */
    ssize_t got = c->gone ? -1 : want ? process_vm_readv(c->peer_pid, local, nl, remote, nr, 0) : 0;
    if (c->gone)
      errno = ESRCH;
    /* The sender may free its buffer once it has closed (its sends then
     * end with ECANCELED): bytes read after that are not its message. */
    if (got != (ssize_t)want ||
        __atomic_load_n(&c->seg->closed[!c->side], __ATOMIC_ACQUIRE)) {
      /* Denied (EIO), or the sender gone or closed, or naming memory it
       * does not have (EFAULT: a record that makes no sense): then the
       * connection ends behind this receive. */
      err = got < 0 && errno != ESRCH && errno != EFAULT ? FI_EIO : FI_ECONNRESET;
      c->doomed = err == FI_ECONNRESET;
    }
    __atomic_store_n(&r->rndv_done, r->rndv_done + 1, __ATOMIC_RELEASE);
    ring_bell(conn); /* its sender may sleep until its send completes */
  } else { /* WIMM: the write landed before the record was published */
    flags |= FI_REMOTE_WRITE;
  }
  ring_taken(conn, r, head + rec_size(payload));
  c->rx_head++;
  if (!err && len > rx->len && h.type != XSHM_R_WIMM)
    err = FI_ETRUNC;
  done_push(lane, rx->req, err == FI_ETRUNC ? rx->len : len, flags, data, err);
  return 1;
}

/* A control record into conn's outgoing control ring: 0, or -FI_EAGAIN
 * where it is full (a peer that takes none of its answers). */
static int ctl_put(xport_conn_t *conn, const struct xshm_ctl *m)
{
  struct xshm_conn *c = xc(conn);
  struct xshm_cring *r = &c->seg->ctl[c->side];
  uint64_t used = c->ctl_tail - __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
  if (used > XSHM_CSLOTS) {
    c->doomed = 1; /* a head the peer wrote that makes no sense */
    return -FI_ECONNRESET;
  }
  if (used == XSHM_CSLOTS)
    return -FI_EAGAIN;
  r->slot[c->ctl_tail % XSHM_CSLOTS] = *m;
  __atomic_store_n(&r->tail, ++c->ctl_tail, __ATOMIC_RELEASE);
  ring_bell(conn);
  return 0;
}

/* conn's incoming control records: requests applied to this context's
 * memory and answered, answers given to their atomics. 0, or -1 where
 * the peer wrote nonsense. */
static int ctl_run(struct xport__lane *lane, xport_conn_t *conn)
{
  struct xshm_conn *c = xc(conn);
  struct xshm_cring *r = &c->seg->ctl[!c->side];
  uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
  if (tail - c->ctl_head > XSHM_CSLOTS)
    return -1;
  while (c->ctl_head != tail) {
    struct xshm_ctl m = r->slot[c->ctl_head % XSHM_CSLOTS];
    if (m.type == XSHM_C_REQUEST) {
      /* Room for the answer first: a request is applied once, and waits
       * (unapplied) while the peer takes none of its answers. */
      struct xshm_cring *out = &c->seg->ctl[c->side];
      uint64_t used = c->ctl_tail - __atomic_load_n(&out->head, __ATOMIC_ACQUIRE);
      if (used > XSHM_CSLOTS)
        return -1;
      if (used == XSHM_CSLOTS)
        break;
      struct xshm_ctl a = {.type = XSHM_C_ANSWER, .token = m.token};
      a.status = xport__atomic_apply(lane, (unsigned)m.kind, m.key, m.addr, m.operand,
                                     m.compare, &a.operand);
      if (ctl_put(conn, &a))
        return -1; /* a head the peer moved back */
    } else if (m.type == XSHM_C_ANSWER) {
      struct xport__req *req = conn->out;
      while (req && !(req->op == XPORT_OP_ATOMIC && req->imm == m.token))
        req = req->cnext;
      if (!req) { /* one of ours it answered already, or none: as a stray answer on
                     the service channel, dropped */
        XPORT__INFO("xshm: an atomic's answer names no operation of ours; dropped");
        __atomic_store_n(&r->head, ++c->ctl_head, __ATOMIC_RELEASE);
        continue;
      }
      /* The peer's word: only a code of ours reaches the user. */
      int status = xport__err_known(m.status) ? m.status : -XPORT_EPROTO;
      req->atom[2] = m.operand;
      c->natom--;
      xport__req_complete(conn->ctx, req, status);
      req->len = status ? 0 : 8;
      req->imm = 0;
    } else {
      return -1;
    }
    __atomic_store_n(&r->head, ++c->ctl_head, __ATOMIC_RELEASE);
  }
  return 0;
}

/* What the rings hold for the receives posted, and the long sends the
 * peers have copied out: run by every read of the CQ that finds it empty. */
static void rings_run(struct xport__lane *lane)
{
  for (xport_conn_t *conn = lane->conns, *next; conn; conn = next) {
    next = conn->next;
    struct xshm_conn *c = xc(conn);
    if (!c->seg || c->releasing)
      continue;
    if (XPORT__UNLIKELY(c->doomed)) {
      xshm_lost(conn, -XPORT_ECONNRESET);
      continue;
    }
    if (XPORT__UNLIKELY(c->seg->ctl[!c->side].tail != c->ctl_head) && ctl_run(lane, conn)) {
      XPORT__WARN("xshm: connection %u: its peer wrote a control record that makes no sense: "
                  "the connection ends", conn->id);
      xshm_lost(conn, -XPORT_ECONNRESET);
      continue;
    }
    if (XPORT__UNLIKELY(c->fout.req != NULL))
      frag_pump(conn);
    if (c->rndv_seen != c->rndv_posted) {
      uint64_t done = __atomic_load_n(&c->seg->ring[c->side].rndv_done, __ATOMIC_ACQUIRE);
      if (done - c->rndv_seen > c->rndv_posted - c->rndv_seen) {
        xshm_lost(conn, -XPORT_ECONNRESET); /* a peer that says it took more than went */
        continue;
      }
      while (c->rndv_seen != done) {
        struct xport__req *req = c->rndv[c->rndv_seen++ % XSHM_RNDV];
        done_push(lane, req, req->len, FI_SEND | FI_MSG, 0, 0);
      }
    }
    int ret = 1;
    for (int budget = 0; budget < 64 && ret == 1 && !c->doomed; budget++)
      ret = take_one(lane, conn);
    if (ret < 0) {
      XPORT__WARN("xshm: connection %u: its peer wrote a record that makes no sense: "
                  "the connection ends", conn->id);
      xshm_lost(conn, -XPORT_ECONNRESET);
    }
  }
}

/* ---- the data path ------------------------------------------------------------ */

/* Writes what fits of the long message going out in pieces: 1 once its
 * last piece is out (its send then completes), 0 while some wait for
 * room. */
static int frag_pump(xport_conn_t *conn)
{
  struct xshm_conn *c = xc(conn);
  while (c->fout.off < c->fout.total) {
    size_t piece = c->fout.total - c->fout.off;
    if (piece > XSHM_EAGER)
      piece = XSHM_EAGER;
    uint64_t tail;
    ssize_t off = ring_reserve(conn, piece, &tail);
    if (off < 0)
      return 0;
    uint8_t *p = c->seg->ring[c->side].data + off;
    int last = c->fout.off + piece == c->fout.total;
    struct xshm_rec h = {.len = (uint32_t)piece, .type = XSHM_R_FRAG,
                         .imm = last ? c->fout.imm : 0,
                         .flags = (last ? XSHM_F_LAST : 0) |
                                  (last && c->fout.with_imm ? XSHM_F_IMM : 0)};
    /* The piece [off, off + piece) of the message, from its elements. */
    size_t at = 0, skip = c->fout.off, left = piece;
    for (size_t i = 0; i < c->fout.cnt && left; i++) {
      size_t l = c->fout.iov[i].iov_len;
      if (skip >= l) {
        skip -= l;
        continue;
      }
      size_t take = l - skip < left ? l - skip : left;
      memcpy(p + sizeof h + at, (char *)c->fout.iov[i].iov_base + skip, take);
      at += take;
      left -= take;
      skip = 0;
    }
    c->fout.off += piece;
    ring_publish(conn, tail, piece, &h);
  }
  done_push(conn->lane, c->fout.req, c->fout.total, FI_SEND | FI_MSG, 0, 0);
  c->fout.req = NULL;
  return 1;
}

static ssize_t xshm_send(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt, uint64_t flags, uint64_t data)
{
  (void)desc;
  struct xshm_conn *c = xc(conn);
  if (XPORT__UNLIKELY(c->doomed))
    return -FI_ECONNRESET;
  if (XPORT__UNLIKELY(c->fout.req != NULL))
    return -FI_EAGAIN; /* behind a long message still going out in pieces */
  size_t total = iov_sum(iov, cnt);
  int imm = !!(flags & FI_REMOTE_CQ_DATA);
  if (total <= XSHM_EAGER) {
    ssize_t ret = put_msg(conn, iov, cnt, total, imm, (uint32_t)data);
    if (!ret)
      done_push(conn->lane, req, total, FI_SEND | FI_MSG, 0, 0);
    return ret;
  }
  if (total > UINT32_MAX)
    return -FI_EMSGSIZE;
  if (!__atomic_load_n(&c->seg->can_read[!c->side], __ATOMIC_ACQUIRE)) {
    /* The peer may not read this process: in pieces, through the ring. */
    c->fout.req = req;
    memcpy(c->fout.iov, iov, cnt * sizeof *iov);
    c->fout.cnt = cnt;
    c->fout.total = total;
    c->fout.off = 0;
    c->fout.imm = (uint32_t)data;
    c->fout.with_imm = imm;
    frag_pump(conn);
    return 0;
  }
  if (c->rndv_posted - c->rndv_seen >= XSHM_RNDV)
    return -FI_EAGAIN;
  uint64_t tail;
  ssize_t off = ring_reserve(conn, 16 * cnt, &tail);
  if (off < 0)
    return off;
  uint8_t *p = c->seg->ring[c->side].data + off;
  struct xshm_rec h = {.len = (uint32_t)total, .type = XSHM_R_RNDV, .niov = (uint16_t)cnt,
                       .imm = (uint32_t)data, .flags = imm ? XSHM_F_IMM : 0};
  for (size_t i = 0; i < cnt; i++) {
    uint64_t a = (uintptr_t)iov[i].iov_base, l = iov[i].iov_len;
    memcpy(p + sizeof h + 16 * i, &a, 8);
    memcpy(p + sizeof h + 16 * i + 8, &l, 8);
  }
  c->rndv[c->rndv_posted++ % XSHM_RNDV] = req;
  ring_publish(conn, tail, 16 * cnt, &h);
  return 0;
}

static ssize_t xshm_inject(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                           uint32_t imm)
{
  struct iovec v = {(void *)buf, len};
  if (XPORT__UNLIKELY(xc(conn)->doomed))
    return -FI_ECONNRESET;
  if (XPORT__UNLIKELY(xc(conn)->fout.req != NULL))
    return -FI_EAGAIN;
  return put_msg(conn, &v, 1, len, with_imm, imm);
}

static ssize_t xshm_recv(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt)
{
  (void)desc;
  struct xshm_conn *c = xc(conn);
  if (c->rx_tail - c->rx_head >= XSHM_RXQ)
    return -FI_EAGAIN;
  struct xshm_rx *rx = &c->rx[c->rx_tail++ % XSHM_RXQ];
  rx->req = req;
  rx->cnt = cnt;
  memcpy(rx->iov, iov, cnt * sizeof *iov);
  rx->len = iov_sum(iov, cnt);
  return 0;
}

static ssize_t xshm_marker(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  (void)conn, (void)req, (void)flags;
  return -FI_ENOSYS; /* write_imm is native here */
}

static int xshm_is_marker(const struct fi_cq_data_entry *e)
{
  (void)e;
  return 0;
}

/* A one-sided transfer between iov here and [addr, addr + total) of the
 * peer, checked against its key table first. */
static ssize_t rma(xport_conn_t *conn, struct xport__req *req, struct iovec *iov, size_t cnt,
                   uint64_t addr, uint64_t key, int write)
{
  struct xshm_conn *c = xc(conn);
  size_t total = iov_sum(iov, cnt);
  int err = 0;
  if (XPORT__UNLIKELY(!c->cma)) {
    err = FI_EIO; /* this process may not touch the peer's memory */
  } else if (!key_ok(conn, key, addr, total,
                     write ? XPORT_ACCESS_REMOTE_WRITE : XPORT_ACCESS_REMOTE_READ)) {
    /* As a device refuses a key: the operation fails, the connection
     * ends (both sides), and nothing sent after it is delivered. */
    err = FI_EACCES;
    c->doomed = 1;
  } else if (total) {
    struct iovec remote = {(void *)(uintptr_t)addr, total};
    ssize_t n = write ? process_vm_writev(c->peer_pid, iov, cnt, &remote, 1, 0)
                      : process_vm_readv(c->peer_pid, iov, cnt, &remote, 1, 0);
    if (n != (ssize_t)total) {
      err = FI_EIO;
      if (n < 0 && errno == ESRCH) { /* the target's process is gone */
        err = FI_ECONNRESET;
        conn->proc.gone = 1;
      }
      c->doomed = 1;
    }
  }
  done_push(conn->lane, req, err ? 0 : total, write ? FI_RMA | FI_WRITE : FI_RMA | FI_READ, 0,
            err);
  return 0;
}

static ssize_t xshm_read(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt, uint64_t addr, uint64_t key)
{
  (void)desc;
  return rma(conn, req, iov, cnt, addr, key, 0);
}

static ssize_t xshm_write(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                          void **desc, size_t cnt, uint64_t addr, uint64_t key, uint64_t flags,
                          uint64_t data)
{
  (void)desc;
  if (!(flags & FI_REMOTE_CQ_DATA))
    return rma(conn, req, iov, cnt, addr, key, 1);
  /* With an immediate: the record's room first, so that a write is never
   * done whose notice cannot follow. */
  uint64_t tail;
  ssize_t off = ring_reserve(conn, 0, &tail);
  if (off < 0)
    return off;
  struct xshm_lane *x = xl(conn->lane);
  unsigned before = x->qtail;
  rma(conn, req, iov, cnt, addr, key, 1);
  if (x->q[before % x->qsize].err)
    return 0; /* refused or failed: no notice */
  struct xshm_rec h = {.type = XSHM_R_WIMM, .imm = (uint32_t)data, .flags = XSHM_F_IMM};
  ring_publish(conn, tail, 0, &h);
  return 0;
}

/* An atomic, applied by the target's xport when it next makes progress
 * (its poll, or its progress thread): the answer completes req. */
static int xshm_atomic(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t key,
                       uint64_t addr)
{
  struct xshm_conn *c = xc(conn);
  if (XPORT__UNLIKELY(c->doomed))
    return -XPORT_ECONNRESET;
  if (c->natom >= XSHM_ATOM)
    return -XPORT_EAGAIN;
  req->imm = ++c->atom_seq;
  struct xshm_ctl m = {.type = XSHM_C_REQUEST, .token = req->imm, .kind = kind, .key = key,
                       .addr = addr, .operand = req->atom[0], .compare = req->atom[1]};
  int ret = ctl_put(conn, &m);
  if (ret)
    return ret == -FI_EAGAIN ? -XPORT_EAGAIN : -XPORT_ECONNRESET;
  c->natom++;
  return 0;
}

static ssize_t xshm_atomic_op(xport_conn_t *conn, struct xport__req *req, unsigned kind,
                              uint64_t *v, void *desc, uint64_t addr, uint64_t key)
{
  (void)conn, (void)req, (void)kind, (void)v, (void)desc, (void)addr, (void)key;
  return -FI_ENOSYS;
}

static const struct xport__data_ops xshm_data = {
    .send = xshm_send,
    .inject = xshm_inject,
    .recv = xshm_recv,
    .marker = xshm_marker,
    .is_marker = xshm_is_marker,
    .read = xshm_read,
    .write = xshm_write,
    .atomic = xshm_atomic_op,
};

/* ---- connections ---------------------------------------------------------------- */

/* What a peer's probe reads here (cross-memory attach). */
static const char canary[16] = "xport xshm cma";

/* Whether this process may read pid's memory: its canary, read. */
static int cma_probe(pid_t pid, uint64_t addr)
{
  if (!xport__env_bool(XPORT__ENV_XSHM_CMA, 1))
    return 0;
  char got[sizeof canary];
  struct iovec l = {got, sizeof got}, r = {(void *)(uintptr_t)addr, sizeof got};
  return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof got &&
         !memcmp(got, canary, sizeof got);
}

/* Yama's ptrace_scope, or -1 where the kernel has no Yama. */
static int yama_scope(void)
{
  int scope = -1;
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
  if (f) {
    if (fscanf(f, "%d", &scope) != 1)
      scope = -1;
    fclose(f);
  }
  return scope;
}

/* The candidate's remark: where cross-memory attach is off or limited
 * before any peer is met, so that xport_info shows it. */
static void xshm_remark(const struct xport__lane *lane, char *buf, size_t len)
{
  (void)lane;
  int scope = yama_scope();
  if (!xport__env_bool(XPORT__ENV_XSHM_CMA, 1))
    snprintf(buf, len, "no cross-memory attach (XPORT_XSHM_CMA=0): one-sided operations fail");
  else if (scope > 0)
    snprintf(buf, len, "cross-memory attach limited (Yama ptrace_scope %d): see xport(7) xshm",
             scope);
}

/* Said once per process where a peer's memory cannot be read: what it
 * costs, and why, where the kernel says (Yama). */
static void cma_denied_say(pid_t pid)
{
  static int said;
  if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED) || !xport__env_bool(XPORT__ENV_XSHM_CMA, 1))
    return;
  char why[96] = "";
  int scope = yama_scope();
  if (scope > 0)
    snprintf(why, sizeof why, " (Yama's kernel.yama.ptrace_scope is %d: 0 allows it)", scope);
  XPORT__WARN("xshm: this process may not read the memory of its peer %d by cross-memory "
              "attach%s: messages over %u bytes go through the ring in pieces, and "
              "xport_read, xport_write and xport_write_imm over xshm fail with XPORT_EIO "
              "(XPORT_SHM=libfabric uses libfabric's shm instead)",
              (int)pid, why, XSHM_EAGER);
}

/* Ends conn's use of the rings: what the core has yet to read of it goes
 * first, then every operation still out ends with status. */
static void conn_release(xport_conn_t *conn, int status)
{
  struct xshm_conn *c = xc(conn);
  if (!c->seg)
    return;
  __atomic_store_n(&c->seg->closed[c->side], 1, __ATOMIC_RELEASE);
  c->releasing = 1;
  xport__cq_drain(conn->lane);
  c->rx_head = c->rx_tail = 0;
  c->rndv_seen = c->rndv_posted = 0;
  c->natom = 0;
  c->fout.req = NULL;
  c->fin = 0;
  c->fin_off = 0;
  while (conn->out)
    xport__req_complete(conn->ctx, conn->out, status);
  xport__held_flush(conn, status);
  epoll_ctl(xl(conn->lane)->epfd, EPOLL_CTL_DEL, c->sock, NULL);
  close(c->sock);
  close(c->peer_efd);
  epoll_ctl(xl(conn->lane)->epfd, EPOLL_CTL_DEL, c->my_efd, NULL);
  close(c->my_efd);
  c->sock = c->peer_efd = c->my_efd = -1;
  munmap(c->seg, sizeof *c->seg);
  munmap((void *)c->peer_keys, XSHM_KEYS * sizeof *c->peer_keys);
  c->seg = NULL;
  c->peer_keys = NULL;
}

static void xshm_lost(xport_conn_t *conn, int status)
{
  if (conn->state != XPORT__CONN_CONNECTED)
    return;
  conn->state = XPORT__CONN_DISCONNECTED;
  conn->proc.gone = 1;
  conn_release(conn, status);
  if (conn->app.handed)
    xport__evq_push(conn->ctx, conn, xport__lost_status(status));
}

static void xshm_close_conn(xport_conn_t *conn)
{
  conn_release(conn, -XPORT_ECANCELED);
}

static void xshm_drop(xport_conn_t *conn, int status)
{
  xshm_lost(conn, status);
}

/* A connection made (either side): linked, its rings and the peer's key
 * table mapped, its doorbell watched. Takes seg, keys, peer_efd and
 * my_efd. */
static int conn_make(struct xport__lane *lane, int sock, int side, pid_t pid, uint64_t ctx_id,
                     struct xshm_seg *seg, const struct xshm_key *keys, int peer_efd,
                     int my_efd, uint64_t peer_canary, xport_conn_t **conn_p)
{
  struct epoll_event ev = {.events = EPOLLIN};
  xport_conn_t *conn = xport__conn_new(lane);
  if (!conn)
    return -XPORT_ENOMEM;
  struct epoll_event line = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = conn};
  if (epoll_ctl(xl(lane)->epfd, EPOLL_CTL_ADD, my_efd, &ev)) {
    free(conn);
    return -XPORT_ENOMEM;
  }
  if (epoll_ctl(xl(lane)->epfd, EPOLL_CTL_ADD, sock, &line)) {
    epoll_ctl(xl(lane)->epfd, EPOLL_CTL_DEL, my_efd, NULL);
    free(conn);
    return -XPORT_ENOMEM;
  }
  xc(conn)->peer_efd = peer_efd;
  xc(conn)->my_efd = my_efd;
  xc(conn)->cma = cma_probe(pid, peer_canary);
  if (!xc(conn)->cma)
    cma_denied_say(pid);
  __atomic_store_n(&seg->can_read[side], (uint32_t)xc(conn)->cma, __ATOMIC_RELEASE);
  struct xshm_conn *c = xc(conn);
  c->sock = sock;
  c->side = side;
  c->peer_pid = pid;
  c->seg = seg;
  c->peer_keys = keys;
  conn->ops = &xshm_data;
  conn->id = ++xl(lane)->next_conn_id;
  conn->peer_ctx_id = ctx_id;
  conn->state = XPORT__CONN_CONNECTED;
  conn->peer_holds = 1;
  xport__conn_link(conn);
  *conn_p = conn;
  return 0;
}

/* host as a listener's name says it: its first address, numeric, or "*"
 * for a wildcard (0.0.0.0, ::), so that two spellings of one address
 * name one listener. 0, or -XPORT_EINVAL. */
static int host_key(const char *host, char *out, size_t len)
{
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res))
    return -XPORT_EINVAL;
  char num[64] = "";
  int ret = getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof num, NULL, 0, NI_NUMERICHOST);
  int any = (res->ai_family == AF_INET &&
             ((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY)) ||
            (res->ai_family == AF_INET6 &&
             IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)(void *)res->ai_addr)->sin6_addr));
  freeaddrinfo(res);
  if (ret)
    return -XPORT_EINVAL;
  snprintf(out, len, "%s", any ? "*" : num);
  return 0;
}

/* The listener's socket name: abstract (this network namespace's), per
 * user, host (host_key) and port. */
static socklen_t sock_name(struct sockaddr_un *sa, const char *hkey, unsigned port)
{
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "xport-xshm.%u.%s.%u",
                   (unsigned)geteuid(), hkey, port);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* host names this node (an address of it that a socket can bind): 0, or
 * -XPORT_EADDRNOTAVAIL (another node's, which xshm cannot reach), or
 * -XPORT_EINVAL (no such host). */
static int host_here(const char *host)
{
  struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *res;
  if (getaddrinfo(host, "0", &hints, &res))
    return -XPORT_EINVAL;
  int ret = -XPORT_EADDRNOTAVAIL;
  for (struct addrinfo *a = res; a && ret; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && !bind(fd, a->ai_addr, a->ai_addrlen))
      ret = 0;
    if (fd >= 0)
      close(fd);
  }
  freeaddrinfo(res);
  return ret;
}

/* The peer at the other end of sock, if it is this user's and of this PID
 * namespace: its pid, or 0. */
static pid_t peer_of(int sock)
{
  struct ucred cr;
  socklen_t l = sizeof cr;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) || cr.uid != geteuid())
    return 0;
  /* 0: a process this PID namespace does not see. */
  return cr.pid > 0 ? cr.pid : -1;
}

static int send_hello(int sock, const struct xshm_hello *h, const int *fds, int nfds)
{
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(3 * sizeof(int))];
  } u;
  struct iovec v = {(void *)h, sizeof *h};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
  memset(&u, 0, sizeof u);
  m.msg_control = u.buf;
  m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
  memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof *h ? 0 : -XPORT_ECONNRESET;
}

/* A hello of kind with want descriptors, by deadline: 0 with them in
 * fds[], or a code with none left open. */
static int recv_hello(int sock, long deadline, unsigned kind, struct xshm_hello *h, int *fds,
                      int want)
{
  for (;;) {
    struct pollfd p = {.fd = sock, .events = POLLIN};
    if (!deadline) { /* only a look: the listener's handshakes (shake) */
      if (poll(&p, 1, 0) != 1)
        return -XPORT_EAGAIN;
      break;
    }
    long left = deadline < 0 ? 1000 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (r > 0)
      break;
    if (r < 0 && errno != EINTR)
      return -XPORT_EIO;
  }
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(3 * sizeof(int))];
  } u;
  struct iovec v = {h, sizeof *h};
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf,
                     .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  int got = 0;
  for (struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; cm; cm = CMSG_NXTHDR(&m, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        if (got < want && fds)
          fds[got++] = fd;
        else
          close(fd);
      }
    }
  if (n != (ssize_t)sizeof *h || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
      h->magic != XSHM_MAGIC || h->version != XSHM_VERSION || h->kind != kind || got != want) {
    for (int i = 0; i < got; i++)
      close(fds[i]);
    if (n == (ssize_t)sizeof *h && h->kind == XSHM_H_REFUSE && h->magic == XSHM_MAGIC)
      return h->status ? -(int)h->status : -XPORT_ECONNREFUSED;
    return n <= 0 ? -XPORT_ECONNRESET : -XPORT_EPROTO; /* its end closed, or reset */
  }
  return 0;
}

/* The seals every segment and key table carries: their size fixed for
 * good, so that a peer cannot shrink one under a mapping (SIGBUS in the
 * reader); a key table also refuses writers other than its owner's one
 * mapping (a peer maps it read-only, or not at all). */
#define SEALS_SIZE (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define SEALS_KEYS (SEALS_SIZE | F_SEAL_FUTURE_WRITE)

/* A memfd of len bytes, mapped read-write here, then sealed with seals:
 * its address, and its descriptor in *fd_p; NULL with nothing left. */
static void *memfd_make(const char *name, size_t len, int seals, int *fd_p)
{
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *p = MAP_FAILED;
  if (fd < 0 || ftruncate(fd, (off_t)len) ||
      (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED ||
      fcntl(fd, F_ADD_SEALS, seals)) {
    if (p != MAP_FAILED)
      munmap(p, len);
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  *fd_p = fd;
  return p;
}

/* Maps a peer's fd (this user's memfd, of exactly len bytes, sealed with
 * at least seals): NULL if it is not that. */
static void *map_fd(int fd, size_t len, int prot, int seals)
{
  struct stat st;
  int have = fcntl(fd, F_GET_SEALS);
  if (have < 0 || (have & seals) != seals || fstat(fd, &st) || st.st_uid != geteuid() ||
      (size_t)st.st_size != len)
    return NULL;
  void *p = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* fd is an eventfd (a peer's doorbell), made non-blocking: a peer that
 * hands over a pipe, or an eventfd near its limit, cannot stall a send. */
static int doorbell_ok(int fd)
{
  char path[64], link[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n <= 0)
    return 0;
  link[n] = '\0';
  int fl = fcntl(fd, F_GETFL);
  return !strcmp(link, "anon_inode:[eventfd]") && fl >= 0 &&
         fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

/* A side's proof of the context key over the handshake: the client's
 * hello and the listener's welcome, whole (their nonces, ids and pids),
 * under a label per direction. */
static void proof(const struct xport__lane *lane, int by_listener, const struct xshm_hello *hello,
                  const struct xshm_hello *welcome, uint8_t mac[XPORT__AUTH_MAC])
{
  static const char label[2][32] = {"xport xshm 1: the client", "xport xshm 1: the listener"};
  struct {
    char label[32];
    struct xshm_hello h, w;
  } t;
  memset(&t, 0, sizeof t);
  memcpy(t.label, label[by_listener], 32);
  t.h = *hello;
  t.w = *welcome;
  memset(t.h.mac, 0, sizeof t.h.mac);
  memset(t.w.mac, 0, sizeof t.w.mac);
  t.h.kind = t.w.kind = 0;
  xport__auth_mac(lane->ctx->auth_key, &t, sizeof t, mac);
}

/* A listener at host:port of this node and network namespace: its
 * abstract name is bound (/proc/net/unix lists this namespace's). */
static int xshm_here(const struct xport__lane *lane, const char *addr)
{
  (void)lane;
  char host[256], port[8], want[96], line[512];
  char hk[64], want2[96];
  if (xport__addr_split(addr, host, sizeof host, port, sizeof port) || host_here(host) ||
      host_key(host, hk, sizeof hk))
    return 0;
  snprintf(want, sizeof want, " @xport-xshm.%u.%s.%s\n", (unsigned)geteuid(), hk, port);
  snprintf(want2, sizeof want2, " @xport-xshm.%u.*.%s\n", (unsigned)geteuid(), port);
  FILE *f = fopen("/proc/net/unix", "re");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    size_t n = strlen(line), w = strlen(want), w2 = strlen(want2);
    found = (n >= w && !strcmp(line + n - w, want)) || (n >= w2 && !strcmp(line + n - w2, want2));
  }
  if (f)
    fclose(f);
  return found;
}

static void accept_hooked(struct xport__lane *lane);

/* The listener's answer of kind (its welcome, its READY) to our hello.
 * Meanwhile the listeners a layer above owns (a job's) go on accepting,
 * as over the fabric's transports: two ranks that connect to each other
 * at once each take the other's request a step further (job.c weighs
 * which stays), where waiting alone would leave both waiting until one
 * listener gave up the other's handshake. */
static int await_answer(struct xport__lane *lane, int sock, long deadline, unsigned kind,
                        struct xshm_hello *w, int *got, int want)
{
  for (;;) {
    long slice = xport__now_ms() + 1;
    if (deadline >= 0 && deadline < slice)
      slice = deadline;
    int ret = recv_hello(sock, slice, kind, w, got, want);
    if (ret != -XPORT_ETIMEDOUT || (deadline >= 0 && xport__now_ms() >= deadline))
      return ret;
    /* Meanwhile a job's listener accepts, here and on the fabric beside:
     * ranks that connect to each other in a ring, some over xshm and some
     * over the fabric, each wait on one that must accept theirs. */
    accept_hooked(lane);
    xport__progress_beside(lane);
  }
}

static int xshm_connect(struct xport__lane *lane, const char *host, const char *port,
                        const struct xport__conn_data *data, long deadline, xport_conn_t **conn_p)
{
  char *end;
  unsigned long pn = strtoul(port, &end, 10);
  if (*end || !pn || pn > 65535)
    return -XPORT_EINVAL;
  int ret = host_here(host); /* this node's: xshm reaches no other */
  if (ret)
    return ret;
  char hk[64];
  if ((ret = host_key(host, hk, sizeof hk)))
    return ret;
  /* Non-blocking: a listener whose backlog is full refuses at once. */
  int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0)
    return -XPORT_ENOMEM;
  ret = -XPORT_ECONNREFUSED;
  int segfd = -1, keyfd = -1, efd = -1, my = -1;
  struct xshm_seg *seg = NULL;
  pid_t pid;
  /* The host's own listener, else one on every address. */
  struct sockaddr_un sa;
  socklen_t sl = sock_name(&sa, hk, (unsigned)pn);
  int rc = connect(sock, (struct sockaddr *)&sa, sl);
  if (rc && errno == ECONNREFUSED) {
    sl = sock_name(&sa, "*", (unsigned)pn);
    rc = connect(sock, (struct sockaddr *)&sa, sl);
  }
  if (rc)
    goto fail;
  /* A name another user took is not our listener; one of another PID
   * namespace cannot be reached by its pid: not this way. */
  pid = peer_of(sock);
  ret = !pid ? -XPORT_EACCES : -XPORT_EADDRNOTAVAIL;
  if (pid <= 0)
    goto fail;
  ret = -XPORT_ENOMEM;
  if (!(seg = memfd_make("xport-xshm", sizeof *seg, SEALS_SIZE, &segfd)))
    goto fail;
  seg->magic = XSHM_MAGIC;
  seg->version = XSHM_VERSION;
  struct xshm_hello h = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_HELLO,
                         .ctx_id = lane->ctx->id, .pid = (uint32_t)getpid(),
                         .seg_size = sizeof *seg, .canary = (uintptr_t)canary};
  if (lane->ctx->auth_on) {
    h.flags = XSHM_HF_AUTH;
    xport__auth_nonce(h.nonce);
  }
  h.datalen = (uint32_t)data->len;
  memcpy(h.data, data->bytes, data->len);
  ret = -XPORT_ENOMEM;
  if ((my = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    goto fail;
  int fds[3] = {segfd, xl(lane)->keys_fd, my};
  if ((ret = send_hello(sock, &h, fds, 3)))
    goto fail;
  close(segfd);
  segfd = -1;
  struct xshm_hello w;
  int got[2];
  if ((ret = await_answer(lane, sock, deadline, XSHM_H_WELCOME, &w, got, 2))) {
    /* A listener closed with this request still waiting refused it. */
    if (ret == -XPORT_ECONNRESET)
      ret = -XPORT_ECONNREFUSED;
    goto fail;
  }
  keyfd = got[0];
  efd = got[1];
  const struct xshm_key *keys = map_fd(keyfd, XSHM_KEYS * sizeof *keys, PROT_READ, SEALS_KEYS);
  close(keyfd);
  ret = -XPORT_EPROTO;
  if (!keys || w.pid != (uint32_t)pid || !doorbell_ok(efd))
    goto fail_keys;
  if (lane->ctx->auth_on) {
    /* The listener proves the key first; then this side, and the
     * listener's READY says it took the proof. */
    uint8_t want[XPORT__AUTH_MAC];
    proof(lane, 1, &h, &w, want);
    ret = -XPORT_EACCES;
    if (!(w.flags & XSHM_HF_AUTH) || !xport__auth_same(want, w.mac)) {
      XPORT__WARN("authentication failed: the listener does not hold this context's key");
      goto fail_keys;
    }
    struct xshm_hello pr = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_PROOF,
                            .flags = XSHM_HF_AUTH};
    proof(lane, 0, &h, &w, pr.mac);
    struct xshm_hello rd;
    ret = send(sock, &pr, sizeof pr, MSG_NOSIGNAL) != (ssize_t)sizeof pr
              ? -XPORT_ECONNRESET
              : await_answer(lane, sock, deadline, XSHM_H_READY, &rd, NULL, 0);
    /* A listener that closed with this request unfinished refused it, as
     * before its welcome. */
    if (ret == -XPORT_ECONNRESET)
      ret = -XPORT_ECONNREFUSED;
    if (ret)
      goto fail_keys;
  }
  ret = conn_make(lane, sock, 0, pid, w.ctx_id, seg, keys, efd, my, w.canary, conn_p);
  if (!ret)
    return 0;
fail_keys:
  if (keys)
    munmap((void *)keys, XSHM_KEYS * sizeof *keys);
  close(efd);
fail:
  if (seg)
    munmap(seg, sizeof *seg);
  if (segfd >= 0)
    close(segfd);
  if (my >= 0)
    close(my);
  close(sock);
  return ret;
}

/* A connection request on a listener's socket, its handshake under way:
 * many side by side (XSHM_PEND), none waiting for another. */
struct xshm_pend {
  int sock;
  pid_t pid;
  long deadline;
  int stage; /* 0: its hello awaited; 1: its proof (under a key) */
  struct xshm_hello h, w;
  struct xshm_seg *seg;
  const struct xshm_key *keys;
  int efd, my; /* the peer's doorbell, and ours for this connection */
};

static void pend_drop(struct xshm_pend *p)
{
  if (p->seg)
    munmap(p->seg, sizeof *p->seg);
  if (p->keys)
    munmap((void *)p->keys, XSHM_KEYS * sizeof *p->keys);
  if (p->efd >= 0)
    close(p->efd);
  if (p->my >= 0)
    close(p->my);
  close(p->sock);
  p->seg = NULL;
  p->keys = NULL;
  p->efd = p->my = p->sock = -1;
}

/* Refuses p's request with code (its peer's connect fails with it). */
static void pend_refuse(struct xshm_pend *p, int code)
{
  struct xshm_hello r = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_REFUSE,
                         .status = (uint32_t)code};
  send(p->sock, &r, sizeof r, MSG_NOSIGNAL | MSG_DONTWAIT);
  pend_drop(p);
}

/* One step of p's handshake, without waiting: 1 with the connection made
 * (*conn_p), 0 while it waits for its peer, -1 when it ended (refused or
 * gone; p dropped). */
static int shake(xport_listener_t *lst, struct xshm_pend *p, xport_conn_t **conn_p)
{
  struct xport__lane *lane = lst->lane;
  int keyed = lane->ctx->auth_on;
  if (p->stage == 0) {
    int fds[3];
    int ret = recv_hello(p->sock, 0, XSHM_H_HELLO, &p->h, fds, 3);
    if (ret == -XPORT_EAGAIN)
      return 0;
    if (ret == -XPORT_EPROTO) {
      /* Said to a peer still there: another version of xport, or a hello
       * without its descriptors, learns why rather than a bare close. */
      XPORT__INFO("xshm: a connection request refused: not a hello of this version of xport "
                  "(%u) with its three descriptors", XSHM_VERSION);
      pend_refuse(p, XPORT_EPROTO);
      return -1;
    }
    if (ret) {
      pend_drop(p);
      return -1;
    }
    p->efd = fds[2];
    /* Another PID namespace sees another pid: cross-memory attach would
     * name the wrong process. Not this way (beside a fabric, the fabric
     * carries it). */
    int bad = p->h.pid != (uint32_t)p->pid ? XPORT_EADDRNOTAVAIL : 0;
    if (!bad && (p->h.datalen > XPORT_CONN_DATA_MAX || p->h.pad2))
      bad = XPORT_EPROTO;
    if (!bad && (p->h.seg_size != sizeof *p->seg ||
                 !(p->seg = map_fd(fds[0], sizeof *p->seg, PROT_READ | PROT_WRITE,
                                   SEALS_SIZE)) ||
                 !doorbell_ok(p->efd) || p->seg->magic != XSHM_MAGIC ||
                 p->seg->version != XSHM_VERSION ||
                 !(p->keys = map_fd(fds[1], XSHM_KEYS * sizeof *p->keys, PROT_READ, SEALS_KEYS))))
      bad = XPORT_ECONNREFUSED;
    close(fds[0]);
    close(fds[1]);
    if (!bad && !(p->h.flags & XSHM_HF_AUTH) != !keyed) {
      XPORT__INFO("xshm: a connection request refused: %s",
                  keyed ? "without a key: authentication failed: the peer does not hold this "
                          "context's key"
                        : "that offers a key: this listener has none (XPORT_AUTH_KEY_FILE)");
      bad = XPORT_EACCES;
    }
    if (!bad && lst->admit && !lst->admit(lst->hook_arg, p->h.ctx_id))
      bad = XPORT_ECONNREFUSED;
    if (bad) {
      pend_refuse(p, bad);
      return -1;
    }
    /* Whether this side can read the client, said before the welcome: a
     * client that sends a long message at once sees it (else it sends in
     * pieces, though it need not). */
    __atomic_store_n(&p->seg->can_read[1], (uint32_t)cma_probe(p->pid, p->h.canary),
                     __ATOMIC_RELEASE);
    p->w = (struct xshm_hello){.magic = XSHM_MAGIC, .version = XSHM_VERSION,
                               .kind = XSHM_H_WELCOME, .ctx_id = lane->ctx->id,
                               .pid = (uint32_t)getpid(), .canary = (uintptr_t)canary};
    if (keyed) {
      p->w.flags = XSHM_HF_AUTH;
      xport__auth_nonce(p->w.nonce);
      proof(lane, 1, &p->h, &p->w, p->w.mac);
    }
    if ((p->my = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
      pend_refuse(p, XPORT_ENOMEM);
      return -1;
    }
    int mine[2] = {xl(lane)->keys_fd, p->my};
    if (send_hello(p->sock, &p->w, mine, 2)) {
      pend_drop(p);
      return -1;
    }
    p->stage = 1;
    if (!keyed)
      goto made;
  }
  struct xshm_hello pr;
  int ret = recv_hello(p->sock, 0, XSHM_H_PROOF, &pr, NULL, 0);
  if (ret == -XPORT_EAGAIN)
    return 0;
  uint8_t want[XPORT__AUTH_MAC];
  proof(lane, 0, &p->h, &p->w, want);
  if (ret || !xport__auth_same(want, pr.mac)) {
    XPORT__INFO("xshm: a connection request refused: authentication failed: the peer "
                "does not hold this context's key");
    pend_refuse(p, XPORT_EACCES);
    return -1;
  }
  struct xshm_hello rd = {.magic = XSHM_MAGIC, .version = XSHM_VERSION, .kind = XSHM_H_READY};
  if (send(p->sock, &rd, sizeof rd, MSG_NOSIGNAL) != (ssize_t)sizeof rd) {
    pend_drop(p);
    return -1;
  }
made:
  if (conn_make(lane, p->sock, 1, p->pid, p->h.ctx_id, p->seg, p->keys, p->efd, p->my,
                p->h.canary, conn_p)) {
    pend_drop(p);
    return -1;
  }
  (*conn_p)->shake.data.len = p->h.datalen; /* checked with the hello */
  memcpy((*conn_p)->shake.data.bytes, p->h.data, p->h.datalen);
  return 1;
}

#define XSHM_PEND 64
#define XSHM_SHAKE_MS 5000 /* a peer that never finishes its handshake is dropped */

struct xshm_lst {
  int fd;
  struct xshm_pend pend[XSHM_PEND];
  int npend;
};

static int xshm_shaking_from(const xport_listener_t *lst, uint64_t peer_ctx_id)
{
  const struct xshm_lst *l = lst->tpd;
  for (int i = 0; i < l->npend; i++)
    if (l->pend[i].stage > 0 && l->pend[i].h.ctx_id == peer_ctx_id)
      return 1;
  return 0;
}

static int xshm_accept(xport_listener_t *lst, long deadline, xport_conn_t **conn_p)
{
  struct xshm_lst *l = lst->tpd;
  for (;;) {
    long now = xport__now_ms();
    int starved = 0;
    /* New requests; where every slot is taken, a waiting one evicts the
     * oldest handshake (a peer that says nothing), as a TCP listener
     * drops its oldest unfinished one. */
    for (;;) {
      if (l->npend == XSHM_PEND) {
        struct pollfd q = {.fd = l->fd, .events = POLLIN};
        if (poll(&q, 1, 0) != 1)
          break;
        int oldest = 0;
        for (int i = 1; i < l->npend; i++)
          if (l->pend[i].deadline < l->pend[oldest].deadline)
            oldest = i;
        pend_drop(&l->pend[oldest]);
        l->pend[oldest] = l->pend[--l->npend];
      }
      int sock = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (sock < 0) {
        /* Out of descriptors (a flood of strangers elsewhere): the
         * requests wait in the backlog for a later accept, which this
         * one's waits do not spin on. */
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          starved = 1;
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                 errno != ECONNABORTED)
          return -XPORT_EIO;
        break;
      }
      pid_t pid = peer_of(sock);
      if (!pid) { /* another user's: refused at once */
        close(sock);
        continue;
      }
      l->pend[l->npend++] = (struct xshm_pend){.sock = sock, .pid = pid > 0 ? pid : 0,
                                               .deadline = now + XSHM_SHAKE_MS, .efd = -1,
                                               .my = -1};
    }
    /* Every handshake a step on; the first made is the answer. */
    for (int i = 0; i < l->npend;) {
      struct xshm_pend *p = &l->pend[i];
      int r = shake(lst, p, conn_p);
      if (r == 0 && now > p->deadline) {
        pend_drop(p);
        r = -1;
      }
      if (r != 0)
        l->pend[i] = l->pend[--l->npend];
      else
        i++;
      if (r == 1)
        return 0;
    }
    long left = deadline < 0 ? 1000 : deadline - xport__now_ms();
    if (left <= 0)
      return -XPORT_ETIMEDOUT;
    struct pollfd pf[1 + XSHM_PEND];
    pf[0] = (struct pollfd){.fd = starved ? -1 : l->fd, .events = POLLIN};
    for (int i = 0; i < l->npend; i++)
      pf[1 + i] = (struct pollfd){.fd = l->pend[i].sock, .events = POLLIN};
    poll(pf, (nfds_t)(1 + l->npend), left > 10 ? 10 : (int)left);
    xport__progress_beside(lst->lane);
  }
}

static int xshm_listen(xport_listener_t *lst, const char *addr, const char *host,
                       const char *port)
{
  (void)addr;
  char *end;
  unsigned long pn = strtoul(port, &end, 10);
  if (*end || pn > 65535)
    return -XPORT_EINVAL;
  char hk[64];
  int ret = host_here(host);
  if (!ret)
    ret = host_key(host, hk, sizeof hk);
  if (ret)
    return ret;
  struct xshm_lst *l = calloc(1, sizeof *l);
  if (!l)
    return -XPORT_ENOMEM;
  l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (l->fd < 0) {
    free(l);
    return -XPORT_ENOMEM;
  }
  ret = -XPORT_EADDRINUSE;
  /* Port 0: one free in the dynamic range, drawn. */
  for (int tries = 0; tries < (pn ? 1 : 64); tries++) {
    unsigned p = pn ? (unsigned)pn : 49152 + (unsigned)(xport__random_key(2) % 16384);
    struct sockaddr_un sa;
    socklen_t sl = sock_name(&sa, hk, p);
    if (!bind(l->fd, (struct sockaddr *)&sa, sl)) {
      /* The kernel lets one more than its backlog wait on a Unix socket. */
      int bl = lst->backlog > 4096 ? 4096 : (int)lst->backlog;
      ret = listen(l->fd, bl - 1) ? -XPORT_EIO : 0;
      snprintf(lst->addr, sizeof lst->addr, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, p);
      break;
    }
    if (errno != EADDRINUSE) {
      ret = -XPORT_EIO;
      break;
    }
  }
  if (ret) {
    close(l->fd);
    free(l);
    return ret;
  }
  lst->tpd = l;
  return 0;
}

static void xshm_listener_close(xport_listener_t *lst)
{
  struct xshm_lst *l = lst->tpd;
  if (!l)
    return;
  for (int i = 0; i < l->npend; i++)
    pend_refuse(&l->pend[i], XPORT_ECONNREFUSED);
  close(l->fd); /* requests still queued are refused: their peers see the socket go */
  free(l);
  lst->tpd = NULL;
}

/* ---- the lane ------------------------------------------------------------------ */

static int xshm_describe(struct fi_info **info_p)
{
  struct fi_info *fi = fi_allocinfo();
  if (!fi)
    return -XPORT_ENOMEM;
  fi->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  /* A write-with-immediate consumes a receive, as on verbs. */
  fi->mode = FI_RX_CQ_DATA;
  fi->ep_attr->type = FI_EP_MSG;
  fi->ep_attr->max_msg_size = UINT32_MAX;
  fi->tx_attr->size = fi->rx_attr->size = XSHM_DEPTH;
  fi->tx_attr->iov_limit = fi->rx_attr->iov_limit = XSHM_IOV;
  fi->tx_attr->inject_size = XSHM_INJECT;
  fi->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
  fi->domain_attr->mr_key_size = 8;
  fi->domain_attr->cq_data_size = 4;
  fi->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  fi->domain_attr->name = strdup("xshm");
  fi->fabric_attr->name = strdup("xshm");
  fi->fabric_attr->prov_name = strdup("xshm");
  if (!fi->domain_attr->name || !fi->fabric_attr->name || !fi->fabric_attr->prov_name) {
    fi_freeinfo(fi);
    return -XPORT_ENOMEM;
  }
  *info_p = fi;
  return 0;
}

static int xshm_open(struct xport__lane *lane)
{
  struct xshm_lane *x = xl(lane);
  size_t klen = XSHM_KEYS * sizeof *x->keys;
  if (!(x->keys = memfd_make("xport-xshm-keys", klen, SEALS_KEYS, &x->keys_fd)))
    return -XPORT_ENOMEM;
  lane->max_posted = 4096;
  x->qsize = 2 * (unsigned)lane->max_posted;
  x->q = calloc(x->qsize, sizeof *x->q);
  if (!x->q) {
    munmap(x->keys, klen);
    close(x->keys_fd);
    return -XPORT_ENOMEM;
  }
  x->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (x->epfd < 0) {
    free(x->q);
    munmap(x->keys, klen);
    close(x->keys_fd);
    return -XPORT_ENOMEM;
  }
  lane->cq_fd = x->epfd;
  x->fabric.fid = (struct fid){.fclass = FI_CLASS_FABRIC, .context = lane, .ops = &obj_ops};
  x->fabric.ops = &fab_ops;
  x->domain.fid = (struct fid){.fclass = FI_CLASS_DOMAIN, .context = lane, .ops = &obj_ops};
  x->domain.mr = &mr_ops;
  x->cq.fid = (struct fid){.fclass = FI_CLASS_CQ, .context = lane, .ops = &obj_ops};
  x->cq.ops = &cq_ops;
  lane->fabric = &x->fabric;
  lane->domain = &x->domain;
  lane->cq = &x->cq;
  return 0;
}

static void xshm_fini(struct xport__lane *lane)
{
  struct xshm_lane *x = xl(lane);
  munmap(x->keys, XSHM_KEYS * sizeof *x->keys);
  close(x->keys_fd);
  close(x->epfd);
  x->keys = NULL;
  free(x->q);
  x->q = NULL;
}

/* A listener a layer above owns (a job's) accepts in the background. */
static void accept_hooked(struct xport__lane *lane)
{
  for (xport_listener_t *lst = lane->listeners, *next; lst; lst = next) {
    next = lst->next;
    xport_conn_t *conn;
    while (lst->admit && lst->tpd && xshm_accept(lst, 0, &conn) == 0)
      lst->accepted(lst->hook_arg, conn);
  }
}

/* Housekeeping, every XSHM_LOOK_MS at most: a peer whose socket closed
 * (it closed, or died) has given all it will; what its ring holds for our
 * receives is taken, then the connection ends. */
static void xshm_progress(struct xport__lane *lane)
{
  long now = xport__now_ms();
  if (now - xl(lane)->looked_ms < XSHM_LOOK_MS && now >= xl(lane)->looked_ms &&
      !xl(lane)->look_now)
    return;
  xl(lane)->looked_ms = now;
  xl(lane)->look_now = 0;
  accept_hooked(lane);
  for (xport_conn_t *conn = lane->conns, *next; conn; conn = next) {
    next = conn->next;
    struct xshm_conn *c = xc(conn);
    if (conn->state != XPORT__CONN_CONNECTED || c->sock < 0)
      continue;
    struct pollfd p = {.fd = c->sock, .events = POLLIN};
    char b;
    if (poll(&p, 1, 0) == 1 && ((p.revents & (POLLHUP | POLLERR)) ||
                                recv(c->sock, &b, 1, MSG_DONTWAIT) == 0)) {
      /* All it wrote first, into the receives posted (rings_run takes a
       * budget per run), then the loss. */
      c->gone = 1;
      rings_run(lane);
      while (c->seg && !c->doomed && take_one(lane, conn) == 1)
        ;
      xshm_lost(conn, -XPORT_ECONNRESET);
    }
  }
}

static void xshm_op_failed(struct xport__lane *lane, struct xport__req *req, int status)
{
  (void)lane, (void)req, (void)status;
}

/* Its peer is a process of this node, whose pid the kernel told us. */
static void xshm_peer_addr(const xport_conn_t *conn, char *buf, size_t len)
{
  snprintf(buf, len, "local:%d", (int)xc(conn)->peer_pid);
}

const struct xport__transport xport__transport_xshm = {
    .name = "xshm",
    .ep_type = FI_EP_MSG,
    .ctx_size = sizeof(struct xshm_lane),
    .conn_size = sizeof(struct xshm_conn),
    .describe = xshm_describe,
    .open = xshm_open,
    .listen = xshm_listen,
    .here = xshm_here,
    .listener_close = xshm_listener_close,
    .connect = xshm_connect,
    .accept = xshm_accept,
    .peer_addr = xshm_peer_addr,
    .shaking_from = xshm_shaking_from,
    .close_conn = xshm_close_conn,
    .progress = xshm_progress,
    .op_failed = xshm_op_failed,
    .drop = xshm_drop,
    .atomic = xshm_atomic,
    .data = &xshm_data,
    .fini = xshm_fini,
    .mr_access = xshm_mr_access,
    .watches_peers = 1,
    .remark = xshm_remark,
};
