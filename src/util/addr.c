/* "host:port" strings (IPv4, hostnames, and IPv6 in brackets), and what
 * the context's provider makes of them. */
#include "xport_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xport__addr_split(const char *addr, char *host, size_t hlen, char *port,
                      size_t plen)
{
  const char *h, *colon;
  size_t n;

  if (!addr || !*addr)
    return -XPORT_EINVAL;
  if (addr[0] == '[') {
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':')
      return -XPORT_EINVAL;
    h = addr + 1;
    n = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon || strchr(addr, ':') != colon) /* bare IPv6 needs brackets */
      return -XPORT_EINVAL;
    h = addr;
    n = (size_t)(colon - addr);
  }
  if (!n || n >= hlen)
    return -XPORT_EINVAL;
  const char *p = colon + 1;
  size_t pl = strlen(p);
  if (!pl || pl >= plen || strspn(p, "0123456789") != pl || pl > 5)
    return -XPORT_EINVAL;
  long v = 0;
  for (size_t i = 0; i < pl; i++)
    v = v * 10 + (p[i] - '0');
  if (v > 65535)
    return -XPORT_EINVAL;
  memcpy(host, h, n);
  host[n] = '\0';
  memcpy(port, p, pl + 1);
  return 0;
}

int xport__format_sockaddr(const void *sa, size_t len, char *buf, size_t buflen)
{
  char ip[INET6_ADDRSTRLEN] = "?";
  sa_family_t fam = AF_UNSPEC;
  union {
    struct sockaddr_in s4;
    struct sockaddr_in6 s6;
  } u;
  if (len >= sizeof fam)
    memcpy(&fam, sa, sizeof fam); /* a raw address aligns nothing */
  int v4 = fam == AF_INET;
  if ((!v4 && fam != AF_INET6) || len < (v4 ? sizeof u.s4 : sizeof u.s6)) {
    snprintf(buf, buflen, "?");
    return -1;
  }
  memcpy(&u, sa, v4 ? sizeof u.s4 : sizeof u.s6);
  inet_ntop(fam, v4 ? (const void *)&u.s4.sin_addr : (const void *)&u.s6.sin6_addr, ip, sizeof ip);
  snprintf(buf, buflen, v4 ? "%s:%u" : "[%s]:%u", ip, ntohs(v4 ? u.s4.sin_port : u.s6.sin6_port));
  return 0;
}

/* fi_getinfo for host:port on the chosen provider: first on the chosen
 * domain (verbs and verbs;ofi_rxm endpoints must stay on their device),
 * then on any of the provider's (tcp names domains by interface, and the
 * endpoint still opens on ctx's domain). */
int xport__resolve(struct xport__lane *lane, const char *host, const char *port, uint64_t flags,
                   struct fi_info **info_p)
{
  int ret = -FI_ENODATA;
  for (int keep = 1; keep >= 0 && ret; keep--) {
    struct fi_info *h = fi_dupinfo(lane->info);
    if (!h)
      return -XPORT_ENOMEM;
    free(h->src_addr);
    free(h->dest_addr);
    h->src_addr = h->dest_addr = NULL;
    h->src_addrlen = h->dest_addrlen = 0;
    h->addr_format = FI_FORMAT_UNSPEC;
    free(h->fabric_attr->name);
    h->fabric_attr->name = NULL;
    if (!keep) {
      free(h->domain_attr->name);
      h->domain_attr->name = NULL;
    }
    ret = fi_getinfo(XPORT__FI_VERSION, host, port, flags, h, info_p);
    fi_freeinfo(h);
  }
  if (ret == -FI_ENODATA && (flags & FI_SOURCE) && strcmp(port, "0")) {
    /* Some providers (verbs, rxm over it) bind while resolving: a taken
     * port then looks like a bad address. Tell the two apart. */
    struct fi_info *any = NULL;
    if (!xport__resolve(lane, host, "0", flags, &any)) {
      fi_freeinfo(any);
      return -XPORT_EADDRINUSE;
    }
  }
  if (ret) {
    XPORT__INFO("cannot resolve %s:%s: %s", host, port, fi_strerror(-ret));
    return ret == -FI_ENODATA ? -XPORT_EADDRNOTAVAIL : xport__err_from_fi(ret);
  }
  return 0;
}
