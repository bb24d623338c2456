/* libFuzzer target: the RDM transport's handshake and control messages
 * (rdm_wire.h), as rdm.c checks each one that arrives before it acts on
 * it. Whatever the bytes, the parser reads only the message, and one it
 * passes on is of this version, of a known type, names no more address
 * than a control message holds, and, if a request, a receive tag and an
 * address and no connection of ours.
 *
 * Input: the message as it travels (one struct xport__ctl). */
#include "xport_int.h"
#include "transport/rdm_wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint8_t *msg = malloc(size ? size : 1); /* a read past it is reported */
  if (!msg)
    return 0;
  memcpy(msg, data, size);
  struct xport__ctl m;
  memset(&m, 0xa5, sizeof m);
  const char *why = xport__ctl_parse(msg, size, &m);
  if (why) {
    /* Refused: *m untouched. */
    const uint8_t *b = (const uint8_t *)&m;
    for (size_t i = 0; i < sizeof m; i++)
      if (b[i] != 0xa5)
        abort();
  } else if (size != sizeof m || memcmp(&m, msg, sizeof m) || m.magic != XPORT__CTL_MAGIC ||
             m.version != XPORT__CTL_VERSION || m.type < XPORT__CTL_CONNREQ ||
             m.type > XPORT__CTL_AUTH || m.addrlen > XPORT__CTL_ADDR_MAX ||
             (m.type == XPORT__CTL_CONNREQ &&
              (!m.addrlen || m.dst_id || !m.tag || (m.tag & ~XPORT__TAG_MASK)))) {
    abort();
  }
  free(msg);
  return 0;
}
