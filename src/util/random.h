/* Random keys and ids (util/random.c). */
#ifndef XPORT_UTIL_RANDOM_H
#define XPORT_UTIL_RANDOM_H

#include "base.h"

uint64_t xport__random_key(size_t key_size);

#endif /* XPORT_UTIL_RANDOM_H */
