/* What the job layer hooks into listeners (api/conn.c). */
#ifndef XPORT_API_CONN_H
#define XPORT_API_CONN_H

#include "../core/objects.h"

/* Hands lst to a layer above: see struct xport_listener (admit NULL
 * gives it back to the application). */
void xport__listener_hook(xport_listener_t *lst, int (*admit)(void *, uint64_t),
                          void (*accepted)(void *, xport_conn_t *), void *arg);
/* Accepts what the listeners a layer above owns have ready (the jobs). */
void xport__auto_accept(xport_ctx_t *ctx);

#endif /* XPORT_API_CONN_H */
