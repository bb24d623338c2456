/* Write-with-immediate emulated where the provider consumes no receive
 * (api/wimm.c). */
#ifndef XPORT_API_WIMM_H
#define XPORT_API_WIMM_H

#include "../core/objects.h"

/* wimm.c: posts an emulated write_imm of iov (len bytes) to the peer's
 * addr under key (rma.c, once checked): both halves, or neither. */
int xport__wimm_post(xport_conn_t *conn, const xport_iov_t *iov, size_t iovcnt, size_t len,
                     uint64_t addr, uint64_t key, uint32_t imm, void *user_ctx);
/* wimm.c: the write of a deferred write_imm (p, its user half) finished
 * with status: its marker goes now, or p fails with that status. Lower
 * layers reach it through ctx->wimm_write_done. */
void xport__wimm_write_done(xport_ctx_t *ctx, struct xport__req *p, int status);
/* Posts the markers that waited for room; with fail, fails them all
 * (lower layers: ctx->wimm_retry). */
void xport__wimm_retry(xport_ctx_t *ctx, int fail);

#endif /* XPORT_API_WIMM_H */
