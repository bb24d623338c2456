/* Fault injection, XPORT_FAULT (core/fault.c). */
#ifndef XPORT_CORE_FAULT_H
#define XPORT_CORE_FAULT_H

#include "objects.h"

/* fault.c: fault injection (XPORT_FAULT), costing the data path one test
 * of ctx->fault while off. */
struct xport__fault;
/* Reads XPORT_FAULT: 0 with its rules in *f_p (NULL where it is unset),
 * or -XPORT_EINVAL, logged, for a malformed value. */
int xport__fault_new(struct xport__fault **f_p);
/* ctx (on every lane) injects f's faults;
 * f NULL does nothing. xport__fault_fini ends them and frees f;
 * xport__fault_free frees one never attached (NULL: nothing). */
void xport__fault_attach(xport_ctx_t *ctx, struct xport__fault *f);
void xport__fault_free(struct xport__fault *f);
void xport__fault_fini(xport_ctx_t *ctx);
/* A post on conn (send, receive, write, read, atomic), with its context's
 * lock held: -XPORT_EAGAIN for one to push back (nothing done yet, nothing
 * to undo), else 0 and the post goes on. */
int xport__fault_post(xport_conn_t *conn);
/* 1 where this registration (xport_mr_reg) is to fail. */
int xport__fault_mr_reg(xport_ctx_t *ctx);
/* xport_poll and xport_wait with the faults on; poll and wait are theirs
 * without. */
int xport__fault_poll(xport_ctx_t *ctx, xport_completion_t *comps, int max,
                      int (*poll)(xport_ctx_t *, xport_completion_t *, int));
int xport__fault_wait(xport_ctx_t *ctx, int timeout_ms, int (*wait)(xport_ctx_t *, int));
/* conn is being closed: its held disconnect event goes, and its drop. */
void xport__fault_forget(xport_conn_t *conn);

#endif /* XPORT_CORE_FAULT_H */
