/* libFuzzer target: remote key blobs, as xport_rkey_unpack(3) reads them
 * from a peer (one key, or one per transport back to back), offered to
 * contexts of every provider and mode a key names. Whatever the bytes,
 * the parser reads only the blob, and a key it accepts lies inside it and
 * grants a nonempty range with some remote right.
 *
 * Input: the blob as it travels. The peer context id a connection
 * expects is taken from the blob's parts (their bytes 16 to 24), so that
 * the fuzzer reaches the checks beyond it. */
#include "xport_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const providers[] = {"tcp", "shm", "verbs", "tcp;ofi_rxm"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static struct xport__lane ctxs[4 * 4]; /* lanes of a context, one per mode */
  static int ready;
  if (!ready) {
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
      snprintf(ctxs[i].caps.provider, sizeof ctxs[i].caps.provider, "%s", providers[i / 4]);
      ctxs[i].virt_addr = i & 1;
      ctxs[i].raw_keys = !!(i & 2);
    }
    ready = 1;
  }
  /* A copy of exactly size bytes: a read past the blob is one past this
   * allocation, which AddressSanitizer reports. */
  uint8_t *blob = malloc(size ? size : 1);
  if (!blob)
    return 0;
  memcpy(blob, data, size);
  uint64_t ids[2] = {0, 0};
  if (size >= 24)
    ids[0] = xport__get64(blob + 16);
  size_t first = size >= 10 ? xport__get16(blob + 8) : 0;
  if (first && size >= first + 24)
    ids[1] = xport__get64(blob + first + 16);
  for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++)
    for (int j = 0; j < 2; j++) {
      struct xport__rkey_wire k;
      if (xport__rkey_parse(&ctxs[i], ids[j], blob, size, &k))
        continue;
      if (k.key < blob || k.klen > size || k.key + k.klen > blob + size || !k.len ||
          k.addr + k.len < k.addr || !k.access || (k.access & ~(unsigned)XPORT__ACCESS_REMOTE) ||
          (!ctxs[i].raw_keys && k.klen != 8))
        abort();
    }
  free(blob);
  return 0;
}
