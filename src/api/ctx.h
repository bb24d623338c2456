/* Contexts made on a transport named by the caller (api/ctx.c). */
#ifndef XPORT_API_CTX_H
#define XPORT_API_CTX_H

#include "../transport/transport.h"

/* A context whose one lane runs on own (its describe set), for a
 * transport of its own provider: 0, or a code with nothing made
 * (the provider-free tests). */
int xport__ctx_create_on(const struct xport__transport *own, const xport_ctx_attr_t *attr,
                         xport_ctx_t **ctx_p);

#endif /* XPORT_API_CTX_H */
