/* One-sided operations: packing and unpacking remote keys, and posting
 * writes, reads and writes with immediate data.
 *
 * A packed key is self-describing, little-endian, and checked on unpack:
 *   0  magic "XRK1"        4  version (u16)     6  flags (u16: virt, raw)
 *   8  total size (u16)   10  key size (u16)   12  access (u32)
 *  16  owner context id   24  remote address of the range (VA or offset)
 *  32  range length       40  provider name (16 bytes, NUL padded)
 *  56  key bytes          ..  FNV-1a of everything before (u32)
 * A context with several transports (XPORT_SHM) packs one such key per
 * transport, back to back, its fabric's first; unpacking takes the one of
 * the provider the connection runs on, so one blob serves every peer.
 */
#include "xport_int.h"

#include <stdlib.h>
#include <string.h>

#define RK_MAGIC 0x314b5258u /* "XRK1" */
#define RK_VERSION 1
#define RK_HDR 56
#define RK_F_VIRT 0x1
#define RK_F_RAW 0x2
#define RK_ONE_MAX 128 /* one transport's key */
#define RK_RAW_MAX (RK_ONE_MAX - RK_HDR - 4)
#define RK_PARTS_MAX (XPORT_RKEY_MAX_SIZE / (RK_HDR + 4))

static uint32_t fnv1a(const uint8_t *p, size_t n)
{
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 16777619u;
  return h;
}

/* The key names a registration of exactly the packed range (mem.c), so
 * the exporter's provider refuses a key whose bytes were widened, forged
 * or outlived its region: nothing the peer does to the blob reaches
 * memory the exporter did not pack. The checksum only catches accidents. */
static int rkey_pack_locked(xport_mr_t *mr, size_t offset, size_t len, void *buf,
                            size_t buflen)
{
  uint8_t raw[RK_RAW_MAX];
  size_t klen = 8;
  uint64_t addr;
  struct fid_mr *fmr;

  xport_ctx_t *ctx = mr->ctx;
  /* Atomics need an aligned word; the range's start decides it, since
   * offsets into it are checked against 8 by the initiator. A key that
   * would grant nothing is refused. */
  unsigned access = mr->access & XPORT__ACCESS_REMOTE;
  if ((uintptr_t)(mr->base + offset) % 8)
    access &= ~XPORT_ACCESS_REMOTE_ATOMIC;
  if (!access)
    return -XPORT_EACCES;
  size_t total = RK_HDR + (mr->lane->raw_keys ? 0 : klen) + 4;
  if (!mr->lane->raw_keys && buflen < total)
    return -XPORT_ERANGE; /* known before registering anything */
  int ret = xport__mr_span(mr, offset, len, &fmr);
  if (ret)
    return ret;
  if (mr->lane->raw_keys) {
    uint64_t base = 0;
    klen = sizeof raw;
    ret = fi_mr_raw_attr(fmr, &base, raw, &klen, 0);
    if (ret)
      return ret == -FI_ETOOSMALL ? -XPORT_ENOSYS : xport__err_from_fi(ret);
  } else {
    xport__put64(raw, fi_mr_key(fmr));
  }
  /* Virtual address of the range's start, or its offset in the
   * registration the key names (0 for a range of its own). */
  addr = mr->lane->virt_addr ? (uint64_t)(uintptr_t)(mr->base + offset)
                        : fmr == mr->mr ? (uint64_t)offset : 0;
  total = RK_HDR + klen + 4;
  if (buflen < total)
    return -XPORT_ERANGE;

  uint8_t *p = buf;
  memset(p, 0, RK_HDR);
  xport__put32(p, RK_MAGIC);
  xport__put16(p + 4, RK_VERSION);
  xport__put16(p + 6, (uint16_t)((mr->lane->virt_addr ? RK_F_VIRT : 0) | (mr->lane->raw_keys ? RK_F_RAW : 0)));
  xport__put16(p + 8, (uint16_t)total);
  xport__put16(p + 10, (uint16_t)klen);
  /* Atomics need an aligned word; the range's start decides it, since
   * offsets into it are checked against 8 by the initiator. */
  xport__put32(p + 12, access);
  xport__put64(p + 16, ctx->id);
  xport__put64(p + 24, addr);
  xport__put64(p + 32, len);
  memcpy(p + 40, mr->lane->caps.provider, strnlen(mr->lane->caps.provider, 16));
  memcpy(p + RK_HDR, raw, klen);
  xport__put32(p + RK_HDR + klen, fnv1a(p, RK_HDR + klen));
  return (int)total;
}

XPORT_API int xport_rkey_pack(xport_mr_t *mr, size_t offset, size_t len, void *buf,
                              size_t buflen)
{
  if (!mr || !buf || !len)
    return -XPORT_EINVAL;
  if (offset > mr->len || len > mr->len - offset)
    return -XPORT_ERANGE;
  if (!(mr->access & XPORT__ACCESS_REMOTE))
    return -XPORT_EACCES;
  XPORT__LOCK(mr->ctx);
  int ret = rkey_pack_locked(mr, offset, len, buf, buflen);
  XPORT__UNLOCK(mr->ctx);
  if (ret < 0 || !mr->sub)
    return ret;
  xport_mr_t *sub = mr->sub;
  XPORT__LOCK(sub->ctx);
  int more = rkey_pack_locked(sub, offset, len, (uint8_t *)buf + ret, buflen - (size_t)ret);
  XPORT__UNLOCK(sub->ctx);
  return more < 0 ? more : ret + more;
}

/* One transport's key, the whole of [buf, buf + len): checked, and its
 * fields into *k. */
static int parse_one(const struct xport__lane *lane, uint64_t peer_ctx_id, const uint8_t *p, size_t len,
                     struct xport__rkey_wire *k)
{
  char prov[17];
  /* Every field is checked before any is trusted: a key is data from
   * the network. */
  if (len < RK_HDR + 4 || xport__get32(p) != RK_MAGIC || xport__get16(p + 4) != RK_VERSION)
    goto bad;
  size_t total = xport__get16(p + 8), klen = xport__get16(p + 10);
  if (total != len || klen > RK_RAW_MAX || total != RK_HDR + klen + 4)
    goto bad;
  if (xport__get32(p + RK_HDR + klen) != fnv1a(p, RK_HDR + klen))
    goto bad;
  memcpy(prov, p + 40, 16);
  prov[16] = '\0';
  unsigned flags = xport__get16(p + 6), access = xport__get32(p + 12);
  if (strcmp(prov, lane->caps.provider) || !(flags & RK_F_VIRT) != !lane->virt_addr ||
      !(flags & RK_F_RAW) != !lane->raw_keys || (!lane->raw_keys && klen != 8))
    goto foreign;
  if (xport__get64(p + 16) != peer_ctx_id)
    goto foreign;
  uint64_t addr = xport__get64(p + 24), rlen = xport__get64(p + 32);
  if (!rlen || addr + rlen < addr || !access ||
      (access & ~(unsigned)XPORT__ACCESS_REMOTE))
    goto bad;
  k->addr = addr;
  k->len = rlen;
  k->access = access;
  k->key = p + RK_HDR;
  k->klen = klen;
  return 0;
bad:
  XPORT__INFO("refused a remote key: truncated, corrupted or of another version");
  return -XPORT_EPROTO;
foreign:
  XPORT__INFO("refused a remote key: it belongs to another provider, mode or peer");
  return -XPORT_EPROTO;
}

int xport__rkey_parse(const struct xport__lane *lane, uint64_t peer_ctx_id, const void *buf, size_t len,
                      struct xport__rkey_wire *k)
{
  const uint8_t *p = buf;
  /* A key per transport, back to back: their sizes must tile the blob
   * exactly before the connection's provider picks one, which is then
   * checked whole. */
  size_t at[RK_PARTS_MAX], sz[RK_PARTS_MAX], n = 0, off = 0;
  while (off < len && n < RK_PARTS_MAX) {
    size_t total = len - off >= 10 ? xport__get16(p + off + 8) : 0;
    if (total < RK_HDR + 4 || total > len - off)
      break;
    at[n] = off;
    sz[n++] = total;
    off += total;
  }
  if (n <= 1 || off != len)
    return parse_one(lane, peer_ctx_id, p, len, k); /* one key, or what it says of a bad one */
  /* Every part sound, the ones this connection does not take too: a
   * blob damaged anywhere is refused. */
  for (size_t i = 0; i < n; i++) {
    const uint8_t *q = p + at[i];
    size_t klen = xport__get16(q + 10);
    if (xport__get32(q) != RK_MAGIC || xport__get16(q + 4) != RK_VERSION || klen > RK_RAW_MAX ||
        sz[i] != RK_HDR + klen + 4 || xport__get32(q + RK_HDR + klen) != fnv1a(q, RK_HDR + klen)) {
      XPORT__INFO("refused a remote key: part %zu of %zu is truncated or corrupted", i + 1, n);
      return -XPORT_EPROTO;
    }
  }
  const char *prov = lane->caps.provider;
  for (size_t i = 0; i < n; i++)
    if (!strncmp((const char *)p + at[i] + 40, prov, 16))
      return parse_one(lane, peer_ctx_id, p + at[i], sz[i], k);
  XPORT__INFO("refused a remote key: none of its parts is for %s", prov);
  return -XPORT_EPROTO;
}

static int xport_rkey_unpack__locked(xport_conn_t *conn, const void *buf, size_t len,
                                     xport_rkey_t **rkey_p)
{
  struct xport__rkey_wire k;
  if (!conn || !buf || !rkey_p)
    return -XPORT_EINVAL;
  if (conn->state != XPORT__CONN_CONNECTED)
    return conn->state == XPORT__CONN_CLOSED ? -XPORT_EINVAL : -XPORT_ENOTCONN;
  int ret = xport__rkey_parse(conn->lane, conn->peer_ctx_id, buf, len, &k);
  if (ret)
    return ret;
  xport_rkey_t *rk = calloc(1, sizeof *rk);
  if (!rk)
    return -XPORT_ENOMEM;
  if (conn->lane->raw_keys) {
    ret = fi_mr_map_raw(conn->lane->domain, k.addr, (uint8_t *)k.key, k.klen, &rk->key, 0);
    if (ret) {
      free(rk);
      return -XPORT_EPROTO;
    }
    rk->mapped = 1;
  } else {
    rk->key = xport__get64(k.key);
  }
  rk->conn = conn;
  rk->lane = conn->lane;
  rk->addr = k.addr;
  rk->len = k.len;
  rk->access = k.access;
  *rkey_p = rk;
  return 0;
}

XPORT_API int xport_rkey_release(xport_rkey_t *rkey)
{
  if (!rkey)
    return 0;
  if (rkey->mapped) {
    XPORT__LOCK(rkey->lane->ctx);
    fi_mr_unmap_key(rkey->lane->domain, rkey->key);
    XPORT__UNLOCK(rkey->lane->ctx);
  }
  free(rkey);
  return 0;
}

static size_t iov_total(const xport_iov_t *iov, size_t cnt)
{
  size_t t = 0;
  for (size_t i = 0; i < cnt; i++)
    t += iov[i].len;
  return t;
}

static int post_rma_locked(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov, size_t iovcnt,
                    const xport_rkey_t *rk, size_t offset, int with_imm, uint32_t imm,
                    void *user_ctx)
{
  struct iovec fiov[XPORT__IOV_MAX];
  void *desc[XPORT__IOV_MAX];
  struct xport__req *req;
  size_t cnt;
  ssize_t ret;

  if (XPORT__UNLIKELY(!conn || !iov || !iovcnt))
    return -XPORT_EINVAL;
  size_t len = iov_total(iov, iovcnt);
  /* Zero bytes are only meaningful as a notification (write_imm). */
  if (XPORT__UNLIKELY(!len && !with_imm))
    return -XPORT_EINVAL;
  ret = xport__check_remote(conn, rk, offset, len,
                     op == XPORT_OP_READ ? XPORT_ACCESS_REMOTE_READ : XPORT_ACCESS_REMOTE_WRITE);
  if (XPORT__UNLIKELY(ret))
    return (int)ret;
  xport_ctx_t *ctx = conn->ctx;
  uint64_t addr = rk->addr + offset;

  if (XPORT__UNLIKELY(with_imm && conn->lane->native_wimm < 0))
    return -XPORT_ENOSYS;
  if (with_imm && !conn->lane->native_wimm)
    return xport__wimm_post(conn, iov, iovcnt, len, addr, rk->key, imm, user_ctx);

  ret = xport__post_begin(conn, op, iov, iovcnt, user_ctx, fiov, desc, &cnt, &req);
  if (XPORT__UNLIKELY(ret))
    return (int)ret;
  if (XPORT__UNLIKELY(conn->lane->rma_timeout_ms))
    req->posted_ms = xport__now_ms(), req->posted_seq = ++ctx->dl.rma_seq;
  uint64_t flags = op == XPORT_OP_READ ? 0
                   : conn->lane->write_flags | (with_imm ? FI_REMOTE_CQ_DATA : 0);
  if (XPORT__UNLIKELY(conn->hq.head != NULL))
    ret = -FI_EAGAIN; /* behind those: one-sided operations stay in order too */
  else if (op == XPORT_OP_READ)
    ret = conn->ops->read(conn, req, fiov, desc, cnt, addr, rk->key);
  else
    ret = conn->ops->write(conn, req, fiov, desc, cnt, addr, rk->key, flags, imm);
  if (XPORT__UNLIKELY(xport__pushed_back(ret))) {
    /* Kept, to go behind the posts already waiting (xport__post_hold). */
    struct xport__held h = {.kind = op == XPORT_OP_READ ? XPORT__H_READ : XPORT__H_WRITE,
                            .cnt = cnt, .rma = {addr, len, rk->key}, .flags = flags,
                            .data = imm};
    return xport__post_hold(conn, req, &h, fiov, desc);
  }
  return xport__post_end(conn, req, ret);
}

static int post_rma(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov, size_t iovcnt,
                    const xport_rkey_t *rk, size_t offset, int with_imm, uint32_t imm,
                    void *user_ctx)
{
  int ret;
  if (XPORT__UNLIKELY(!conn))
    return -XPORT_EINVAL;
  XPORT__LOCK(conn->ctx);
  /* Fault injection (XPORT_FAULT): pushed back before anything is taken. */
  if (XPORT__UNLIKELY(conn->ctx->fault != NULL) && (ret = xport__fault_post(conn))) {
    XPORT__UNLOCK(conn->ctx);
    return ret;
  }
  ret = post_rma_locked(conn, op, iov, iovcnt, rk, offset, with_imm, imm, user_ctx);
  XPORT__UNLOCK(conn->ctx);
  return ret;
}

XPORT_API int xport_write(xport_conn_t *conn, const void *buf, size_t len, xport_mr_t *mr,
                          const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  xport_iov_t v = {(void *)buf, len, mr};
  return post_rma(conn, XPORT_OP_WRITE, &v, 1, rkey, offset, 0, 0, user_ctx);
}

XPORT_API int xport_write_imm(xport_conn_t *conn, const void *buf, size_t len,
                              xport_mr_t *mr, const xport_rkey_t *rkey, size_t offset,
                              uint32_t imm, void *user_ctx)
{
  xport_iov_t v = {(void *)buf, len, mr};
  return post_rma(conn, XPORT_OP_WRITE, &v, 1, rkey, offset, 1, imm, user_ctx);
}

XPORT_API int xport_writev(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt,
                           const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  return post_rma(conn, XPORT_OP_WRITE, iov, iovcnt, rkey, offset, 0, 0, user_ctx);
}

XPORT_API int xport_read(xport_conn_t *conn, void *buf, size_t len, xport_mr_t *mr,
                         const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  xport_iov_t v = {buf, len, mr};
  return post_rma(conn, XPORT_OP_READ, &v, 1, rkey, offset, 0, 0, user_ctx);
}

XPORT_API int xport_readv(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt,
                          const xport_rkey_t *rkey, size_t offset, void *user_ctx)
{
  return post_rma(conn, XPORT_OP_READ, iov, iovcnt, rkey, offset, 0, 0, user_ctx);
}

XPORT_API int xport_rkey_unpack(xport_conn_t *conn, const void *buf, size_t len,
                                xport_rkey_t **rkey_p)
{
  if (!conn)
    return xport_rkey_unpack__locked(conn, buf, len, rkey_p);
  xport_ctx_t *lctx = conn->ctx;
  XPORT__LOCK(lctx);
  int ret = xport_rkey_unpack__locked(conn, buf, len, rkey_p);
  XPORT__UNLOCK(lctx);
  return ret;
}
