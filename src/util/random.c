/* Random 64-bit values: keys, names, context ids and secrets. */
#include "xport_int.h"

#include <stdlib.h>
#include <sys/random.h>

/* Keys the caller chooses (tcp, shm) are drawn at random so that a
 * connected peer cannot reach a region it was never given by guessing. */
uint64_t xport__random_key(size_t key_size)
{
  uint64_t k = 0;
  do {
    if (getrandom(&k, sizeof k, 0) != (ssize_t)sizeof k)
      k = ((uint64_t)rand() << 32) ^ (uint64_t)rand();
    if (key_size && key_size < 8)
      k &= (UINT64_C(1) << (8 * key_size)) - 1;
  } while (k == 0);
  return k;
}
