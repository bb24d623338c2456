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
/* mem.c: finds what a key of lane names (its part of a registration of its
 * context): the local range it covers and
 * the region's rights; 0, or -XPORT_EACCES for no such key. */
int xport__mr_by_key(const struct xport__lane *lane, uint64_t key, char **base_p,
                     size_t *len_p, unsigned *access_p);

/* Applies an atomic (XPORT__ATOM_*) that a peer asked for to the word at
 * addr of lane's context, under key: 0 with the word's old value in
 * *old_p, or why it is refused (a key not honoured, out of its range,
 * misaligned: -XPORT_EACCES; no such kind: -XPORT_EPROTO). The emulated
 * atomics of the transports that carry them (msg's service channel,
 * xshm's control ring). */
int xport__atomic_apply(struct xport__lane *lane, unsigned kind, uint64_t key, uint64_t addr,
                        uint64_t operand, uint64_t compare, uint64_t *old_p);

#endif /* XPORT_CORE_MEM_H */
