/* Posting an operation: checks, bookkeeping, held posts (api/msg.c). */
#ifndef XPORT_API_POST_H
#define XPORT_API_POST_H

#include "../core/objects.h"

/* msg.c: the post path shared by messages and RMA. begin validates,
 * takes a request and gives every element a descriptor (fiov, desc,
 * *cnt); end hands the provider's verdict back: on failure it undoes
 * begin, on success it links the request to its connection. */
int xport__post_begin(xport_conn_t *conn, xport_op_t op, const xport_iov_t *iov,
                      size_t iovcnt, void *user_ctx, struct iovec *fiov, void **desc,
                      size_t *cnt, struct xport__req **req_p);
int xport__post_end(xport_conn_t *conn, struct xport__req *req, ssize_t ret);
/* Instead of end, for a send, read or write the provider pushed back
 * (xport__pushed_back) or that must stay behind held ones (conn->held):
 * req waits on conn, in order, to be posted as h says, with h->cnt
 * elements of fiov and desc; 0, or
 * -XPORT_EAGAIN (undone) where no memory is left to keep it. */
int xport__post_hold(xport_conn_t *conn, struct xport__req *req, const struct xport__held *h,
                     const struct iovec *fiov, void *const *desc);
static inline int xport__pushed_back(ssize_t ret)
{
  /* ENOMEM: the provider's per-endpoint entry pool ran out (shm). */
  return ret == -FI_EAGAIN || ret == -FI_ENOMEM;
}
/* 0 if n more operations of op's direction fit conn's depth and the
 * context's CQ, else -XPORT_EAGAIN. */
int xport__post_room(const xport_conn_t *conn, xport_op_t op, size_t n);

/* pool.c: conn, just handed out, joins the shared pool if the context
 * has one, and is lent its receives at once. */
void xport__pool_join(xport_conn_t *conn);

#endif /* XPORT_API_POST_H */
