/* "host:port" strings: IPv4, hostnames, and IPv6 in brackets. */
#include "xport_int.h"

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
