/* libFuzzer target: the MSG transport's greeting (msg_wire.h), as msg.c
 * reads it from a connection request's or an acceptance's private data.
 * Whatever the bytes, the parser reads only them, and a greeting it
 * passes on is of this version and is the data's first bytes (a missing
 * process tail reads as zeros).
 *
 * Input: the private data as it arrives. */
#include "xport_int.h"
#include "transport/msg_wire.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint8_t *buf = malloc(size ? size : 1); /* a read past it is reported */
  if (!buf)
    return 0;
  memcpy(buf, data, size);
  struct xport__hello h, before;
  memset(&h, 0xa5, sizeof h);
  before = h;
  if (!xport__hello_parse(buf, size, &h)) {
    if (memcmp(&h, &before, sizeof h)) /* refused: *h untouched */
      abort();
  } else {
    /* The process tail is optional: what the data did not carry is zero. */
    size_t got = size < sizeof h ? size : sizeof h;
    static const uint8_t zeros[sizeof h];
    if (size < offsetof(struct xport__hello, pid) || memcmp(&h, buf, got) ||
        memcmp((uint8_t *)&h + got, zeros, sizeof h - got) || h.magic != HELLO_MAGIC ||
        h.version != HELLO_VERSION)
      abort();
  }
  free(buf);
  return 0;
}
