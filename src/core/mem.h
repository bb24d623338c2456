/* Registration on every lane, copy buffers, keys (core/mem.c). */
#ifndef XPORT_CORE_MEM_H
#define XPORT_CORE_MEM_H

#include "objects.h"

int xport__reg(struct xport__lane *lane, void *buf, size_t len, uint64_t fi_access,
               struct fid_mr **mr_p);
struct xport__bounce *xport__bounce_get(struct xport__lane *lane);
/* A registered slot of XPORT__SMALL_SLOT bytes; given back by bounce_put. */
struct xport__bounce *xport__small_get(struct xport__lane *lane);
void xport__bounce_put(struct xport__lane *lane, struct xport__bounce *b);
void xport__bounce_fini(struct xport__lane *lane);
/* The registration that covers exactly [offset, offset + len) of mr:
 * the region's own for the whole of it, else one made for that range
 * (kept until mr is deregistered). */
int xport__mr_span(xport_mr_t *mr, size_t offset, size_t len, struct fid_mr **fmr_p);
/* mem.c: finds what a key of this context names: the local range it covers and
 * the region's rights; 0, or -XPORT_EACCES for no such key. */
int xport__mr_by_key(xport_ctx_t *ctx, uint64_t key, char **base_p, size_t *len_p,
                     unsigned *access_p);

#endif /* XPORT_CORE_MEM_H */
