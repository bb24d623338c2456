/* Registered memory: user regions, the pool of pre-registered copy
 * buffers, and temporary registrations for large unregistered buffers. */
#include "xport_int.h"

#include <stdlib.h>
#include <string.h>

#define BOUNCE_SLOTS 64 /* slots per registered chunk */

int xport__reg(struct xport__lane *lane, void *buf, size_t len, uint64_t fi_access,
               struct fid_mr **mr_p)
{
  int ret;
  for (int tries = 0; tries < 8; tries++) {
    uint64_t key = lane->prov_key ? 0 : xport__random_key(lane->info->domain_attr->mr_key_size);
    ret = fi_mr_reg(lane->domain, buf, len, fi_access, 0, key, 0, mr_p, NULL);
    if (ret != -FI_ENOKEY) /* a duplicate random key: draw again */
      break;
  }
  if (ret)
    return ret == -FI_ENOMEM ? -XPORT_ENOMEM : xport__err_from_fi(ret);
  return 0;
}

/* libfabric has no atomic-only right: a native atomic needs the target
 * to allow remote reads and writes (a fetch reads, every one writes). */
static uint64_t remote_access(unsigned access)
{
  return (access & (XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_ATOMIC) ? FI_REMOTE_READ : 0) |
         (access & (XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_ATOMIC) ? FI_REMOTE_WRITE : 0);
}

static int reg_args_ok(const void *buf, size_t len, unsigned access, xport_mr_t **mr_p)
{
  const unsigned all = XPORT_ACCESS_LOCAL | XPORT__ACCESS_REMOTE;
  return buf && mr_p && len && access && !(access & ~all);
}

/* One lane's part of a registration: in no list yet. */
static int reg_part(struct xport__lane *lane, void *buf, size_t len, unsigned access,
                    xport_mr_t **mr_p)
{
  uint64_t fa = 0;
  if (access & XPORT_ACCESS_LOCAL)
    fa |= FI_SEND | FI_RECV | FI_READ | FI_WRITE;
  fa |= remote_access(access);
  xport_mr_t *mr = calloc(1, sizeof *mr);
  if (!mr)
    return -XPORT_ENOMEM;
  int ret = xport__reg(lane, buf, len, fa, &mr->mr);
  if (ret) {
    free(mr);
    if (ret == -XPORT_ENOMEM)
      XPORT__WARN("registering %zu bytes failed: out of memory or over the "
                  "locked-memory limit (ulimit -l)", len);
    return ret;
  }
  if (lane->tp->mr_access)
    lane->tp->mr_access(mr->mr, access);
  mr->ctx = lane->ctx;
  mr->lane = lane;
  mr->desc = fi_mr_desc(mr->mr);
  mr->base = buf;
  mr->len = len;
  mr->access = access;
  *mr_p = mr;
  return 0;
}

int xport__mr_span(xport_mr_t *mr, size_t offset, size_t len, struct fid_mr **fmr_p)
{
  if (offset == 0 && len == mr->len) {
    *fmr_p = mr->mr;
    return 0;
  }
  struct xport__span *s;
  for (s = mr->spans; s; s = s->next)
    if (s->offset == offset && s->len == len) {
      *fmr_p = s->mr;
      return 0;
    }
  /* Bounded: a loop of packs must not take the provider's registrations
   * (verbs: the device's) without limit. */
  if (mr->nspans >= XPORT__SPANS_MAX) {
    XPORT__WARN("a region holds %d packed sub-ranges already, each a registration of its "
                "own: pack wider ranges, or register the pieces", XPORT__SPANS_MAX);
    return -XPORT_ENOMEM;
  }
  if (!(s = calloc(1, sizeof *s)))
    return -XPORT_ENOMEM;
  int ret = xport__reg(mr->lane, mr->base + offset, len, remote_access(mr->access), &s->mr);
  if (ret) {
    free(s);
    return ret;
  }
  if (mr->lane->tp->mr_access)
    mr->lane->tp->mr_access(s->mr, mr->access);
  s->offset = offset;
  s->len = len;
  s->next = mr->spans;
  mr->spans = s;
  mr->nspans++;
  *fmr_p = s->mr;
  return 0;
}

int xport__mr_by_key(const struct xport__lane *lane, uint64_t key, char **base_p,
                     size_t *len_p, unsigned *access_p)
{
  for (xport_mr_t *reg = lane->ctx->mrs; reg; reg = reg->next) {
    /* The part of the registration on lane: its keys are that lane's. */
    const xport_mr_t *mr = xport__mr_for(reg, lane);
    if (!mr || !(mr->access & XPORT__ACCESS_REMOTE))
      continue;
    char *base = NULL;
    size_t len = 0;
    if (fi_mr_key(mr->mr) == key) {
      base = mr->base;
      len = mr->len;
    }
    for (struct xport__span *s = mr->spans; s && !base; s = s->next)
      if (fi_mr_key(s->mr) == key) {
        base = mr->base + s->offset;
        len = s->len;
      }
    if (base) {
      *base_p = base;
      *len_p = len;
      *access_p = mr->access;
      return 0;
    }
  }
  return -XPORT_EACCES;
}

/* Closes one lane's part: the keys packed from it die here, its
 * sub-ranges first. */
static int part_close(xport_mr_t *mr)
{
  while (mr->spans) {
    struct xport__span *s = mr->spans;
    int ret = fi_close(&s->mr->fid);
    if (ret)
      return xport__err_from_fi(ret);
    mr->spans = s->next;
    mr->nspans--;
    free(s);
  }
  int ret = fi_close(&mr->mr->fid);
  if (ret)
    return xport__err_from_fi(ret);
  free(mr);
  return 0;
}

/* Grows a pool by one registered chunk of slots of size slot: the copy
 * buffers (bounce_size), or the small slots (XPORT__SMALL_SLOT). */
static int bounce_grow(struct xport__lane *lane, size_t slot, struct xport__bounce **free_p,
                       struct xport__bounce_chunk **chunks_p)
{
  struct xport__bounce_chunk *c = calloc(1, sizeof *c);
  if (!c)
    return -XPORT_ENOMEM;
  c->mem = aligned_alloc(64, BOUNCE_SLOTS * slot);
  c->slots = calloc(BOUNCE_SLOTS, sizeof *c->slots);
  if (!c->mem || !c->slots)
    goto fail;
  if (xport__reg(lane, c->mem, BOUNCE_SLOTS * slot, FI_SEND | FI_RECV | FI_READ | FI_WRITE,
                 &c->mr))
    goto fail;
  void *desc = fi_mr_desc(c->mr);
  for (size_t i = 0; i < BOUNCE_SLOTS; i++) {
    c->slots[i].buf = c->mem + i * slot;
    c->slots[i].desc = desc;
    c->slots[i].small = slot == XPORT__SMALL_SLOT;
    c->slots[i].next = *free_p;
    *free_p = &c->slots[i];
  }
  c->next = *chunks_p;
  *chunks_p = c;
  return 0;
fail:
  free(c->mem);
  free(c->slots);
  free(c);
  return -XPORT_ENOMEM;
}

struct xport__bounce *xport__bounce_get(struct xport__lane *lane)
{
  struct xport__bounce *b = lane->free_bounce;
  if (XPORT__UNLIKELY(!b)) {
    if (bounce_grow(lane, lane->bounce_size, &lane->free_bounce, &lane->bounce_chunks))
      return NULL;
    b = lane->free_bounce;
  }
  lane->free_bounce = b->next;
  return b;
}

struct xport__bounce *xport__small_get(struct xport__lane *lane)
{
  struct xport__bounce *b = lane->free_small;
  if (!b) {
    if (bounce_grow(lane, XPORT__SMALL_SLOT, &lane->free_small, &lane->small_chunks))
      return NULL;
    b = lane->free_small;
  }
  lane->free_small = b->next;
  return b;
}

void xport__bounce_put(struct xport__lane *lane, struct xport__bounce *b)
{
  struct xport__bounce **free_p = XPORT__UNLIKELY(b->small) ? &lane->free_small
                                                            : &lane->free_bounce;
  b->next = *free_p;
  *free_p = b;
}

static void pool_fini(struct xport__bounce_chunk **chunks_p, struct xport__bounce **free_p)
{
  while (*chunks_p) {
    struct xport__bounce_chunk *c = *chunks_p;
    *chunks_p = c->next;
    fi_close(&c->mr->fid);
    free(c->mem);
    free(c->slots);
    free(c);
  }
  *free_p = NULL;
}

void xport__bounce_fini(struct xport__lane *lane)
{
  pool_fini(&lane->bounce_chunks, &lane->free_bounce);
  pool_fini(&lane->small_chunks, &lane->free_small);
}

XPORT_API int xport_mr_reg(xport_ctx_t *ctx, void *buf, size_t len,
                           unsigned access, xport_mr_t **mr_p)
{
  xport_mr_t *mr, *sub = NULL;
  if (!ctx || !reg_args_ok(buf, len, access, mr_p))
    return -XPORT_EINVAL;
  XPORT__LOCK(ctx);
  /* XPORT_FAULT mr_reg fails the call's last registration: the second
   * lane's part where there is one, so that the first is undone as after
   * a real failure there. */
  int inject = XPORT__UNLIKELY(ctx->fault != NULL) && xport__fault_mr_reg(ctx);
  int ret = inject && ctx->nlanes == 1 ? -XPORT_ENOMEM
                                       : reg_part(ctx->lanes[0], buf, len, access, &mr);
  /* One region for every lane of the context, so that any connection
   * takes it and one packed key serves all. */
  if (!ret && ctx->nlanes > 1 &&
      (ret = inject ? -XPORT_ENOMEM : reg_part(ctx->lanes[1], buf, len, access, &sub)))
    part_close(mr);
  if (!ret) {
    mr->sub = sub;
    XPORT__LIST_PUSH(ctx->mrs, mr, next, prev);
    *mr_p = mr; /* only now: a failed call writes nothing */
  }
  XPORT__UNLOCK(ctx);
  return ret;
}

XPORT_API int xport_mr_dereg(xport_mr_t *mr)
{
  if (!mr)
    return 0;
  xport_ctx_t *ctx = mr->ctx;
  XPORT__LOCK(ctx);
  int ret = 0;
  if (mr->sub && !(ret = part_close(mr->sub)))
    mr->sub = NULL;
  if (!ret) {
    xport_mr_t *next = mr->next, *prev = mr->prev;
    if (!(ret = part_close(mr))) {
      if (prev)
        prev->next = next;
      else
        ctx->mrs = next;
      if (next)
        next->prev = prev;
    }
  }
  XPORT__UNLOCK(ctx);
  return ret;
}

int xport__atomic_apply(struct xport__lane *lane, unsigned kind, uint64_t key, uint64_t addr,
                        uint64_t operand, uint64_t compare, uint64_t *old_p)
{
  char *base;
  size_t len;
  unsigned access;
  if (kind < XPORT__ATOM_FADD || kind > XPORT__ATOM_ADD)
    return -XPORT_EPROTO;
  if (xport__mr_by_key(lane, key, &base, &len, &access) ||
      !(access & XPORT_ACCESS_REMOTE_ATOMIC))
    return -XPORT_EACCES;
  /* Outside the key's registration, or misaligned: the initiator checks
   * both against the key it holds, so only a forged key gets here, and is
   * refused as any key the target does not honour. */
  uint64_t off = lane->virt_addr ? addr - (uint64_t)(uintptr_t)base : addr;
  if (off > len || len - off < 8)
    return -XPORT_EACCES;
  uint64_t *word = (uint64_t *)(void *)(base + off);
  if ((uintptr_t)word % 8)
    return -XPORT_EACCES;
  /* Sequentially consistent, as a device's atomics are to one another:
   * other emulated operations on the word, and the target's own atomic
   * operations on it, see one order. */
  if (kind == XPORT__ATOM_CSWAP) {
    uint64_t expect = compare;
    __atomic_compare_exchange_n(word, &expect, operand, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    *old_p = expect;
  } else {
    *old_p = __atomic_fetch_add(word, operand, __ATOMIC_SEQ_CST);
  }
  return 0;
}
