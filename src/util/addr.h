/* host:port strings and their resolution (util/addr.c). */
#ifndef XPORT_UTIL_ADDR_H
#define XPORT_UTIL_ADDR_H

struct xport__lane;

#include "base.h"
#include <rdma/fabric.h>

int xport__addr_split(const char *addr, char *host, size_t hlen, char *port,
                      size_t plen);
/* sa (len bytes) as "ip:port" or "[ip6]:port" into buf; 0, or -1 with
 * "?" there for another family or a short address. */
int xport__format_sockaddr(const void *sa, size_t len, char *buf, size_t buflen);
/* fi_getinfo for host:port on the context's provider (flags FI_SOURCE:
 * to listen there); 0, or why not, logged. */
int xport__resolve(struct xport__lane *lane, const char *host, const char *port, uint64_t flags,
                   struct fi_info **info_p);

#endif /* XPORT_UTIL_ADDR_H */
