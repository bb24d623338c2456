/* One-sided operations on a libfabric endpoint, to dest, as both
 * transports post them for their connections' read, write and atomic
 * data operations (struct xport__data_ops): the plainest call that
 * carries what is asked. Only the transports include it. */
#ifndef XPORT_TRANSPORT_FI_RMA_H
#define XPORT_TRANSPORT_FI_RMA_H

#include "../xport_int.h"

static inline ssize_t xport__fi_read(struct fid_ep *ep, fi_addr_t dest, struct xport__req *req,
                                     struct iovec *iov, void **desc, size_t cnt, uint64_t addr,
                                     uint64_t key)
{
  if (cnt == 1)
    return fi_read(ep, iov[0].iov_base, iov[0].iov_len, desc[0], dest, addr, key, &req->fictx);
  return fi_readv(ep, iov, desc, cnt, dest, addr, key, &req->fictx);
}

static inline ssize_t xport__fi_write(struct fid_ep *ep, fi_addr_t dest, struct xport__req *req,
                                      struct iovec *iov, void **desc, size_t cnt, uint64_t addr,
                                      uint64_t key, uint64_t flags, uint64_t data)
{
  if (XPORT__UNLIKELY(flags)) {
    size_t len = req->len;
    if (flags == FI_REMOTE_CQ_DATA && cnt == 1)
      return fi_writedata(ep, len ? iov[0].iov_base : NULL, len, len ? desc[0] : NULL, data,
                          dest, addr, key, &req->fictx);
    /* Delivery-complete: only the message form carries the flag. An
     * empty write (an immediate alone) carries no element. */
    struct fi_rma_iov riov = {addr, len, key};
    struct fi_msg_rma m = {.msg_iov = iov, .desc = desc, .iov_count = len ? cnt : 0,
                           .addr = dest, .rma_iov = &riov, .rma_iov_count = 1,
                           .context = &req->fictx, .data = data};
    return fi_writemsg(ep, &m, flags);
  }
  if (cnt == 1)
    return fi_write(ep, iov[0].iov_base, iov[0].iov_len, desc[0], dest, addr, key, &req->fictx);
  return fi_writev(ep, iov, desc, cnt, dest, addr, key, &req->fictx);
}

static inline ssize_t xport__fi_atomic(struct fid_ep *ep, fi_addr_t dest, struct xport__req *req,
                                       unsigned kind, uint64_t *v, void *desc, uint64_t addr,
                                       uint64_t key)
{
  if (kind == XPORT__ATOM_FADD)
    return fi_fetch_atomic(ep, &v[0], 1, desc, &v[2], desc, dest, addr, key, FI_UINT64, FI_SUM,
                           &req->fictx);
  if (kind == XPORT__ATOM_CSWAP)
    return fi_compare_atomic(ep, &v[0], 1, desc, &v[1], desc, &v[2], desc, dest, addr, key,
                             FI_UINT64, FI_CSWAP, &req->fictx);
  return fi_atomic(ep, &v[0], 1, desc, dest, addr, key, FI_UINT64, FI_SUM, &req->fictx);
}

#endif /* XPORT_TRANSPORT_FI_RMA_H */
